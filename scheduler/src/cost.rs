//! The cost model of DESIGN §3, shared by the simulator, the baselines and the ILP: bytes and
//! time of a block, compute time of a slot, persistent bytes of a unit.

use crate::profile::{CommCurves, Link, Profile};
use crate::schedule::{Recompute, Schedule, UnitSchedule};
use crate::timeline::{Level, Op, Timeline};

/// Interference in a slot (DESIGN §3.4): compute c beside communication-stream work takes
/// c + L, where L = Σ κ_c,op·(each kind of collective's time) + κ_u·(optimizer steps' time); that
/// work beside compute takes Q + κ_q·c (κ_q ≤ 1, so a slot without communication is never
/// stretched by it). κ_q = 0 and κ_u = κ_c,op = κ_c is the one-sided model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interference {
    /// κ_c: compute µs lost per µs of concurrent AllReduces.
    pub compute: f64,
    /// κ_c,RS: compute µs lost per µs of concurrent ReduceScatters.
    pub reduce_scatter: f64,
    /// κ_c,AG: compute µs lost per µs of concurrent AllGathers.
    pub all_gather: f64,
    /// κ_q: communication-stream µs lost per µs of concurrent compute.
    pub comm: f64,
    /// κ_u: compute µs lost per µs of a concurrent optimizer step (on the communication stream).
    pub update: f64,
}

impl Interference {
    /// The profile's factors (κ_c,RS, κ_c,AG and κ_u default to κ_c where it leaves them out).
    pub fn of(profile: &Profile) -> Interference {
        Interference {
            compute: profile.overlap_slowdown,
            reduce_scatter: profile
                .overlap_slowdown_reduce_scatter
                .unwrap_or(profile.overlap_slowdown),
            all_gather: profile
                .overlap_slowdown_all_gather
                .unwrap_or(profile.overlap_slowdown),
            comm: profile.comm_slowdown,
            update: profile.update_slowdown.unwrap_or(profile.overlap_slowdown),
        }
    }

    /// κ_c for every collective alike, κ_q and κ_u.
    pub fn uniform(compute: f64, comm: f64, update: f64) -> Interference {
        Interference {
            compute,
            reduce_scatter: compute,
            all_gather: compute,
            comm,
            update,
        }
    }

    /// d = max(c + L, Q + κ_q·c): a strict slot's duration from its compute c, its
    /// communication-stream time Q and the compute load L of that work.
    pub fn slot_duration(self, compute_us: f64, comm_us: f64, load_us: f64) -> f64 {
        (compute_us + load_us).max(comm_us + self.comm * compute_us)
    }

    /// How much longer each block of a slot takes beside the slot's compute: (Q + κ_q·c)/Q.
    pub fn comm_stretch(self, compute_us: f64, comm_us: f64) -> f64 {
        if comm_us > 0.0 {
            1.0 + self.comm * compute_us / comm_us
        } else {
            1.0
        }
    }

    /// κ_c,op: the compute a µs of `op`'s collective costs beside it.
    pub fn collective(self, op: Op) -> f64 {
        match op {
            Op::AllReduce | Op::ReplicaAllReduce => self.compute,
            Op::ReduceScatter => self.reduce_scatter,
            Op::Gather | Op::GatherForward | Op::GatherBackward => self.all_gather,
        }
    }

    /// L of one block of `op`: κ_c,op·t_op + κ_u·upd, the compute it costs the slot it runs in.
    pub fn load_us(self, op: Op, block: BlockTime) -> f64 {
        self.collective(op) * block.collective_us + self.update * block.update_us
    }
}

/// One block's time on the communication stream: the collective's, and the share of the unit's
/// optimizer step that follows a reduction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockTime {
    pub collective_us: f64,
    pub update_us: f64,
}

impl BlockTime {
    pub fn total_us(self) -> f64 {
        self.collective_us + self.update_us
    }
}

/// Bytes of one block of `op` for unit `unit`: Ψ'_i·g/nb_i for reductions, Ψ'_i·p/nb_i for
/// gathers (Ψ'_i/nb_i = [`Profile::block_params`], the block with its padding).
pub fn block_bytes(profile: &Profile, unit: usize, op: Op) -> f64 {
    let per_param = if op.is_reduction() {
        profile.bytes_per_param.grad
    } else {
        profile.bytes_per_param.param
    };
    (profile.block_params(unit) * per_param) as f64
}

