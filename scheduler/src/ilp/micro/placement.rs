//! Placements at fixed configurations at K ≥ 2 (DESIGN §4.8, as §4.5's placement at fixed
//! levels at K = 1): the micro-batch MIP with every unit's configuration (level, group,
//! accumulate, keep, replica AllReduce) and recompute held, over depth 4 and the positions column
//! generation added. With several groups of ranks per unit, HiGHS' own search of the depth-4 MIP
//! changes configurations and launches together and stays near its warm start; with the
//! configurations held the MIP is a placement problem. Its answers are plans; its bound holds
//! only over plans of those configurations, so its phase claims none.

use super::columns::Config;
use super::model::{Added, Fixed, Space};
use super::run::{config_of, run_mip};
use crate::Result;
use crate::ilp::effort::Budget;
use crate::ilp::{PhaseReport, SolveOptions, SolveStatus, WindowLimits};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::Simulation;
use std::time::Instant;

/// A value counts as nonzero above this.
const NONZERO: f64 = 1e-6;

/// One unit's configurations and recompute in an LP's solution.
#[derive(Debug, Clone)]
pub(super) struct Fractional {
    pub configs: Vec<(Config, f64)>,
    pub recompute: f64,
}

/// The configurations and recompute flags of `schedule`, as a placement holds them.
pub(super) fn held(schedule: &Schedule) -> Vec<Fixed> {
    schedule
        .units()
        .iter()
        .map(|u| Fixed {
            config: config_of(u),
            recompute: u.recompute,
        })
        .collect()
}

/// An LP's configurations made whole by systematic rounding (DESIGN §4.5, "placing the LP's
/// levels", with configurations for levels): unit by unit in order, each takes the configuration
/// whose running sum Σ_{j ≤ i} y_{j,c} most exceeds the units already given it (about
/// Σ_i y_{i,c} units at c, spread evenly over the repeated blocks), and recomputes wherever
/// r_i > 0 (recompute only trades time for memory, so rounding it up keeps what fits).
pub(super) fn spread(units: &[Fractional]) -> Vec<Fixed> {
    let mut owed: Vec<(Config, f64)> = Vec::new();
    units
        .iter()
        .map(|u| {
            let mut best: Option<(Config, f64)> = None;
            for &(config, y) in &u.configs {
                let index = match owed.iter().position(|(c, _)| *c == config) {
                    Some(index) => index,
                    None => {
                        owed.push((config, 0.0));
                        owed.len() - 1
                    }
                };
                owed[index].1 += y;
                let sum = owed[index].1;
                if best.is_none_or(|(_, b)| sum > b) {
                    best = Some((config, sum));
                }
            }
            let (config, _) = best.expect("every unit has a configuration");
            if let Some((_, sum)) = owed.iter_mut().find(|(c, _)| *c == config) {
                *sum -= 1.0;
            }
            Fixed {
                config,
                recompute: u.recompute > NONZERO,
            }
        })
        .collect()
}

/// What the placements found: their plans (in the order placed) and their runs.
#[derive(Default)]
pub(super) struct Placed {
    pub plans: Vec<(Schedule, Simulation)>,
    pub phases: Vec<PhaseReport>,
}

