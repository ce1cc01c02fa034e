//! Placement at fixed levels (DESIGN §4.5, "placement at fixed levels"): on a profile with nodes,
//! the depth-4 MIP with every unit's level and recompute fixed to a plan's. With several groups
//! of ranks per unit, HiGHS' own search of the depth-4 MIP changes levels and launches together
//! and stays near its warm start; with the levels fixed the MIP is a placement problem it solves
//! in a fraction of a second, and the depth-1 plan's levels (chosen with every launch next to its
//! consumer) placed at depth 4 give a plan its own search does not reach. The recompute-free form
//! (`Form::PlacementAmong`) holds the levels only and lets HiGHS choose which units recompute with
//! the launches: the full-window LP's levels made whole recompute wherever its r > 0, more than
//! the cap needs. Its answers are plans; its bound holds only over plans of those levels, so its
//! phase claims none.

use super::effort::Budget;
use super::model::Form;
use super::pool::Pool;
use super::run::{Stop, run_highs};
use super::variables::{Choice, ExtraPositions, UnitLevel};
use super::{PhaseReport, SolveOptions};
use crate::Result;
use crate::profile::Profile;

/// The placement of each distinct levels of `candidates` (in order, those present), each in an
/// equal share of the `work` (LP iterations) left.
pub(super) fn place_each<const N: usize>(
    profile: &Profile,
    options: &SolveOptions,
    (pool, phases, budget): (&mut Pool, &mut Vec<PhaseReport>, &mut Budget),
    (candidates, work, extra): ([Option<Vec<UnitLevel>>; N], u64, &ExtraPositions),
) -> Result<()> {
    let mut distinct: Vec<Vec<UnitLevel>> = Vec::new();
    for levels in candidates.into_iter().flatten() {
        if !distinct.contains(&levels) {
            distinct.push(levels);
        }
    }
    let count = distinct.len() as u64;
    let mut left = work;
    for (k, levels) in (0..).zip(&distinct) {
        if !budget.can_start() {
            break;
        }
        let share = (left / (count - k)).min(budget.left());
        let before = budget.left();
        place_levels(
            profile,
            options,
            (pool, phases, budget),
            (levels, share, extra),
        )?;
        left = left.saturating_sub(before - budget.left());
    }
    Ok(())
}

/// The placement MIP of `levels` for `work` LP iterations, warm-started from the best plan of
/// those levels in `pool`: its plan joins `pool`, its run `phases`.
fn place_levels(
    profile: &Profile,
    options: &SolveOptions,
    search: (&mut Pool, &mut Vec<PhaseReport>, &mut Budget),
    (levels, work, extra): (&[UnitLevel], u64, &ExtraPositions),
) -> Result<()> {
    let form = Form::Placement(levels);
    place_form(profile, options, search, (form, work, extra))
}

/// The placement MIP of `levels` with every unit's recompute free (`Form::PlacementAmong`, each
/// unit's one choice its level) for `work` LP iterations, warm-started from the best plan of those
/// levels in `pool` (whatever its recompute): HiGHS chooses which units recompute together with
/// the launches, so that whole recomputes meet the cap where the plan's recompute, rounded up from
/// the LP's, overshoots it. Its plan joins `pool`, its run `phases`.
pub(super) fn place_recompute_free(
    profile: &Profile,
    options: &SolveOptions,
    search: (&mut Pool, &mut Vec<PhaseReport>, &mut Budget),
    (levels, work, extra): (&[UnitLevel], u64, &ExtraPositions),
) -> Result<()> {
    let held = held_choices(levels);
    let form = Form::PlacementAmong(&held);
    place_form(profile, options, search, (form, work, extra))
}

/// Each unit's level as its one choice (`Form::PlacementAmong`: the level held, recompute free).
pub(super) fn held_choices(levels: &[UnitLevel]) -> Vec<Vec<Choice>> {
    levels.iter().map(|l| vec![l.choice]).collect()
}

