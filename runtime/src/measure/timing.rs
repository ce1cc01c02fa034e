//! Timings through the [`Backend`] trait, between marks, so the same code times host kernels on
//! the CPU and device work on a GPU (CUDA events). Every function lays its buffers out from offset
//! 0 of the arena [`measurement_allocation`] sized.

use super::{DataSteps, Reading, UnitTime, UnitTimes, median, sizes, visits};
use crate::Result;
use crate::backend::{Allocation, Backend, Group, Region, Stream};
use crate::gradients::{GradientStart, first_written_by};
use crate::layout::Layout;
use crate::train::{Train, optimize_unit};
use crate::workload::Pass;
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::timeline::Collective;

/// Elements of the largest message of the curves, rounded to a multiple of the world size.
fn message_elements(bytes: u64, world: usize) -> usize {
    ((bytes / 4) as usize).max(1).div_ceil(world) * world
}

/// The bytes the AllGathers' message pairs rotate through: many times a core's cache (this CPU's
/// L2 is 4 MiB a core), so that each gather finds its buffers out of cache, as a run's do
/// (DESIGN §6.6).
const GATHER_ROTATION_BYTES: u64 = 64 << 20;

/// Where the curves' message pairs (a full message, then room for its shard) lie: `count` pairs of
/// `stride` elements from the arena's element `start`. The reductions use the first pair, the
/// AllGathers each in turn.
#[derive(Debug, Clone, Copy)]
struct MessagePairs {
    start: usize,
    stride: usize,
    count: usize,
}

impl MessagePairs {
    fn new(start: usize, max_bytes: u64, world: usize) -> Self {
        let stride = (2 * message_elements(max_bytes, world)).div_ceil(16) * 16;
        let count = GATHER_ROTATION_BYTES.div_ceil(4 * stride as u64).max(2) as usize;
        MessagePairs {
            start,
            stride,
            count,
        }
    }

    /// The full message of `elements` and its shard in pair `k` (modulo the count).
    fn pair(&self, k: usize, elements: usize, world: usize) -> (Region, Region) {
        let offset = self.start + (k % self.count) * self.stride;
        let full = Region::f32(offset, elements);
        let shard = Region::f32(offset + elements.div_ceil(16) * 16, elements / world);
        (full, shard)
    }

    fn end(&self) -> usize {
        self.start + self.count * self.stride
    }
}

/// The arena the measurements need: the compute layout's arena (`compute_elements`, 0 when only
/// collectives are timed) followed by the curves' message pairs of `max_bytes` ([`MessagePairs`];
/// the κ collectives use the first), and a loss slot for each of the [`DataSteps`]; and where the
/// messages start.
pub fn measurement_allocation(
    compute_elements: usize,
    world: usize,
    max_bytes: u64,
) -> (Allocation, usize) {
    let start = compute_elements.div_ceil(16) * 16;
    let allocation = Allocation {
        arena_elements: MessagePairs::new(start, max_bytes, world).end() + 16,
        host_arena_elements: 0,
        largest_block: message_elements(max_bytes, world),
        loss_slots: DataSteps::COUNT,
    };
    (allocation, start)
}

/// The compute of slot `s` of a step without communication: unit s's forward for s < L, then the
/// backwards in reverse, unit 2L − 1 − s's, each with the gradient zeroing the executor does
/// before it (DESIGN §6.10); slot 0 takes the next of `steps`.
pub fn compute_slot<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    s: usize,
    steps: &DataSteps,
) -> Result<()> {
    let l = workload.unit_count();
    let step = steps.of_slot(s);
    if s < l {
        workload.forward(backend, layout, s, step, Pass::Forward)
    } else {
        let unit = 2 * l - 1 - s;
        for written in first_written_by(workload, unit) {
            GradientStart::Zero.prepare(backend, &layout.units[written])?;
        }
        workload.backward(backend, layout, unit, step)
    }
}

/// A span's two ends.
type SpanReadings<M> = [Reading<M>; 2];

