//! The solve with offload (DESIGN §4.10): where no plan fits on the device alone and the profile
//! has a `[host]`, one MIP over levels, recompute, launches and each unit's offload (within depth
//! 4 unless the user limited the windows), warm-started from the offload baselines, its answer
//! checked against the strict simulator; when nothing fits even so, the smallest cap with offload.

use super::callback::solve_metered;
use super::claim::{Claim, claim};
use super::effort::Clock;
use super::mapping::{schedule_from_values, schedule_values};
use super::model::{Built, Form, build, highs_model};
use super::pool::Pool;
use super::run::spent;
use super::variables::ExtraPositions;
use super::{
    Objective, OutsideTheSpace, PhaseReport, SolveOptions, SolveReport, SolveStatus, Solved,
    WindowLimits,
};
use crate::baselines::{BaselineKind, baselines_at};
use crate::cost::Interference;
use crate::offload::{HostStep, Offload};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, memory_by_slot, simulate};
use crate::size::{format_bytes, whole_bytes};
use crate::timeline::Op;
use crate::{Error, Result};
use good_lp::{Constraint, constraint};
use highs::HighsModelStatus;
use std::num::NonZeroUsize;
use std::time::Instant;

/// Relative agreement required between the ILP's objective and the strict simulation.
const CONSISTENCY: f64 = 1e-6;
/// The window depth of the offload MIP where the user did not limit the windows.
const DEPTH: usize = 4;

/// The best plan with offload under `options` (time objective), an error naming the smallest
/// cap with offload when none fits, or None where the profile offers no offload.
pub(super) fn solve_with_offload(
    profile: &Profile,
    options: &SolveOptions,
    clock: &Clock,
    started: Instant,
    met: &[(Schedule, f64)],
) -> Option<Result<Solved>> {
    if profile.host.is_none() || options.objective != Objective::Time {
        return None;
    }
    let limits = if options.limits.is_full() {
        WindowLimits::depth(NonZeroUsize::new(DEPTH).expect("the depth is positive"))
    } else {
        options.limits
    };
    let limited = SolveOptions {
        limits,
        two_phase: false,
        ..options.clone()
    };
    let built = build(profile, &limited, (Form::Offload, &ExtraPositions::new()));
    built.offload.as_ref()?;
    Some(solve_built(profile, &limited, built, clock, (started, met)))
}

/// Whether offload may beat `met` (best first), plans that fit on the device alone: the best
/// recomputes, so memory the host frees may buy its recompute back, on one node (one link) at
/// K = 1 and κ_q = 0, where the offload MIP has columns, for the runtime's target (DESIGN §4.10).
pub(super) fn offload_may_pay(
    profile: &Profile,
    options: &SolveOptions,
    met: &[(Schedule, f64)],
) -> bool {
    let one_node = profile
        .host
        .as_ref()
        .is_some_and(|h| h.ranks_per_node == profile.world_size);
    one_node
        && options.target == crate::target::Target::Runtime
        && profile.micro_batches == 1
        && Interference::of(profile).comm == 0.0
        && met
            .first()
            .is_some_and(|(best, _)| best.units().iter().any(|u| u.recompute))
}

