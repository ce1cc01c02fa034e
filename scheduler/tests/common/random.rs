//! Random instances from a seed: the generator, profiles, topologies and schedules.

use super::{UnitSpec, affine, profile};
use shardplan_scheduler::profile::{CommCurves, GroupCurves, Link, Profile, Topology};
use shardplan_scheduler::schedule::Schedule;
use std::collections::BTreeMap;

/// SplitMix64: a tiny deterministic generator for building random instances from a seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// A random profile of `units` units with parameter counts in 100..=`max_params` (B = 1000
/// bytes, p = g = 2: up to ceil(2·max_params/1000) blocks per unit).
pub fn random_profile(rng: &mut Rng, units: usize, kappa: f64, max_params: u64) -> Profile {
    let specs: Vec<UnitSpec> = (0..units)
        .map(|_| {
            let f = rng.range(1, 100) as f64;
            let act = rng.range(100, 6000);
            (
                rng.range(100, max_params),
                f,
                2.0 * f,
                act,
                act / rng.range(2, 10),
                rng.range(0, 500),
                rng.range(0, 500),
            )
        })
        .collect();
    let n = [2, 4, 8][rng.range(0, 2) as usize];
    let mut curve = || affine(rng.range(1, 30) as f64, rng.range(5, 50) as f64);
    let (all_gather, reduce_scatter, all_reduce) = (curve(), curve(), curve());
    let mut profile = profile(
        n,
        1000,
        kappa,
        rng.range(0, 20) as f64,
        (2, 2, 12),
        &specs,
        all_gather,
        reduce_scatter,
        all_reduce,
    );
    // Optimizer steps, carried by the reductions' blocks; recomputations that do half to all of
    // the forward's work, or (absent) all of it.
    for unit in &mut profile.units {
        unit.optimizer_us = rng.range(0, 40) as f64;
        if rng.coin() {
            unit.recompute_us = Some(unit.forward_us * rng.range(50, 100) as f64 / 100.0);
        }
    }
    // Each kind of collective's own κ_c, around κ_c (or, absent, κ_c itself).
    if kappa > 0.0 && rng.coin() {
        profile.overlap_slowdown_reduce_scatter = Some(kappa * rng.range(50, 200) as f64 / 100.0);
        profile.overlap_slowdown_all_gather = Some(kappa * rng.range(50, 200) as f64 / 100.0);
    }
    // Checkpointed forwards 80–120% of the plain one (a cache-hot workspace can make them
    // faster), or (absent) the plain one.
    for unit in &mut profile.units {
        if rng.coin() {
            unit.checkpointed_forward_us =
                Some(unit.forward_us * rng.range(80, 120) as f64 / 100.0);
        }
    }
    profile
}

/// Puts a random world of N ≥ 4 ranks on nodes of G = 2 or N/2 ranks (DESIGN §3.11): every
/// group the plan space offers, with affine curves — inside a node mostly faster than the
/// world's, as NVLink is than a NIC; across nodes around the world's — and a random communicator
/// size. False, leaving the profile as it is, for N < 4 (a node of one rank has no group).
pub fn with_topology(rng: &mut Rng, profile: &mut Profile) -> bool {
    let n = profile.world_size;
    if n < 4 {
        return false;
    }
    let g = if rng.coin() { 2 } else { n / 2 };
    with_nodes(rng, profile, g);
    true
}

/// A tiny instance of the exhaustive tests' kinds, varied by `seed` and drawn from `rng`: 1–3
/// units (≤ 1,000 parameters), κ_c 0 or 0.1, κ_q 0.3 on a third, nodes with shard groups and hpz
/// on a quarter of the others; and whether recompute is allowed (on half).
pub fn tiny_instance(seed: u64, mut rng: Rng) -> (Profile, bool) {
    let units = 1 + (seed % 3) as usize;
    let mut profile = random_profile(&mut rng, units, 0.1 * (seed % 2) as f64, 1000);
    profile.comm_slowdown = if seed % 3 == 2 { 0.3 } else { 0.0 };
    if (seed / 2) % 2 == 1 {
        with_topology(&mut rng, &mut profile);
    }
    (profile, seed % 4 < 2)
}

/// Puts the profile's world on nodes of `g` ranks (`g` divides N): every group the plan space
/// offers (`offered_groups`), with [`with_topology`]'s random curves and communicator size.
pub fn with_nodes(rng: &mut Rng, profile: &mut Profile, g: u32) {
    use shardplan_scheduler::profile::offered_groups;
    let n = profile.world_size;
    let groups = offered_groups(n, g)
        .into_iter()
        .map(|group| {
            let mut curve = || match group.link {
                Link::Intra => affine(rng.range(1, 10) as f64, rng.range(20, 2000) as f64),
                Link::Inter => affine(rng.range(1, 30) as f64, rng.range(5, 50) as f64),
            };
            let comm = CommCurves {
                all_gather: curve(),
                reduce_scatter: curve(),
                all_reduce: curve(),
            };
            GroupCurves {
                ranks: group.ranks,
                link: group.link,
                comm,
            }
        })
        .collect();
    profile.topology = Some(Topology {
        gpus_per_node: g,
        groups,
        communicator_bytes: rng.range(0, 100),
    });
}

