//! The solve over FSDP2's space (`--target fsdp2`, DESIGN §4.9): one MIP over the full windows
//! restricted by `super::target` (at K ≥ 2 the micro-batch MIP restricted alike, with the
//! switches per unit: `super::micro::run_fsdp2`), warm-started from the best baseline whose FSDP2 export is
//! exact and fits, every candidate judged by its export (exact, FSDP2's peak within the cap,
//! FSDP2's time within the ceiling of the memory objective), the gap proven against the MIP's
//! bound over the whole restricted space. The objective is FSDP2's time, or FSDP2's peak.

use super::effort::{Budget, Clock};
use super::model::Form;
use super::run::{Stop, run_highs};
use super::variables::ExtraPositions;
use super::{
    Objective, OutsideTheSpace, SolveOptions, SolveReport, SolveStatus, Solved, WindowLimits,
};
use crate::baselines::{BaselineKind, baselines_at};
use crate::export::fsdp2 as export;
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, simulate};
use crate::{Error, Result};
use std::num::NonZeroUsize;
use std::time::Instant;

/// The share of the effort the depth-1 run spends before the full space's.
const SHALLOW_SHARE: f64 = 0.5;

/// How far past the iteration-time ceiling a plan's FSDP2 time may be and still meet it: the
/// MIP's row holds the ceiling to HiGHS' feasibility tolerance.
const CEILING_TOLERANCE: f64 = 1e-9;

/// Solves for the fastest plan FSDP2 executes exactly within the cap, or (memory objective) the
/// one of the smallest FSDP2 peak within the cap and the iteration-time ceiling.
pub(super) fn solve(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    let started = Instant::now();
    let clock = Clock::new(started, options.time_limit_s);
    let cap = options.memory_cap_bytes;
    let warm = baselines_at(
        profile,
        &BaselineKind::of(profile),
        options.recompute_choice(),
        cap,
    )
    .filter_map(|c| {
        let value = fsdp2_value(profile, &c.plan.schedule, options)?;
        Some((c.label(), c.plan.schedule, value))
    })
    .min_by(|a, b| a.2.total_cmp(&b.2));
    // Every plan met that FSDP2 executes exactly within the cap (and the ceiling), best first:
    // each run starts from the first its windows hold.
    let mut plans: Vec<(Schedule, f64)> = warm.iter().map(|(_, s, t)| (s.clone(), *t)).collect();
    let mut budget = Budget::new(options.effort, &clock);
    let mut phases = Vec::new();
    let mut infeasible = false;
    let shallow = SolveOptions {
        limits: WindowLimits::depth(NonZeroUsize::MIN),
        ..options.clone()
    };
    // Depth 1 first (each gather issued by the unit next to its consumer) where the space is
    // the full one: a small MIP whose plan starts the full space's.
    let stages: Vec<(&SolveOptions, f64)> = if options.limits.is_full() && options.two_phase {
        vec![(&shallow, SHALLOW_SHARE), (options, 1.0)]
    } else {
        vec![(options, 1.0)]
    };
    for (stage, share) in stages {
        let stop = Stop {
            // The full space's run gets its own share of the effort even where depth 1 ran
            // past its share (HiGHS checks the meter only between its search's steps): the bound
            // the claim takes is that run's.
            work: if share < 1.0 {
                budget.share(share)
            } else {
                budget.rest().max(full_share(options))
            },
            objective_target: None,
            clock: &clock,
        };
        // K ≥ 2: the micro-batch MIP over FSDP2's space (its switches per unit, DESIGN §4.9).
        let run = if profile.micro_batches >= 2 {
            super::micro::run_fsdp2(profile, stage, &plans, stop)?
        } else {
            run_highs(
                profile,
                (stage, Form::Mip, &ExtraPositions::new()),
                &plans,
                stop,
            )?
        };
        budget.spend(run.work);
        infeasible = run.infeasible;
        if let Some(schedule) = run.schedule
            && let Some(value) = fsdp2_value(profile, &schedule, options)
        {
            plans.push((schedule, value));
            plans.sort_by(|a, b| a.1.total_cmp(&b.1));
        }
        phases.push(run.phase);
    }
    let Some((schedule, objective)) = plans.into_iter().next() else {
        return Err(
            if let (
                true,
                Objective::Memory {
                    max_iteration_time_us: Some(ceiling),
                },
            ) = (infeasible, options.objective)
            {
                Error::Infeasible(format!(
                    "no plan FSDP2 can execute (--target fsdp2) meets the iteration-time ceiling of \
                 {:.3} ms{}",
                    ceiling / 1e3,
                    cap.map_or(String::new(), |c| format!(
                        " within {}",
                        crate::size::format_bytes(c as f64)
                    ))
                ))
            } else if infeasible {
                Error::Infeasible(format!(
                    "no plan FSDP2 can execute (--target fsdp2) fits {}",
                    cap.map_or("the memory cap".into(), |c| format!(
                        "the memory cap of {}",
                        crate::size::format_bytes(c as f64)
                    ))
                ))
            } else {
                Error::Infeasible(
                    "the effort or time limit ended before any plan FSDP2 can execute was found"
                        .into(),
                )
            },
        );
    };
    // The last run searched every plan within the options' windows: its bound is the claim's.
    let last = phases.last().expect("a run ran");
    let last_bound = last.best_bound;
    let best_bound = last_bound.min(objective);
    let gap = ((objective - best_bound) / objective.abs().max(1e-12)).max(0.0);
    let status = if clock.fired() {
        SolveStatus::TimeLimit
    } else if gap <= options.relative_gap {
        SolveStatus::Optimal
    } else {
        SolveStatus::GapLimit
    };
    let (variables, integer_variables, constraints) =
        (last.variables, last.integer_variables, last.constraints);
    let simulation = simulate(profile, &schedule, Semantics::Strict);
    let report = SolveReport {
        status,
        objective,
        best_bound,
        gap,
        solve_seconds: started.elapsed().as_secs_f64(),
        variables,
        integer_variables,
        constraints,
        warm_start: warm.map(|(name, _, time)| (name, time)),
        window_depth: options.limits,
        phases,
        outside_the_space: OutsideTheSpace::of(options.objective, objective, last_bound),
    };
    Ok(Solved {
        schedule,
        simulation,
        report,
    })
}

/// The full space's share of the effort where depth 1 runs first.
fn full_share(options: &SolveOptions) -> u64 {
    (options.effort.iterations() as f64 * (1.0 - SHALLOW_SHARE)) as u64
}

/// FSDP2's value of `schedule` for the options' objective (its time, µs, or its peak, bytes)
/// where its export is exact, FSDP2's peak fits the cap and, under the memory objective, FSDP2's
/// time meets the ceiling (to the MIP's relative tolerance, as its row holds it); None otherwise.
pub(super) fn fsdp2_value(
    profile: &Profile,
    schedule: &Schedule,
    options: &SolveOptions,
) -> Option<f64> {
    let exported = export(profile, schedule).ok()?;
    let peak = exported.fsdp2_peak_memory_bytes;
    let time = exported.fsdp2_iteration_time_us;
    let fits = options.memory_cap_bytes.is_none_or(|c| peak <= c);
    let value = match options.objective {
        Objective::Time => time,
        Objective::Memory {
            max_iteration_time_us,
        } => {
            if max_iteration_time_us.is_some_and(|c| time > c * (1.0 + CEILING_TOLERANCE)) {
                return None;
            }
            peak as f64
        }
    };
    (exported.exact && fits).then_some(value)
}
