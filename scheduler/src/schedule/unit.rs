//! What a schedule holds per unit (`UnitSchedule`): its level, recompute choice (`Recompute`,
//! and `RecomputeChoice` for searches), launches, and with K ≥ 2 micro-batches its
//! `Accumulation` (DESIGN §3.10, §3.11.1).

use crate::timeline::{Level, Op};
use std::collections::BTreeMap;

/// `blocks` blocks of an op launched at the start of slot index `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub slot: usize,
    pub blocks: u32,
}

/// Whether a unit recomputes its activations in its backward (activation checkpointing) or
/// keeps them from its forward. It replaces the `checkpoint: bool` / `recompute: bool`
/// parameters: `On` is their `true`, `Off` their `false`. A schedule's unit holds it as
/// [`UnitSchedule::recompute`], a bool as the plan file writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recompute {
    Off,
    On,
}

impl Recompute {
    /// The setting `unit` holds as its [`UnitSchedule::recompute`] flag.
    pub fn of(unit: &UnitSchedule) -> Recompute {
        if unit.recompute {
            Recompute::On
        } else {
            Recompute::Off
        }
    }

    /// Whether activations are recomputed (the bool a plan file writes).
    pub fn is_on(self) -> bool {
        self == Recompute::On
    }
}

/// Whether a search (the ILP, the baselines' variants) may choose [`Recompute::On`] for a unit.
/// It replaces the `allow_recompute: bool` / `checkpointing: bool` parameters: `Allowed` is their
/// `true`, `Forbidden` their `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecomputeChoice {
    /// Every unit keeps its activations.
    Forbidden,
    /// A unit may keep its activations or recompute them.
    Allowed,
}

impl RecomputeChoice {
    /// The settings a unit may take, [`Recompute::Off`] first.
    pub fn settings(self) -> &'static [Recompute] {
        match self {
            RecomputeChoice::Forbidden => &[Recompute::Off],
            RecomputeChoice::Allowed => &[Recompute::Off, Recompute::On],
        }
    }

    pub fn is_allowed(self) -> bool {
        self == RecomputeChoice::Allowed
    }
}

/// One unit's choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSchedule {
    pub level: Level,
    /// r_i: activation checkpointing (recompute in backward).
    pub recompute: bool,
    /// Launches per op at the step boundary (and AGB's in every micro-batch); ops of other
    /// levels are absent.
    pub launches: BTreeMap<Op, Vec<Launch>>,
    /// Gradient accumulation across the step's micro-batches (DESIGN §3.10); the default at K = 1.
    pub accumulation: Accumulation,
    /// S, a sharded unit's shard group when smaller than the world (DESIGN §3.11, HSDP): its
    /// state is sharded over S ranks, replicated N/S times, and its reduction adds RA.
    pub shard_group: Option<u32>,
    /// H, an fsdp unit's hpZ secondary group (DESIGN §3.11): after its forward it keeps a 1/H
    /// shard, and its backward gather runs inside the node's group of H ranks.
    pub secondary_group: Option<u32>,
}

impl UnitSchedule {
    /// The unit's ops in canonical order: its level's, and RA after RS where its shard group is
    /// smaller than the world.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.level.ops().to_vec();
        if self.shard_group.is_some() {
            ops.insert(1, Op::ReplicaAllReduce);
        }
        ops
    }
}

/// A unit's choices across micro-batches (DESIGN §3.10).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accumulation {
    /// a_i: the unsharded gradient accumulates over the step and is reduced once.
    pub accumulate: bool,
    /// k_i (sdp, fsdp): gathered parameters stay from B^m_i to the end of F^{m+1}_i.
    pub keep: bool,
    /// Launches per op at the boundary between two micro-batches (slot index 2L is I), for the
    /// ops that run there ([`Accumulation::inner_ops`]).
    pub inner: BTreeMap<Op, Vec<Launch>>,
    /// A shard-group unit that reduces every micro-batch: whether its replica AllReduce follows
    /// every ReduceScatter or only the step's (DESIGN §3.11.1).
    pub replica_reduce: ReplicaReduce,
}

/// When a shard-group unit's reduced shard is AllReduced across its replica group, where it
/// reduce-scatters every micro-batch (DESIGN §3.11.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaReduce {
    /// After every micro-batch's ReduceScatter (FSDP2's default).
    #[default]
    Every,
    /// After the step's last ReduceScatter only; the inner ones add into the shard, which the
    /// one AllReduce then reduces (FSDP2's `set_requires_all_reduce(False)` until the last
    /// micro-batch).
    Last,
}

impl Accumulation {
    /// The ops of a unit at `level` that run at the boundary between two micro-batches: its
    /// reduction unless it accumulates, its forward gather unless it keeps the parameters (read
    /// from `accumulate` and `keep`; `inner` is not read). It replaces the free function
    /// `inner_ops(level, accumulate: bool, keep: bool)`.
    pub fn inner_ops(&self, level: Level) -> Vec<Op> {
        level
            .ops()
            .iter()
            .copied()
            .filter(|op| match op {
                Op::AllReduce | Op::ReduceScatter => !self.accumulate,
                Op::Gather | Op::GatherForward => !self.keep,
                Op::GatherBackward | Op::ReplicaAllReduce => false,
            })
            .collect()
    }
}
