//! The ILP of K ≥ 2 micro-batches per step (DESIGN §4.8): `columns` declares the configuration
//! indicators (over every group of ranks the space offers) and the launch columns of both
//! boundary kinds, `model` the rows of the step unrolled to first, steady and last micro-batch,
//! `memory` its memory rows; `linear` reads its forms back at a solution; `run` runs HiGHS on
//! one space and checks its plan against the simulator; `pricing` bounds every plan where the
//! MIP searched limited windows; on a profile with nodes `staged` adds a depth-1 MIP before it
//! and `placement`'s placements at fixed configurations after. This module picks the answer
//! and reports the claim.

mod columns;
mod linear;
mod memory;
mod model;
mod placement;
mod pricing;
mod run;
mod staged;
mod target;

use super::claim::claim;
use super::effort::{Budget, Clock};
use super::limits::PLACEMENT_DEPTH;
use super::warm::best_baseline;
use super::{Objective, PhaseReport, SolveOptions, SolveReport, SolveStatus, Solved, WindowLimits};
use crate::profile::Profile;
use crate::schedule::{RecomputeChoice, Schedule};
use crate::sim::Simulation;
use crate::size::format_bytes;
use crate::timeline::{Timeline, WindowKind};
use crate::{Error, Result};
use columns::Config;
use highs::HighsModelStatus;
pub(super) use model::Added;
use model::{Space, build};
pub(super) use pricing::{generated, priced};
pub(super) use run::run_fsdp2;
use run::{Parts, config_of, run_mip, values_of};
use std::time::Instant;

/// Where the MIP searches limited windows of a model too large for the full ones, the bound over
/// every plan after it (`pricing`) gets this share of the effort on top of the MIP's (HiGHS checks
/// the MIP's work at its own points: on the K = 8 demo on nodes it stops at 63,037 LP iterations
/// under a limit of 48,000 as under 60,000, which would leave a share after it nothing). Half
/// the effort ended the demo's column generation in its third round (about 14,000 LP iterations
/// a round).
const BOUND_SHARE: f64 = 1.0;

/// The best plan of K ≥ 2 micro-batches for the objective (the fastest under the cap, or the
/// smallest peak under a time ceiling), with HiGHS' proven gap.
pub(super) fn solve(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    let started = Instant::now();
    let clock = Clock::new(started, options.time_limit_s);
    let limits = limits_for(profile, options);
    // Warm start: the best baseline that fits (the answer is never worse than it).
    let warm = best_baseline(profile, options, &clock);
    let value_of = |s: &Simulation| options.objective.value_of(s);
    let baseline = warm
        .as_ref()
        .map(|c| (c.plan.schedule.clone(), c.plan.simulation.clone()));
    let staged = staged::applies(profile, options, limits);
    let mut budget = Budget::new(options.effort, &clock);
    let mut phases = Vec::new();
    // On a profile with nodes, the depth-1 MIP first (`staged`): its plan warm-starts the main
    // MIP beside the baseline, the better first.
    let first = if staged {
        let found = staged::depth_one(profile, options, baseline.as_ref(), &mut budget)?;
        found.map(|d| {
            phases.push(d.phase);
            d.plan
        })
    } else {
        None
    };
    let starts = by_value(options, [first.as_ref(), baseline.as_ref()]);
    let none = Added::new();
    let space = Space::within(limits, &none, options.target);
    let warm_starts: Vec<&Schedule> = starts.iter().map(|(s, _)| s).collect();
    let main = run_mip(
        profile,
        options,
        (space, budget.left()),
        &warm_starts,
        &clock,
    )?;
    if matches!(
        main.status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    ) && first.is_none()
    {
        return Err(infeasible(profile, options, &clock));
    }
    // A time limit can stop HiGHS above its warm start, or before it holds any plan (the
    // baselines took the time): the better start is then the answer.
    let Some((schedule, simulation)) = by_value(
        options,
        [main.found.as_ref(), first.as_ref(), baseline.as_ref()],
    )
    .first()
    .map(|&(s, sim)| (s.clone(), sim.clone())) else {
        return Err(Error::Infeasible(
            "the time limit ended before any feasible plan was found".into(),
        ));
    };
    let time = value_of(&simulation);
    // A baseline in a configuration the MIP does not offer its unit (`Config::all`) lies outside
    // its space: the bound is over that space, not over the plan, and may lie above it.
    let bound = if outside_the_space(profile, &schedule) {
        main.dual_bound
    } else {
        main.dual_bound.min(time)
    };
    let gap = if bound > 0.0 {
        ((time - bound) / time).max(0.0)
    } else {
        f64::INFINITY
    };
    // The clock, else whether the gap met the target (a baseline answer may have a larger gap
    // than HiGHS' incumbent).
    let status = if clock.fired() {
        SolveStatus::TimeLimit
    } else if gap <= options.relative_gap.max(1e-9) {
        SolveStatus::Optimal
    } else {
        SolveStatus::GapLimit
    };
    let (variables, integer_variables, constraints) = (
        main.size.variables,
        main.size.integer_variables,
        main.size.constraints,
    );
    phases.push(PhaseReport {
        window_depth: limits,
        relaxation: None,
        status,
        objective: time,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: main.work,
        variables,
        integer_variables,
        constraints,
    });
    let mut answer = (schedule, simulation);
    // Where the MIP searched narrower windows than asked, pricing then bounds every plan; on a
    // profile with nodes, configurations are then placed over the positions it added.
    if limits != options.limits && options.objective == Objective::Time {
        let mut budget = Budget::new(options.effort, &clock);
        budget.spend(budget.share(1.0 - BOUND_SHARE));
        let needed = time * (1.0 - options.relative_gap);
        let generation = pricing::generation(profile, options, limits, needed, &mut budget)?;
        if staged {
            let met = [first.as_ref(), main.found.as_ref()];
            let placed =
                staged::place(profile, options, (limits, generation.as_ref()), met, &clock)?;
            phases.extend(placed.phases);
            if let Some(best) = by_value(options, placed.plans.iter().map(Some))
                .first()
                .filter(|(_, sim)| value_of(sim) < value_of(&answer.1))
            {
                answer = (best.0.clone(), best.1.clone());
            }
        }
        phases.extend(generation.map(|g| g.phase));
    }
    let (schedule, simulation) = answer;
    let time = value_of(&simulation);
    // The widest window whose gap meets the target, else the smallest gap (`claim`).
    let claimed = claim(&phases, &schedule, time, options.relative_gap);
    let status = if clock.fired() {
        SolveStatus::TimeLimit
    } else {
        claimed.status
    };
    let seconds = started.elapsed().as_secs_f64();
    Ok(Solved {
        schedule,
        simulation,
        report: SolveReport {
            status,
            objective: time,
            best_bound: claimed.best_bound,
            gap: claimed.gap,
            solve_seconds: seconds,
            variables,
            integer_variables,
            constraints,
            warm_start: warm.map(|c| (c.label(), c.plan.simulation.iteration_time_us)),
            window_depth: claimed.window_depth,
            phases,
            outside_the_space: None,
        },
    })
}

