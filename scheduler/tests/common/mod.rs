//! Test fixtures: tiny profiles with affine collective curves, plans written as TOML text, random
//! profiles and schedules, and the zoo's analytic profiles. The root crate's tests include this
//! file too (`tests/common`).
#![allow(dead_code)]

pub mod offload;

use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::{
    BytesPerParam, CommCurves, GroupCurves, Link, Profile, Topology, UnitProfile,
};
use shardplan_scheduler::schedule::Schedule;
use std::collections::BTreeMap;

/// One unit: (params, forward µs, backward µs, act, ckpt, ws_f, ws_b).
pub type UnitSpec = (u64, f64, f64, u64, u64, u64, u64);

/// The repository's root (this file is compiled from the root crate and from the scheduler's).
pub fn repo_root() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if dir.join("models").is_dir() {
        dir.to_path_buf()
    } else {
        dir.join("..")
    }
}

/// The analytic profile of zoo model `name` on 64 H100s on one link (`profile analytic --flat`:
/// the library builds no topology unless asked, and these tests check the flat model).
pub fn zoo_profile(name: &str) -> Profile {
    let path = repo_root().join(format!("models/{name}.toml"));
    analytic_profile(
        &ModelSpec::load(&path).unwrap(),
        &Catalog::bundled().unwrap(),
        &AnalyticOptions::new("h100-sxm", 64),
    )
    .unwrap()
}

/// A curve with t(bytes) = latency + bytes / bytes_per_us (exact for any message of ≥ 1 byte).
pub fn affine(latency_us: f64, bytes_per_us: f64) -> CommCurve {
    let far = 1u64 << 40;
    CommCurve {
        points: vec![
            (1, latency_us + 1.0 / bytes_per_us),
            (far, latency_us + far as f64 / bytes_per_us),
        ],
    }
}

/// Builds a valid profile.
#[allow(clippy::too_many_arguments)]
pub fn profile(
    world_size: u32,
    block_size_bytes: u64,
    overlap_slowdown: f64,
    iteration_extra_us: f64,
    bytes_per_param: (u64, u64, u64),
    units: &[UnitSpec],
    all_gather: CommCurve,
    reduce_scatter: CommCurve,
    all_reduce: CommCurve,
) -> Profile {
    let profile = Profile {
        schema: 1,
        name: "test".into(),
        source: BTreeMap::new(),
        world_size,
        block_size_bytes,
        overlap_slowdown,
        overlap_slowdown_reduce_scatter: None,
        overlap_slowdown_all_gather: None,
        comm_slowdown: 0.0,
        update_slowdown: None,
        iteration_extra_us,
        bytes_per_param: BytesPerParam {
            param: bytes_per_param.0,
            grad: bytes_per_param.1,
            optimizer: bytes_per_param.2,
        },
        micro_batches: 1,
        shard_quantum_params: 1,
        units: units
            .iter()
            .enumerate()
            .map(|(k, &(params, f, b, act, ckpt, wsf, wsb))| UnitProfile {
                name: format!("u{}", k + 1),
                params,
                forward_us: f,
                checkpointed_forward_us: None,
                backward_us: b,
                recompute_us: None,
                optimizer_us: 0.0,
                activation_bytes: act,
                checkpoint_activation_bytes: ckpt,
                forward_workspace_bytes: wsf,
                backward_workspace_bytes: wsb,
                reads_params_of: None,
            })
            .collect(),
        comm: CommCurves {
            all_gather,
            reduce_scatter,
            all_reduce,
        },
        topology: None,
        host: None,
    };
    profile.validate("test profile").unwrap();
    profile
}

/// A plan file for `profile` whose `[[units]]` tables are `units_toml`.
pub fn plan_toml(profile: &Profile, units_toml: &str) -> String {
    format!(
        "schema = 1\nprofile_digest = \"{}\"\nworld_size = {}\nmicro_batches = {}\n\n\
         [producer]\nname = \"hand\"\n\n[predicted]\niteration_time_us = 0.0\n\
         peak_memory_bytes = 0\npeak_slot = \"E\"\n\n{units_toml}",
        profile.digest(),
        profile.world_size,
        profile.micro_batches
    )
}

/// Parses and validates a plan written as TOML.
pub fn schedule(profile: &Profile, units_toml: &str) -> shardplan_scheduler::Result<Schedule> {
    let plan: Plan =
        shardplan_scheduler::io::parse_toml(&plan_toml(profile, units_toml), "test plan")?;
    plan.schedule(profile, "test plan")
}

