//! The communication stream (DESIGN §6.3, §6.11): per global slot, once compute has reached it,
//! the slot's blocks in plan order, each counted on its (unit, kind) event, the optimizer step
//! after a unit's last reduction block. Where the program has two channels (a plan's intra- and
//! inter-node links) each runs on a host thread of its own, so the two links' collectives run
//! at once as the model's per-link queues do; a channel starts slot g only once the other has
//! finished every block before slot g (the strict slot boundary, which also orders an RA after
//! its RS and a shard group's gathers after its RA, and keeps the arena's per-slot lifetimes).

use super::kind::Kind;
use super::program::Block;
use super::watchdog::InFlight;
use super::{PendingSpan, Walk};
use crate::backend::{Backend, COMMUNICATION_THREAD, Region, Stream};
use crate::train::{Train, optimize_unit};
use crate::{Error, Result};
use shardplan_scheduler::offload::Offload;
use shardplan_scheduler::profile::Link;

impl<B: Backend, W: Train<B>> Walk<'_, B, W> {
    /// The communication stream: every channel, the second (if any) on a thread of its own; a
    /// failing channel abandons the other's waits.
    pub(super) fn communicate(&self) -> Result<Vec<PendingSpan<B::Mark>>> {
        let [first, rest @ ..] = self.program.channels.as_slice() else {
            return Ok(Vec::new());
        };
        let Some(&second) = rest.first() else {
            return self.communicate_channel(0);
        };
        std::thread::scope(|scope| {
            let name = format!("comm-{}", link_name(second));
            let spawned = std::thread::Builder::new()
                .name(name.clone())
                .spawn_scoped(scope, || {
                    let result = self
                        .backend
                        .enter_stream_thread(Stream::Communication)
                        .and_then(|()| self.communicate_channel(1));
                    if result.is_err() {
                        self.abandon_channel_waits();
                    }
                    result
                })
                .map_err(|e| Error::Backend(format!("the {name} thread could not start: {e}")))?;
            let here = self.communicate_channel(0);
            if here.is_err() {
                self.abandon_channel_waits();
            }
            let there = spawned.join().map_err(|_| {
                Error::Backend(format!(
                    "the {name} thread ({COMMUNICATION_THREAD}, {} link) panicked",
                    link_name(*first)
                ))
            })?;
            match (here, there) {
                (Ok(mut spans), Ok(more)) => {
                    spans.extend(more);
                    Ok(spans)
                }
                (Err(Error::Abandoned(_)), Err(e)) | (Err(e), _) | (_, Err(e)) => Err(e),
            }
        })
    }

    /// A failed channel's signals will not come: every wait on the channels' slots (the other
    /// channel's, strict compute's) fails at once.
    fn abandon_channel_waits(&self) {
        self.comm_done.iter().for_each(|e| e.abandon());
    }

    /// Channel `channel`'s blocks, global slot by global slot.
    fn communicate_channel(&self, channel: usize) -> Result<Vec<PendingSpan<B::Mark>>> {
        let stream = Stream::Communication;
        let mut spans = Vec::with_capacity(self.span_capacity());
        let others = (0..self.comm_done.len()).filter(|&c| c != channel);
        for g in 0..self.total {
            let (iter, s) = self.program.split(g);
            self.wait(stream, &self.slot_started, g as u64 + 1, &|| {
                format!("the compute stream reaching global slot {g}")
            })?;
            for other in others.clone() {
                self.wait(stream, &self.comm_done[other], g as u64, &|| {
                    let link = link_name(self.program.channels[other]);
                    format!("the {link} link's blocks before global slot {g}")
                })?;
            }
            let blocks = self.program.queues[s].iter();
            for b in blocks.filter(|b| b.channel == channel) {
                let Some(d) = iter.data_step(b.offset, self.options.steps) else {
                    continue;
                };
                let start = self.mark_if_tracing(stream)?;
                let step = self.options.first_step + d;
                self.watch.enter(
                    channel,
                    InFlight {
                        kind: b.kind,
                        group: b.group,
                        unit: b.unit,
                        block: b.index,
                        blocks: self.layout(d).units[b.unit].blocks,
                        step,
                        slot: g,
                    },
                );
                self.communicate_block(b, d as u32)?;
                let end = self.backend.mark(stream)?;
                self.watch.launched(channel, end.clone());
                if let Some(start) = start {
                    spans.push(PendingSpan {
                        stream,
                        channel,
                        what: b.kind.name(),
                        unit: b.unit,
                        step,
                        micro_batch: b.micro_batch,
                        start,
                        end: end.clone(),
                    });
                }
                self.event(b.unit, b.kind).signal(end);
            }
            self.comm_done[channel].signal(self.backend.mark(stream)?);
        }
        Ok(spans)
    }

    /// Before a gather block of an offloaded unit for data step `step` (DESIGN §6.12): the
    /// host's steps of the steps before, and with `full` the block's shard copied into its
    /// staging buffer.
    fn before_offloaded_gather(&self, b: &Block, step: u32, backward: bool) -> Result<()> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        let name = || self.workload.unit_name(b.unit);
        match host.mode(b.unit) {
            Offload::None => return Ok(()),
            Offload::Optimizer | Offload::Full => {
                self.wait(
                    Stream::Communication,
                    host.stepped(b.unit),
                    step.into(),
                    &|| format!("the host's step {} of {}", step.saturating_sub(1), name()),
                )?;
            }
        }
        if host.mode(b.unit) != Offload::Full {
            return Ok(());
        }
        let u = &self.layout(step as usize).units[b.unit];
        let from = u.params.part(b.index, u.blocks);
        let to = u.gather_source(b.index, backward);
        let after = self.backend.mark(Stream::Communication)?;
        let count = host.issue_staging(b.unit, [from, to], after);
        self.wait(Stream::Communication, host.staged(b.unit), count, &|| {
            format!("the copy of {}'s block {} to the device", name(), b.index)
        })
    }

    /// One block of data step `step` among its group; after a unit's last reduction block, its
    /// optimizer step, or an offloaded unit's gradient copy to the host, waited for before the
    /// block counts as done (so the reduced shard is free when its fences and its slot end).
    fn communicate_block(&self, b: &Block, step: u32) -> Result<()> {
        let (backend, layout) = (self.backend, self.layout(step as usize));
        let u = &layout.units[b.unit];
        let part = |r: Region| r.part(b.index, u.blocks);
        let sharded = |r: Option<Region>| {
            r.map(part).ok_or_else(|| {
                Error::Backend(format!(
                    "{} of {} has no buffer for it in the layout",
                    b.kind.name(),
                    self.workload.unit_name(b.unit)
                ))
            })
        };
        let group = b.group;
        match b.kind {
            Kind::AllReduce | Kind::ReplicaAllReduce => backend.all_reduce(group, part(u.grads))?,
            Kind::ReduceScatter => {
                backend.reduce_scatter(group, sharded(u.full_grad)?, part(u.grads))?
            }
            Kind::ForwardGather => {
                self.before_offloaded_gather(b, step, false)?;
                let from = u.gather_source(b.index, false);
                backend.all_gather(group, from, sharded(u.gathered_forward)?)?
            }
            Kind::BackwardGather => {
                self.before_offloaded_gather(b, step, true)?;
                // An hpZ unit gathers from its secondary shard, inside its node.
                let from = match u.secondary {
                    Some((_, shard)) => part(shard),
                    None => u.gather_source(b.index, true),
                };
                backend.all_gather(group, from, sharded(u.gathered_backward)?)?
            }
        }
        if !(b.step_reduction && b.index + 1 == u.blocks) {
            return Ok(());
        }
        if let (Some(host), Some(offloaded)) = (&self.host, u.offload) {
            let after = backend.mark(Stream::Communication)?;
            let shards = [u.grads, offloaded.host_grads];
            let count = host.issue_gradient(b.unit, step as usize, shards, after);
            return self.wait(
                Stream::Communication,
                host.gradients(b.unit),
                count,
                &|| {
                    let name = self.workload.unit_name(b.unit);
                    format!("the gradient copy of {name} to the host")
                },
            );
        }
        let trained = self.options.first_step as u32 + step + 1;
        optimize_unit(self.workload, backend, layout, b.unit, trained)
    }
}

fn link_name(link: Link) -> &'static str {
    match link {
        Link::Intra => "intra",
        Link::Inter => "inter",
    }
}