/// The ranks a collective runs among (DESIGN §3.11): the world; a shard group of S ranks; the
/// replica group of N/S ranks across nodes (the reduced shard's AllReduce); an hpZ unit's
/// secondary group of H ranks inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Among {
    World,
    Shard(u32),
    Replica(u32),
    Secondary(u32),
}

impl Among {
    /// Where `op` of a unit sharded over `shard` ranks (None: the world) with secondary group
    /// `secondary` runs: AR among the world; RA across the replica group; an hpZ unit's backward
    /// gather inside its H ranks; every other collective in the shard group.
    pub fn of(op: Op, world: u32, shard: Option<u32>, secondary: Option<u32>) -> Among {
        let in_shard = shard.map_or(Among::World, Among::Shard);
        match (op, secondary) {
            (Op::AllReduce, _) => Among::World,
            (Op::ReplicaAllReduce, _) => Among::Replica(world / shard.unwrap_or(world)),
            (Op::GatherBackward, Some(h)) => Among::Secondary(h),
            _ => in_shard,
        }
    }

    /// The link the collective runs over: a group inside one node on the intra link, one that
    /// spans nodes on the inter link (without a topology every collective is among the world,
    /// on one link).
    pub fn link(self, profile: &Profile) -> Link {
        let ranks = match self {
            Among::World => profile.world_size,
            Among::Shard(r) | Among::Replica(r) | Among::Secondary(r) => r,
        };
        match (self, &profile.topology) {
            (Among::Replica(_), _) => Link::Inter,
            (_, Some(t)) => Link::of_group(ranks, t.gpus_per_node),
            (_, None) => Link::Inter,
        }
    }

    /// The time curves of the group (a validated schedule only names groups the profile has).
    fn curves(self, profile: &Profile) -> &CommCurves {
        let group = match self {
            Among::World => return &profile.comm,
            Among::Shard(r) | Among::Replica(r) | Among::Secondary(r) => r,
        };
        profile
            .topology
            .as_ref()
            .and_then(|t| t.curves(group, self.link(profile)))
            .expect("a group is offered only where the topology has its curves")
    }

    /// The ranks the unit's state is sharded over: S in a shard or replica group's op, else N.
    fn shard_ranks(self, world: u32) -> u32 {
        match self {
            Among::Shard(s) => s,
            Among::Replica(r) => world / r,
            Among::World | Among::Secondary(_) => world,
        }
    }
}

/// t_op(bytes) and upd_op of one block for unit `unit`, its collective among `among`. A unit's
/// optimizer step follows its last reduction block on the communication stream, in equal shares
/// over that reduction's blocks: upd = o_i/nb_i after an AllReduce (the whole unit),
/// o_i/(S·nb_i) after the ReduceScatter of a unit sharded over S ranks, or after its replica
/// AllReduce where it has one (then the ReduceScatter carries none); gathers carry none. The
/// replica AllReduce moves the reduced shard, Ψ'_i·g/(nb_i·S) bytes.
pub fn block_time(profile: &Profile, unit: usize, op: Op, among: Among) -> BlockTime {
    let blocks = f64::from(profile.blocks(unit));
    let optimizer_us = profile.units[unit].optimizer_us;
    let comm = among.curves(profile);
    let shard = f64::from(among.shard_ranks(profile.world_size));
    let replicated = matches!(among, Among::Shard(_));
    let (curve, update_us, bytes) = match op {
        Op::AllReduce => (&comm.all_reduce, optimizer_us / blocks, 1.0),
        Op::ReduceScatter if replicated => (&comm.reduce_scatter, 0.0, 1.0),
        Op::ReduceScatter => (&comm.reduce_scatter, optimizer_us / (blocks * shard), 1.0),
        Op::ReplicaAllReduce => (
            &comm.all_reduce,
            optimizer_us / (blocks * shard),
            1.0 / shard,
        ),
        Op::Gather | Op::GatherForward | Op::GatherBackward => (&comm.all_gather, 0.0, 1.0),
    };
    BlockTime {
        collective_us: curve.time_us(block_bytes(profile, unit, op) * bytes),
        update_us,
    }
}