fn solve_built(
    profile: &Profile,
    options: &SolveOptions,
    built: Built,
    clock: &Clock,
    (started, met): (Instant, &[(Schedule, f64)]),
) -> Result<Solved> {
    let run_started = Instant::now();
    let mut pool = Pool::new(profile, options);
    for (schedule, _) in met {
        pool.offer(schedule.clone());
    }
    let kinds = BaselineKind::offload_of(profile);
    let cap = options.memory_cap_bytes;
    let mut warm_start = None;
    for chosen in baselines_at(profile, &kinds, options.recompute_choice(), cap) {
        let schedule = chosen.plan.schedule;
        // The baseline with its steps overlapped and `full` as `optimizer`: the ILP's space.
        let optimizer = schedule
            .offload_modes()
            .iter()
            .map(|m| {
                if m.is_none() {
                    Offload::None
                } else {
                    Offload::Optimizer
                }
            })
            .collect();
        let overlapped = [schedule.offload_modes().to_vec(), optimizer]
            .into_iter()
            .filter_map(|modes| {
                let s = schedule.clone();
                s.offloaded(profile, modes, HostStep::Overlapped, "warm start")
                    .ok()
            })
            .collect::<Vec<_>>();
        if schedule.fits(profile) && chosen.plan.simulation.peak_memory_bytes <= cap_of(options) {
            let time = chosen.plan.simulation.iteration_time_us;
            if warm_start.as_ref().is_none_or(|(_, t)| time < *t) {
                warm_start = Some((chosen.kind.label(chosen.checkpoint), time));
            }
        }
        pool.offer(schedule);
        // Also each with its first units back on the device (a baseline's own `full` plans lie
        // outside the ILP's space, but are plans all the same).
        for overlapped in overlapped
            .into_iter()
            .filter_map(|s| with_useful_recompute(profile, s))
        {
            if let Some(prefix) = device_prefix(profile, &overlapped, cap_of(options)) {
                pool.offer(prefix);
            }
            pool.offer(overlapped);
        }
    }
    let start = pool
        .plans()
        .iter()
        .find_map(|(s, _)| start_values(profile, options, &built, s));
    // The MIP is held to the plans no slower than its start, whose time then bounds its big M
    // (the same columns, in the same order, so the start's values still index them).
    let built = match &start {
        Some((time, _)) => {
            let within = Form::OffloadWithin(time.ceil() as u64 + 1);
            build(profile, options, (within, &ExtraPositions::new()))
        }
        None => built,
    };
    let (columns, integers, rows) = (built.columns, built.integers, built.constraints.len());
    let free = free_columns(&built);
    let units = built.units;
    let offload = built
        .offload
        .expect("the caller checked the offload columns");
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        clock.seconds_left(),
    )?;
    if let Some((_, values)) = &start {
        model
            .try_set_solution(Some(values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    // HiGHS may end in a numerical error on these big-M rows (a solution it claims, off by more
    // than its tolerance): the warm starts then stand alone and the phase proves nothing.
    let solved = solve_metered(model, options.effort.iterations()).ok();
    let status = solved.as_ref().map(|s| s.status());
    if status == Some(HighsModelStatus::ReachedTimeLimit) {
        clock.record_stop();
    }
    let bound = solved
        .as_ref()
        .and_then(|s| s.double_info_value(c"mip_dual_bound").ok())
        .unwrap_or(f64::NEG_INFINITY);
    // The start is a point of the model (its LP at the plan's integers is optimal at the plan's
    // time), so the MIP's best is no worse, whatever HiGHS reports when its search is stopped.
    let mut objective = start.as_ref().map_or(f64::NAN, |(time, _)| *time);
    let answer = solved
        .as_ref()
        .filter(|s| s.primal_solution_status() == highs::HighsSolutionStatus::Feasible)
        .map(|s| s.get_solution().columns().to_vec());
    if let Some(values) = answer {
        let modes = offload.modes(units.len(), &values);
        let schedule = schedule_from_values(profile, &units, &values)?.offloaded(
            profile,
            modes,
            HostStep::Overlapped,
            "the ILP's plan",
        );
        // A plan over the host's memory by HiGHS' tolerance is no plan.
        if let Ok(schedule) = schedule {
            let own = fixed_lp(profile, options, &values, &free)?.0;
            check_consistency(profile, &schedule, own)?;
            objective = objective.min(own);
            pool.offer(schedule);
        }
    }
    let phase = PhaseReport {
        window_depth: options.limits,
        relaxation: None,
        status: match status {
            Some(HighsModelStatus::Optimal) => SolveStatus::Optimal,
            Some(HighsModelStatus::ReachedTimeLimit) => SolveStatus::TimeLimit,
            _ => SolveStatus::GapLimit,
        },
        objective,
        best_bound: bound,
        gap: if objective.is_finite() && bound.is_finite() {
            ((objective - bound) / objective).max(0.0)
        } else {
            f64::INFINITY
        },
        seconds: run_started.elapsed().as_secs_f64(),
        lp_iterations: solved.as_ref().map_or(0, spent),
        variables: columns,
        integer_variables: integers,
        constraints: rows,
    };
    let Some((schedule, value)) = pool.into_best() else {
        return Err(smallest_cap_with_offload(profile, options, clock));
    };
    let phases = vec![phase];
    // The MIP's bound holds over its space only: a warm start outside it (`full`, steps after
    // the backward, a reduction later than right after B_i) is claimed nothing.
    let inside = in_space(profile, &schedule);
    let claim = if inside {
        claim(&phases, &schedule, value, options.relative_gap)
    } else {
        Claim {
            status: SolveStatus::GapLimit,
            best_bound: f64::NEG_INFINITY,
            gap: f64::INFINITY,
            window_depth: phases[0].window_depth,
        }
    };
    let simulation = simulate(profile, &schedule, Semantics::Strict);
    Ok(Solved {
        schedule,
        simulation,
        report: SolveReport {
            status: if clock.fired() {
                SolveStatus::TimeLimit
            } else {
                claim.status
            },
            objective: value,
            best_bound: claim.best_bound,
            gap: claim.gap,
            solve_seconds: started.elapsed().as_secs_f64(),
            variables: columns,
            integer_variables: integers,
            constraints: rows,
            warm_start,
            window_depth: claim.window_depth,
            phases,
            outside_the_space: if inside {
                OutsideTheSpace::of(options.objective, value, claim.best_bound)
            } else {
                Some(OutsideTheSpace::OffloadBeyondTheMip)
            },
        },
    })
}

/// `schedule` (every unit offloaded, steps overlapped) with its first k units back on the
/// device, k the most whose peak fits `cap` (the peak grows with k): the host then steps only the
/// later units, which the backward's rest and the next forward's first units hide.
fn device_prefix(profile: &Profile, schedule: &Schedule, cap: f64) -> Option<Schedule> {
    let with_prefix = |k: usize| {
        let modes: Vec<Offload> = (0..schedule.units().len())
            .map(|i| {
                if i < k {
                    Offload::None
                } else {
                    schedule.offload(i)
                }
            })
            .collect();
        let s = schedule
            .clone()
            .offloaded(profile, modes, HostStep::Overlapped, "warm start")
            .ok()?;
        let peak = memory_by_slot(profile, &s)
            .iter()
            .map(|m| m.total())
            .fold(0.0, f64::max);
        (peak <= cap).then_some(s)
    };
    let (mut fits, mut over) = (0, schedule.units().len() + 1);
    with_prefix(0)?;
    while over - fits > 1 {
        let mid = (fits + over) / 2;
        if with_prefix(mid).is_some() {
            fits = mid;
        } else {
            over = mid;
        }
    }
    with_prefix(fits)
}

/// `schedule` without recompute where it saves no memory (checkpoint bytes ≥ activation bytes:
/// the model has no recompute column there, DESIGN §4.3), so that it can start the MIP: as fast
/// or faster, and no larger.
fn with_useful_recompute(profile: &Profile, schedule: Schedule) -> Option<Schedule> {
    let modes = schedule.offload_modes().to_vec();
    let host_step = schedule.host_step();
    let units = schedule
        .into_units()
        .into_iter()
        .zip(&profile.units)
        .map(|(mut u, p)| {
            u.recompute &= p.checkpoint_activation_bytes < p.activation_bytes;
            u
        })
        .collect();
    Schedule::new(profile, units)
        .ok()?
        .offloaded(profile, modes, host_step, "warm start")
        .ok()
}

/// Whether `schedule` lies in the offload MIP's space (DESIGN §4.10): offloaded units' steps
/// overlapped, each reducing whole right after B_i.
fn in_space(profile: &Profile, schedule: &Schedule) -> bool {
    let timeline = schedule.timeline();
    (0..profile.unit_count()).all(|unit| match schedule.offload(unit) {
        Offload::None => true,
        Offload::Optimizer | Offload::Full => {
            let first = timeline
                .window(unit, Op::ReduceScatter.window_kind())
                .slot_at(0);
            schedule.host_step() == HostStep::Overlapped
                && schedule
                    .launches(unit, Op::ReduceScatter)
                    .iter()
                    .all(|l| l.slot == first)
        }
    })
}

fn cap_of(options: &SolveOptions) -> f64 {
    options.memory_cap_bytes.map_or(f64::INFINITY, |c| c as f64)
}

/// A plan's time and values in the offload model: its launches, levels and offload columns, and
/// the slot durations and host ends of the model's LP with those fixed (the strict simulation's,
/// for a plan of its space); None where the model cannot hold it.
fn start_values(
    profile: &Profile,
    options: &SolveOptions,
    built: &Built,
    schedule: &Schedule,
) -> Option<(f64, Vec<f64>)> {
    if schedule.offloads() && schedule.host_step() != HostStep::Overlapped {
        return None;
    }
    let offload = built.offload.as_ref()?;
    let mut values = schedule_values(&built.units, schedule, built.columns)?;
    if !offload.set_values(&built.units, schedule.offload_modes(), &mut values) {
        return None;
    }
    let free = free_columns(built);
    fixed_lp(profile, options, &values, &free).ok()
}

/// The columns a plan's integers do not fix: the slot durations and the host's ends.
fn free_columns(built: &Built) -> Vec<usize> {
    built
        .durations
        .iter()
        .map(|d| d.index)
        .chain(built.offload.iter().flat_map(|o| o.free_columns()))
        .collect()
}

/// The ILP's own time of an integer solution and its values: its model again with every column
/// but the slot durations and the host's ends fixed at `values`, solved for the least Σ d_s.
fn fixed_lp(
    profile: &Profile,
    options: &SolveOptions,
    values: &[f64],
    free: &[usize],
) -> Result<(f64, Vec<f64>)> {
    let built = build(profile, options, (Form::OffloadLp, &ExtraPositions::new()));
    let mut constraints = built.constraints;
    let fixed: Vec<Constraint> = built
        .problem
        .iter_variables_with_def()
        .enumerate()
        .filter(|(index, _)| !free.contains(index))
        .map(|(index, (var, _))| constraint!(var == values[index].round()))
        .collect();
    constraints.extend(fixed);
    let model = highs_model(
        built.problem,
        built.objective,
        constraints,
        options,
        f64::INFINITY,
    )?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    if solved.status() != HighsModelStatus::Optimal {
        return Err(Error::Solver(format!(
            "internal check failed: the offload MIP's answer with its launches fixed is {:?}",
            solved.status()
        )));
    }
    Ok((
        solved.objective_value(),
        solved.get_solution().columns().to_vec(),
    ))
}

/// The ILP's objective must equal the strict simulation of its plan (DESIGN §4).
fn check_consistency(profile: &Profile, schedule: &Schedule, ilp_time: f64) -> Result<()> {
    let sim = simulate(profile, schedule, Semantics::Strict);
    let error = (sim.iteration_time_us - ilp_time).abs() / ilp_time.max(1e-12);
    if error > CONSISTENCY {
        return Err(Error::Solver(format!(
            "internal check failed: the offload ILP's objective {ilp_time} µs differs from the simulated {} µs",
            sim.iteration_time_us
        )));
    }
    Ok(())
}

/// Nothing fits even with offload: the smallest peak a plan with offload reaches — the offload
/// MIP's (memory objective, no cap) or an offload baseline's, `full` offload lying outside the
/// MIP's space — and what fills its peak slot.
fn smallest_cap_with_offload(profile: &Profile, options: &SolveOptions, clock: &Clock) -> Error {
    let cap = options
        .memory_cap_bytes
        .map_or("the memory cap".to_string(), |c| {
            format!("the memory cap of {}", format_bytes(c as f64))
        });
    let relaxed = SolveOptions {
        objective: Objective::Memory {
            max_iteration_time_us: None,
        },
        memory_cap_bytes: None,
        ..options.clone()
    };
    let built = build(profile, &relaxed, (Form::Offload, &ExtraPositions::new()));
    let (units, offload) = (built.units, built.offload);
    let solved = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        &relaxed,
        clock.seconds_left(),
    )
    .ok()
    .and_then(|model| solve_metered(model, options.effort.iterations()).ok())
    .filter(|s| s.primal_solution_status() == highs::HighsSolutionStatus::Feasible);
    let schedule = solved.and_then(|solved| {
        let values = solved.get_solution().columns().to_vec();
        let modes = offload.as_ref()?.modes(units.len(), &values);
        schedule_from_values(profile, &units, &values)
            .ok()?
            .offloaded(profile, modes, HostStep::Overlapped, "the ILP's plan")
            .ok()
    });
    // Each candidate simulated once: the MIP's plan here, a baseline by its own construction.
    let from_mip = schedule.map(|s| simulate(profile, &s, Semantics::Strict));
    let kinds = BaselineKind::offload_of(profile);
    let from_baselines = baselines_at(profile, &kinds, options.recompute_choice(), None)
        .map(|chosen| chosen.plan.simulation);
    let smallest = from_mip
        .into_iter()
        .chain(from_baselines)
        .min_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes));
    match smallest {
        Some(sim) => {
            let (what, bytes) = sim.peak().memory.dominant();
            Error::Infeasible(format!(
                "no plan fits {cap}, offload to the host included: the smallest feasible cap is {} ({} bytes) with offload (the offload ILP within {} and the offload baselines), peaking at slot {} where the largest part is {}, {}",
                format_bytes(sim.peak_memory_bytes),
                whole_bytes(sim.peak_memory_bytes),
                options.limits,
                sim.peak_at(),
                what,
                format_bytes(bytes)
            ))
        }
        None => Error::Infeasible(format!(
            "no plan fits {cap}, offload to the host included (within {})",
            options.limits
        )),
    }
}
