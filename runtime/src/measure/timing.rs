//! Timings through the [`Backend`] trait, between marks, so the same code times host kernels on
//! the CPU and device work on a GPU (CUDA events). Every function lays its buffers out from offset
//! 0 of the arena [`measurement_allocation`] sized.

use super::{UnitTime, UnitTimes, median, sizes};
use crate::backend::{Allocation, Backend, Region, Stream};
use crate::layout::Layout;
use crate::workload::{Pass, Train};
use crate::{Error, Result};
use shardplan_scheduler::cost::Interference;

/// Elements of the largest message of the curves, rounded to a multiple of the world size.
fn message_elements(bytes: u64, world: usize) -> usize {
    ((bytes / 4) as usize).max(1).div_ceil(world) * world
}

/// The arena the measurements need: the compute layout's arena (`compute_elements`, 0 when only
/// collectives are timed) followed by two messages of `max_bytes` (full and shard, or the κ
/// AllReduce); and where the messages start.
pub fn measurement_allocation(
    compute_elements: usize,
    world: usize,
    max_bytes: u64,
) -> (Allocation, usize) {
    let start = compute_elements.div_ceil(16) * 16;
    let message = message_elements(max_bytes, world);
    let allocation = Allocation {
        arena_elements: start + 2 * message + 16,
        largest_block: message,
        loss_slots: 1,
    };
    (allocation, start)
}

/// One compute round in slot order on the compute stream: every unit's forward, then every
/// backward (data step 0), as a step runs them without communication. Returns the marks around
/// each unit's forward and backward.
fn compute_round_marks<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
) -> Result<Vec<[B::Mark; 2]>> {
    let stream = Stream::Compute;
    let l = workload.unit_count();
    let mut marks = Vec::with_capacity(2 * l);
    for i in 0..l {
        let start = backend.mark(stream)?;
        workload.forward(backend, layout, i, 0, Pass::Forward)?;
        marks.push([start, backend.mark(stream)?]);
    }
    for i in (0..l).rev() {
        let start = backend.mark(stream)?;
        workload.backward(backend, layout, i, 0)?;
        marks.push([start, backend.mark(stream)?]);
    }
    Ok(marks)
}

/// One compute round (every unit's forward and backward), for κ.
pub fn compute_round<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
) -> Result<()> {
    compute_round_marks(backend, workload, layout).map(|_| ())
}

/// Forward, backward and optimizer µs of each unit: 3 warm-up rounds, then the median of
/// `repeats`. The first unit's forward includes taking and uploading the batch, as in a run.
/// After each round every unit takes an optimizer step on the communication stream (with the
/// gradients the round left), as the executor does after a unit's last reduction; the streams
/// wait for each other in between, so no step is timed beside other work.
pub fn time_units<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    repeats: usize,
) -> Result<UnitTimes> {
    let l = workload.unit_count();
    let mut rounds = Vec::with_capacity(repeats);
    for k in 0..repeats + 3 {
        let mut marks = compute_round_marks(backend, workload, layout)?;
        let computed = backend.mark(Stream::Compute)?;
        backend.wait_mark(Stream::Communication, &computed)?;
        for i in 0..l {
            let start = backend.mark(Stream::Communication)?;
            workload.optimize(backend, layout, i, 1)?;
            marks.push([start, backend.mark(Stream::Communication)?]);
        }
        let updated = backend.mark(Stream::Communication)?;
        backend.wait_mark(Stream::Compute, &updated)?;
        if k >= 3 {
            rounds.push(marks);
        }
    }
    backend.synchronize()?;
    (0..l)
        .map(|i| {
            let time = |k: usize| -> Result<f64> {
                let samples = rounds
                    .iter()
                    .map(|m| backend.elapsed_us(&m[k][0], &m[k][1]))
                    .collect::<Result<Vec<f64>>>()?;
                Ok(median(samples))
            };
            Ok(UnitTime {
                forward_us: time(i)?,
                backward_us: time(2 * l - 1 - i)?,
                optimizer_us: time(2 * l + i)?,
            })
        })
        .collect()
}

/// Times each collective across message sizes 4 KiB … `max_bytes` (bytes = the full message, as
/// nccl-tests' size) on the communication stream: 2 warm-up runs, then the median of `repeats`.
/// Every rank must call it; on one rank the collectives are what that rank's backend makes of
/// them (copies).
pub fn time_collectives<B: Backend>(
    backend: &B,
    start: usize,
    max_bytes: u64,
    repeats: usize,
) -> Result<shardplan_scheduler::profile::CommCurves> {
    use shardplan_scheduler::curve::CommCurve;
    let n = backend.world_size();
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

/// The interference of compute and communication (DESIGN §3.4). A compute round
/// (`compute_round` enqueues it on the compute stream, touching no byte of the message) is timed
/// alone (t_alone), and `rounds` AllReduces of `bytes` alone (Q); then the AllReduces start
/// together with as many compute rounds as cover Q, each round taking t_with and the AllReduces
/// D. Both streams are busy throughout, so each progresses at a rate: compute r_c =
/// t_alone/t_with, communication r_q = Q/D. A slot with compute c and communication Q then lasts
/// max(c + κ_c·Q, Q + κ_q·c) with κ_c = (1 − r_c)/r_q and κ_q = (1 − r_q)/r_c (whichever stream
/// finishes first, the other runs on alone at full rate). The form holds while r_c + r_q ≥ 1,
/// i.e. both factors ≤ 1; they are clamped to [0, 1]. Every rank must call it (all run the same
/// AllReduces).
pub fn time_interference<B: Backend>(
    backend: &B,
    compute_round: &dyn Fn() -> Result<()>,
    start: usize,
    bytes: u64,
    rounds: usize,
) -> Result<Interference> {
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
    let (with, comm_with) = std::thread::scope(|scope| -> Result<(f64, f64)> {
        let comm = scope.spawn(|| timed(Stream::Communication, &reductions));
        let with = timed(Stream::Compute, &|| {
            (0..overlapped_rounds).try_for_each(|_| compute_round())
        });
        let comm_with = comm
            .join()
            .map_err(|_| Error::Backend("the communication thread panicked".into()))??;
        Ok((with?, comm_with))
    })?;
    let with = with / overlapped_rounds as f64;
    let compute_rate = (alone / with.max(1e-9)).clamp(1e-9, 1.0);
    let comm_rate = (comm_alone / comm_with.max(1e-9)).clamp(1e-9, 1.0);
    Ok(Interference {
        compute: ((1.0 - compute_rate) / comm_rate).clamp(0.0, 1.0),
        comm: ((1.0 - comm_rate) / compute_rate).clamp(0.0, 1.0),
    })
}