/// One compute round in slot order on the compute stream: every unit's forward, then every
/// backward, as a step runs them without communication; with `recompute`, each backward preceded
/// by its unit's recomputation, as a checkpointed unit's backward slot runs them. Returns the
/// readings around each unit's forward and backward, then around each recomputation (slot order:
/// the last unit's first).
fn compute_round_marks<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    steps: &DataSteps,
    recompute: Recompute,
) -> Result<Vec<SpanReadings<B::Mark>>> {
    let (stream, l) = (Stream::Compute, workload.unit_count());
    let mut marks = Vec::with_capacity(3 * l);
    let mut recomputed = Vec::with_capacity(l);
    for s in 0..2 * l {
        if recompute.is_on() && s >= l {
            let start = Reading::now(backend, stream)?;
            let unit = 2 * l - 1 - s;
            workload.forward(backend, layout, unit, steps.current(), Pass::Recompute)?;
            recomputed.push([start, Reading::now(backend, stream)?]);
        }
        let start = Reading::now(backend, stream)?;
        compute_slot(backend, workload, layout, s, steps)?;
        marks.push([start, Reading::now(backend, stream)?]);
    }
    marks.extend(recomputed);
    Ok(marks)
}

/// The layouts units are timed in ([`super::compute_placements`]): DDP's, and DDP's with every unit
/// checkpointed, each in its own part of the arena.
#[derive(Debug, Clone, Copy)]
pub struct TimedLayouts<'a> {
    pub plain: &'a Layout,
    pub checkpointed: &'a Layout,
}

/// Forward, checkpointed forward, backward, recompute and optimizer µs of each unit. First plain
/// rounds (forwards and backwards) alternating with rounds whose backwards are each preceded by
/// the unit's recomputation, in the plain layout: f_i and b_i from the plain rounds (a
/// recomputation just before a backward warms the caches it reads), and what recomputation adds
/// to the unit's backward slot, f'_i = (the recomputation + the backward right after it) − b_i,
/// at least 0, from the others: the backward reads what the recomputation just wrote (DESIGN
/// §6.6). Then rounds in the checkpointed layout, each backward preceded by the unit's
/// recomputation as a checkpointed unit's slots run them, whose forwards write their internals
/// into the reused forward workspace: f^c_i. The layouts do not alternate round by round: right
/// after a round of the other layout, gpt2-tiny's forwards and backwards measured 5–20% slower
/// than a run's, whose step follows a step of its own layout. Each kind of round: 3 warm-up
/// rounds, then the median over `repeats` rounds of each span's slowest rank's time (on the
/// host its thread's CPU time, [`Reading::until`]; a slot
/// whose collectives join the ranks ends with the slowest; on gpt2-tiny at N = 2 its median is
/// 0.4–3.5% above one rank's own). The first unit's forward includes taking and uploading the
/// batch, as in a run; a recomputation takes nothing. After each round every unit takes an
/// optimizer step on the communication stream (with the gradients the round left), as the
/// executor does after a unit's last reduction; the streams wait for each other in between, so
/// no step is timed beside other work.
pub fn time_units<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layouts: TimedLayouts,
    repeats: usize,
    steps: &DataSteps,
) -> Result<UnitTimes> {
    const WARM_UP: usize = 3;
    let l = workload.unit_count();
    let round = |layout: &Layout, recompute: Recompute| -> Result<Vec<SpanReadings<B::Mark>>> {
        let mut marks = compute_round_marks(backend, workload, layout, steps, recompute)?;
        let computed = backend.mark(Stream::Compute)?;
        backend.wait_mark(Stream::Communication, &computed)?;
        for i in 0..l {
            let start = Reading::now(backend, Stream::Communication)?;
            optimize_unit(workload, backend, layout, i, 1)?;
            marks.push([start, Reading::now(backend, Stream::Communication)?]);
        }
        let updated = backend.mark(Stream::Communication)?;
        backend.wait_mark(Stream::Compute, &updated)?;
        Ok(marks)
    };
    let (mut plain, mut recomputing) = (Vec::with_capacity(repeats), Vec::new());
    for k in 0..2 * (repeats + WARM_UP) {
        let recompute = [Recompute::Off, Recompute::On][k % 2];
        let mut marks = round(layouts.plain, recompute)?;
        if k >= 2 * WARM_UP {
            if recompute.is_on() {
                recomputing.push(marks.drain(l..3 * l).collect::<Vec<_>>());
            } else {
                plain.push(marks);
            }
        }
    }
    let mut checkpointed = Vec::with_capacity(repeats);
    for k in 0..repeats + WARM_UP {
        let mut forwards = round(layouts.checkpointed, Recompute::On)?;
        if k >= WARM_UP {
            forwards.truncate(l);
            checkpointed.push(forwards);
        }
    }
    backend.synchronize()?;
    let checkpointed = slowest_spans(backend, &checkpointed)?;
    let plain = slowest_spans(backend, &plain)?;
    // Per recomputing round: the backwards after their recomputations, then the recomputations
    // (each in slot order: the last unit's first).
    let recomputing = slowest_spans(backend, &recomputing)?;
    Ok((0..l)
        .map(|i| {
            let backward_us = plain[2 * l - 1 - i];
            let recomputed_backward_us = recomputing[l - 1 - i] + recomputing[2 * l - 1 - i];
            UnitTime {
                forward_us: plain[i],
                checkpointed_forward_us: checkpointed[i],
                backward_us,
                recompute_us: (recomputed_backward_us - backward_us).max(0.0),
                optimizer_us: plain[2 * l + i],
            }
        })
        .collect())
}

