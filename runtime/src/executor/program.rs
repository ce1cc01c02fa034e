//! The executor's static program: per slot of the plan's timeline, the blocks the
//! communication stream runs (with the data step each serves), the compute stream's relaxed waits
//! and its buffer-reuse fences.

use super::kind::{Kind, PerUnitKind};
use crate::backend::Group;
use crate::layout::Placement;
use shardplan_scheduler::cost::Among;
use shardplan_scheduler::profile::{Link, Profile};
use shardplan_scheduler::schedule::{
    QueueKey, ReplicaReduce, Schedule, UnitSchedule, in_canonical_order, queue_key,
};
use shardplan_scheduler::timeline::{Level, Op};
use shardplan_scheduler::unrolled::Unrolled;
use std::fmt;

/// The ranks `op` of unit `u` runs among on `world` ranks (DESIGN §3.11).
fn group_of(op: Op, u: &UnitSchedule, world: usize) -> Group {
    Group::of(among(op, u, world), world).normalized(world)
}

fn among(op: Op, u: &UnitSchedule, world: usize) -> Among {
    Among::of(op, world as u32, u.shard_group, u.secondary_group)
}

/// Every group a collective of `schedule` runs among on `world` ranks but the world, each once:
/// the communicators a run opens before its first step.
pub fn groups(schedule: &Schedule, world: usize) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for u in schedule.units() {
        for op in u.ops() {
            let group = group_of(op, u, world);
            if group != Group::World && !groups.contains(&group) {
                groups.push(group);
            }
        }
    }
    groups
}

/// Whether `op` is unit `u`'s last reduction of a step, which its optimizer step follows: RA
/// where the unit is sharded over a shard group (it reduces across the replicas), else its
/// AllReduce or ReduceScatter.
fn last_reduction(op: Op, u: &UnitSchedule) -> bool {
    match op {
        Op::ReduceScatter => u.shard_group.is_none(),
        op => op.is_reduction(),
    }
}

/// One block on the communication stream's queue for a slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub(super) unit: usize,
    pub(super) kind: Kind,
    /// The ranks it runs among.
    pub(super) group: Group,
    /// The communication channel (one per link, [`Program::channels`]) it runs on.
    pub(super) channel: usize,
    /// The block's index in its op instance (0 … nb − 1).
    pub(super) index: usize,
    /// Data step = iteration + offset ([`Iteration::data_step`]).
    pub(super) offset: i64,
    /// The step's last reduction of the unit, which the optimizer step follows.
    pub(super) step_reduction: bool,
    /// The micro-batch (0-based) the block's instance serves.
    pub(super) micro_batch: usize,
}

/// A wait of the compute stream before a slot of data step d: event (unit, kind) must reach
/// `per_step`·d + `through` blocks (every block of the steps before, then the step's instances up
/// to the one needed).
#[derive(Debug, Clone, Copy)]
pub(super) struct Need {
    pub(super) unit: usize,
    pub(super) kind: Kind,
    pub(super) through: u64,
}

/// Per unit and kind, the op instances of one step in the order the communication stream runs
/// them (the micro-batch each serves), as block counts.
struct Counts {
    /// Per (unit, kind): the micro-batches served, ascending.
    served: PerUnitKind<Vec<usize>>,
    blocks: Vec<u64>,
}

impl Counts {
    fn new(unrolled: Unrolled, schedule: &Schedule, blocks: &[u64]) -> Counts {
        let mut served = PerUnitKind::new(blocks.len(), |_, _| Vec::new());
        for (instance, _) in unrolled.instances(schedule) {
            served[(instance.unit, Kind::of(instance.op))]
                .push(instance.micro_batch(unrolled.micro_batches));
        }
        served.iter_mut().for_each(|s| s.sort_unstable());
        Counts {
            served,
            blocks: blocks.to_vec(),
        }
    }

    /// Blocks per step of each (unit, kind).
    fn per_step(&self) -> PerUnitKind<u64> {
        PerUnitKind::new(self.blocks.len(), |unit, kind| {
            self.served[(unit, kind)].len() as u64 * self.blocks[unit]
        })
    }

