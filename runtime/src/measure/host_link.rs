//! The profile's `[host]` measured on a backend that offloads (DESIGN §3.13, §6.12): the H2D and
//! D2H curves as copies between the host arena and the device arena, every rank copying at once
//! as a plan's ranks do, the mean over ranks of each size's median; the host's optimizer step per
//! parameter from the measured optimizer steps; the host's memory from the system.

use super::{median, sizes};
use crate::backend::{Backend, Region, Stream};
use crate::gpt2::kernels::{AdamW, Decay, adamw};
use crate::{Error, Result};
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::profile::{Host, Profile};
use std::time::Instant;

/// Where the copies go: device words from `device_start` on, host words from `host_start` on,
/// each room for `max_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct CopyRoom {
    pub device_start: usize,
    pub host_start: usize,
    pub max_bytes: u64,
}

impl CopyRoom {
    /// The host arena's words the copies need.
    pub fn host_elements(max_bytes: u64) -> usize {
        (max_bytes / 4) as usize
    }
}

/// `[host]` for `profile`'s ranks (one node: they share this host; the curves' `ranks_per_link`
/// is this job's ranks, which copied at once): the copy curves timed in `room`, `repeats` samples each after two warm-ups; the step per parameter the
/// measured optimizer steps take (the host's Adam is the same kernel on the same memory where the
/// backend's device is the host; on a GPU the host's AdamW timed on its own); the node's memory
/// from `/proc/meminfo`.
pub fn measure_host<B: Backend>(
    backend: &B,
    room: CopyRoom,
    repeats: usize,
    profile: &Profile,
) -> Result<Host> {
    let mut curves: [Vec<(u64, f64)>; 2] = Default::default();
    let stream = Stream::Communication;
    for bytes in sizes(room.max_bytes) {
        let len = (bytes / 4) as usize;
        let device = Region::f32(room.device_start, len);
        let host = Region::f32(room.host_start, len);
        for (direction, curve) in curves.iter_mut().enumerate() {
            let (from, to) = match direction {
                0 => (host, device),
                _ => (device, host),
            };
            let mut samples = Vec::with_capacity(repeats);
            for k in 0..repeats + 2 {
                let before = backend.mark(stream)?;
                let after = backend.copy_across(from, to, Some(&before))?;
                if k >= 2 {
                    samples.push(backend.elapsed_us(&before, &after)?);
                }
            }
            curve.push((bytes, median(samples).max(1e-3)));
        }
    }
    let mut sums: Vec<f32> = curves.iter().flatten().map(|&(_, t)| t as f32).collect();
    backend.all_reduce_host(&mut sums)?;
    let ranks = backend.world_size() as f64;
    for ((_, time), sum) in curves.iter_mut().flatten().zip(sums) {
        *time = (f64::from(sum) / ranks).max(1e-3);
    }
    let [host_to_device, device_to_host] = curves.map(|points| CommCurve { points });
    let optimizer_us_per_param = match backend.host_computes() {
        true => {
            let (step_us, params) = (profile.units.iter()).fold((0.0, 0.0), |(t, n), u| {
                (t + u.optimizer_us, n + u.params as f64)
            });
            step_us / params.max(1.0)
        }
        false => host_adamw_us_per_param(repeats),
    };
    // The profile's ranks all run on this host, as the CPU backend runs them; the curves were
    // timed with this job's ranks copying at once.
    Ok(Host {
        ranks_per_node: profile.world_size,
        ranks_per_link: backend.world_size() as u32,
        memory_bytes: memory_total_bytes().ok_or_else(|| {
            Error::Backend("the host's memory: /proc/meminfo has no MemTotal".into())
        })?,
        optimizer_us_per_param,
        host_to_device,
        device_to_host,
    })
}

/// Parameters the host's step is timed on where the device is not the host.
const HOST_STEP_PARAMS: usize = 1 << 22;

/// µs per parameter of the host's AdamW (the kernel the host step of an offloaded unit runs,
/// `gpt2::kernels::adamw`) over [`HOST_STEP_PARAMS`] parameters on this thread: the median of
/// `repeats` steps after two warm-ups. For a backend whose optimizer steps run on a device, whose
/// measured steps say nothing of the host's.
fn host_adamw_us_per_param(repeats: usize) -> f64 {
    let hp = AdamW {
        learning_rate: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let n = HOST_STEP_PARAMS;
    let grads: Vec<f32> = (0..n).map(|k| (k % 97) as f32 * 1e-3 - 0.05).collect();
    let (mut params, mut m, mut v) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let samples = (0..repeats.max(1) + 2)
        .map(|k| {
            let start = Instant::now();
            adamw(
                &mut params,
                &grads,
                &mut m,
                &mut v,
                k as u32 + 1,
                &hp,
                Decay::Apply,
            );
            start.elapsed().as_secs_f64() * 1e6
        })
        .skip(2)
        .collect();
    median(samples) / n as f64
}

/// The system's memory (`MemTotal` of `/proc/meminfo`), where it says.
fn memory_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
