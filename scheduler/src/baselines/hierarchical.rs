//! The hierarchical baselines (DESIGN §3.11, §3.11.1): FSDP2's HSDP over a shard group of whole
//! nodes and hpZ's node-local secondary shard, each at any number of micro-batches with the
//! gradient-sync and all-reduce switches its kind sets.

use super::{Groups, depth_schedule, levels};
use crate::groups::{secondary_group, whole_node_groups};
use crate::profile::Profile;
use crate::schedule::{ReplicaReduce, Schedule};
use crate::size::format_bytes;
use crate::timeline::Level;
use crate::{Error, Result};

/// hpz: fsdp2's plan with every fsdp unit keeping a secondary shard of the node's H ranks, at
/// `(accumulate, keep)` with micro-batches; H and the schedule.
pub(super) fn hpz(
    profile: &Profile,
    checkpoint: bool,
    accumulation: (bool, bool),
) -> Result<(u32, Schedule)> {
    let h = secondary_group(profile)
        .ok_or_else(|| Error::Mismatch("hpz: the profile offers no secondary group".into()))?;
    let groups = Groups {
        secondary: Some(h),
        ..Groups::default()
    };
    let l = profile.unit_count();
    let schedule = depth_schedule(
        profile,
        (&levels(l, Level::Fsdp, true), groups),
        &vec![(1, 1); l],
        checkpoint,
        accumulation,
    )?;
    Ok((h, schedule))
}

/// FSDP2's HSDP: fsdp2's plan with every sharded unit over the smallest shard group of whole
/// nodes (S = G·2^j < N, with curves in the profile) whose plan fits `cap` (without a cap, the
/// node), at `(accumulate, keep)` and the replica AllReduce's `ReplicaReduce` with
/// micro-batches; the shard group and the schedule.
pub(super) fn hsdp(
    profile: &Profile,
    checkpoint: bool,
    cap: Option<u64>,
    (accumulation, replica_reduce): ((bool, bool), ReplicaReduce),
) -> Result<(u32, Schedule)> {
    let candidates = whole_node_groups(profile);
    let l = profile.unit_count();
    let mut smallest_peak = f64::INFINITY;
    for &s in &candidates {
        let groups = Groups {
            shard: Some(s),
            secondary: None,
            replica_reduce,
        };
        let schedule = depth_schedule(
            profile,
            (&levels(l, Level::Fsdp, true), groups),
            &vec![(1, 1); l],
            checkpoint,
            accumulation,
        )?;
        let sim = crate::classes::simulate_strict(profile, &schedule);
        if cap.is_none_or(|c| sim.peak_memory_bytes <= c as f64) {
            return Ok((s, schedule));
        }
        smallest_peak = smallest_peak.min(sim.peak_memory_bytes);
    }
    Err(Error::Infeasible(format!(
        "hsdp: no shard group of whole nodes ({}) fits the memory cap of {}; the smallest peak is {}",
        candidates
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        format_bytes(cap.unwrap_or(0) as f64),
        format_bytes(smallest_peak)
    )))
}