/// Per span of the rounds (each round the same spans), the median over the rounds of the slowest
/// rank's time ([`Reading::until`]: where the host computes, its CPU time).
fn slowest_spans<B: Backend>(
    backend: &B,
    rounds: &[Vec<SpanReadings<B::Mark>>],
) -> Result<Vec<f64>> {
    let spans = rounds.first().map_or(0, Vec::len);
    let mine = rounds
        .iter()
        .flat_map(|m| m.iter().map(|[start, end]| start.until(backend, end)))
        .collect::<Result<Vec<f64>>>()?;
    let ranks = every_rank(backend, &mine)?;
    let slowest = |r: usize, k: usize| {
        ranks
            .iter()
            .map(|times| times[r * spans + k])
            .fold(0.0, f64::max)
    };
    Ok((0..spans)
        .map(|k| median((0..rounds.len()).map(|r| slowest(r, k)).collect()))
        .collect())
}

/// Every rank's `values` (the same length on every rank), on every rank: each rank adds its own
/// into its share of a zeroed buffer summed over the ranks. Every rank must call it.
pub(super) fn every_rank<B: Backend>(backend: &B, values: &[f64]) -> Result<Vec<Vec<f64>>> {
    let (n, rank) = (values.len(), backend.rank());
    let mut all = vec![0f32; n * backend.world_size()];
    for (slot, v) in all[rank * n..(rank + 1) * n].iter_mut().zip(values) {
        *slot = *v as f32;
    }
    backend.all_reduce_host(&mut all)?;
    Ok(all
        .chunks(n.max(1))
        .map(|c| c.iter().map(|&t| f64::from(t)).collect())
        .collect())
}

