//! Timings through the [`Backend`] trait, between marks, so the same code times host kernels on
//! the CPU and device work on a GPU (CUDA events). Every function lays its buffers out from offset
//! 0 of the arena [`measurement_allocation`] sized.

use super::{UnitTimes, median, sizes};
use crate::backend::{Allocation, Backend, Region, Stream};
use crate::mlp::MlpSpec;
use crate::{Error, Result};

/// One unit's buffers, packed from offset 0.
struct UnitRegions {
    x: Region,
    params: Region,
    out: Region,
    grad_out: Region,
    grads: Region,
    grad_in: Region,
    end: usize,
}

fn unit_regions(spec: &MlpSpec, i: usize, start: usize) -> UnitRegions {
    let rows = spec.batch_per_rank;
    let (din, dout) = spec.dims(i);
    let mut next = start;
    let mut take = |len: usize| {
        let r = Region { offset: next, len };
        next += len.div_ceil(16) * 16;
        r
    };
    let (x, params, out) = (take(rows * din), take(spec.params(i)), take(rows * dout));
    let (grad_out, grads, grad_in) = (take(rows * dout), take(spec.params(i)), take(rows * din));
    UnitRegions {
        x,
        params,
        out,
        grad_out,
        grads,
        grad_in,
        end: next,
    }
}

/// Elements of the largest message of the curves, rounded to a multiple of the world size.
fn message_elements(bytes: u64, world: usize) -> usize {
    ((bytes / 4) as usize).max(1).div_ceil(world) * world
}

/// The arena the measurements need: the largest unit's buffers (when timing an MLP) followed by
/// two messages of `max_bytes` (full and shard, or the κ AllReduce); and where the messages start.
pub fn measurement_allocation(
    spec: Option<&MlpSpec>,
    world: usize,
    max_bytes: u64,
) -> (Allocation, usize) {
    let units = spec.map_or(0, |s| {
        (0..s.units())
            .map(|i| unit_regions(s, i, 0).end)
            .max()
            .unwrap_or(0)
    });
    let message = message_elements(max_bytes, world);
    let allocation = Allocation {
        arena_elements: units + 2 * message + 16,
        largest_block: message,
        loss_slots: 0,
    };
    (allocation, units)
}

/// Forward and backward µs of each unit: 3 warm-up runs, the median of `repeats`. The first
/// unit's forward includes making and uploading the batch, as in a run.
pub fn time_units<B: Backend>(backend: &B, spec: &MlpSpec, repeats: usize) -> Result<UnitTimes> {
    let rows = spec.batch_per_rank;
    let teacher = spec.teacher();
    let mut batch_x = vec![0.0; rows * spec.input];
    let mut batch_y = vec![0.0; rows * spec.widths.last().expect("validated")];
    let stream = Stream::Compute;
    (0..spec.units())
        .map(|i| {
            let (din, dout) = spec.dims(i);
            let r = unit_regions(spec, i, 0);
            backend.upload(r.params, &spec.initial_params(i, spec.params(i)))?;
            let x: Vec<f32> = (0..rows * din)
                .map(|k| ((k % 17) as f32 - 8.0) / 8.0)
                .collect();
            backend.upload(r.x, &x)?;
            backend.upload(r.grad_out, &vec![0.5; rows * dout])?;
            let mut marks = Vec::with_capacity(repeats + 3);
            for k in 0..repeats + 3 {
                let start = backend.mark(stream)?;
                if i == 0 {
                    spec.batch(k, 0, rows, &teacher, &mut batch_x, &mut batch_y);
                    backend.upload(r.x, &batch_x)?;
                }
                backend.linear_forward(r.x, r.params, r.out, rows, (din, dout), spec.relu(i))?;
                let middle = backend.mark(stream)?;
                backend.linear_backward(
                    r.x,
                    r.params,
                    r.out,
                    r.grad_out,
                    r.grads,
                    (i > 0).then_some(r.grad_in),
                    rows,
                    (din, dout),
                    spec.relu(i),
                )?;
                marks.push((start, middle, backend.mark(stream)?));
            }
            backend.synchronize()?;
            let mut forward = Vec::with_capacity(repeats);
            let mut backward = Vec::with_capacity(repeats);
            for (start, middle, end) in marks.iter().skip(3) {
                forward.push(backend.elapsed_us(start, middle)?);
                backward.push(backend.elapsed_us(middle, end)?);
            }
            Ok((median(forward), median(backward)))
        })
        .collect()
}