/// The placement MIP `form` for `work` LP iterations, warm-started from the best plan of its
/// levels in `pool`: its plan joins `pool`, its run `phases`.
fn place_form(
    profile: &Profile,
    options: &SolveOptions,
    (pool, phases, budget): (&mut Pool, &mut Vec<PhaseReport>, &mut Budget),
    (form, work, extra): (Form, u64, &ExtraPositions),
) -> Result<()> {
    if !budget.can_start() {
        return Ok(());
    }
    let stop = Stop {
        work,
        objective_target: None,
        clock: budget.clock(),
    };
    let warm = pool.within(options.limits, extra);
    let placement = run_highs(profile, (options, form, extra), &warm, stop)?;
    budget.spend(placement.work);
    phases.push(placement.phase);
    if let Some(schedule) = placement.schedule {
        pool.offer(schedule);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::{AnalyticOptions, analytic_profile, zoo};
    use crate::baselines::{BaselineKind, baseline};
    use crate::hardware::Catalog;
    use crate::ilp::WindowLimits;
    use crate::ilp::variables::Choice;
    use crate::schedule::Recompute;
    use crate::sim::{Semantics, simulate};
    use std::num::NonZeroUsize;

    /// Llama-2 7B on 2 nodes of 8 H100s, at a cap halfway between fsdp2+ckpt's peak and
    /// hsdp+ckpt's: the depth-1 MIP's optimum mixes levels over the world and the node. Placing its
    /// own levels gives a plan of those levels at its value, and claims no bound.
    #[test]
    fn placing_the_optimums_levels_gives_it_back_and_claims_no_bound() {
        let options = AnalyticOptions {
            topology: Some(Some(8)),
            ..AnalyticOptions::new("h100-sxm", 16)
        };
        let catalog = Catalog::bundled().unwrap();
        let profile = analytic_profile(&zoo("llama2-7b"), &catalog, &options).unwrap();
        let peak = |kind| {
            let plan = baseline(&profile, kind, Recompute::On, None).unwrap();
            plan.simulation.peak_memory_bytes
        };
        let cap = (peak(BaselineKind::Fsdp2) + peak(BaselineKind::Hsdp)) / 2.0;
        let options = SolveOptions {
            memory_cap_bytes: Some(cap as u64),
            relative_gap: 0.0,
            limits: WindowLimits::depth(NonZeroUsize::MIN),
            ..SolveOptions::default()
        };
        let none = ExtraPositions::new();
        let clock = crate::ilp::effort::Clock::new(std::time::Instant::now(), 60.0);
        let stop = || Stop {
            work: u64::MAX,
            objective_target: None,
            clock: &clock,
        };
        let run = |form| run_highs(&profile, (&options, form, &none), &[], stop()).unwrap();
        let optimum = run(Form::Mip);
        assert_eq!(optimum.phase.status, crate::ilp::SolveStatus::Optimal);
        let value = optimum.phase.objective;
        let levels = optimum.levels.unwrap();
        let groups: std::collections::BTreeSet<_> =
            levels.iter().filter_map(|l| l.choice.group()).collect();
        assert!(groups.len() > 1, "levels over one group only: {levels:?}");
        assert!(levels.iter().any(|l| l.choice != Choice::Sdp(0)));

        let placed = run(Form::Placement(&levels));
        let schedule = placed.schedule.unwrap();
        assert!((placed.phase.objective - value).abs() <= 1e-9 * value);
        assert_eq!(placed.phase.best_bound, f64::NEG_INFINITY);
        assert!(placed.phase.gap.is_infinite());
        for (unit, fixed) in schedule.units().iter().zip(&levels) {
            assert_eq!(unit.level, fixed.choice.level());
            assert_eq!(unit.recompute, fixed.recompute);
        }
        let sim = simulate(&profile, &schedule, Semantics::Strict);
        assert!((sim.iteration_time_us - value).abs() <= 1e-6 * value);
    }
}