/// Asserts two floats agree to 1e-9 relative.
pub fn close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{what}: got {actual}, expected {expected}"
    );
}

/// Asserts a simulation's iteration time and its slots' durations (in slot order), and that the
/// durations sum to the time.
pub fn check(sim: &shardplan_scheduler::sim::Simulation, time: f64, durations: &[f64]) {
    close(sim.iteration_time_us, time, "iteration time");
    for (s, d) in sim.slots.iter().zip(durations) {
        close(s.duration_us, *d, &format!("duration of {}", s.slot));
    }
    close(
        sim.slots.iter().map(|s| s.duration_us).sum(),
        time,
        "sum of slot durations",
    );
}

/// Asserts a simulation's per-slot memory (in slot order) and the slot of its peak.
pub fn check_memory(sim: &shardplan_scheduler::sim::Simulation, memory: &[f64], peak_slot: &str) {
    for (s, m) in sim.slots.iter().zip(memory) {
        close(s.memory_bytes, *m, &format!("memory of {}", s.slot));
    }
    assert_eq!(sim.peak_slot.to_string(), peak_slot);
}

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

/// Every way to put `nb` blocks (1 or 2) on the window positions `from..len`, as sorted position
/// lists (the exhaustive searches' tiny instances).
pub fn placements(nb: u32, from: usize, len: usize) -> Vec<Vec<usize>> {
    match nb {
        1 => (from..len).map(|p| vec![p]).collect(),
        2 => (from..len)
            .flat_map(|a| (a..len).map(move |b| vec![a, b]))
            .collect(),
        _ => unreachable!("tiny instances have at most 2 blocks per unit"),
    }
}

