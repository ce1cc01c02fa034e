//! The cost model of DESIGN §3, shared by the simulator, the baselines and the ILP: bytes and
//! time of a block, compute time of a slot, persistent bytes of a unit.

use crate::profile::Profile;
use crate::timeline::{Level, Op, Timeline};

/// Bytes of one block of `op` for unit `unit`: Ψ_i·g/nb_i for reductions, Ψ_i·p/nb_i for gathers.
pub fn block_bytes(profile: &Profile, unit: usize, op: Op) -> f64 {
    let per_param = if op.is_reduction() {
        profile.bytes_per_param.grad
    } else {
        profile.bytes_per_param.param
    };
    (profile.units[unit].params * per_param) as f64 / f64::from(profile.blocks(unit))
}

/// t_op(bytes(b)) + upd_op: time of one block of `op` for unit `unit`. A reduction's blocks
/// also carry equal shares of the unit's optimizer step, which follows its last block on the
/// communication stream: upd = o_i/nb_i after an AllReduce (the whole unit), o_i/(N·nb_i) after
/// a ReduceScatter (the rank's shard); gathers carry none.
pub fn block_time_us(profile: &Profile, unit: usize, op: Op) -> f64 {
    let blocks = f64::from(profile.blocks(unit));
    let optimizer_us = profile.units[unit].optimizer_us;
    let (curve, update_us) = match op {
        Op::AllReduce => (&profile.comm.all_reduce, optimizer_us / blocks),
        Op::ReduceScatter => (
            &profile.comm.reduce_scatter,
            optimizer_us / (blocks * f64::from(profile.world_size)),
        ),
        Op::Gather | Op::GatherForward | Op::GatherBackward => (&profile.comm.all_gather, 0.0),
    };
    curve.time_us(block_bytes(profile, unit, op)) + update_us
}

/// c_s: f_i at F_i, b_i (+ f_i with recompute) at B_i, the extra time at E.
pub fn compute_us(
    profile: &Profile,
    timeline: Timeline,
    slot: usize,
    recompute: impl Fn(usize) -> bool,
) -> f64 {
    match timeline.compute_unit(slot) {
        None => profile.iteration_extra_us,
        Some(unit) if slot == timeline.forward(unit) => profile.units[unit].forward_us,
        Some(unit) => {
            let u = &profile.units[unit];
            u.backward_us + if recompute(unit) { u.forward_us } else { 0.0 }
        }
    }
}

/// persistent_i: Ψ_i(p+g+o), divided by N when sharded.
pub fn persistent_bytes(profile: &Profile, unit: usize, level: Level) -> f64 {
    let b = profile.bytes_per_param;
    let full = (profile.units[unit].params * (b.param + b.grad + b.optimizer)) as f64;
    match level {
        Level::None => full,
        Level::Sdp | Level::Fsdp => full / f64::from(profile.world_size),
    }
}
