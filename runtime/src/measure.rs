//! The measuring profiler (CPU) and the MLP's profile.
//!
//! A unit's bytes in the profile are exactly the runtime's buffers (fp32): activations = its
//! output (the first unit also keeps the input batch, the last the targets), with recompute the
//! same (a Linear+ReLU unit has nothing inside to drop); forward workspace 0 (the output is the
//! activation); backward workspace = the gradient of its output plus, past the first unit, the
//! gradient of its input. p = g = 4, o = 8 (Adam m and v; the fp32 parameters are the master
//! copy).

use crate::backend::Collectives;
use crate::mlp::{self, MlpSpec};
use crate::{Error, Result};
use shardplan_scheduler::analytic::BLOCK_BANDWIDTH_FRACTION;
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::profile::{
    BytesPerParam, CommCurves, PROFILE_SCHEMA, Profile, UnitProfile,
};
use std::collections::BTreeMap;
use std::time::Instant;

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
    let block = block_size_bytes.unwrap_or_else(|| {
        [&comm.all_gather, &comm.reduce_scatter, &comm.all_reduce]
            .iter()
            .map(|c| c.block_size(BLOCK_BANDWIDTH_FRACTION))
            .max()
            .expect("three curves")
    });
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

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Forward and backward µs of each unit on this machine: 3 warm-up runs, the median of `repeats`.
/// The first unit's forward includes making the batch, as in a run.
pub fn time_units(spec: &MlpSpec, repeats: usize) -> UnitTimes {
    let rows = spec.batch_per_rank;
    let teacher = spec.teacher();
    let mut batch_x = vec![0.0; rows * spec.input];
    let mut batch_y = vec![0.0; rows * spec.widths.last().expect("validated")];
    (0..spec.units())
        .map(|i| {
            let (din, dout) = spec.dims(i);
            let params = spec.initial_params(i, spec.params(i));
            let x: Vec<f32> = (0..rows * din)
                .map(|k| ((k % 17) as f32 - 8.0) / 8.0)
                .collect();
            let mut out = vec![0.0; rows * dout];
            let mut grad_out = vec![0.5; rows * dout];
            let mut grads = vec![0.0; params.len()];
            let mut grad_in = vec![0.0; rows * din];
            let mut forward = Vec::with_capacity(repeats);
            let mut backward = Vec::with_capacity(repeats);
            for k in 0..repeats + 3 {
                let t = Instant::now();
                if i == 0 {
                    spec.batch(k, 0, rows, &teacher, &mut batch_x, &mut batch_y);
                }
                mlp::linear_forward(&x, &params, &mut out, rows, (din, dout), spec.relu(i));
                let f = t.elapsed().as_secs_f64() * 1e6;
                let t = Instant::now();
                mlp::linear_backward(
                    &x,
                    &params,
                    &out,
                    &mut grad_out,
                    &mut grads,
                    (i > 0).then_some(grad_in.as_mut_slice()),
                    rows,
                    (din, dout),
                    spec.relu(i),
                );
                let b = t.elapsed().as_secs_f64() * 1e6;
                if k >= 3 {
                    forward.push(f);
                    backward.push(b);
                }
            }
            (median(forward), median(backward))
        })
        .collect()
}

/// Message sizes of the measured curves: 4 KiB … `max_bytes`, powers of two.
fn sizes(max_bytes: u64) -> Vec<u64> {
    (12..=40)
        .map(|e| 1u64 << e)
        .take_while(|&s| s <= max_bytes)
        .collect()
}

/// Times each collective across message sizes (bytes = the full message, as nccl-tests' size):
/// 2 warm-up runs, then the median of `repeats`; every rank must call it.
pub fn time_collectives<C: Collectives>(
    c: &C,
    max_bytes: u64,
    repeats: usize,
) -> Result<CommCurves> {
    let n = c.size();
    if n < 2 {
        return Err(Error::Mismatch(
            "collectives cannot be measured on one rank; run under mpirun -np N with N >= 2".into(),
        ));
    }
    let mut curves: [Vec<(u64, f64)>; 3] = Default::default();
    for bytes in sizes(max_bytes) {
        let full = ((bytes / 4) as usize).div_ceil(n) * n;
        let mut big = vec![1.0f32; full];
        let mut other = vec![0.0f32; full];
        let mut shard = vec![1.0f32; full / n];
        let mut time = |op: usize| {
            let mut samples = Vec::with_capacity(repeats);
            for k in 0..repeats + 2 {
                let t = Instant::now();
                match op {
                    0 => c.all_gather(&shard, &mut big),
                    1 => c.reduce_scatter(&big, &mut shard),
                    _ => c.all_reduce(&big, &mut other),
                }
                if k >= 2 {
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            median(samples)
        };
        for (op, curve) in curves.iter_mut().enumerate() {
            curve.push((4 * full as u64, time(op).max(1e-3)));
        }
    }
    let [ag, rs, ar] = curves;
    Ok(CommCurves {
        all_gather: CommCurve { points: ag },
        reduce_scatter: CommCurve { points: rs },
        all_reduce: CommCurve { points: ar },
    })
}

/// κ: the share of compute time lost while collectives run beside it. A compute round (every
/// unit's forward and backward, as in a step) runs alone, then while a second thread runs
/// `rounds` AllReduces of `bytes` (the same count on every rank, so ranks stay matched);
/// κ = (t_with − t_alone)/t_with per round, clamped to [0, 1]. Every rank must call it.
pub fn time_overlap_slowdown<C: Collectives>(
    c: &C,
    spec: &MlpSpec,
    bytes: u64,
    rounds: usize,
) -> f64 {
    let rows = spec.batch_per_rank;
    let mut units: Vec<_> = (0..spec.units())
        .map(|i| {
            let (din, dout) = spec.dims(i);
            let params = spec.initial_params(i, spec.params(i));
            let grads = vec![0.0; params.len()];
            (
                params,
                grads,
                vec![0.5; rows * din],
                vec![0.0; rows * dout],
                vec![0.5; rows * dout],
                vec![0.0; rows * din],
                (din, dout),
            )
        })
        .collect();
    let mut compute_round = || {
        for (i, (p, g, x, out, grad_out, grad_in, dims)) in units.iter_mut().enumerate() {
            mlp::linear_forward(x, p, out, rows, *dims, spec.relu(i));
            mlp::linear_backward(
                x,
                p,
                out,
                grad_out,
                g,
                Some(grad_in),
                rows,
                *dims,
                spec.relu(i),
            );
        }
    };
    let alone = {
        let t = Instant::now();
        for _ in 0..10 {
            compute_round();
        }
        t.elapsed().as_secs_f64() / 10.0
    };
    let elements = ((bytes / 4) as usize).max(c.size());
    let send = vec![1.0f32; elements];
    let mut recv = vec![0.0f32; elements];
    let finished = std::sync::atomic::AtomicBool::new(false);
    let (rounds_done, busy) = std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..rounds {
                c.all_reduce(&send, &mut recv);
            }
            finished.store(true, std::sync::atomic::Ordering::Release);
        });
        let t = Instant::now();
        let mut done = 0usize;
        while !finished.load(std::sync::atomic::Ordering::Acquire) {
            compute_round();
            done += 1;
        }
        (done, t.elapsed().as_secs_f64())
    });
    if rounds_done == 0 {
        return 0.0;
    }
    let with = busy / rounds_done as f64;
    ((with - alone) / with).clamp(0.0, 1.0)
}