/// Times each collective across message sizes 4 KiB … `max_bytes` (bytes = the full message, as
/// nccl-tests' size) on the communication stream: 2 warm-up runs, then the median of `repeats`.
/// Every rank must call it; one rank cannot measure collectives.
pub fn time_collectives<B: Backend>(
    backend: &B,
    start: usize,
    max_bytes: u64,
    repeats: usize,
) -> Result<shardplan_scheduler::profile::CommCurves> {
    use shardplan_scheduler::curve::CommCurve;
    let n = backend.world_size();
    if n < 2 {
        return Err(Error::Mismatch(
            "collectives cannot be measured on one rank: run under mpirun -np N with N >= 2, or \
             give --device to take the hardware catalog's curves"
                .into(),
        ));
    }
    let stream = Stream::Communication;
    let mut curves: [Vec<(u64, f64)>; 3] = Default::default();
    for bytes in sizes(max_bytes) {
        let elements = message_elements(bytes, n);
        let full = Region {
            offset: start,
            len: elements,
        };
        let shard = Region {
            offset: start + elements.div_ceil(16) * 16,
            len: elements / n,
        };
        for (op, curve) in curves.iter_mut().enumerate() {
            let mut marks = Vec::with_capacity(repeats + 2);
            for _ in 0..repeats + 2 {
                let before = backend.mark(stream)?;
                match op {
                    0 => backend.all_gather(shard, full)?,
                    1 => backend.reduce_scatter(full, shard)?,
                    _ => backend.all_reduce(full)?,
                }
                marks.push((before, backend.mark(stream)?));
            }
            backend.synchronize()?;
            let samples = marks
                .iter()
                .skip(2)
                .map(|(a, b)| backend.elapsed_us(a, b))
                .collect::<Result<Vec<f64>>>()?;
            curve.push((4 * elements as u64, median(samples).max(1e-3)));
        }
    }
    let [ag, rs, ar] = curves;
    Ok(shardplan_scheduler::profile::CommCurves {
        all_gather: CommCurve { points: ag },
        reduce_scatter: CommCurve { points: rs },
        all_reduce: CommCurve { points: ar },
    })
}

/// One compute round of an MLP: every unit's forward and backward, as in a step.
pub fn mlp_compute_round<B: Backend>(backend: &B, spec: &MlpSpec) -> Result<()> {
    let rows = spec.batch_per_rank;
    for i in 0..spec.units() {
        let r = unit_regions(spec, i, 0);
        let (dims, relu) = (spec.dims(i), spec.relu(i));
        backend.linear_forward(r.x, r.params, r.out, rows, dims, relu)?;
        let grad_in = Some(r.grad_in);
        backend.linear_backward(
            r.x, r.params, r.out, r.grad_out, r.grads, grad_in, rows, dims, relu,
        )?;
    }
    Ok(())
}

/// κ: the share of compute time lost while collectives run beside it. A compute round
/// (`compute_round` enqueues it on the compute stream, touching no byte of the message) is timed
/// alone; then `rounds` AllReduces of `bytes` start on the communication stream together with as
/// many compute rounds as cover their duration alone; κ = (t_with − t_alone)/t_with per round,
/// clamped to [0, 1]. Every rank must call it (all run the same AllReduces).
pub fn time_overlap_slowdown<B: Backend>(
    backend: &B,
    compute_round: &dyn Fn() -> Result<()>,
    start: usize,
    bytes: u64,
    rounds: usize,
) -> Result<f64> {
    let timed = |stream: Stream, work: &dyn Fn() -> Result<()>| -> Result<f64> {
        let before = backend.mark(stream)?;
        work()?;
        let after = backend.mark(stream)?;
        backend.synchronize()?;
        backend.elapsed_us(&before, &after)
    };
    let message = Region {
        offset: start,
        len: message_elements(bytes, backend.world_size()),
    };
    let reductions = || -> Result<()> {
        for _ in 0..rounds {
            backend.all_reduce(message)?;
        }
        Ok(())
    };
    compute_round()?;
    let alone = timed(Stream::Compute, &|| {
        (0..10).try_for_each(|_| compute_round())
    })? / 10.0;
    let comm_alone = timed(Stream::Communication, &reductions)?;
    let overlapped_rounds = ((comm_alone / alone.max(1e-3)).ceil() as usize).clamp(1, 100_000);
    let go = backend.mark(Stream::Compute)?;
    backend.wait_mark(Stream::Communication, &go)?;
    let with = std::thread::scope(|scope| -> Result<f64> {
        let comm = scope.spawn(reductions);
        let with = timed(Stream::Compute, &|| {
            (0..overlapped_rounds).try_for_each(|_| compute_round())
        });
        comm.join()
            .map_err(|_| Error::Backend("the communication thread panicked".into()))??;
        with
    })? / overlapped_rounds as f64;
    Ok(((with - alone) / with).clamp(0.0, 1.0))
}
