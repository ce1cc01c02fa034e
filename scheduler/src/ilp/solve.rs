//! The solve: warm starts from the best feasible baseline and the hint, the staged phases or the
//! full-window MIP, the plan with the claim its phases prove, and infeasible caps explained.

use super::claim::{claim, objective_of};
use super::effort::{Budget, Clock};
use super::model::{Form, build};
use super::offload_solve::{offload_may_pay, solve_with_offload};
use super::pool::Pool;
use super::run::{Stop, run_highs};
use super::search::Search;
use super::staged::{FullWindow, full_window_mip, is_staged, staged_phases};
use super::variables::ExtraPositions;
use super::warm::best_baseline;
use super::{
    ModelSize, Objective, OutsideTheSpace, PhaseReport, SolveOptions, SolveReport, SolveStatus,
    Solved,
};
use crate::baselines::OffloadFallback;
use crate::profile::Profile;
use crate::sim::{Semantics, simulate};
use crate::size::{format_bytes, whole_bytes};
use crate::{Error, Result};
use std::time::Instant;

/// Solves for the plan that minimises the chosen objective within `options.effort`: the same plan
/// and claim on any machine for the same options, unless the outer clock (`time_limit_s`) stopped
/// the solve, which its status then says (DESIGN §4.6). Errors with [`Error::Infeasible`] (naming
/// the smallest feasible cap and what dominates it) when nothing fits the cap.
pub fn solve(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    if options.target == super::Target::Fsdp2 {
        return super::fsdp2_solve::solve(profile, options);
    }
    if profile.micro_batches >= 2 {
        return super::micro::solve(profile, options).map(|mut solved| {
            let r = &solved.report;
            solved.report.outside_the_space =
                OutsideTheSpace::of(options.objective, r.objective, r.best_bound);
            solved
        });
    }
    let started = Instant::now();
    let clock = Clock::new(started, options.time_limit_s);
    let warm = best_baseline(profile, options, &clock).map(|chosen| {
        let time = chosen.plan.simulation.iteration_time_us;
        (chosen.label(), chosen.plan.schedule, time)
    });
    // Every feasible plan met so far, best first: each phase warm-starts from the best one its
    // window limit can represent (a neighbour's plan outside D = 4 must not leave D = 4 cold).
    let mut pool = Pool::new(profile, options);
    if let Some((_, schedule, _)) = &warm {
        pool.offer(schedule.clone());
    }
    // A hint slower than the best baseline is no start: where the baseline cannot start a phase
    // the hint would, and from a plan this slow HiGHS may not leave it (a sweep of Llama-2 70B on
    // 8 nodes, 74.69 GiB from 29.63 GiB's plan: depth 1 stuck at 8,799 ms after 1.9 s, against
    // 6,122 ms in 1.4 s from no start).
    if let Some(hint) = &options.hint
        && hint.fits(profile)
    {
        let value = objective_of(profile, options.objective, hint);
        if pool.best_value().is_none_or(|best| value < best) {
            pool.offer(hint.clone());
        }
    }
    let mut search = Search::new(pool, Budget::new(options.effort, &clock));
    let user_limited = !options.limits.is_full();
    let full_window = if is_staged(profile, options) {
        staged_phases(profile, options, &mut search)?
    } else {
        FullWindow::Run
    };
    // The full-window MIP runs unless the staged phases ran it or proved it unneeded: the best
    // plan proven within the gap over every plan, or the model too large for it to finish its
    // root LP (it still runs when no plan was found, to tell an infeasible cap).
    let infeasible = match full_window {
        FullWindow::Ran { infeasible } => infeasible,
        FullWindow::Skip => false,
        // Past the deadline HiGHS would stop it at once, after its model was built: with a plan
        // in hand and a phase to claim from, the clock keeps it from starting (which `expired`
        // records).
        FullWindow::Run
            if !search.pool.is_empty() && !search.phases.is_empty() && clock.expired() =>
        {
            false
        }
        FullWindow::Run => {
            let run = full_window_mip(profile, options, &mut search)?;
            search.phases.push(run.phase);
            if let Some(schedule) = run.schedule {
                search.pool.offer(schedule);
            }
            run.infeasible
        }
    };
    let Search {
        mut pool, phases, ..
    } = search;
    if user_limited {
        // A warm start outside the windows asked for is not an answer to the limited search.
        pool.retain_within(options.limits);
    }
    // On a profile with a host, the offload MIP (DESIGN §4.10), started from the plans met: where
    // no plan fits on the device alone (proven, or only a hint that offloads met), and where one
    // does but offload may pay (its answer then only if it offloads, faster than those plans).
    let device_fits = pool.plans().iter().any(|(s, _)| !s.offloads());
    if (!device_fits && (infeasible || !pool.is_empty())
        || device_fits && offload_may_pay(profile, options, pool.plans()))
        && let Some(solved) = solve_with_offload(profile, options, &clock, started, pool.plans())
    {
        match solved {
            Ok(solved) if !device_fits || solved.schedule.offloads() => return Ok(solved),
            Err(e) if !device_fits => return Err(e),
            _ => {}
        }
    }
    if infeasible && pool.is_empty() {
        if let Objective::Memory {
            max_iteration_time_us: Some(ceiling),
        } = options.objective
        {
            return Err(Error::Infeasible(format!(
                "no plan meets the iteration-time ceiling of {:.3} ms{}",
                ceiling / 1e3,
                options.memory_cap_bytes.map_or(String::new(), |c| format!(
                    " within {}",
                    format_bytes(c as f64)
                ))
            )));
        }
        return Err(explain_infeasible(profile, options, &clock));
    }
    let Some((schedule, objective)) = pool.into_best() else {
        return Err(Error::Infeasible(
            "the time limit ended before any feasible plan was found".into(),
        ));
    };
    let claim = claim(&phases, &schedule, objective, options.relative_gap);
    let simulation = simulate(profile, &schedule, Semantics::Strict);
    let size = model_size(profile, options, &phases);
    let report = SolveReport {
        status: if clock.fired() {
            SolveStatus::TimeLimit
        } else {
            claim.status
        },
        objective,
        best_bound: claim.best_bound,
        gap: claim.gap,
        solve_seconds: started.elapsed().as_secs_f64(),
        variables: size.variables,
        integer_variables: size.integer_variables,
        constraints: size.constraints,
        warm_start: warm.map(|(name, _, time)| (name, time)),
        window_depth: claim.window_depth,
        phases,
        outside_the_space: OutsideTheSpace::of(options.objective, objective, claim.best_bound),
    };
    Ok(Solved {
        schedule,
        simulation,
        report,
    })
}