/// The launches of blocks at window `positions` of `op` of `unit`, one per slot.
pub fn launches(
    timeline: shardplan_scheduler::timeline::Timeline,
    unit: usize,
    op: shardplan_scheduler::timeline::Op,
    positions: &[usize],
) -> Vec<shardplan_scheduler::schedule::Launch> {
    let window = timeline.window(unit, op.window_kind());
    let mut counts = BTreeMap::new();
    for &p in positions {
        *counts.entry(window.slot_at(p)).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .map(|(slot, blocks)| shardplan_scheduler::schedule::Launch { slot, blocks })
        .collect()
}

/// Every schedule made of one option per unit (`per_unit[u]`: the options of unit u), each
/// handed to `visit`.
pub fn every_schedule(
    profile: &Profile,
    per_unit: &[Vec<shardplan_scheduler::schedule::UnitSchedule>],
    mut visit: impl FnMut(Schedule),
) {
    let mut index = vec![0usize; per_unit.len()];
    loop {
        let units = index
            .iter()
            .zip(per_unit)
            .map(|(&k, o)| o[k].clone())
            .collect();
        visit(Schedule::new(profile, units).expect("enumerated options are valid"));
        let mut u = 0;
        loop {
            if u == index.len() {
                return;
            }
            index[u] += 1;
            if index[u] < per_unit[u].len() {
                break;
            }
            index[u] = 0;
            u += 1;
        }
    }
}

/// The smallest feasible cap an infeasible solve names: `(N bytes)`.
pub fn reported_minimum(message: &str) -> u64 {
    let end = message
        .find(" bytes)")
        .expect("the message names a cap in bytes");
    let start = message[..end].rfind('(').expect("an opening parenthesis") + 1;
    message[start..end]
        .parse()
        .expect("a whole number of bytes")
}

/// Three units, N = 4 on nodes of 2: u1 Ψ 400, f 10, b 20, act 1000; u2 Ψ 200, f 20, b 40, act
/// 2000; u3 Ψ 100, f 5, b 10, act 500; p = g = 2, o = 4, κ = 0.
/// World curves: AG 10 + B/10, RS 5 + B/20; the node group of 2: AG 2 + B/100, RS 1 + B/100; the
/// replica group of 2 across nodes: AR 3 + B/10. 100 bytes per communicator.
pub fn three_units_on_two_nodes() -> Profile {
    let mut p = profile(
        4,
        1 << 20,
        0.0,
        0.0,
        (2, 2, 4),
        &[
            (400, 10.0, 20.0, 1000, 100, 0, 0),
            (200, 20.0, 40.0, 2000, 200, 0, 0),
            (100, 5.0, 10.0, 500, 50, 0, 0),
        ],
        affine(10.0, 10.0),
        affine(5.0, 20.0),
        affine(1.0, 1.0),
    );
    p.topology = Some(Topology {
        gpus_per_node: 2,
        groups: vec![
            GroupCurves {
                ranks: 2,
                link: Link::Intra,
                comm: CommCurves {
                    all_gather: affine(2.0, 100.0),
                    reduce_scatter: affine(1.0, 100.0),
                    all_reduce: affine(1.0, 1.0),
                },
            },
            GroupCurves {
                ranks: 2,
                link: Link::Inter,
                comm: CommCurves {
                    all_gather: affine(1.0, 1.0),
                    reduce_scatter: affine(1.0, 1.0),
                    all_reduce: affine(3.0, 10.0),
                },
            },
        ],
        communicator_bytes: 100,
    });
    p
}

/// Every valid choice for one unit (the exhaustive tests' enumeration, `ilp_exhaustive`,
/// `ilp_anatomy`).
pub fn unit_options(
    profile: &Profile,
    unit: usize,
    recompute: bool,
) -> Vec<shardplan_scheduler::schedule::UnitSchedule> {
    use shardplan_scheduler::groups::secondary_group;
    use shardplan_scheduler::schedule::UnitSchedule;
    use shardplan_scheduler::timeline::{Level, Op, Timeline};
    let timeline = Timeline::new(profile.unit_count());
    let nb = profile.blocks(unit);
    let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len;
    let between = timeline.window(unit, Op::GatherBackward.window_kind()).len;
    let mut options = Vec::new();
    for r in if recompute {
        vec![false, true]
    } else {
        vec![false]
    } {
        for ar in placements(nb, 0, after) {
            let launches =
                BTreeMap::from([(Op::AllReduce, launches(timeline, unit, Op::AllReduce, &ar))]);
            options.push(UnitSchedule {
                shard_group: None,
                secondary_group: None,
                level: Level::None,
                recompute: r,
                launches,
                accumulation: Default::default(),
            });
        }
        // Sharded over the world, and over every shard group a plan may name (DESIGN §3.11),
        // whatever the ILP offers: RA a slot after each RS block, the gathers a slot after the
        // last RA.
        let shards = std::iter::once(None).chain(valid_shard_groups(profile).into_iter().map(Some));
        for shard in shards.filter(|s| s.is_none() || after >= 3) {
            let gap = if shard.is_some() { 2 } else { 0 };
            let ranks = shard.unwrap_or(profile.world_size);
            // fsdp, and hpz where the topology offers a smaller secondary group.
            let secondary = secondary_group(profile).filter(|&h| h < ranks);
            let groups: Vec<Option<u32>> =
                std::iter::once(None).chain(secondary.map(Some)).collect();
            for rs in placements(nb, 0, after - gap / 2) {
                for ag in placements(nb, 0, after)
                    .into_iter()
                    .filter(|ag| ag[0] >= *rs.last().unwrap() + gap)
                {
                    let sdp = BTreeMap::from([
                        (
                            Op::ReduceScatter,
                            launches(timeline, unit, Op::ReduceScatter, &rs),
                        ),
                        (Op::Gather, launches(timeline, unit, Op::Gather, &ag)),
                    ]);
                    options.push(UnitSchedule {
                        shard_group: shard,
                        secondary_group: None,
                        level: Level::Sdp,
                        recompute: r,
                        launches: sdp,
                        accumulation: Default::default(),
                    });
                    for (agb, &h) in placements(nb, 0, between)
                        .iter()
                        .flat_map(|agb| groups.iter().map(move |h| (agb, h)))
                    {
                        let fsdp = BTreeMap::from([
                            (
                                Op::ReduceScatter,
                                launches(timeline, unit, Op::ReduceScatter, &rs),
                            ),
                            (
                                Op::GatherForward,
                                launches(timeline, unit, Op::GatherForward, &ag),
                            ),
                            (
                                Op::GatherBackward,
                                launches(timeline, unit, Op::GatherBackward, agb),
                            ),
                        ]);
                        options.push(UnitSchedule {
                            shard_group: shard,
                            secondary_group: h,
                            level: Level::Fsdp,
                            recompute: r,
                            launches: fsdp,
                            accumulation: Default::default(),
                        });
                    }
                }
            }
        }
    }
    options
}
