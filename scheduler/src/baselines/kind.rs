//! The baseline families (`BaselineKind`): their names, which a profile offers, and how each
//! accumulates with micro-batches (DESIGN §5, §3.11.1, §3.13).

use super::offload;
use crate::groups::{secondary_group, shard_groups};
use crate::profile::Profile;
use crate::schedule::{Accumulation, Recompute, ReplicaReduce};

/// The baseline families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineKind {
    Ddp,
    Zero2,
    Fsdp1,
    Fsdp2,
    Zero3,
    BestGrid,
    /// DDP under `no_sync()` for the first K − 1 micro-batches (K ≥ 2).
    DdpNoSync,
    /// FSDP2 with `set_requires_gradient_sync(False)` until the last micro-batch (K ≥ 2).
    Fsdp2NoSync,
    /// ZeRO++ hpZ, FSDP2's `reshard_after_forward=G`: fsdp2 with every fsdp unit keeping a
    /// node-local secondary shard (DESIGN §3.11; on a profile whose topology offers it).
    Hpz,
    /// FSDP2's HSDP (a 2-D replicate × shard mesh): fsdp2 over the smallest shard group of
    /// whole nodes that fits (DESIGN §3.11); with K ≥ 2 it reduce-scatters and all-reduces
    /// across replicas every micro-batch (FSDP2's and torchtitan's default).
    Hsdp,
    /// hsdp with `set_requires_gradient_sync(False)` until the last micro-batch: the unsharded
    /// gradient accumulates, one ReduceScatter and replica AllReduce a step (K ≥ 2).
    HsdpNoSync,
    /// hsdp with `set_requires_all_reduce(False)` until the last micro-batch: a ReduceScatter
    /// every micro-batch, the replica AllReduce once a step (K ≥ 2, DESIGN §3.11.1).
    HsdpRaOnce,
    /// hpz with `set_requires_gradient_sync(False)` until the last micro-batch (K ≥ 2).
    HpzNoSync,
    /// FSDP2's `CPUOffloadPolicy`: fsdp2 with every unit's parameters, gradients and optimizer
    /// state on the host and the step there after the backward (DESIGN §3.13).
    Fsdp2Offload,
    /// DeepSpeed ZeRO-3 with `offload_optimizer`: zero3 with every unit's optimizer state and
    /// master on the host, the step there after the backward (DESIGN §3.13).
    Zero3Offload,
}

impl BaselineKind {
    pub const ALL: [BaselineKind; 6] = [
        BaselineKind::Ddp,
        BaselineKind::Zero2,
        BaselineKind::Fsdp1,
        BaselineKind::Fsdp2,
        BaselineKind::Zero3,
        BaselineKind::BestGrid,
    ];

    /// The baselines that exist only with micro-batches (K ≥ 2): the gradient-sync switches.
    pub const NO_SYNC: [BaselineKind; 2] = [BaselineKind::DdpNoSync, BaselineKind::Fsdp2NoSync];

    /// The baselines that need a topology's groups (DESIGN §3.11): hsdp and hpz, and their
    /// forms that exist only with micro-batches (DESIGN §3.11.1).
    pub const HIERARCHICAL: [BaselineKind; 5] = [
        BaselineKind::Hsdp,
        BaselineKind::HsdpNoSync,
        BaselineKind::HsdpRaOnce,
        BaselineKind::Hpz,
        BaselineKind::HpzNoSync,
    ];

    /// The baselines that offload to the host (DESIGN §3.13).
    pub const OFFLOAD: [BaselineKind; 2] = [BaselineKind::Fsdp2Offload, BaselineKind::Zero3Offload];

    /// The offload baselines `profile` offers (a `[host]`, one micro-batch per step). Kept out of
    /// [`Self::of`], the device-only solve's warm starts: they start the offload MIP instead.
    pub fn offload_of(profile: &Profile) -> Vec<BaselineKind> {
        Self::OFFLOAD
            .into_iter()
            .filter(|kind| kind.unavailable_on(profile).is_none())
            .collect()
    }

    /// The baselines of `profile`: [`Self::ALL`], [`Self::NO_SYNC`] when it has K ≥ 2, and of
    /// [`Self::HIERARCHICAL`] those its topology and micro-batches offer.
    pub fn of(profile: &Profile) -> Vec<BaselineKind> {
        let mut kinds = Self::ALL.to_vec();
        if profile.micro_batches >= 2 {
            kinds.extend(Self::NO_SYNC);
        }
        kinds.extend(
            Self::HIERARCHICAL
                .into_iter()
                .filter(|k| k.unavailable_on(profile).is_none()),
        );
        kinds
    }

    /// Whether the baseline exists only with micro-batches (K ≥ 2): the gradient-sync and
    /// all-reduce switches.
    pub fn needs_micro_batches(self) -> bool {
        self.at_one_micro_batch().is_some()
    }

    /// The baseline a micro-batch form switches from at its last micro-batch (`hsdp-nosync` →
    /// `hsdp`), for the forms that exist only with K ≥ 2; None for every other.
    fn at_one_micro_batch(self) -> Option<BaselineKind> {
        match self {
            BaselineKind::DdpNoSync => Some(BaselineKind::Ddp),
            BaselineKind::Fsdp2NoSync => Some(BaselineKind::Fsdp2),
            BaselineKind::HsdpNoSync | BaselineKind::HsdpRaOnce => Some(BaselineKind::Hsdp),
            BaselineKind::HpzNoSync => Some(BaselineKind::Hpz),
            _ => None,
        }
    }