/// [`solve`] for the one cap a user asked for: where no plan fits it, the error names the fastest
/// offload baseline that does (DESIGN §3.13) where the ILP's offload choices do not cover the
/// profile (DESIGN §4.10). Searches over
/// many caps (sweeps, `solve --model`'s lower caps) take [`solve`]'s error as it is.
pub fn solve_naming_offload(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    solve(profile, options).map_err(|error| match error {
        Error::Infeasible(why) => Error::Infeasible(format!(
            "{why}{}",
            OffloadFallback::at(profile, options.memory_cap_bytes)
        )),
        error => error,
    })
}

/// The size of the model of the plans asked for (the full windows unless the user limited them):
/// the MIP phase that solved it, or, where a staged solve skipped that phase, the model built
/// and counted.
fn model_size(profile: &Profile, options: &SolveOptions, phases: &[PhaseReport]) -> ModelSize {
    if let Some(phase) = phases
        .iter()
        .find(|p| p.relaxation.is_none() && p.window_depth == options.limits)
    {
        return phase.size();
    }
    let built = build(profile, options, (Form::Mip, &ExtraPositions::new()));
    ModelSize {
        variables: built.columns,
        integer_variables: built.integers,
        constraints: built.constraints.len(),
    }
}

/// The smallest feasible cap (memory objective, no cap) and what dominates its peak slot.
fn explain_infeasible(profile: &Profile, options: &SolveOptions, clock: &Clock) -> Error {
    let cap = options
        .memory_cap_bytes
        .map_or("the memory cap".to_string(), |c| {
            format!("the memory cap of {}", format_bytes(c as f64))
        });
    let plan = if options.limits.is_full() {
        "plan".to_string()
    } else {
        format!("plan within {}", options.limits)
    };
    let relaxed = SolveOptions {
        objective: Objective::Memory {
            max_iteration_time_us: None,
        },
        memory_cap_bytes: None,
        two_phase: false,
        ..options.clone()
    };
    let stop = Stop {
        work: options.effort.iterations(),
        objective_target: None,
        clock,
    };
    match run_highs(
        profile,
        (&relaxed, Form::Mip, &ExtraPositions::new()),
        &[],
        stop,
    )
    .ok()
    .and_then(|r| r.schedule)
    {
        Some(schedule) => {
            let sim = simulate(profile, &schedule, Semantics::Strict);
            let peak = sim.peak();
            let (what, bytes) = peak.memory.dominant();
            Error::Infeasible(format!(
                "no {plan} fits {cap}: the smallest feasible cap is {} ({} bytes), peaking at slot {} where the largest part is {}, {}",
                format_bytes(sim.peak_memory_bytes),
                whole_bytes(sim.peak_memory_bytes),
                sim.peak_at(),
                what,
                format_bytes(bytes)
            ))
        }
        None => Error::Infeasible(format!("no {plan} fits {cap}")),
    }
}
