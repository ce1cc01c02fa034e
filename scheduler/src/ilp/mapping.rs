//! Between schedules and column values: a schedule as a warm start, a solution as a schedule,
//! and the ILP's own evaluation of an integer solution (for the consistency check).

use super::variables::{Choice, Col, OpVars, UnitLevel, UnitVars};
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

/// The ILP op that carries a schedule op of a unit at `choice` (None for RA, which follows its
/// RS block and has no columns of its own).
fn op_vars(u: &UnitVars, op: Op, choice: Choice) -> Option<&OpVars> {
    let group = choice.group().map(|g| &u.groups[g]);
    match (op, choice) {
        (Op::AllReduce, _) => u.ar.as_ref(),
        (Op::ReduceScatter, _) => Some(&group?.rs),
        (Op::Gather | Op::GatherForward, _) => Some(&group?.fg),
        (Op::GatherBackward, Choice::Hpz(_)) => u.bgh.as_ref(),
        (Op::GatherBackward, _) => group?.bg.as_ref(),
        (Op::ReplicaAllReduce, _) => None,
    }
}

/// The ILP's choice of a schedule's unit, where the model has it (its shard group among the
/// unit's groups, its secondary group the one on offer).
fn choice_of(u: &UnitVars, s: &UnitSchedule) -> Option<Choice> {
    let g = u.groups.iter().position(|g| g.shard == s.shard_group)?;
    Some(match (s.level, s.secondary_group) {
        (Level::None, _) => Choice::None,
        (Level::Sdp, _) => Choice::Sdp(g),
        (Level::Fsdp, None) => Choice::Fsdp(g),
        (Level::Fsdp, Some(h)) if u.groups[g].secondary == Some(h) => Choice::Hpz(g),
        (Level::Fsdp, Some(_)) => return None,
    })
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
        let choice = choice_of(u, s)?;
        values[u.column(choice)?.index] = 1.0;
        if let Some(c) = choice.group().and_then(|g| u.groups[g].communicator) {
            values[c.index] = 1.0;
        }
        if let (Choice::Hpz(_), Some(c)) = (choice, u.secondary_communicator) {
            values[c.index] = 1.0;
        }
        if s.recompute {
            values[u.recompute?.index] = 1.0;
        }
        for (op, launches) in schedule
            .ops(i)
            .filter(|(op, _)| *op != Op::ReplicaAllReduce)
        {
            let vars = op_vars(u, op, choice)?;
            for l in launches {
                let k = vars.positions.iter().position(|&p| p == l.position)?;
                if l.blocks % vars.blocks_per_launch != 0 {
                    return None;
                }
                values[vars.launches[k].index] += f64::from(l.blocks / vars.blocks_per_launch);
            }
            let mut running = 0.0;
            for (x, c) in vars.launches.iter().zip(&vars.cumulative) {
                running += values[x.index];
                values[c.index] = running;
            }
        }
        // Boundary: the last reduction position plus the group's gap (for a replicated unit,
        // past every candidate); every other group's boundary at its end.
        for (g, group) in u.groups.iter().enumerate() {
            let boundary = schedule
                .span(i, Op::ReduceScatter)
                .filter(|_| choice.group() == Some(g))
                .map_or(usize::MAX, |(_, last)| last + group.gap);
            for &(k, z) in &group.boundary {
                values[z.index] = if boundary <= k { 1.0 } else { 0.0 };
            }
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
    let units = levels_from_values(units, values)
        .into_iter()
        .zip(units)
        .map(|(UnitLevel { choice, recompute }, u)| {
            let level = choice.level();
            let group = choice.group().map(|g| &u.groups[g]);
            let secondary_group = group
                .and_then(|g| g.secondary)
                .filter(|_| matches!(choice, Choice::Hpz(_)));
            let launches = level
                .ops()
                .iter()
                .map(|&op| {
                    let vars = op_vars(u, op, choice).expect("the level's ops have variables");
                    let mut launches =
                        launches_of(vars.window, &vars.positions, &vars.launches, values);
                    for l in &mut launches {
                        l.blocks *= vars.blocks_per_launch;
                    }
                    (op, launches)
                })
                .collect::<BTreeMap<_, _>>();
            UnitSchedule {
                level,
                recompute,
                launches,
                accumulation: Default::default(),
                shard_group: group.and_then(|g| g.shard),
                secondary_group,
            }
        })
        .collect();
    Schedule::new(profile, units)
}

/// Each unit's level and recompute in a solution's column values (binaries rounded).
pub(super) fn levels_from_values(units: &[UnitVars], values: &[f64]) -> Vec<UnitLevel> {
    let on = |c: Option<Col>| c.is_some_and(|c| values[c.index] > 0.5);
    units
        .iter()
        .map(|u| UnitLevel {
            choice: u
                .choices()
                .into_iter()
                .find(|&(_, column)| on(column))
                .map_or(Choice::Sdp(0), |(choice, _)| choice),
            recompute: on(u.recompute),
        })
        .collect()
}

/// Per slot (c_s, max_ℓ Q^ℓ_s, L_s) of an integer solution, from the ILP's own coefficients: the
/// busiest link's communication sets the slot's duration (DESIGN §3.11).
pub(super) fn slot_terms(
    profile: &Profile,
    units: &[UnitVars],
    values: &[f64],
) -> Vec<(f64, f64, f64)> {
    let timeline = Timeline::new(units.len());
    let recompute = |u: usize| units[u].recompute.is_some_and(|r| values[r.index] > 0.5);
    let slots = timeline.slot_count();
    let mut per_link = vec![[0.0; 2]; slots];
    let mut load = vec![0.0; slots];
    for op in units.iter().flat_map(UnitVars::ops) {
        for (&pos, x) in op.positions.iter().zip(&op.launches) {
            let blocks = values[x.index].round();
            for (offset, link, time, compute) in op.parts() {
                let slot = (op.window.slot_at(pos) + offset) % slots;
                per_link[slot][link.index()] += time * blocks;
                load[slot] += compute * blocks;
            }
        }
    }
    (0..slots)
        .map(|s| {
            let busiest = per_link[s].into_iter().fold(0.0, f64::max);
            (
                compute_us(profile, timeline, s, recompute),
                busiest,
                load[s],
            )
        })
        .collect()
}

/// T = Σ_s max(c_s + L_s, max_ℓ Q^ℓ_s + κ_q·c_s): the objective of an integer solution with tight
/// durations.
pub(super) fn tight_time(terms: &[(f64, f64, f64)], interference: Interference) -> f64 {
    terms
        .iter()
        .map(|&(c, q, l)| interference.slot_duration(c, q, l))
        .sum()
}
