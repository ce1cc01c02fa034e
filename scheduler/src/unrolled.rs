//! The step of K micro-batches unrolled (DESIGN §3.10): K copies of F_1 … F_L, B_L … B_1, each
//! followed by its boundary (I between micro-batches, E after the last), K·(2L + 1) slots; at
//! K = 1 the flat timeline itself. The simulator and the runtime's executor both walk it: they
//! share where an op instance's blocks launch, not what happens there.

use crate::profile::Profile;
use crate::schedule::{Placed, Schedule};
use crate::timeline::{Op, Timeline, Window, WindowKind};

/// Where things are in the unrolled step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrolled {
    pub timeline: Timeline,
    /// K.
    pub micro_batches: usize,
}

/// One op instance: `op` of `unit` at boundary `boundary` (0: the step boundary, before the
/// first micro-batch; m ≥ 1: between micro-batches m − 1 and m, 0-based) or, for AGB, in
/// micro-batch `boundary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    pub unit: usize,
    pub op: Op,
    pub boundary: usize,
}

impl Instance {
    /// The micro-batch (0-based) the instance serves: a gather the one after its boundary, a
    /// reduction the one before (the step boundary's reduction serves the last).
    pub fn micro_batch(self, micro_batches: usize) -> usize {
        if self.op.is_reduction() {
            (self.boundary + micro_batches - 1) % micro_batches
        } else {
            self.boundary
        }
    }

    /// The step's last reduction of the unit, the one the optimizer step follows.
    pub fn is_step_reduction(self) -> bool {
        self.op.is_reduction() && self.boundary == 0
    }
}

impl Unrolled {
    pub fn of(schedule: &Schedule) -> Unrolled {
        Unrolled {
            timeline: schedule.timeline(),
            micro_batches: schedule.micro_batches() as usize,
        }
    }

    /// 2L + 1, the slots of one micro-batch with its boundary.
    pub fn width(self) -> usize {
        self.timeline.slot_count()
    }

    pub fn slot_count(self) -> usize {
        self.micro_batches * self.width()
    }

    /// The unrolled index of flat slot `flat` of micro-batch `m` (0-based, taken cyclically).
    pub fn at(self, m: usize, flat: usize) -> usize {
        (m % self.micro_batches) * self.width() + flat
    }

    /// Unrolled slot `s` as (micro-batch, flat slot).
    pub fn split(self, s: usize) -> (usize, usize) {
        (s / self.width(), s % self.width())
    }

    /// The unrolled index of window position `pos` of an op whose window ends before micro-batch
    /// `boundary`'s forward (`AfterBackward`: its slots up to the boundary slot belong to the
    /// micro-batch before) or lies inside micro-batch `boundary` (`BetweenPasses`).
    pub fn position(self, window: Window, kind: WindowKind, boundary: usize, pos: usize) -> usize {
        let flat = window.slot_at(pos);
        match kind {
            WindowKind::AfterBackward if flat >= window.first => {
                self.at(boundary + self.micro_batches - 1, flat)
            }
            _ => self.at(boundary, flat),
        }
    }

    /// The unrolled slot of `instance`'s window position `pos`, and whether that slot lies in
    /// the iteration before the step the instance serves (a step boundary's gather launched in
    /// the last micro-batch: −1) or after it (the step's reduction launched in the next step's
    /// first micro-batch: +1), else 0.
    pub fn place(self, instance: Instance, pos: usize) -> (usize, i64) {
        let kind = instance.op.window_kind();
        let window = self.timeline.window(instance.unit, kind);
        let slot = self.position(window, kind, instance.boundary, pos);
        let before_step_end = instance.boundary == 0
            && kind == WindowKind::AfterBackward
            && window.slot_at(pos) >= window.first;
        let iteration = match (before_step_end, instance.op.is_reduction()) {
            (false, true) if instance.boundary == 0 => 1,
            (true, false) => -1,
            _ => 0,
        };
        (slot, iteration)
    }

    /// Every op instance of the step with its launches (the step boundary's, the inner
    /// boundaries', AGB's in every micro-batch; a shard group's RA, derived from its RS),
    /// unit by unit, boundaries in order.
    pub fn instances(self, schedule: &Schedule) -> Vec<(Instance, &[Placed])> {
        let mut all = Vec::new();
        for (unit, u) in schedule.units().iter().enumerate() {
            for op in u.ops() {
                for boundary in 0..self.micro_batches {
                    let launches = if boundary == 0 || op == Op::GatherBackward {
                        schedule.launches(unit, op)
                    } else {
                        schedule.inner_launches(unit, op)
                    };
                    if !launches.is_empty() {
                        all.push((Instance { unit, op, boundary }, launches));
                    }
                }
            }
        }
        all
    }
}

/// The unit whose backward writes `unit`'s full gradient first: the unit that reads its
/// parameters (a tied head, DESIGN §3.9), or the unit itself.
pub fn first_gradient_writer(profile: &Profile, unit: usize) -> usize {
    profile.borrower(unit).unwrap_or(unit)
}
