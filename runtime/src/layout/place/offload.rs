//! An offloaded unit's buffers in the layout (DESIGN §6.12): its kept state in the host arena
//! (indices from [`HOST_INDEX`] on, placed after the device arena's words), its reduced gradient
//! shard on the device until its copy to the host, and `full`'s staging shards beside its
//! gathered blocks.

use super::{Birth, Builder, UnitSlots};
use crate::Result;
use crate::arena::{Request, Tenure};
use crate::backend::FloatFormat;
use shardplan_scheduler::timeline::Op;

/// Where a host arena buffer's index begins: the builder's indices below it are device requests,
/// `HOST_INDEX + k` the host arena's k-th buffer (DESIGN §6.12).
pub(super) const HOST_INDEX: usize = 1 << 48;

impl Builder {
    /// State kept in the host arena (an offloaded unit's, DESIGN §6.12).
    pub(super) fn add_host(&mut self, elements: usize, format: FloatFormat) -> usize {
        self.host.push((elements, format));
        HOST_INDEX + self.host.len() - 1
    }

    /// Kept state on the device, or in the host arena where `on_host`.
    pub(super) fn add_kept_on(
        &mut self,
        on_host: bool,
        name: String,
        elements: usize,
        format: FloatFormat,
    ) -> usize {
        match on_host {
            true => self.add_host(elements, format),
            false => self.add_kept(name, elements, format),
        }
    }
}

impl UnitSlots<'_> {
    /// An offloaded unit's reduced gradient shard on the device: written by its RS blocks,
    /// read by the copy to the host, alive from B_i to the end of its last RS launch slot — over
    /// a shard group to the end of its last replica AllReduce (RA) launch slot, which reduces it in
    /// place before the copy reads it (DESIGN §3.13, offload on nodes).
    pub(super) fn reduced_shard(
        &self,
        b: &mut Builder,
        elements: usize,
        format: FloatFormat,
    ) -> Result<usize> {
        let backward = self.backward;
        let replica_reduced = self
            .instances
            .iter()
            .any(|(x, _)| x.unit == self.unit && x.op == Op::ReplicaAllReduce);
        let reductions: &[Op] = match replica_reduced {
            true => &[Op::ReduceScatter, Op::ReplicaAllReduce],
            false => &[Op::ReduceScatter],
        };
        let mut alive = vec![false; self.step.slot_count()];
        for &op in reductions {
            let (blocks, _) = self.blocks_alive(op, &|_, launch| vec![(backward, launch)])?;
            for (s, live) in alive.iter_mut().enumerate() {
                *live |= blocks.iter().any(|block| block[s]);
            }
        }
        let name = format!("{} reduced gradient shard", self.name);
        let request = Request::whole(name, format.bytes() * elements as u64, alive);
        Ok(b.push(request, format, Tenure::Step { birth: backward }, false))
    }

    /// A `full` unit's staging buffer beside a gathered buffer: `shard` elements of each block,
    /// each block alive as its gathered block.
    pub(super) fn staging(
        &self,
        b: &mut Builder,
        (shard, format): (usize, FloatFormat),
        alive: Vec<Vec<bool>>,
        birth: Birth,
        of: &str,
    ) -> usize {
        let name = format!("{} staging for {of}", self.name);
        b.add_blocks(name, (shard, format), alive, birth)
    }
}
