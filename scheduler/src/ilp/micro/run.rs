//! One HiGHS run of the micro-batch MIP (DESIGN §4.8): the model of a space (its window limits,
//! the positions column generation added, the configurations a placement holds) built,
//! warm-started from the first plan of a list it can express, limited to its share of the effort
//! and the outer clock, its plan read back and checked against the simulator (at K' = 3 and 4,
//! extended to K: `classes`).

use super::columns::{Boundary, Communicator, Config, SetKey, UnitCols};
use super::model::{Added, Built, SlotTerms, Space, build};
use crate::classes::simulate_strict;
use crate::cost::Interference;
use crate::ilp::callback::solve_metered;
use crate::ilp::effort::Clock;
use crate::ilp::mapping::launches_of;
use crate::ilp::model::{highs_model, memory_scale};
use crate::ilp::run::{Run, Stop, spent};
use crate::ilp::space::fsdp2_peak;
use crate::ilp::variables::{Col, ExtraPositions};
use crate::ilp::{Objective, PhaseReport, SolveOptions, SolveStatus};
use crate::profile::Profile;
use crate::schedule::{Accumulation, Launch, Schedule, UnitSchedule};
use crate::sim::Simulation;
use crate::target::Target;
use crate::timeline::{Level, Op};
use crate::{Error, Result};
use good_lp::constraint;
use highs::HighsModelStatus;
use std::collections::BTreeMap;
use std::time::Instant;

/// Relative agreement required between the MIP's step time and the simulator's.
const CONSISTENCY: f64 = 1e-6;

/// The size of a run's model.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size {
    pub variables: usize,
    pub integer_variables: usize,
    pub constraints: usize,
}

/// What one run of the MIP returned.
pub(super) struct MipRun {
    /// Its best plan, checked, and that plan's strict simulation.
    pub found: Option<(Schedule, Simulation)>,
    pub status: HighsModelStatus,
    /// HiGHS' dual bound, in the objective's units (−∞ where it has none).
    pub dual_bound: f64,
    /// The LP iterations it spent.
    pub work: u64,
    pub size: Size,
}

