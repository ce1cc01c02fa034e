//! The ILP of K ≥ 2 micro-batches per step (DESIGN §4.8): `columns` declares the configuration
//! indicators (over every group of ranks the space offers) and the launch columns of both
//! boundary kinds, `model` the rows of the step unrolled to first, steady and last micro-batch,
//! `memory` its memory rows; `linear` reads its forms back at a solution; `pricing` bounds
//! every plan where the MIP searched limited windows. This module runs HiGHS, turns the solution
//! into a schedule, checks the MIP's time against the simulator (at K' = 3 and 4, extended to K:
//! `classes`) and reports the claim.

mod columns;
mod linear;
mod memory;
mod model;
mod pricing;
mod target;

use super::callback::solve_metered;
use super::claim::claim;
use super::effort::{Budget, Clock};
use super::limits::PLACEMENT_DEPTH;
use super::mapping::launches_of;
use super::model::{highs_model, memory_scale};
use super::run::spent;
use super::warm::best_baseline;
use super::{Objective, PhaseReport, SolveOptions, SolveReport, SolveStatus, Solved, WindowLimits};
use crate::baselines::ChosenBaseline;
use crate::classes::simulate_strict;
use crate::cost::Interference;
use crate::profile::Profile;
use crate::schedule::{Accumulation, Launch, RecomputeChoice, Schedule, UnitSchedule};
use crate::size::format_bytes;
use crate::timeline::{Level, Op, Timeline, WindowKind};
use crate::{Error, Result};
use columns::{Boundary, Communicator, Config, SetKey, UnitCols};
use good_lp::constraint;
use highs::HighsModelStatus;
pub(super) use model::Added;
use model::{Built, SlotTerms, Space, build};
pub(super) use pricing::{generated, priced};
use std::collections::BTreeMap;
use std::time::Instant;
pub(super) use target::run as run_fsdp2;