    /// Blocks of (unit, kind) in a step up to and including the instance serving `micro_batch`.
    fn through(&self, unit: usize, kind: Kind, micro_batch: usize) -> u64 {
        let served = &self.served[(unit, kind)];
        let before = served.iter().filter(|&&m| m <= micro_batch).count() as u64;
        before * self.blocks[unit]
    }
}

/// The static program: per slot of the unrolled step its queue, the relaxed waits and the fences.
pub(super) struct Program {
    pub(super) unrolled: Unrolled,
    pub(super) slots: usize,
    /// The links the blocks run on, one communication channel each (DESIGN §6.11): one, or the
    /// inter- and the intra-node link where the plan uses both and the backend runs collectives
    /// of two communicators at once.
    pub(super) channels: Vec<Link>,
    pub(super) queues: Vec<Vec<Block>>,
    pub(super) needs: Vec<Vec<Need>>,
    /// Per (unit, kind), blocks per step.
    pub(super) per_step: PerUnitKind<u64>,
    /// Per unit, the units whose gradient its backward writes first (`gradients`): the ones it
    /// prepares, and whose previous reduction it waits for.
    pub(super) first_written: Vec<Vec<usize>>,
    /// Per slot of an even iteration, then (where the arena alternates layouts) of an odd one,
    /// the units whose reductions must have completed as far as launched.
    pub(super) fences: Vec<Vec<usize>>,
    /// Per unit, the reduction its fences count ([`fence_kinds`]).
    pub(super) fence_kinds: Vec<Kind>,
    /// 1, or 2 where the arena alternates layouts by step parity.
    pub(super) parities: usize,
}

/// Whether the links' collectives run on channels of their own: `Separate` (the former
/// `concurrent: bool`'s `true`, where the backend can run two links' collectives at once) or one
/// `Shared` channel (`false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkChannels {
    Separate,
    Shared,
}

/// The program of `schedule` over its unrolled step (DESIGN §6.3, §6.10): each op instance's
/// blocks queued at their launch slots in the canonical order, with the data step they serve,
/// each on the channel of its link (`link_channels`: separate, or every block on one channel).
pub(super) fn program(
    schedule: &Schedule,
    placement: &Placement,
    first_written: Vec<Vec<usize>>,
    profile: &Profile,
    link_channels: LinkChannels,
) -> Program {
    let channels = channels(schedule, profile, link_channels);
    let unrolled = Unrolled::of(schedule);
    let blocks: Vec<u64> = (placement.for_step(0).units.iter())
        .map(|u| u.blocks as u64)
        .collect();
    let counts = Counts::new(unrolled, schedule, &blocks);
    let queues = queues(schedule, unrolled, profile, &channels);
    let needs = needs(schedule, unrolled, &counts, &first_written);
    let parities = placement.parities();
    let slots = unrolled.slot_count();
    Program {
        unrolled,
        slots,
        channels,
        needs,
        per_step: counts.per_step(),
        first_written,
        fences: fences(placement, schedule.units().len(), slots),
        fence_kinds: fence_kinds(placement, &queues),
        queues,
        parities,
    }
}

/// The link each op of `schedule` runs on, one channel per link (`Separate`), else one.
fn channels(schedule: &Schedule, profile: &Profile, link_channels: LinkChannels) -> Vec<Link> {
    let world = profile.world_size as usize;
    let mut channels: Vec<Link> = (schedule.units().iter())
        .flat_map(|u| {
            u.ops()
                .into_iter()
                .map(|op| among(op, u, world).link(profile))
        })
        .collect();
    channels.sort_unstable();
    channels.dedup();
    if link_channels == LinkChannels::Shared {
        channels.truncate(1);
    }
    channels
}