/// Times each collective across message sizes 4 KiB … `max_bytes` (bytes = the full message, as
/// nccl-tests' size) on the communication stream: the median of `repeats` timings, averaged over
/// the ranks so that every rank holds the same curves (and derives the same block size from
/// them). The timings of a point are taken in visits spread over the whole measurement
/// ([`visits`]), each visit one warm-up and at most two timed runs: timed back
/// to back, a point's samples all fell inside one stretch of a few milliseconds, and a rank
/// descheduled for such a stretch (other processes on its core) took the median with it (an
/// AllReduce of 1 MiB at 3,994 µs against 367–758 µs in the profiles beside it,
/// docs/runtime-results.md). The reductions repeat on one message pair, which stays in cache as
/// a run's gradient does (the backward beside it has just written it; a visit's warm-up reads it
/// again); each AllGather takes the next pair of [`MessagePairs`], out of cache as a run's
/// parameter shard is (the optimizer wrote it a step before). Every rank must call it; on one rank
/// the collectives are what that rank's backend makes of them (copies). Among a `group` smaller
/// than the world, every group runs its own collectives at once, as a plan's shard or replica
/// groups do, and the times are averaged over every rank.
pub fn time_collectives<B: Backend>(
    backend: &B,
    group: Group,
    start: usize,
    max_bytes: u64,
    repeats: usize,
) -> Result<shardplan_scheduler::profile::CommCurves> {
    use shardplan_scheduler::curve::CommCurve;
    let n = group.size(backend.world_size());
    let stream = Stream::Communication;
    // Laid out for the world's messages, which are the largest (n divides the world).
    let pairs = MessagePairs::new(start, max_bytes, backend.world_size());
    let points: Vec<(usize, usize)> = sizes(max_bytes)
        .into_iter()
        .flat_map(|bytes| (0..3).map(move |op| (message_elements(bytes, n), op)))
        .collect();
    let mut samples = vec![Vec::with_capacity(repeats); points.len()];
    // Each AllGather's pair: the next of the rotation.
    let mut gathers = 0;
    for timed in visits(repeats) {
        for (&(elements, op), samples) in points.iter().zip(samples.iter_mut()) {
            let mut marks = Vec::with_capacity(timed + 1);
            for _ in 0..=timed {
                let (full, shard) = pairs.pair(0, elements, n);
                let before = backend.mark(stream)?;
                match op {
                    0 => {
                        let (full, shard) = pairs.pair(gathers, elements, n);
                        gathers += 1;
                        backend.all_gather(group, shard, full)?
                    }
                    1 => backend.reduce_scatter(group, full, shard)?,
                    _ => backend.all_reduce(group, full)?,
                }
                marks.push((before, backend.mark(stream)?));
            }
            backend.synchronize()?;
            for (a, b) in marks.iter().skip(1) {
                samples.push(backend.elapsed_us(a, b)?);
            }
        }
    }
    let mut curves: [Vec<(u64, f64)>; 3] = Default::default();
    for (&(elements, op), samples) in points.iter().zip(samples) {
        curves[op].push((4 * elements as u64, median(samples).max(1e-3)));
    }
    mean_over_ranks(backend, &mut curves)?;
    let [ag, rs, ar] = curves;
    Ok(shardplan_scheduler::profile::CommCurves {
        all_gather: CommCurve { points: ag },
        reduce_scatter: CommCurve { points: rs },
        all_reduce: CommCurve { points: ar },
    })
}

/// Each point's time averaged over the ranks, the same on every rank (each rank timed its own
/// view of the same collectives: one that arrives late waits less). Every rank must call it.
fn mean_over_ranks<B: Backend>(backend: &B, curves: &mut [Vec<(u64, f64)>; 3]) -> Result<()> {
    let mut sums: Vec<f32> = curves.iter().flatten().map(|&(_, t)| t as f32).collect();
    backend.all_reduce_host(&mut sums)?;
    let ranks = backend.world_size() as f64;
    for ((_, time), sum) in curves.iter_mut().flatten().zip(sums) {
        *time = (f64::from(sum) / ranks).max(1e-3);
    }
    Ok(())
}

/// Rank 0's `value` on every rank: a broadcast through the host AllReduce, the other ranks adding
/// zeros, in 16-bit limbs so that the f32 sums stay exact. Every rank must call it.
fn from_first_rank<B: Backend>(backend: &B, value: u64) -> Result<u64> {
    let mine = if backend.rank() == 0 { value } else { 0 };
    let mut limbs: [f32; 4] = std::array::from_fn(|k| ((mine >> (16 * k)) & 0xffff) as f32);
    backend.all_reduce_host(&mut limbs)?;
    Ok(limbs
        .iter()
        .enumerate()
        .map(|(k, &limb)| (limb as u64) << (16 * k))
        .sum())
}

