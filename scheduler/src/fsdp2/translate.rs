//! FSDP2's settings as the simulator's schedule (DESIGN §3.12): every all-gather launches whole
//! at the start of the slot whose pre-hook issued it (a unit's forward prefetch list at its F
//! slot, its backward list or default prefetch at its B slot; the first unit's own forward
//! gather at E, or I between micro-batches, where the step's other work ends), every reduction
//! in the slot after the unit's backward (FSDP2 issues it in the post-backward hook) and an HSDP
//! unit's replica AllReduce one slot later (DESIGN §3.11). A gather that only the consumer's own
//! pre-hook issues runs exposed before its compute; the slot model has no such position, so such
//! settings are refused, naming the unit.

use super::hooks::{Pass, Walk};
use super::{Reshard, Sharding, UnitSettings};
use crate::profile::Profile;
use crate::schedule::{Accumulation, Launch, ReplicaReduce, Schedule, UnitSchedule};
use crate::timeline::{Level, Op, Timeline, WindowKind};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// The schedule of `units` whose hooks ran as `walk`.
pub fn schedule(profile: &Profile, units: &[UnitSettings], walk: &Walk) -> Result<Schedule> {
    let timeline = Timeline::new(units.len());
    let mut scheduled = Vec::with_capacity(units.len());
    for (v, u) in units.iter().enumerate() {
        let (level, shard_group, secondary_group) = match u.sharding {
            Sharding::Replicated => (Level::None, None, None),
            Sharding::Sharded {
                shard_group,
                reshard_after_forward,
            } => match reshard_after_forward {
                Reshard::Keep => (Level::Sdp, shard_group, None),
                Reshard::Free => (Level::Fsdp, shard_group, None),
                Reshard::ToSecondary(h) => (Level::Fsdp, shard_group, Some(h)),
            },
        };
        let mut launches = BTreeMap::new();
        for &op in level.ops() {
            let slot = match op {
                // An HSDP unit's replica AllReduce follows its reduce-scatter a slot later by
                // itself (DESIGN §3.11): it takes no launches.
                Op::AllReduce | Op::ReduceScatter | Op::ReplicaAllReduce => {
                    timeline.window(v, WindowKind::AfterBackward).slot_at(0)
                }
                Op::Gather | Op::GatherForward => forward_gather_slot(profile, walk, timeline, v)?,
                Op::GatherBackward => backward_gather_slot(profile, walk, timeline, v)?,
            };
            launches.insert(op, vec![whole(profile, v, slot)]);
        }
        let mut accumulation = Accumulation {
            accumulate: !u.requires_gradient_sync,
            keep: !u.reshard_after_backward,
            inner: BTreeMap::new(),
            replica_reduce: if u.requires_all_reduce {
                ReplicaReduce::Every
            } else {
                ReplicaReduce::Last
            },
        };
        if profile.micro_batches >= 2 {
            accumulation.inner = accumulation
                .inner_ops(level)
                .into_iter()
                .map(|op| (op, launches[&op].clone()))
                .collect();
        }
        scheduled.push(UnitSchedule {
            level,
            recompute: u.recompute,
            launches,
            accumulation,
            shard_group,
            secondary_group,
        });
    }
    Schedule::new(profile, scheduled)
}

fn whole(profile: &Profile, unit: usize, slot: usize) -> Launch {
    Launch {
        slot,
        blocks: profile.blocks(unit),
    }
}

/// The slot whose pre-forward issues `unit`'s gather in the first micro-batch.
fn forward_gather_slot(
    profile: &Profile,
    walk: &Walk,
    timeline: Timeline,
    unit: usize,
) -> Result<usize> {
    match walk.issuer(0, Pass::Forward, unit) {
        Some(b) if b.unit != unit => Ok(timeline.forward(b.computes)),
        _ if unit == 0 => Ok(timeline.end()),
        _ => Err(exposed(
            profile,
            unit,
            "forward",
            "forward_prefetch of a unit before it",
        )),
    }
}

/// The slot whose pre-backward issues `unit`'s backward gather.
fn backward_gather_slot(
    profile: &Profile,
    walk: &Walk,
    timeline: Timeline,
    unit: usize,
) -> Result<usize> {
    match walk.issuer(0, Pass::Backward, unit) {
        // A tied lender's pre-backward runs just before its borrower's compute: a gather it
        // issues for the borrower is as exposed as the borrower's own.
        Some(b) if b.unit != unit && b.computes != unit => Ok(timeline.backward(b.computes)),
        _ => Err(exposed(
            profile,
            unit,
            "backward",
            "backward_prefetch of a unit after it (or that unit's default prefetch, an empty list)",
        )),
    }
}

fn exposed(profile: &Profile, unit: usize, pass: &str, expected: &str) -> Error {
    let name = &profile.units[unit].name;
    Error::invalid(
        "FSDP2 settings",
        format!("{name}.{pass}_gather"),
        format!(
            "{name} in a {expected}: nothing else issues its {pass} all-gather, so FSDP2 issues it \
             at {name}'s own pre-{pass}, exposed, which the slot model cannot place"
        ),
    )
}
