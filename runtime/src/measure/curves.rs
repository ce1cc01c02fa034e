//! The collectives timed across the ranks: the curves' messages (powers of two, and the exact
//! messages of a profile's blocks, DESIGN §6.6), the collectives beside compute that κ is
//! measured with, and the host exchanges that make every rank hold the same figures.

use super::{DataSteps, median, sizes};
use crate::Result;
use crate::backend::{Allocation, Backend, Group, Region, Stream};
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
        largest_block: message_elements(max_bytes, world),
        loss_slots: DataSteps::COUNT,
    };
    (allocation, start)
}

/// Times each collective across message sizes 4 KiB … `max_bytes` (bytes = the full message, as
/// nccl-tests' size) on the communication stream: 2 warm-up runs, then the median of `repeats`,
/// averaged over the ranks so that every rank holds the same curves (and derives the same block
/// size from them). The reductions repeat on one message pair, which stays in cache as a run's
/// gradient does (the backward beside it has just written it); each AllGather takes the next pair
/// of [`MessagePairs`], out of cache as a run's parameter shard is (the optimizer wrote it a step
/// before). Every rank must call it; on one rank the collectives are what that rank's backend
/// makes of them (copies). Among a `group` smaller than the world, every group runs its own
/// collectives at once, as a plan's shard or replica groups do, and the times are averaged over
/// every rank.
pub fn time_collectives<B: Backend>(
    backend: &B,
    group: Group,
    start: usize,
    max_bytes: u64,
    repeats: usize,
) -> Result<shardplan_scheduler::profile::CommCurves> {
    use shardplan_scheduler::curve::CommCurve;
    let every = sizes(max_bytes);
    let sizes = [every.clone(), every.clone(), every];
    let [ag, rs, ar] = time_messages(backend, group, (start, max_bytes), repeats, &sizes)?;
    Ok(shardplan_scheduler::profile::CommCurves {
        all_gather: CommCurve { points: ag },
        reduce_scatter: CommCurve { points: rs },
        all_reduce: CommCurve { points: ar },
    })
}

/// The AllGather's, ReduceScatter's and AllReduce's times at each of their `sizes` (bytes; those
/// above the `max_bytes` the message pairs at `start` were laid out for are left out), as
/// [`time_collectives`] times them. Every rank must call it with the same sizes.
pub fn time_messages<B: Backend>(
    backend: &B,
    group: Group,
    (start, max_bytes): (usize, u64),
    repeats: usize,
    sizes: &[Vec<u64>; 3],
) -> Result<[Vec<(u64, f64)>; 3]> {
    let n = group.size(backend.world_size());
    let stream = Stream::Communication;
    let mut curves: [Vec<(u64, f64)>; 3] = Default::default();
    // Laid out for the world's messages, which are the largest (n divides the world).
    let pairs = MessagePairs::new(start, max_bytes, backend.world_size());
    let mut every: Vec<u64> = sizes.iter().flatten().copied().collect();
    every.sort_unstable();
    every.dedup();
    for bytes in every.into_iter().filter(|&b| b <= max_bytes) {
        let elements = message_elements(bytes, n);
        let (full, shard) = pairs.pair(0, elements, n);
        for (op, curve) in curves.iter_mut().enumerate() {
            if !sizes[op].contains(&bytes) {
                continue;
            }
            let mut marks = Vec::with_capacity(repeats + 2);
            for k in 0..repeats + 2 {
                let before = backend.mark(stream)?;
                match op {
                    0 => {
                        let (full, shard) = pairs.pair(k, elements, n);
                        backend.all_gather(group, shard, full)?
                    }
                    1 => backend.reduce_scatter(group, full, shard)?,
                    _ => backend.all_reduce(group, full)?,
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
    mean_over_ranks(backend, &mut curves)?;
    Ok(curves)
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
