//! The solve over FSDP2's space (`--target fsdp2`, DESIGN §4.9): one MIP over the full windows
//! restricted by `super::target`, warm-started from the fastest baseline whose FSDP2 export is
//! exact and fits, every candidate judged by its export (exact, FSDP2's peak within the cap), the
//! gap proven against the MIP's bound over the whole restricted space.

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
use crate::target::Target;
use crate::{Error, Result};
use std::num::NonZeroUsize;
use std::time::Instant;

/// The share of the effort the depth-1 run spends before the full space's.
const SHALLOW_SHARE: f64 = 0.5;

/// Solves for the fastest plan FSDP2 executes exactly within the cap.
pub(super) fn solve(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    refuse_unsupported(profile, options)?;
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
        let time = fsdp2_time(profile, &c.plan.schedule, cap)?;
        Some((c.label(), c.plan.schedule, time))
    })
    .min_by(|a, b| a.2.total_cmp(&b.2));
    // Every plan met that FSDP2 executes exactly within the cap, fastest first: each run starts
    // from the first its windows hold.
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
            work: if share < 1.0 {
                budget.share(share)
            } else {
                budget.rest()
            },
            objective_target: None,
            clock: &clock,
        };
        let run = run_highs(
            profile,
            (stage, Form::Mip, &ExtraPositions::new()),
            &plans,
            stop,
        )?;
        budget.spend(run.work);
        infeasible = run.infeasible;
        if let Some(schedule) = run.schedule
            && let Some(time) = fsdp2_time(profile, &schedule, cap)
        {
            plans.push((schedule, time));
            plans.sort_by(|a, b| a.1.total_cmp(&b.1));
        }
        phases.push(run.phase);
    }
    let Some((schedule, objective)) = plans.into_iter().next() else {
        return Err(if infeasible {
            Error::Infeasible(format!(
                "no plan FSDP2 can execute (--target fsdp2) fits {}",
                cap.map_or("the memory cap".into(), |c| format!(
                    "the memory cap of {}",
                    crate::size::format_bytes(c as f64)
                ))
            ))
        } else {
            Error::Infeasible(
                "the effort or time limit ended before any plan FSDP2 can execute was found".into(),
            )
        });
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

/// FSDP2's time of `schedule` where its export is exact and FSDP2's peak fits `cap`; None
/// otherwise.
pub(super) fn fsdp2_time(profile: &Profile, schedule: &Schedule, cap: Option<u64>) -> Option<f64> {
    let exported = export(profile, schedule).ok()?;
    let fits = cap.is_none_or(|c| exported.fsdp2_peak_memory_bytes <= c);
    (exported.exact && fits).then_some(exported.fsdp2_iteration_time_us)
}

/// What this round's FSDP2 target does not solve, each a one-line error naming `--target`.
fn refuse_unsupported(profile: &Profile, options: &SolveOptions) -> Result<()> {
    let expected = if profile.micro_batches >= 2 {
        format!(
            "`runtime` for a profile of {} micro-batches per step (the FSDP2 target solves K = 1 \
             only)",
            profile.micro_batches
        )
    } else if options.objective != Objective::Time {
        "`runtime` with --objective memory (the FSDP2 target minimises time)".into()
    } else {
        return Ok(());
    };
    Err(Error::invalid(
        "solve",
        "--target",
        format!("{expected}, got `{}`", Target::Fsdp2.name()),
    ))
}