/// t_op(bytes(b)) + upd_op: time of one block of `op` for unit `unit` among the world.
pub fn block_time_us(profile: &Profile, unit: usize, op: Op) -> f64 {
    block_time(profile, unit, op, Among::World).total_us()
}

/// Where `op` of the unit scheduled as `u` runs.
pub fn among(profile: &Profile, u: &UnitSchedule, op: Op) -> Among {
    Among::of(op, profile.world_size, u.shard_group, u.secondary_group)
}

/// c_s: f_i at F_i (f^c_i with recompute), b_i (+ f'_i with recompute) at B_i, the extra time
/// at E.
pub fn compute_us(
    profile: &Profile,
    timeline: Timeline,
    slot: usize,
    recompute: impl Fn(usize) -> bool,
) -> f64 {
    let Some(unit) = timeline.compute_unit(slot) else {
        return profile.iteration_extra_us;
    };
    let (u, recomputed) = (&profile.units[unit], recompute(unit));
    match (slot == timeline.forward(unit), recomputed) {
        (true, false) => u.forward_us,
        (true, true) => u.checkpointed_forward_time_us(),
        (false, false) => u.backward_us,
        (false, true) => u.backward_us + u.recompute_time_us(),
    }
}

/// c̄_s: the most compute slot `slot` can take, with or without its unit's recompute (each slot's
/// compute depends on one unit's r_i alone).
pub fn most_compute_us(profile: &Profile, timeline: Timeline, slot: usize) -> f64 {
    [false, true]
        .map(|recomputed| compute_us(profile, timeline, slot, |_| recomputed))
        .into_iter()
        .fold(0.0, f64::max)
}

/// saved_i: the bytes a unit keeps from F_i to B_i, its activations or (recomputed) its
/// checkpoint (DESIGN §3.5).
pub fn saved_bytes(profile: &Profile, unit: usize, recompute: Recompute) -> f64 {
    let p = &profile.units[unit];
    match recompute {
        Recompute::On => p.checkpoint_activation_bytes as f64,
        Recompute::Off => p.activation_bytes as f64,
    }
}

/// The secondary shard an hpZ unit keeps from F_i to B_i (DESIGN §3.11): Ψ'_i·p/H.
pub fn secondary_shard_bytes(profile: &Profile, unit: usize, h: u32) -> f64 {
    (profile.laid_out_params(unit) * profile.bytes_per_param.param) as f64 / f64::from(h)
}

/// The device memory of the communicators `schedule` uses (DESIGN §3.11): the profile's
/// `communicator_bytes` for the world's, for each distinct shard group size's two (its shard and
/// replica groups) and each distinct secondary group size's; 0 without a topology.
pub fn communicator_bytes(profile: &Profile, schedule: &Schedule) -> f64 {
    let Some(topology) = &profile.topology else {
        return 0.0;
    };
    let units = schedule.units();
    let shards: std::collections::BTreeSet<u32> =
        units.iter().filter_map(|u| u.shard_group).collect();
    let secondaries: std::collections::BTreeSet<u32> =
        units.iter().filter_map(|u| u.secondary_group).collect();
    let count = 1 + 2 * shards.len() + secondaries.len();
    topology.communicator_bytes as f64 * count as f64
}

/// persistent_i: Ψ'_i(p+g+o), divided by N when sharded (Ψ'_i = [`Profile::laid_out_params`]).
pub fn persistent_bytes(profile: &Profile, unit: usize, level: Level) -> f64 {
    persistent_bytes_over(profile, unit, level, None)
}

/// persistent_i of a unit sharded over `shard` ranks (None: the world): Ψ'_i(p+g+o)/S.
pub fn persistent_bytes_over(
    profile: &Profile,
    unit: usize,
    level: Level,
    shard: Option<u32>,
) -> f64 {
    let b = profile.bytes_per_param;
    let full = (profile.laid_out_params(unit) * (b.param + b.grad + b.optimizer)) as f64;
    match level {
        Level::None => full,
        Level::Sdp | Level::Fsdp => full / f64::from(shard.unwrap_or(profile.world_size)),
    }
}