/// Per slot of the unrolled step, its blocks in the canonical order, each with the data step it
/// serves, its group and its channel among `channels`.
fn queues(
    schedule: &Schedule,
    unrolled: Unrolled,
    profile: &Profile,
    channels: &[Link],
) -> Vec<Vec<Block>> {
    let world = profile.world_size as usize;
    let channel = |op: Op, u: &UnitSchedule| {
        let l = among(op, u, world).link(profile);
        channels.iter().position(|&c| c == l).unwrap_or(0)
    };
    let units = schedule.units();
    let mut keyed: Vec<Vec<(QueueKey, Block)>> = vec![Vec::new(); unrolled.slot_count()];
    for (instance, launches) in unrolled.instances(schedule) {
        let window = unrolled
            .timeline
            .window(instance.unit, instance.op.window_kind());
        let mut index = 0;
        for l in launches {
            let (slot, iteration) = unrolled.place(instance, l.position);
            let key = queue_key(instance.op, l.position, window.len, instance.unit);
            let u = &units[instance.unit];
            for _ in 0..l.blocks {
                let block = Block {
                    unit: instance.unit,
                    kind: Kind::of(instance.op),
                    group: group_of(instance.op, u, world),
                    channel: channel(instance.op, u),
                    index,
                    offset: -iteration,
                    step_reduction: instance.is_step_reduction() && last_reduction(instance.op, u),
                    micro_batch: instance.micro_batch(unrolled.micro_batches),
                };
                keyed[slot].push((key, block));
                index += 1;
            }
        }
    }
    in_canonical_order(keyed)
}

/// Per slot of the unrolled step, the blocks relaxed compute waits for: a forward's gathered
/// (or reduced) parameters, a backward's gather, and the previous micro-batch's reduction of
/// each gradient the slot prepares (`first_written`).
fn needs(
    schedule: &Schedule,
    unrolled: Unrolled,
    counts: &Counts,
    first_written: &[Vec<usize>],
) -> Vec<Vec<Need>> {
    let timeline = unrolled.timeline;
    let units = schedule.units();
    let need = |unit: usize, kind: Kind, micro_batch: Option<usize>| Need {
        unit,
        kind,
        through: micro_batch.map_or(0, |m| counts.through(unit, kind, m)),
    };
    (0..unrolled.slot_count())
        .map(|s| {
            let (m, flat) = unrolled.split(s);
            let Some(i) = timeline.compute_unit(flat) else {
                return vec![];
            };
            let u = &units[i];
            let keep = u.accumulation.keep;
            let mut needs = Vec::new();
            if flat == timeline.forward(i) {
                match u.level {
                    Level::None if m == 0 => needs.push(need(i, Kind::AllReduce, None)),
                    Level::Sdp | Level::Fsdp if m == 0 || !keep => {
                        needs.push(need(i, Kind::ForwardGather, Some(m)));
                    }
                    _ => {}
                }
                return needs;
            }
            if u.level == Level::Fsdp {
                needs.push(need(i, Kind::BackwardGather, Some(m)));
            }
            // The previous micro-batch's reduction of each gradient this slot prepares, and its
            // replica AllReduce where one follows every ReduceScatter (it reduces the shard the
            // seed reads in place, DESIGN §3.11.1).
            for &w in &first_written[i] {
                let a = &units[w].accumulation;
                if m > 0 && !a.accumulate {
                    let kind = Kind::of(units[w].level.ops()[0]);
                    needs.push(need(w, kind, Some(m - 1)));
                    if units[w].shard_group.is_some() && a.replica_reduce == ReplicaReduce::Every {
                        needs.push(need(w, Kind::ReplicaAllReduce, Some(m - 1)));
                    }
                }
            }
            needs
        })
        .collect()
}

/// Per slot of an even iteration, then (where the arena alternates layouts) of an odd one, the
/// units whose full gradient (one region, or one per parity of the step it holds) is lent then,
/// or an offloaded unit's reduced gradient shard (DESIGN §6.12: its last RS block counts once
/// the shard's copy to the host is done).
fn fences(placement: &Placement, units: usize, slots: usize) -> Vec<Vec<usize>> {
    let parities = placement.parities();
    let full_grads = |u: usize| {
        (0..parities).flat_map(move |p| {
            let requests = &placement.for_step(p).requests[u];
            let reduced_shard = requests.offload.map(|_| requests.grads);
            requests.full_grad.into_iter().chain(reduced_shard)
        })
    };
    (0..parities * slots)
        .map(|s| {
            (0..units)
                .filter(|&u| full_grads(u).any(|r| placement.lent_in(r, s)))
                .collect()
        })
        .collect()
}