/// Every shard group S < N a plan may name for a sharded unit of `profile`: each S that
/// `groups::check` (the plan's validation) accepts, whatever the ILP offers.
pub fn valid_shard_groups(profile: &Profile) -> Vec<u32> {
    use shardplan_scheduler::groups::{UnitGroups, check};
    use shardplan_scheduler::timeline::Level;
    (2..profile.world_size)
        .filter(|&s| {
            let groups = UnitGroups {
                level: Level::Sdp,
                shard_group: Some(s),
                secondary_group: None,
            };
            check(profile, groups).is_ok()
        })
        .collect()
}

/// A random valid schedule: random levels (the last unit never fsdp), recompute flags, and
/// each op's blocks spread over random slots of its window, reductions before gathers; with
/// micro-batches, random accumulate and keep, and the inner boundary's ops spread over their
/// whole windows (no order rule there; a shard-group unit's inner RS short of the last slot
/// where its replica AllReduce follows it, and a random `ReplicaReduce` where it reduces every
/// micro-batch).
pub fn random_schedule(rng: &mut Rng, profile: &Profile) -> Schedule {
    use shardplan_scheduler::schedule::{Accumulation, Launch, ReplicaReduce, UnitSchedule};
    use shardplan_scheduler::timeline::{Level, Op, Timeline};
    let l = profile.unit_count();
    let timeline = Timeline::new(l);
    let spread = |rng: &mut Rng,
                  nb: u32,
                  positions: std::ops::RangeInclusive<usize>,
                  op: Op,
                  unit: usize| {
        let window = timeline.window(unit, op.window_kind());
        let mut counts = BTreeMap::new();
        for _ in 0..nb {
            let pos = rng.range(*positions.start() as u64, *positions.end() as u64) as usize;
            *counts.entry(window.slot_at(pos)).or_insert(0u32) += 1;
        }
        counts
            .into_iter()
            .map(|(slot, blocks)| Launch { slot, blocks })
            .collect::<Vec<_>>()
    };
    let units = (0..l)
        .map(|unit| {
            let level = match rng.range(0, if unit + 1 == l { 1 } else { 2 }) {
                0 => Level::None,
                1 => Level::Sdp,
                _ => Level::Fsdp,
            };
            let nb = profile.blocks(unit);
            let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len - 1;
            // Over a shard group (DESIGN §3.11), RA follows each RS block a slot later and the
            // gathers come a slot after that.
            let shards = shardplan_scheduler::groups::shard_groups(profile);
            let shard_group =
                (level != Level::None && after >= 2 && !shards.is_empty() && rng.coin())
                    .then(|| shards[rng.range(0, shards.len() as u64 - 1) as usize]);
            let gap = if shard_group.is_some() { 2 } else { 0 };
            let boundary = rng.range(0, (after - gap) as u64) as usize;
            let mut launches = BTreeMap::new();
            for &op in level.ops() {
                let positions = match op {
                    Op::AllReduce => 0..=after,
                    Op::ReduceScatter => 0..=boundary,
                    Op::Gather | Op::GatherForward => boundary + gap..=after,
                    Op::GatherBackward => 0..=timeline.window(unit, op.window_kind()).len - 1,
                    Op::ReplicaAllReduce => unreachable!("RA follows RS; no level lists it"),
                };
                launches.insert(op, spread(rng, nb, positions, op, unit));
            }
            let mut accumulation = Accumulation::default();
            if profile.micro_batches >= 2 {
                accumulation.accumulate = rng.coin();
                let kept_fsdp_lender = level == Level::Fsdp && profile.borrower(unit).is_some();
                accumulation.keep = level != Level::None && !kept_fsdp_lender && rng.coin();
                if shard_group.is_some() && !accumulation.accumulate && rng.coin() {
                    accumulation.replica_reduce = ReplicaReduce::Last;
                }
                let followed =
                    shard_group.is_some() && accumulation.replica_reduce == ReplicaReduce::Every;
                for op in accumulation.inner_ops(level) {
                    let len = timeline.window(unit, op.window_kind()).len;
                    let last = if op == Op::ReduceScatter && followed {
                        len - 2
                    } else {
                        len - 1
                    };
                    let positions = 0..=last;
                    let spread = spread(rng, nb, positions, op, unit);
                    accumulation.inner.insert(op, spread);
                }
            }
            let secondary = shardplan_scheduler::groups::secondary_group(profile)
                .filter(|&h| h < shard_group.unwrap_or(profile.world_size));
            let secondary_group = secondary.filter(|_| level == Level::Fsdp && rng.coin());
            UnitSchedule {
                shard_group,
                secondary_group,
                level,
                recompute: rng.coin(),
                launches,
                accumulation,
            }
        })
        .collect();
    Schedule::new(profile, units).expect("generated schedules are valid")
}
