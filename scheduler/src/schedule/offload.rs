//! A schedule's offload choices (DESIGN §3.13): where a unit's optimizer state, fp32 master and
//! gradients live (`Offload`), when the host steps (`HostStep`), the host memory they take, and
//! their checks against the profile and the units' other choices.

use super::UnitSchedule;
use crate::profile::Profile;
use crate::size::format_bytes;
use crate::timeline::{Level, Op, Timeline};
use serde::{Deserialize, Serialize};

/// Where a sharded unit's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// Everything on the device (§3.5).
    #[default]
    None,
    /// ZeRO-Offload: the optimizer state and fp32 master on the host, the step there; gradient
    /// shards copied to the host after the reduction, updated parameter shards back.
    Optimizer,
    /// FSDP2's `CPUOffloadPolicy`: the parameter shard on the host too, copied to the device
    /// before each gather.
    Full,
}

impl Offload {
    /// Whether the unit stays on the device (the default, which plan files leave out).
    pub fn is_none(&self) -> bool {
        *self == Offload::None
    }

    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::Full => "full",
        }
    }
}

/// When the host's optimizer steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostStep {
    /// Each unit's step as soon as its gradient is on the host (shardplan's own).
    #[default]
    Overlapped,
    /// Every step once every gradient is on the host; E ends when they and their copies are done
    /// (the frameworks' `optimizer.step()` after `backward()`).
    AfterBackward,
}

impl HostStep {
    /// Whether it is the default, which plan files leave out.
    pub fn is_overlapped(&self) -> bool {
        *self == HostStep::Overlapped
    }
}

/// S, the ranks a unit's state is sharded over: its shard group's, or the world's N (DESIGN
/// §3.11; an hpZ unit's secondary group does not change it).
pub fn shard_ranks(profile: &Profile, shard_group: Option<u32>) -> u32 {
    shard_group.unwrap_or(profile.world_size)
}

/// Ψ'_i·bytes/S: a rank's shard of unit `unit` at `bytes` per parameter, sharded over `ranks`.
pub(crate) fn shard_bytes(profile: &Profile, unit: usize, bytes: u64, ranks: u32) -> f64 {
    (profile.laid_out_params(unit) * bytes) as f64 / f64::from(ranks)
}

/// A rank's host bytes of unit `unit` under `mode`, sharded over `ranks` (S): Ψ'_i(g + o + m)/S
/// (`optimizer`, m the fp32 master o lacks at fp32 parameters: the host's Adam needs the
/// parameters it updates, DESIGN §6.12), Ψ'_i(p + g + o)/S (`full`), 0 (`none`).
pub fn host_bytes(profile: &Profile, unit: usize, mode: Offload, ranks: u32) -> f64 {
    let b = profile.bytes_per_param;
    let master_beside_o = if b.param == 4 { 4 } else { 0 };
    let bytes = match mode {
        Offload::None => return 0.0,
        Offload::Optimizer => b.grad + b.optimizer + master_beside_o,
        Offload::Full => b.param + b.grad + b.optimizer,
    };
    shard_bytes(profile, unit, bytes, ranks)
}

/// The host memory of one node: ranks_per_node · Σ_i host_i, each unit sharded over its group
/// (0 without a host).
pub fn host_node_bytes(profile: &Profile, units: &[UnitSchedule], modes: &[Offload]) -> f64 {
    let ranks = profile.host.as_ref().map_or(0, |h| h.ranks_per_node);
    let per_rank: f64 = (units.iter().zip(modes).enumerate())
        .map(|(unit, (u, &mode))| {
            host_bytes(profile, unit, mode, shard_ranks(profile, u.shard_group))
        })
        .sum();
    per_rank * f64::from(ranks)
}

/// Checks `modes` and `host_step` against the profile and the units' other choices (DESIGN
/// §3.13: sharded units at K = 1, over the world or a shard group, `full` without hpZ); the error is the field and what it expected.
pub fn check(
    profile: &Profile,
    units: &[UnitSchedule],
    modes: &[Offload],
    host_step: HostStep,
) -> Result<(), (String, String)> {
    let timeline = Timeline::new(profile.unit_count());
    for (unit, (u, &mode)) in units.iter().zip(modes).enumerate() {
        if mode.is_none() {
            continue;
        }
        let field = format!("units[{unit}].offload");
        let refuse = |why: String| Err((field.clone(), format!("none: {why}")));
        if profile.host.is_none() {
            return refuse(
                "the profile has no [host], so no host link to offload over (`profile analytic` \
                 writes one for a device whose catalog entry has a host)"
                    .into(),
            );
        }
        if u.level == Level::None {
            return refuse("a replicated unit (level none) has no shard to offload".into());
        }
        if profile.micro_batches >= 2 {
            return refuse(format!(
                "offload is modelled at one micro-batch per step, and the profile has \
                 micro_batches = {}",
                profile.micro_batches
            ));
        }
        if mode == Offload::Full && u.secondary_group.is_some() {
            return refuse(
                "`full` offload keeps no parameter shard on the device, and a secondary group \
                 (hpZ) gathers its backward from one: `optimizer` or no secondary_group"
                    .into(),
            );
        }
        if host_step == HostStep::AfterBackward {
            check_after_backward(profile, timeline, unit, u)?;
        }
    }
    let (needed, host) = (
        host_node_bytes(profile, units, modes),
        profile.host.as_ref(),
    );
    if let Some(host) = host
        && needed > host.memory_bytes as f64
    {
        return Err((
            "units".into(),
            format!(
                "offloaded state within the host's memory of {} per node (the profile's \
                 host.memory_bytes), got {} ({} ranks per node)",
                format_bytes(host.memory_bytes as f64),
                format_bytes(needed),
                host.ranks_per_node
            ),
        ));
    }
    Ok(())
}

/// Under `after-backward`, unit `unit`'s reduction launches by E and its forward gather at E or
/// in the next iteration's forward: steps run after the whole backward.
fn check_after_backward(
    profile: &Profile,
    timeline: Timeline,
    unit: usize,
    u: &UnitSchedule,
) -> Result<(), (String, String)> {
    let backward = timeline.backward(unit);
    let end = timeline.slot_count() - 1;
    for (&op, launches) in &u.launches {
        let late = launches.iter().any(|l| {
            let in_backward = l.slot > backward && l.slot < end;
            match op {
                Op::ReduceScatter => l.slot < backward,
                Op::Gather | Op::GatherForward => in_backward,
                _ => false,
            }
        });
        if late {
            return Err((
                format!("units[{unit}].{}", op.key()),
                format!(
                    "with host_step = \"after-backward\", {} of unit `{}` launched {}",
                    op.key(),
                    profile.units[unit].name,
                    if op == Op::ReduceScatter {
                        "by E (the steps follow the whole backward)"
                    } else {
                        "at E or in the next forward (after the steps)"
                    }
                ),
            ));
        }
    }
    Ok(())
}