/// Collectives of `kind` on rank 0's `bytes` (every rank runs the same size: ranks that derived
/// another block size from their own timings would otherwise run collectives of different sizes
/// against each other, MPI_ERR_TRUNCATE or a corrupted heap), `rounds` of them, on the two
/// message buffers from element `start` of the arena (the full message, then a shard of it): the
/// communication side of κ_c and κ_q. Every rank must call it.
pub fn block_collectives<B: Backend>(
    backend: &B,
    start: usize,
    bytes: u64,
    rounds: usize,
    kind: Collective,
) -> Result<impl Fn() -> Result<()> + Sync + '_> {
    let bytes = from_first_rank(backend, bytes)?;
    let full = Region::f32(start, message_elements(bytes, backend.world_size()));
    let shard = Region::f32(start + full.len, full.len / backend.world_size());
    Ok(move || -> Result<()> {
        for _ in 0..rounds {
            match kind {
                Collective::AllReduce => backend.all_reduce(Group::World, full)?,
                Collective::ReduceScatter => backend.reduce_scatter(Group::World, full, shard)?,
                Collective::AllGather => backend.all_gather(Group::World, shard, full)?,
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Collectives, CpuBackend};

    /// Rank 1 of two, whose peer adds `peer` to every AllReduce.
    struct SecondOfTwo {
        peer: Vec<f32>,
    }

    impl Collectives for SecondOfTwo {
        fn rank(&self) -> usize {
            1
        }
        fn size(&self) -> usize {
            2
        }
        fn split(&self, _: usize, _: usize) -> Result<SecondOfTwo> {
            unreachable!("not used")
        }
        fn all_gather(&self, _: &[f32], _: &mut [f32]) {
            unreachable!("not used")
        }
        fn reduce_scatter(&self, _: &[f32], _: &mut [f32]) {
            unreachable!("not used")
        }
        fn all_reduce(&self, send: &[f32], recv: &mut [f32]) {
            for ((r, s), p) in recv.iter_mut().zip(send).zip(&self.peer) {
                *r = s + p;
            }
        }
        fn all_gather_bits(&self, _: &[u16], _: &mut [u16]) {
            unreachable!("not used")
        }
        fn reduce_scatter_bf16(&self, _: &[u16], _: &mut [u16]) {
            unreachable!("not used")
        }
        fn all_reduce_bf16(&self, _: &[u16], _: &mut [u16]) {
            unreachable!("not used")
        }
    }

    #[test]
    fn every_rank_gets_the_first_ranks_value_exactly() {
        for value in [0u64, 1, 65_535, 65_536, 3 << 40 | 12_345, u64::MAX] {
            let peer = (0..4)
                .map(|k| ((value >> (16 * k)) & 0xffff) as f32)
                .collect();
            let backend = CpuBackend::new(SecondOfTwo { peer });
            assert_eq!(from_first_rank(&backend, 777).unwrap(), value);
        }
    }

    #[test]
    fn every_rank_sees_each_ranks_values_in_rank_order() {
        let backend = CpuBackend::new(SecondOfTwo {
            peer: vec![7.0, 8.5, 0.0, 0.0],
        });
        assert_eq!(
            every_rank(&backend, &[5.0, 6.25]).unwrap(),
            [vec![7.0, 8.5], vec![5.0, 6.25]]
        );
    }

    #[test]
    fn curves_are_the_mean_of_the_ranks() {
        let backend = CpuBackend::new(SecondOfTwo {
            peer: vec![30.0, 50.0, 70.0],
        });
        let mut curves = [vec![(4096, 10.0)], vec![(4096, 20.0)], vec![(4096, 30.0)]];
        mean_over_ranks(&backend, &mut curves).unwrap();
        assert_eq!(
            curves,
            [vec![(4096, 20.0)], vec![(4096, 35.0)], vec![(4096, 50.0)]]
        );
    }

    /// Every size's pairs lie inside the allocation, apart from each other and from the compute
    /// layout before them; the gathers rotate through at least GATHER_ROTATION_BYTES (at least
    /// two pairs for messages as large as that).
    #[test]
    fn the_gathers_rotate_through_disjoint_pairs_inside_the_arena() {
        for (compute, world, max_bytes) in [(0, 2, 4 << 20), (1001, 3, 4096), (77, 8, 64 << 20)] {
            let (allocation, start) = measurement_allocation(compute, world, max_bytes);
            assert!(start >= compute);
            let pairs = MessagePairs::new(start, max_bytes, world);
            assert!(4 * (pairs.count * pairs.stride) as u64 >= GATHER_ROTATION_BYTES);
            assert!(pairs.count >= 2);
            for bytes in sizes(max_bytes) {
                let elements = message_elements(bytes, world);
                let mut spans: Vec<(usize, usize)> = (0..pairs.count)
                    .flat_map(|k| {
                        let (full, shard) = pairs.pair(k, elements, world);
                        assert_eq!(shard.len * world, full.len);
                        [full, shard].map(|r| (r.offset, r.offset + r.len))
                    })
                    .collect();
                spans.sort_unstable();
                assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
                assert!(spans[spans.len() - 1].1 <= allocation.arena_elements);
            }
            assert_eq!(
                pairs.pair(pairs.count, 16 * world, world),
                pairs.pair(0, 16 * world, world)
            );
        }
    }
}
