//! The executor's static program: per slot of the plan's timeline, the blocks the
//! communication stream runs (with the data step each serves), the compute stream's relaxed waits
//! and its buffer-reuse fences.

use crate::layout::Placement;
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::timeline::{Level, Op, Timeline};

/// The communication kinds of the executor (RS serves both sharded levels; FG is AG or AGF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    AllReduce,
    ReduceScatter,
    ForwardGather,
    BackwardGather,
}

impl Kind {
    /// The number of kinds (events are kept per unit and kind).
    pub(super) const COUNT: usize = 4;

    pub(super) fn of(op: Op) -> Kind {
        match op {
            Op::AllReduce => Kind::AllReduce,
            Op::ReduceScatter => Kind::ReduceScatter,
            Op::Gather | Op::GatherForward => Kind::ForwardGather,
            Op::GatherBackward => Kind::BackwardGather,
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }

    pub(super) fn name(self) -> &'static str {
        ["AR", "RS", "AG", "AGB"][self.index()]
    }

    /// What it is, in words: the collective and, for a gather, which.
    pub(super) fn described(self) -> &'static str {
        [
            "AllReduce",
            "ReduceScatter",
            "forward AllGather",
            "backward AllGather",
        ][self.index()]
    }
}

/// One block on the communication stream's queue for a slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub(super) unit: usize,
    pub(super) kind: Kind,
    pub(super) index: usize,
    /// Data step = iteration + offset.
    pub(super) offset: i64,
}

/// A wait of the compute stream before a slot: event (unit, kind) must reach `per_step`·(step +
/// `shift`) blocks, or (fences) the count of blocks launched before the slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Need {
    pub(super) unit: usize,
    pub(super) kind: Kind,
    pub(super) shift: i64,
}

/// The static program: per slot its queue, the relaxed waits and the fences.
pub(super) struct Program {
    pub(super) slots: usize,
    pub(super) queues: Vec<Vec<Block>>,
    pub(super) needs: Vec<Vec<Need>>,
    /// Per slot of an even iteration, then (where the arena alternates layouts) of an odd one,
    /// the units whose reductions must have completed as far as launched.
    pub(super) fences: Vec<Vec<usize>>,
    /// 1, or 2 where the arena alternates layouts by step parity.
    pub(super) parities: usize,
}

pub(super) fn program(schedule: &Schedule, placement: &Placement) -> Program {
    let timeline: Timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let mut queues = vec![Vec::new(); slots];
    for (s, queue) in schedule.queues().into_iter().enumerate() {
        for q in queue {
            // Blocks of this op launched at earlier window positions come first.
            let first: u32 = schedule
                .launches(q.unit, q.op)
                .iter()
                .take_while(|l| l.slot != s)
                .map(|l| l.blocks)
                .sum();
            let (f, b) = (timeline.forward(q.unit), timeline.backward(q.unit));
            let offset = match Kind::of(q.op) {
                Kind::AllReduce | Kind::ReduceScatter => {
                    if s > b {
                        0
                    } else {
                        -1
                    }
                }
                Kind::ForwardGather => {
                    if s < f {
                        0
                    } else {
                        1
                    }
                }
                Kind::BackwardGather => 0,
            };
            for k in 0..q.blocks {
                queues[s].push(Block {
                    unit: q.unit,
                    kind: Kind::of(q.op),
                    index: (first + k) as usize,
                    offset,
                });
            }
        }
    }
    let needs = (0..slots)
        .map(|s| match timeline.compute_unit(s) {
            None => vec![],
            Some(i) => match (schedule.units()[i].level, s == timeline.forward(i)) {
                (Level::None, true) => vec![Need {
                    unit: i,
                    kind: Kind::AllReduce,
                    shift: 0,
                }],
                (Level::None, false) | (Level::Sdp, false) => vec![],
                (_, true) => vec![Need {
                    unit: i,
                    kind: Kind::ForwardGather,
                    shift: 1,
                }],
                (Level::Fsdp, false) => vec![Need {
                    unit: i,
                    kind: Kind::BackwardGather,
                    shift: 1,
                }],
            },
        })
        .collect();
    let (units, parities) = (placement.for_step(0).requests.len(), placement.parities());
    // A unit's full gradients: one region, or one per parity of the step it holds.
    let full_grads =
        |u: usize| (0..parities).filter_map(move |p| placement.for_step(p).requests[u].full_grad);
    let fences = (0..parities * slots)
        .map(|s| {
            (0..units)
                .filter(|&u| full_grads(u).any(|k| placement.lent_in(k, s)))
                .collect()
        })
        .collect();
    Program {
        slots,
        queues,
        needs,
        fences,
        parities,
    }
}

impl Program {
    /// Global slot g of a walk as (iteration, slot): iteration −1 is the prologue, K the
    /// epilogue.
    pub(super) fn split(&self, g: usize) -> (i64, usize) {
        ((g / self.slots) as i64 - 1, g % self.slots)
    }

    /// The relaxed fences of a K-step walk with their targets, global slot by global slot.
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
/// reductions of real steps launched before the slot), counted as the slots go by (memory
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
        let parity = iter.rem_euclid(p.parities as i64) as usize;
        let targets = p.fences[parity * p.slots + s]
            .iter()
            .map(|&u| (u, self.launched_before[u]))
            .collect();
        for b in &p.queues[s] {
            let d = iter + b.offset;
            if b.kind == Kind::ReduceScatter && d >= 0 && (d as usize) < self.steps {
                self.launched_before[b.unit] += 1;
            }
        }
        self.next += 1;
        targets
    }
}