/// Per unit, the reduction whose blocks its fences count: the replica AllReduce for an offloaded
/// unit over a shard group (its reduced shard is read by the RA, then by the copy to the host
/// that the RA's last block waits for, DESIGN §6.12), else the ReduceScatter (which reads the
/// full gradient; an RA block follows its RS block, so counting RAs covers the full gradient too).
fn fence_kinds(placement: &Placement, queues: &[Vec<Block>]) -> Vec<Kind> {
    let requests = &placement.for_step(0).requests;
    (0..requests.len())
        .map(|u| {
            let replica_reduced =
                (queues.iter().flatten()).any(|b| b.unit == u && b.kind == Kind::ReplicaAllReduce);
            match requests[u].offload.is_some() && replica_reduced {
                true => Kind::ReplicaAllReduce,
                false => Kind::ReduceScatter,
            }
        })
        .collect()
}

/// An iteration of the executor's walk of n steps: −1 the prologue, 0 … n − 1 the steps, n the
/// epilogue. Blocks launched in it serve the data step `offset` iterations on (negative: back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Iteration(i64);

impl Iteration {
    /// The iteration of the walk's `pass`-th pass over the slots (pass 0 is the prologue).
    fn of_pass(pass: usize) -> Iteration {
        Iteration(pass as i64 - 1)
    }

    /// This iteration as an index below `n`, if it is one (not the prologue, not past `n`).
    pub(super) fn below(self, n: usize) -> Option<usize> {
        usize::try_from(self.0).ok().filter(|&i| i < n)
    }

    /// The data step a block with `offset` serves in this iteration, if it is one of the walk's
    /// `steps` steps.
    pub(super) fn data_step(self, offset: i64, steps: usize) -> Option<usize> {
        Iteration(self.0 + offset).below(steps)
    }

    /// The parity (0 … `parities` − 1) of the layout this iteration's slots use: the prologue
    /// is odd.
    fn parity(self, parities: usize) -> usize {
        self.0.rem_euclid(parities as i64) as usize
    }
}

impl fmt::Display for Iteration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Program {
    /// Global slot g of a walk as (iteration, slot).
    pub(super) fn split(&self, g: usize) -> (Iteration, usize) {
        (Iteration::of_pass(g / self.slots), g % self.slots)
    }

    /// The relaxed fences of a walk of `steps` steps with their targets, global slot by global
    /// slot.
    pub(super) fn fence_walk(&self, steps: usize, units: usize) -> FenceWalk<'_> {
        FenceWalk {
            program: self,
            steps,
            next: 0,
            launched_before: vec![0; units],
        }
    }
}

/// The compute stream's walk of the relaxed fences: per global slot, in order, (unit, the
/// reductions of its fence kind of real steps launched before the slot), counted as the slots go by (memory
/// independent of the number of steps).
pub(super) struct FenceWalk<'a> {
    program: &'a Program,
    steps: usize,
    /// The next global slot.
    next: usize,
    launched_before: Vec<u64>,
}

impl FenceWalk<'_> {
    /// The fences of the next global slot, with their targets.
    pub(super) fn next_slot(&mut self) -> Vec<(usize, u64)> {
        let p = self.program;
        let (iter, s) = p.split(self.next);
        let parity = iter.parity(p.parities);
        let targets = p.fences[parity * p.slots + s]
            .iter()
            .map(|&u| (u, self.launched_before[u]))
            .collect();
        for b in &p.queues[s] {
            let real = iter.data_step(b.offset, self.steps).is_some();
            if b.kind == p.fence_kinds[b.unit] && real {
                self.launched_before[b.unit] += 1;
            }
        }
        self.next += 1;
        targets
    }
}