/// The placement of each distinct configurations of `candidates` (in order) over the windows
/// `limits` and the positions `added`, each in an equal share of the `work` (LP iterations)
/// left, warm-started from the best plan of `met` with those configurations.
pub(super) fn place_each(
    profile: &Profile,
    options: &SolveOptions,
    (limits, added): (WindowLimits, &Added),
    (candidates, met): (Vec<Vec<Fixed>>, &[&(Schedule, Simulation)]),
    (work, budget): (u64, &mut Budget),
) -> Result<Placed> {
    let mut distinct: Vec<Vec<Fixed>> = Vec::new();
    for fixed in candidates {
        if !distinct.contains(&fixed) {
            distinct.push(fixed);
        }
    }
    let mut placed = Placed::default();
    let count = distinct.len() as u64;
    let mut left = work;
    for (k, fixed) in (0..).zip(&distinct) {
        if !budget.can_start() {
            break;
        }
        let share = (left / (count - k)).min(budget.left());
        let started = Instant::now();
        let warm: Vec<&Schedule> = met
            .iter()
            .filter(|(s, _)| held(s) == *fixed)
            .map(|(s, _)| s)
            .collect();
        let space = Space {
            fixed: Some(fixed),
            ..Space::within(limits, added, options.target)
        };
        let run = run_mip(profile, options, (space, share), &warm, budget.clock())?;
        budget.spend(run.work);
        left = left.saturating_sub(run.work);
        let objective = run
            .found
            .as_ref()
            .map_or(f64::NAN, |(_, s)| options.objective.value_of(s));
        placed.phases.push(PhaseReport {
            window_depth: limits,
            relaxation: None,
            status: SolveStatus::GapLimit,
            objective,
            best_bound: f64::NEG_INFINITY,
            gap: f64::INFINITY,
            seconds: started.elapsed().as_secs_f64(),
            lp_iterations: run.work,
            variables: run.size.variables,
            integer_variables: run.size.integer_variables,
            constraints: run.size.constraints,
        });
        placed.plans.extend(run.found);
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::{AnalyticOptions, analytic_profile, zoo};
    use crate::baselines::{BaselineKind, baseline};
    use crate::hardware::Catalog;
    use crate::ilp::effort::Clock;
    use crate::schedule::{Recompute, ReplicaReduce};
    use crate::timeline::Level;

    fn config(level: Level, group: Option<u32>) -> Config {
        Config {
            level,
            group,
            secondary: None,
            accumulate: false,
            keep: false,
            replica_reduce: ReplicaReduce::Every,
        }
    }

    /// Five units of y = 0.2 on one configuration and 0.8 on another round to one unit at the
    /// first, third in line (its running sum 0.6 first exceeds the other's), and four at the
    /// second; r rounds up wherever it is above zero.
    #[test]
    fn configurations_spread_evenly_and_recompute_rounds_up() {
        let (a, b) = (config(Level::Sdp, None), config(Level::Fsdp, Some(8)));
        let units: Vec<Fractional> = [0.0, 0.3, 1.0, 1e-9, 0.5]
            .iter()
            .map(|&recompute| Fractional {
                configs: vec![(config(Level::None, None), 0.0), (a, 0.2), (b, 0.8)],
                recompute,
            })
            .collect();
        let fixed = spread(&units);
        let configs: Vec<Config> = fixed.iter().map(|f| f.config).collect();
        assert_eq!(configs, [b, b, a, b, b]);
        let recomputes: Vec<bool> = fixed.iter().map(|f| f.recompute).collect();
        assert_eq!(recomputes, [false, true, true, false, true]);
    }

    /// gpt2-tiny on 2 nodes of 8 at K = 2, at fsdp2+ckpt's peak (a cap equal to a plan's peak,
    /// below every replicated unit's state): the full-window MIP's optimum, its own configurations placed over full
    /// windows, comes back at its value (the placement is a restriction of the MIP, so never
    /// below it, and holds the optimum, so never above), every unit at its configuration and
    /// recompute; and a placement of other configurations holds them.
    #[test]
    fn placing_the_optimums_configurations_gives_it_back() {
        let analytic = AnalyticOptions {
            topology: Some(Some(8)),
            micro_batches: 2,
            ..AnalyticOptions::new("h100-sxm", 16)
        };
        let catalog = Catalog::bundled().unwrap();
        let profile = analytic_profile(&zoo("gpt2-tiny"), &catalog, &analytic).unwrap();
        let fsdp2 = baseline(&profile, BaselineKind::Fsdp2, Recompute::On, None).unwrap();
        let cap = fsdp2.simulation.peak_memory_bytes.ceil();
        let options = SolveOptions {
            memory_cap_bytes: Some(cap as u64),
            relative_gap: 0.0,
            ..SolveOptions::default()
        };
        let clock = Clock::new(Instant::now(), 600.0);
        let none = Added::new();
        let run = |fixed: Option<&[Fixed]>| {
            let space = Space {
                limits: WindowLimits::FULL,
                added: &none,
                left_out: false,
                target: options.target,
                fixed,
            };
            run_mip(&profile, &options, (space, u64::MAX), &[], &clock).unwrap()
        };
        let optimum = run(None);
        assert_eq!(optimum.status, highs::HighsModelStatus::Optimal);
        let (schedule, simulation) = optimum.found.unwrap();
        let held_configs = held(&schedule);
        assert!(held_configs.iter().any(|f| f.config.level != Level::None));
        let placed = run(Some(&held_configs));
        let (placed, placed_simulation) = placed.found.unwrap();
        let (value, again) = (
            simulation.iteration_time_us,
            placed_simulation.iteration_time_us,
        );
        assert!(
            (again - value).abs() <= 1e-6 * value,
            "{again} against {value}"
        );
        assert_eq!(held(&placed), held_configs);
        // Every unit replicated, recomputing: a plan of exactly those configurations.
        let replicated: Vec<Fixed> = (0..profile.unit_count())
            .map(|_| Fixed {
                config: config(Level::None, None),
                recompute: true,
            })
            .collect();
        let options = SolveOptions {
            memory_cap_bytes: None,
            ..options
        };
        let space = Space {
            fixed: Some(&replicated),
            ..Space::within(WindowLimits::FULL, &none, options.target)
        };
        let run = run_mip(&profile, &options, (space, u64::MAX), &[], &clock).unwrap();
        assert_eq!(held(&run.found.unwrap().0), replicated);
    }
}