    /// Why `self` has no plan on `profile` (a requirement the profile does not meet, named with
    /// the way to meet it), or None where it has one: the no-sync and ra-once baselines need
    /// micro-batches, hsdp and hpz (and their forms) a node layout whose world spans nodes, with
    /// its groups' curves (DESIGN §3.11). Every command that takes a baseline by name asks this.
    pub fn unavailable_on(self, profile: &Profile) -> Option<String> {
        let name = self.name();
        if let Some(base) = self.at_one_micro_batch()
            && profile.micro_batches < 2
        {
            let skipped = match self {
                BaselineKind::HsdpRaOnce => "the replica AllReduce can only be deferred",
                _ => "gradient sync can only be skipped",
            };
            return Some(format!(
                "{name}: {skipped} between micro-batches, and the profile has micro_batches = 1 \
                 (`profile analytic --micro-batches K` with K ≥ 2; at K = 1 it is {})",
                base.name()
            ));
        }
        if Self::OFFLOAD.contains(&self) {
            return offload::unavailable_on(name, profile);
        }
        let offered = match self.at_one_micro_batch().unwrap_or(self) {
            BaselineKind::Hsdp => !shard_groups(profile).is_empty(),
            BaselineKind::Hpz => secondary_group(profile).is_some(),
            _ => return None,
        };
        if offered {
            return None;
        }
        let Some(topology) = &profile.topology else {
            return Some(format!(
                "{name} needs a profile with a node layout, a [topology] as `profile analytic \
                 --gpus-per-node G` writes it, and the profile has none"
            ));
        };
        let (world, node) = (profile.world_size, topology.gpus_per_node);
        Some(if world <= node {
            format!(
                "{name} needs a world that spans nodes, and the profile's {world} ranks fit in \
                 one node of {node}"
            )
        } else {
            let groups = match self.at_one_micro_batch().unwrap_or(self) {
                BaselineKind::Hsdp => "a shard group of whole nodes and its replica group",
                _ => "the node group",
            };
            format!(
                "{name} needs the curves of {groups}, as `profile analytic --gpus-per-node G` \
                 writes them, and the profile's [topology] has none"
            )
        })
    }

    /// (a, k) of DESIGN §3.10 as the framework does it by default with several micro-batches:
    /// DDP, FSDP and ZeRO-3 reduce every micro-batch and re-gather; ZeRO-2 keeps its gathered
    /// parameters; the no-sync variants accumulate unsharded gradients. No inner launches.
    pub(super) fn accumulation(self) -> Accumulation {
        let (accumulate, keep) = match self {
            BaselineKind::DdpNoSync
            | BaselineKind::Fsdp2NoSync
            | BaselineKind::HsdpNoSync
            | BaselineKind::HpzNoSync => (true, false),
            BaselineKind::Zero2 => (false, true),
            _ => (false, false),
        };
        Accumulation {
            accumulate,
            keep,
            ..Accumulation::default()
        }
    }

    /// When a shard-group unit all-reduces across replicas (DESIGN §3.11.1): once a step for
    /// `hsdp-ra-once`, after every micro-batch's ReduceScatter for the others.
    pub(super) fn replica_reduce(self) -> ReplicaReduce {
        match self {
            BaselineKind::HsdpRaOnce => ReplicaReduce::Last,
            _ => ReplicaReduce::Every,
        }
    }

    /// The name of the baseline with checkpointing on or off, as tables and reports write it
    /// (`fsdp2`, `fsdp2+ckpt`).
    pub fn label(self, checkpoint: Recompute) -> String {
        let suffix = if checkpoint.is_on() { "+ckpt" } else { "" };
        format!("{}{suffix}", self.name())
    }

    pub fn name(self) -> &'static str {
        match self {
            BaselineKind::Ddp => "ddp",
            BaselineKind::Zero2 => "zero2",
            BaselineKind::Fsdp1 => "fsdp1",
            BaselineKind::Fsdp2 => "fsdp2",
            BaselineKind::Zero3 => "zero3",
            BaselineKind::BestGrid => "best-grid",
            BaselineKind::DdpNoSync => "ddp-nosync",
            BaselineKind::Fsdp2NoSync => "fsdp2-nosync",
            BaselineKind::Hpz => "hpz",
            BaselineKind::Hsdp => "hsdp",
            BaselineKind::HsdpNoSync => "hsdp-nosync",
            BaselineKind::HsdpRaOnce => "hsdp-ra-once",
            BaselineKind::HpzNoSync => "hpz-nosync",
            BaselineKind::Fsdp2Offload => "fsdp2-offload",
            BaselineKind::Zero3Offload => "zero3-offload",
        }
    }
}

impl std::str::FromStr for BaselineKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let every = || {
            Self::ALL
                .into_iter()
                .chain(Self::NO_SYNC)
                .chain(Self::HIERARCHICAL)
                .chain(Self::OFFLOAD)
        };
        every().find(|k| k.name() == s).ok_or_else(|| {
            format!(
                "unknown baseline `{s}` (expected one of: {})",
                every().map(|k| k.name()).collect::<Vec<_>>().join(", ")
            )
        })
    }
}
