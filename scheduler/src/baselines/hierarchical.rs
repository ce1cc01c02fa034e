//! The hierarchical baselines (DESIGN §3.11, §3.11.1): FSDP2's HSDP over a shard group of whole
//! nodes and hpZ's node-local secondary shard, each at any number of micro-batches with the
//! gradient-sync and all-reduce switches its kind sets.

use super::{BaselineKind, Groups, fsdp2_over};
use crate::groups::{secondary_group, shard_groups};
use crate::profile::Profile;
use crate::schedule::{Recompute, Schedule};
use crate::size::format_bytes;
use crate::{Error, Result};

/// hpz (or hpz-nosync, `kind`): fsdp2's plan with every fsdp unit keeping a secondary shard of
/// the node's H ranks, accumulating as `kind` does with micro-batches; H and the schedule.
pub(super) fn hpz(
    profile: &Profile,
    kind: BaselineKind,
    checkpoint: Recompute,
) -> Result<(u32, Schedule)> {
    let h = secondary_group(profile).ok_or_else(|| {
        Error::Mismatch(format!(
            "{}: the profile offers no secondary group",
            kind.name()
        ))
    })?;
    let groups = Groups {
        secondary: Some(h),
        ..Groups::default()
    };
    Ok((
        h,
        fsdp2_over(profile, groups, checkpoint, &kind.accumulation())?,
    ))
}

/// FSDP2's HSDP (hsdp, or its micro-batch forms, `kind`): fsdp2's plan with every sharded unit
/// over the smallest shard group of whole nodes (S = m·G < N, m dividing the node count, with
/// curves in the profile) whose plan fits `cap` (without a cap, the node), accumulating and
/// all-reducing across replicas as `kind` does with micro-batches; the shard group and the
/// schedule.
pub(super) fn hsdp(
    profile: &Profile,
    kind: BaselineKind,
    checkpoint: Recompute,
    cap: Option<u64>,
) -> Result<(u32, Schedule)> {
    let candidates = shard_groups(profile);
    let mut smallest_peak = f64::INFINITY;
    for &s in &candidates {
        let groups = Groups {
            shard: Some(s),
            secondary: None,
            replica_reduce: kind.replica_reduce(),
        };
        let schedule = fsdp2_over(profile, groups, checkpoint, &kind.accumulation())?;
        let sim = crate::classes::simulate_strict(profile, &schedule);
        if cap.is_none_or(|c| sim.peak_memory_bytes <= c as f64) {
            return Ok((s, schedule));
        }
        smallest_peak = smallest_peak.min(sim.peak_memory_bytes);
    }
    Err(Error::Infeasible(format!(
        "{}: no shard group of whole nodes ({}) fits the memory cap of {}; the smallest peak is {}",
        kind.name(),
        candidates
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        format_bytes(cap.unwrap_or(0) as f64),
        format_bytes(smallest_peak)
    )))
}