/// Relative agreement required between the MIP's step time and the simulator's.
const CONSISTENCY: f64 = 1e-6;
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
    let peak_scale = match options.objective {
        Objective::Time => None,
        Objective::Memory { .. } => Some(memory_scale(profile, options)),
    };
    let added = Added::new();
    let space = Space {
        limits,
        added: &added,
        left_out: false,
        target: options.target,
    };
    let built = build(
        profile,
        space,
        options.recompute_choice(),
        (options.memory_cap_bytes, peak_scale),
    );
    let step_time = built.step_time();
    let Built {
        columns,
        units,
        terms,
        durations,
        weights,
        memory: _,
        communicators,
        peak,
        constraints: mut rows,
        kept: _,
    } = built;
    let objective = match (options.objective, peak) {
        (
            Objective::Memory {
                max_iteration_time_us,
            },
            Some((peak, _)),
        ) => {
            if let Some(ceiling) = max_iteration_time_us {
                rows.push(constraint!(step_time <= ceiling));
            }
            good_lp::Expression::from(peak.var)
        }
        _ => step_time,
    };
    let (variables, integer_variables) = (columns.count, columns.integer);
    let constraints = rows.len();
    let built_parts = Parts {
        units: &units,
        terms: &terms,
        durations: &durations,
        communicators: &communicators,
        peak,
        count: variables,
    };
    // Warm start: the best baseline that fits (the answer is never worse than it).
    let warm = best_baseline(profile, options, &clock);
    // The time limit holds for the whole solve: HiGHS gets what the model and the baselines
    // left of it.
    let mut model = highs_model(
        columns.problem,
        objective,
        rows,
        options,
        clock.seconds_left(),
    )?;
    if let Some(values) = warm
        .as_ref()
        .and_then(|chosen| values_of(profile, &built_parts, &chosen.plan.schedule))
    {
        model
            .try_set_solution(Some(&values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    let solved = solve_metered(model, options.effort.iterations())
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    if status == HighsModelStatus::ReachedTimeLimit {
        clock.record_stop();
    }
    if matches!(
        status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    ) {
        return Err(infeasible(profile, options, &clock));
    }
    let found = if solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible {
        let values = solved.get_solution().columns().to_vec();
        Some(checked(profile, &units, (&terms, &weights), &values)?)
    } else {
        None
    };
    // A time limit can stop HiGHS above its warm start, or before it holds any plan (the
    // baselines took the time): the baseline is then the answer.
    let value_of = |s: &crate::sim::Simulation| options.objective.value_of(s);
    let baseline = |c: &ChosenBaseline| (c.plan.schedule.clone(), c.plan.simulation.clone());
    let (schedule, simulation) = match (found, &warm) {
        (Some(found), Some(chosen)) if value_of(&chosen.plan.simulation) < value_of(&found.1) => {
            baseline(chosen)
        }
        (Some(found), _) => found,
        (None, Some(chosen)) => baseline(chosen),
        (None, None) => {
            return Err(Error::Infeasible(
                "the time limit ended before any feasible plan was found".into(),
            ));
        }
    };
    let time = value_of(&simulation);
    let scale = peak.map_or(1.0, |(_, scale)| scale);
    let dual_bound = solved
        .double_info_value(c"mip_dual_bound")
        .unwrap_or(f64::NEG_INFINITY)
        * scale;
    // A baseline in a configuration the MIP does not offer its unit (`Config::all`) lies outside
    // its space: the bound is over that space, not over the plan, and may lie above it.
    let bound = if outside_the_space(profile, &schedule) {
        dual_bound
    } else {
        dual_bound.min(time)
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
    let mut phases = vec![PhaseReport {
        window_depth: limits,
        relaxation: None,
        status,
        objective: time,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: spent(&solved),
        variables,
        integer_variables,
        constraints,
    }];
    // Where the MIP searched narrower windows than asked, pricing then bounds every plan.
    if limits != options.limits && options.objective == Objective::Time {
        let mut budget = Budget::new(options.effort, &clock);
        budget.spend(budget.share(1.0 - BOUND_SHARE));
        let needed = time * (1.0 - options.relative_gap);
        if let Some((phase, _)) = generated(profile, options, limits, needed, &mut budget)? {
            phases.push(phase);
        }
    }
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

/// The schedule of a solution and its strict simulation, once the MIP's step time at the
/// solution (Σ weight·max(c + L, Q + κ_q·c) over its slots) agrees with the simulator's.
fn checked(
    profile: &Profile,
    units: &[UnitCols],
    (terms, weights): (&[SlotTerms], &[f64]),
    values: &[f64],
) -> Result<(Schedule, crate::sim::Simulation)> {
    let schedule = schedule_from(profile, units, values)?;
    let simulation = simulate_strict(profile, &schedule);
    let interference = Interference::of(profile);
    let mip_time: f64 = terms
        .iter()
        .zip(weights)
        .map(|(t, w)| w * t.duration(interference, values))
        .sum();
    let time = simulation.iteration_time_us;
    if (mip_time - time).abs() > CONSISTENCY * time.max(1.0) {
        return Err(Error::Solver(format!(
            "the micro-batch MIP's step time {mip_time:.6} µs disagrees with the simulator's \
             {time:.6} µs"
        )));
    }
    Ok((schedule, simulation))
}

/// The MIP's own account of `schedule` (tests compare it with the simulator): its step time and
/// the memory of each slot of the first, steady (K ≥ 3) and last micro-batch; None where the
/// MIP cannot express the schedule.
pub fn rows_at(profile: &Profile, schedule: &Schedule) -> Option<(f64, Vec<f64>)> {
    let added = Added::new();
    let space = Space {
        limits: WindowLimits::FULL,
        added: &added,
        left_out: false,
        target: crate::target::Target::Runtime,
    };
    let built = build(profile, space, RecomputeChoice::Allowed, (None, None));
    let parts = Parts {
        units: &built.units,
        terms: &built.terms,
        durations: &built.durations,
        communicators: &built.communicators,
        peak: None,
        count: built.columns.count,
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

/// What a warm start's values are made of.
struct Parts<'a> {
    units: &'a [UnitCols],
    terms: &'a [SlotTerms],
    durations: &'a [crate::ilp::variables::Col],
    communicators: &'a [Communicator],
    /// The memory objective's peak column and its scale.
    peak: Option<(crate::ilp::variables::Col, f64)>,
    count: usize,
}

/// The configuration a unit of a schedule takes.
fn config_of(unit: &UnitSchedule) -> Config {
    let a = &unit.accumulation;
    Config {
        level: unit.level,
        group: unit.shard_group,
        secondary: unit.secondary_group,
        accumulate: a.accumulate,
        keep: a.keep,
        replica_reduce: a.replica_reduce,
    }
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

/// The column values of `schedule`: its configurations, recompute flags, launches and their
/// running sums, each group's step RS→FG boundary after its last reduction block, the
/// communicators in use and each slot's duration at its terms; None for a schedule the MIP
/// cannot express (over a group of ranks it does not offer, or launching outside its limits).
fn values_of(profile: &Profile, parts: &Parts, schedule: &Schedule) -> Option<Vec<f64>> {
    let mut values = vec![0.0; parts.count];
    for c in parts.communicators {
        let used = schedule.units().iter().any(|u| c.used_by(config_of(u)));
        values[c.column.index] = f64::from(u8::from(used));
    }
    for (u, unit) in parts.units.iter().zip(schedule.units()) {
        let a = &unit.accumulation;
        let config = config_of(unit);
        let (_, y) = u.configs.iter().find(|(c, _)| *c == config)?;
        values[y.index] = 1.0;
        match u.recompute {
            Some(r) => values[r.index] = f64::from(u8::from(unit.recompute)),
            None if unit.recompute => return None,
            None => {}
        }
        // Puts an op's launches on its columns; false where one lies outside the limits.
        let mut put = |op: Op, boundary: Boundary, launches: &[Launch]| {
            let Some(l) = u.set_of(config, model_op(op), boundary) else {
                return false;
            };
            let (mut running, mut placed) = (0.0, 0);
            for ((&pos, x), c) in l.positions.iter().zip(&l.x).zip(&l.running) {
                let slot = l.window.slot_at(pos);
                let blocks = launches
                    .iter()
                    .find(|k| k.slot == slot)
                    .map_or(0, |k| k.blocks);
                // A column counts whole launches of `blocks_per_launch` blocks.
                if blocks % u.blocks_per_launch != 0 {
                    return false;
                }
                let launched = f64::from(blocks / u.blocks_per_launch);
                values[x.index] = launched;
                running += launched;
                values[c.index] = running;
                placed += blocks;
            }
            placed == launches.iter().map(|k| k.blocks).sum::<u32>()
        };
        let step = unit.launches.iter().map(|(op, l)| (op, Boundary::Step, l));
        let inner = a.inner.iter().map(|(op, l)| (op, Boundary::Inner, l));
        for (op, boundary, launches) in step.chain(inner) {
            if !put(*op, boundary, launches) {
                return None;
            }
        }
        // Z_p = [p ≥ the last RS block + γ] in the unit's group, 1 in every other.
        for order in &u.orders {
            let rs = u.set(SetKey {
                op: Op::ReduceScatter,
                boundary: Boundary::Step,
                group: order.group,
                secondary: None,
                replica_reduce: None,
            })?;
            let last_rs = (0..rs.x.len())
                .rev()
                .find(|&k| values[rs.x[k].index] > 0.0)
                .map(|k| rs.positions[k]);
            for (p, z) in order.z.iter().enumerate() {
                let on = last_rs.is_none_or(|b| p >= b + order.gap);
                values[z.index] = f64::from(u8::from(on));
            }
        }
    }
    let interference = Interference::of(profile);
    for (t, d) in parts.terms.iter().zip(parts.durations) {
        values[d.index] = t.duration(interference, &values);
    }
    if let Some((peak, scale)) = parts.peak {
        // A hair above the schedule's peak, so that rounding does not cut the start off.
        let highest = simulate_strict(profile, schedule).peak_memory_bytes;
        values[peak.index] = highest / scale * (1.0 + 1e-12);
    }
    Some(values)
}

/// The schedule a solution describes: each unit's configuration, recompute flag and launches.
fn schedule_from(profile: &Profile, units: &[UnitCols], values: &[f64]) -> Result<Schedule> {
    let on = |col: crate::ilp::variables::Col| values[col.index] > 0.5;
    let units = units
        .iter()
        .map(|u| {
            let config: Config = u
                .configs
                .iter()
                .find(|&&(_, col)| on(col))
                .map(|&(c, _)| c)
                .expect("one configuration per unit");
            let placed = |op: Op, boundary: Boundary| {
                u.set_of(config, model_op(op), boundary)
                    .map(|l| launches_of(l.window, &l.positions, &l.x, values))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|k| Launch {
                        blocks: k.blocks * u.blocks_per_launch,
                        ..k
                    })
                    .collect::<Vec<_>>()
            };
            let launches: BTreeMap<Op, Vec<Launch>> = config
                .level
                .ops()
                .iter()
                .map(|&op| (op, placed(op, Boundary::Step)))
                .collect();
            let mut accumulation = Accumulation {
                accumulate: config.accumulate,
                keep: config.keep && config.level != Level::None,
                replica_reduce: config.replica_reduce,
                ..Accumulation::default()
            };
            accumulation.inner = accumulation
                .inner_ops(config.level)
                .into_iter()
                .map(|op| (op, placed(op, Boundary::Inner)))
                .collect();
            UnitSchedule {
                level: config.level,
                recompute: u.recompute.is_some_and(on),
                launches,
                accumulation,
                shard_group: config.group,
                secondary_group: config.secondary,
            }
        })
        .collect();
    Schedule::new(profile, units)
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

/// The MIP's op for a schedule's: AG and AGF share the forward gather's columns.
fn model_op(op: Op) -> Op {
    match op {
        Op::GatherForward => Op::Gather,
        op => op,
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
