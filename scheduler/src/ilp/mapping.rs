//! Between schedules and column values: a schedule as a warm start, a solution as a schedule,
//! and the ILP's own evaluation of an integer solution (for the consistency check).

use super::variables::{Col, OpVars, UnitVars};
use crate::Result;
use crate::cost::{Interference, compute_us};
use crate::profile::Profile;
use crate::schedule::{Launch, Schedule, UnitSchedule};
use crate::timeline::{Level, Op, Timeline, Window};
use std::collections::BTreeMap;

/// The launches a solution's block columns describe: `columns[k]` blocks (rounded) at position
/// `positions[k]` of `window`, where any launch (the flat and the micro-batch models alike).
pub(super) fn launches_of(
    window: Window,
    positions: &[usize],
    columns: &[Col],
    values: &[f64],
) -> Vec<Launch> {
    positions
        .iter()
        .zip(columns)
        .filter_map(|(&pos, x)| {
            let blocks = values[x.index].round() as u32;
            (blocks > 0).then(|| Launch {
                slot: window.slot_at(pos),
                blocks,
            })
        })
        .collect()
}

/// The ILP op that carries a schedule op.
fn op_vars(u: &UnitVars, op: Op) -> Option<&OpVars> {
    match op {
        Op::AllReduce => u.ar.as_ref(),
        Op::ReduceScatter => Some(&u.rs),
        Op::Gather | Op::GatherForward => Some(&u.fg),
        Op::GatherBackward => u.bg.as_ref(),
    }
}

/// Column values of `schedule` (durations excluded; see [`slot_terms`]), or None when the
/// schedule uses a level or position the model does not have (a window limit, a pruned level).
pub(super) fn schedule_values(
    units: &[UnitVars],
    schedule: &Schedule,
    columns: usize,
) -> Option<Vec<f64>> {
    let mut values = vec![0.0; columns];
    for (i, (u, s)) in units.iter().zip(schedule.units()).enumerate() {
        let level = match s.level {
            Level::None => u.none?,
            Level::Sdp => u.sdp,
            Level::Fsdp => u.fsdp?,
        };
        values[level.index] = 1.0;
        if s.recompute {
            values[u.recompute?.index] = 1.0;
        }
        for (op, launches) in schedule.ops(i) {
            let vars = op_vars(u, op)?;
            for l in launches {
                let k = vars.positions.iter().position(|&p| p == l.position)?;
                values[vars.launches[k].index] += f64::from(l.blocks);
            }
            let mut running = 0.0;
            for (x, c) in vars.launches.iter().zip(&vars.cumulative) {
                running += values[x.index];
                values[c.index] = running;
            }
        }
        // Boundary: the last reduction position (for a replicated unit, the last candidate).
        let boundary = schedule
            .span(i, Op::ReduceScatter)
            .map_or(usize::MAX, |(_, last)| last);
        for &(k, z) in &u.boundary {
            values[z.index] = if boundary <= k { 1.0 } else { 0.0 };
        }
    }
    Some(values)
}

/// Reads the schedule out of a solution's column values (integers rounded); an error if the
/// values break a rule of the model (which the constraints exclude).
pub(super) fn schedule_from_values(
    profile: &Profile,
    units: &[UnitVars],
    values: &[f64],
) -> Result<Schedule> {
    let on = |c: Option<super::variables::Col>| c.is_some_and(|c| values[c.index] > 0.5);
    let units = units
        .iter()
        .map(|u| {
            let level = if on(u.none) {
                Level::None
            } else if on(u.fsdp) {
                Level::Fsdp
            } else {
                Level::Sdp
            };
            let launches = level
                .ops()
                .iter()
                .map(|&op| {
                    let vars = op_vars(u, op).expect("the level's ops have variables");
                    (
                        op,
                        launches_of(vars.window, &vars.positions, &vars.launches, values),
                    )
                })
                .collect::<BTreeMap<_, _>>();
            UnitSchedule {
                level,
                recompute: on(u.recompute),
                launches,
                accumulation: Default::default(),
            }
        })
        .collect();
    Schedule::new(profile, units)
}

/// Per slot (c_s, Q_s, L_s) of an integer solution, from the ILP's own coefficients.
pub(super) fn slot_terms(
    profile: &Profile,
    units: &[UnitVars],
    values: &[f64],
) -> Vec<(f64, f64, f64)> {
    let timeline = Timeline::new(units.len());
    let recompute = |u: usize| units[u].recompute.is_some_and(|r| values[r.index] > 0.5);
    let mut terms: Vec<(f64, f64, f64)> = (0..timeline.slot_count())
        .map(|s| (compute_us(profile, timeline, s, recompute), 0.0, 0.0))
        .collect();
    for op in units.iter().flat_map(UnitVars::ops) {
        for (&pos, x) in op.positions.iter().zip(&op.launches) {
            let blocks = values[x.index].round();
            let slot = &mut terms[op.window.slot_at(pos)];
            slot.1 += op.block_time_us * blocks;
            slot.2 += op.block_load_us * blocks;
        }
    }
    terms
}

/// T = Σ_s max(c_s + L_s, Q_s + κ_q·c_s): the objective of an integer solution with tight
/// durations.
pub(super) fn tight_time(terms: &[(f64, f64, f64)], interference: Interference) -> f64 {
    terms
        .iter()
        .map(|&(c, q, l)| interference.slot_duration(c, q, l))
        .sum()
}
