//! Offload (DESIGN §3.13): the device bytes and the times offload adds, shared by the simulator
//! and the baselines. The choices themselves (`Offload`, `HostStep`), their host bytes and their
//! checks belong to the schedule ([`crate::schedule::offload`]) and are re-exported here.

pub use crate::schedule::offload::{HostStep, Offload, host_bytes, host_node_bytes, shard_ranks};

use crate::cost::{Among, BlockTime, block_bytes, block_time, persistent_bytes_over};
use crate::profile::{Host, Profile};
use crate::schedule::UnitSchedule;
use crate::schedule::offload::shard_bytes;
use crate::timeline::Op;

/// persistent_i on the device under `mode`: §3.5's without offload, the parameter shard
/// Ψ'_i·p/S with `optimizer` (S the unit's shard ranks), nothing with `full`.
pub fn device_persistent_bytes(
    profile: &Profile,
    unit: usize,
    u: &UnitSchedule,
    mode: Offload,
) -> f64 {
    match mode {
        Offload::None => persistent_bytes_over(profile, unit, u.level, u.shard_group),
        Offload::Optimizer => shard_bytes(
            profile,
            unit,
            profile.bytes_per_param.param,
            shard_ranks(profile, u.shard_group),
        ),
        Offload::Full => 0.0,
    }
}

/// The reduced gradient shard Ψ'_i·g/S an offloaded unit sharded over `ranks` holds on the
/// device until its copy.
pub fn gradient_shard_bytes(profile: &Profile, unit: usize, ranks: u32) -> f64 {
    shard_bytes(profile, unit, profile.bytes_per_param.grad, ranks)
}

/// A `full` unit's shard of one gather block over `ranks`, copied to the device before the
/// gather: Ψ'_i·p/(nb_i·S).
pub fn gather_shard_bytes(profile: &Profile, unit: usize, ranks: u32) -> f64 {
    block_bytes(profile, unit, Op::Gather) / f64::from(ranks)
}

/// A block's time (§3.3) when its unit is under `mode`: an offloaded unit's reduction carries no
/// device optimizer share (its step is the host's).
pub fn offloaded_block_time(
    profile: &Profile,
    unit: usize,
    op: Op,
    among: Among,
    mode: Offload,
) -> BlockTime {
    let time = block_time(profile, unit, op, among);
    match mode {
        Offload::None => time,
        Offload::Optimizer | Offload::Full => BlockTime {
            update_us: 0.0,
            ..time
        },
    }
}

/// The host work of one offloaded unit per iteration, µs (DESIGN §3.13).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostWork {
    /// The gradient shard's device-to-host copy.
    pub d2h_us: f64,
    /// The host optimizer step over the rank's shard.
    pub step_us: f64,
    /// `optimizer`: the updated parameter shard's host-to-device copy after the step.
    pub h2d_after_step_us: Option<f64>,
    /// `full`: each gather block's host-to-device copy of its shard.
    pub h2d_per_gather_block_us: Option<f64>,
}

impl HostWork {
    /// The work of unit `unit` sharded over `ranks` (S) under `mode` on `host`; None when it is
    /// not offloaded.
    pub fn of(
        profile: &Profile,
        host: &Host,
        (unit, ranks): (usize, u32),
        mode: Offload,
    ) -> Option<HostWork> {
        let shard_params = profile.laid_out_params(unit) as f64 / f64::from(ranks);
        let param_shard = shard_bytes(profile, unit, profile.bytes_per_param.param, ranks);
        let h2d = |bytes: f64| host.host_to_device.time_us(bytes);
        let (after_step, per_block) = match mode {
            Offload::None => return None,
            Offload::Optimizer => (Some(h2d(param_shard)), None),
            Offload::Full => (None, Some(h2d(gather_shard_bytes(profile, unit, ranks)))),
        };
        Some(HostWork {
            d2h_us: host
                .device_to_host
                .time_us(gradient_shard_bytes(profile, unit, ranks)),
            step_us: shard_params * host.optimizer_us_per_param,
            h2d_after_step_us: after_step,
            h2d_per_gather_block_us: per_block,
        })
    }
}
