//! The measuring profiler, for any backend (`timing`), and the MLP's profile.
//!
//! A unit's bytes in the profile are exactly the runtime's buffers (fp32): activations = its
//! output (the first unit also keeps the input batch, the last the targets), with recompute the
//! same (a Linear+ReLU unit has nothing inside to drop); forward workspace 0 (the output is the
//! activation); backward workspace = the gradient of its output plus, past the first unit, the
//! gradient of its input. p = g = 4, o = 8 (Adam m and v; the fp32 parameters are the master
//! copy).

mod timing;

pub use timing::{
    measurement_allocation, mlp_compute_round, time_collectives, time_overlap_slowdown, time_units,
};

use crate::Result;
use crate::mlp::MlpSpec;
use shardplan_scheduler::profile::{
    BytesPerParam, CommCurves, PROFILE_SCHEMA, Profile, UnitProfile,
};
use std::collections::BTreeMap;

/// Measured (forward, backward) µs of each unit.
pub type UnitTimes = Vec<(f64, f64)>;

/// The profile of `spec` on `world` ranks from unit times and collective curves.
pub fn mlp_profile(
    spec: &MlpSpec,
    world: u32,
    times: &UnitTimes,
    comm: CommCurves,
    block_size_bytes: Option<u64>,
    source: BTreeMap<String, String>,
) -> Result<Profile> {
    let b = spec.batch_per_rank as u64;
    let l = spec.units();
    let units = (0..l)
        .map(|i| {
            let (din, dout) = spec.dims(i);
            let (din, dout) = (din as u64, dout as u64);
            let activation =
                4 * b * (dout + if i == 0 { din } else { 0 } + if i + 1 == l { dout } else { 0 });
            UnitProfile {
                name: spec.unit_name(i),
                params: spec.params(i) as u64,
                forward_us: times[i].0,
                backward_us: times[i].1,
                activation_bytes: activation,
                checkpoint_activation_bytes: activation,
                forward_workspace_bytes: 0,
                backward_workspace_bytes: 4 * b * (dout + if i > 0 { din } else { 0 }),
            }
        })
        .collect();
    let block = block_size_bytes.unwrap_or_else(|| comm.block_size());
    let profile = Profile {
        schema: PROFILE_SCHEMA,
        name: format!("{} x{world}", spec.name),
        source,
        world_size: world,
        block_size_bytes: block,
        overlap_slowdown: 0.0,
        iteration_extra_us: 0.0,
        bytes_per_param: BytesPerParam {
            param: 4,
            grad: 4,
            optimizer: 8,
        },
        units,
        comm,
    };
    profile.validate("measured profile")?;
    Ok(profile)
}

pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Message sizes of the measured curves: 4 KiB … `max_bytes`, powers of two.
pub(crate) fn sizes(max_bytes: u64) -> Vec<u64> {
    (12..=40)
        .map(|e| 1u64 << e)
        .take_while(|&s| s <= max_bytes)
        .collect()
}
