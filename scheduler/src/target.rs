//! Whose execution a plan is made for (DESIGN §4.9): the project's runtime, whose plans launch
//! blocks anywhere in their windows, or PyTorch FSDP2, whose plan space is what `fully_shard`
//! executes: each op of a unit whole (all nb_i blocks) at one slot where an FSDP2 hook issues it.
//! The ILP restricts its model to a target's space (`ilp::space`); plan files record it.

use crate::profile::Profile;
use crate::timeline::{Op, Slot, Timeline, Window};
use serde::{Deserialize, Serialize};

/// Whose execution a plan is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The project's runtime: block launches anywhere in their windows (DESIGN §3, §6).
    #[default]
    Runtime,
    /// PyTorch FSDP2's `fully_shard`: exactly the settings it can execute (DESIGN §3.12, §4.9).
    Fsdp2,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::Runtime, Target::Fsdp2];

    /// The name the CLI and plan files use.
    pub fn name(self) -> &'static str {
        match self {
            Target::Runtime => "runtime",
            Target::Fsdp2 => "fsdp2",
        }
    }

    /// The target of a name, None for any other.
    pub fn parse(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether `op` of `unit` may launch at position `k` of its `window`: anywhere for the runtime;
    /// for FSDP2 a reduction right after B_i (an HSDP unit's replica AllReduce follows a slot later),
    /// a forward gather at an earlier unit's pre-forward (unit 1's own at E), a backward gather at
    /// a later unit's pre-backward.
    pub fn allows(
        self,
        timeline: Timeline,
        (unit, op): (usize, Op),
        window: Window,
        k: usize,
    ) -> bool {
        if self == Target::Runtime {
            return true;
        }
        let slot = timeline.slot(window.slot_at(k));
        match op {
            // The post-backward: the first slot after B_i.
            Op::AllReduce | Op::ReduceScatter | Op::ReplicaAllReduce => k == 0,
            // An earlier unit's pre-forward within the iteration; unit 1's own at E.
            Op::Gather | Op::GatherForward => match slot {
                Slot::F(j) => j - 1 < unit,
                Slot::E => unit == 0,
                Slot::B(_) | Slot::I => false,
            },
            // A later unit's pre-backward.
            Op::GatherBackward => matches!(slot, Slot::B(j) if j - 1 > unit),
        }
    }

    /// How many of `unit`'s blocks one launch column counts: 1, or all nb_i (FSDP2 gathers and
    /// reduces a module whole).
    pub fn blocks_per_launch(self, profile: &Profile, unit: usize) -> u32 {
        match self {
            Target::Runtime => 1,
            Target::Fsdp2 => profile.blocks(unit),
        }
    }
}