/// The plans present among `plans`, best first (a stable sort: of equal values the earlier).
fn by_value<'a>(
    options: &SolveOptions,
    plans: impl IntoIterator<Item = Option<&'a (Schedule, Simulation)>>,
) -> Vec<&'a (Schedule, Simulation)> {
    let mut present: Vec<_> = plans.into_iter().flatten().collect();
    present.sort_by(|a, b| {
        let value = |p: &(Schedule, Simulation)| options.objective.value_of(&p.1);
        value(a).total_cmp(&value(b))
    });
    present
}

/// The MIP's own account of `schedule` (tests compare it with the simulator): its step time and
/// the memory of each slot of the first, steady (K ≥ 3) and last micro-batch; None where the
/// MIP cannot express the schedule.
pub fn rows_at(profile: &Profile, schedule: &Schedule) -> Option<(f64, Vec<f64>)> {
    let added = Added::new();
    let space = Space::within(WindowLimits::FULL, &added, crate::target::Target::Runtime);
    let built = build(profile, space, RecomputeChoice::Allowed, (None, None));
    let parts = Parts {
        units: &built.units,
        terms: &built.terms,
        durations: &built.durations,
        communicators: &built.communicators,
        peak: None,
        count: built.columns.count,
        target: crate::target::Target::Runtime,
    };
    let values = values_of(profile, &parts, schedule)?;
    let time = built
        .durations
        .iter()
        .zip(&built.weights)
        .map(|(d, w)| w * values[d.index])
        .sum();
    let memory = built.memory.iter().map(|m| m.eval(&values)).collect();
    Some((time, memory))
}

/// Whether a unit of `schedule` takes a configuration the MIP does not offer it (`Config::all`,
/// DESIGN §4.8).
fn outside_the_space(profile: &Profile, schedule: &Schedule) -> bool {
    schedule
        .units()
        .iter()
        .enumerate()
        .any(|(i, u)| !Config::all(profile, i).contains(&config_of(u)))
}

/// Launch columns above which the MIP searches within [`PLACEMENT_DEPTH`] instead of the whole
/// windows (the full MIP of a 70B model, ~50,000 of them, made no progress in a minute).
const FULL_WINDOW_COLUMNS: usize = 10_000;

/// The window limits of a solve: the user's, the full windows when asked to solve them directly
/// (`two_phase` off), or depth 4 for a large model (the claim then holds within them).
fn limits_for(profile: &Profile, options: &SolveOptions) -> WindowLimits {
    if !options.limits.is_full() || !options.two_phase {
        return options.limits;
    }
    let timeline = Timeline::new(profile.unit_count());
    let columns: usize = (0..profile.unit_count())
        .map(|i| {
            let after = timeline.window(i, WindowKind::AfterBackward).len;
            let between = timeline.window(i, WindowKind::BetweenPasses).len;
            6 * after + between
        })
        .sum();
    if columns > FULL_WINDOW_COLUMNS {
        WindowLimits::depth(PLACEMENT_DEPTH)
    } else {
        WindowLimits::FULL
    }
}

/// Why nothing fits: the smallest feasible cap (the memory objective's optimum), its peak slot
/// and what dominates there.
fn infeasible(profile: &Profile, options: &SolveOptions, clock: &Clock) -> Error {
    let cap = options.memory_cap_bytes.unwrap_or(u64::MAX);
    let smallest = SolveOptions {
        objective: Objective::Memory {
            max_iteration_time_us: None,
        },
        memory_cap_bytes: None,
        time_limit_s: clock.seconds_left(),
        ..options.clone()
    };
    let why = match solve(profile, &smallest) {
        Ok(solved) => {
            let sim = &solved.simulation;
            let (what, bytes) = sim.peak().memory.dominant();
            format!(
                ": the smallest feasible cap is {} ({} bytes), peaking at slot {} where the \
                 largest part is {what}, {}",
                format_bytes(sim.peak_memory_bytes),
                crate::size::whole_bytes(sim.peak_memory_bytes),
                sim.peak_at(),
                format_bytes(bytes)
            )
        }
        Err(_) => String::new(),
    };
    Error::Infeasible(format!(
        "no plan of {} micro-batches fits the memory cap of {}{why}",
        profile.micro_batches,
        format_bytes(cap as f64)
    ))
}