/// Runs the MIP over `space` for `work` LP iterations (HiGHS stops at its next check past
/// them), warm-started from the first of `warm` it can express.
pub(super) fn run_mip(
    profile: &Profile,
    options: &SolveOptions,
    (space, work): (Space, u64),
    warm: &[&Schedule],
    clock: &Clock,
) -> Result<MipRun> {
    let peak_scale = match options.objective {
        Objective::Time => None,
        Objective::Memory { .. } => Some(memory_scale(profile, options)),
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
    let size = Size {
        variables: columns.count,
        integer_variables: columns.integer,
        constraints: rows.len(),
    };
    let parts = Parts {
        units: &units,
        terms: &terms,
        durations: &durations,
        communicators: &communicators,
        peak,
        count: columns.count,
        target: space.target,
    };
    // The time limit holds for the whole solve: HiGHS gets what is left of it.
    let mut model = highs_model(
        columns.problem,
        objective,
        rows,
        options,
        clock.seconds_left(),
    )?;
    if let Some(values) = warm.iter().find_map(|s| values_of(profile, &parts, s)) {
        model
            .try_set_solution(Some(&values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    let solved =
        solve_metered(model, work).map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    if status == HighsModelStatus::ReachedTimeLimit {
        clock.record_stop();
    }
    let found = if solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible {
        let values = solved.get_solution().columns().to_vec();
        Some(checked(profile, &units, (&terms, &weights), &values)?)
    } else {
        None
    };
    let scale = peak.map_or(1.0, |(_, scale)| scale);
    let dual_bound = solved
        .double_info_value(c"mip_dual_bound")
        .unwrap_or(f64::NEG_INFINITY)
        * scale;
    Ok(MipRun {
        found,
        status,
        dual_bound,
        work: spent(&solved),
        size,
    })
}

/// One HiGHS run of the micro-batch MIP over FSDP2's space within `options.limits`
/// ([`run_mip`]), warm-started from the first of `warm` it can express, stopped as
/// `stop` says; its plan checked against the simulator. The objective is the step time, or FSDP2's
/// peak (the memory rows hold FSDP2's copies) under the iteration-time ceiling.
pub(in crate::ilp) fn run_fsdp2(
    profile: &Profile,
    options: &SolveOptions,
    warm: &[(Schedule, f64)],
    stop: Stop,
) -> Result<Run> {
    let started = Instant::now();
    let added = Added::new();
    let space = Space::within(options.limits, &added, Target::Fsdp2);
    let warm: Vec<&Schedule> = warm.iter().map(|(schedule, _)| schedule).collect();
    let mip = run_mip(profile, options, (space, stop.work), &warm, stop.clock)?;
    let infeasible = matches!(
        mip.status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    );
    let schedule = mip.found.filter(|_| !infeasible);
    let objective = match (&schedule, options.objective) {
        (Some((_, simulation)), Objective::Time) => simulation.iteration_time_us,
        (Some((s, _)), Objective::Memory { .. }) => fsdp2_peak(profile, s).unwrap_or(f64::NAN),
        (None, _) => f64::NAN,
    };
    let bound = mip.dual_bound;
    let gap = if objective.is_finite() && bound.is_finite() {
        ((objective - bound) / objective.abs().max(1e-12)).max(0.0)
    } else {
        f64::INFINITY
    };
    let phase = PhaseReport {
        window_depth: options.limits,
        relaxation: None,
        status: match mip.status {
            HighsModelStatus::Optimal => SolveStatus::Optimal,
            HighsModelStatus::ReachedTimeLimit => SolveStatus::TimeLimit,
            // Its share of the effort spent.
            _ => SolveStatus::GapLimit,
        },
        objective,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: mip.work,
        variables: mip.size.variables,
        integer_variables: mip.size.integer_variables,
        constraints: mip.size.constraints,
    };
    Ok(Run {
        schedule: schedule.map(|(s, _)| s),
        levels: None,
        bands_used: ExtraPositions::new(),
        phase,
        infeasible,
        work: mip.work,
    })
}

/// The schedule of a solution and its strict simulation, once the MIP's step time at the
/// solution (Σ weight·max(c + L, Q + κ_q·c) over its slots) agrees with the simulator's.
pub(super) fn checked(
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

/// What a warm start's values are made of.
pub(super) struct Parts<'a> {
    pub units: &'a [UnitCols],
    pub terms: &'a [SlotTerms],
    pub durations: &'a [Col],
    pub communicators: &'a [Communicator],
    /// The memory objective's peak column and its scale.
    pub peak: Option<(Col, f64)>,
    pub count: usize,
    /// Whose peak the peak column holds: the strict simulation's, or FSDP2's.
    pub target: Target,
}

/// The configuration a unit of a schedule takes.
pub(super) fn config_of(unit: &UnitSchedule) -> Config {
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

/// The column values of `schedule`: its configurations, recompute flags, launches and their
/// running sums, each group's step RS→FG boundary after its last reduction block, the
/// communicators in use and each slot's duration at its terms; None for a schedule the MIP
/// cannot express (over a group of ranks it does not offer, or launching outside its limits).
pub(super) fn values_of(profile: &Profile, parts: &Parts, schedule: &Schedule) -> Option<Vec<f64>> {
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
        // A hair above the schedule's peak (FSDP2's under its target; None where the schedule
        // does not export exactly), so that rounding does not cut the start off.
        let highest = match parts.target {
            Target::Runtime => simulate_strict(profile, schedule).peak_memory_bytes,
            Target::Fsdp2 => fsdp2_peak(profile, schedule)?,
        };
        values[peak.index] = highest / scale * (1.0 + 1e-12);
    }
    Some(values)
}

/// The schedule a solution describes: each unit's configuration, recompute flag and launches.
fn schedule_from(profile: &Profile, units: &[UnitCols], values: &[f64]) -> Result<Schedule> {
    let on = |col: Col| values[col.index] > 0.5;
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

/// The MIP's op for a schedule's: AG and AGF share the forward gather's columns.
fn model_op(op: Op) -> Op {
    match op {
        Op::GatherForward => Op::Gather,
        op => op,
    }
}
