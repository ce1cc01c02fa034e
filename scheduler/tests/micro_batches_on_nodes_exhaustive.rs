//! The whole plan space of K ≥ 2 micro-batches on nodes (DESIGN §3.11.1, the space of §4.8's one
//! model for every K), enumerated exhaustively on a tiny instance: every level (none, sdp, fsdp,
//! hpz) over every group of ranks the space offers (the world, the node's shard group), every
//! accumulate, keep and replica_reduce, recompute on and off, every placement of the step's and
//! the inner boundary's blocks, judged by the simulator alone (which unrolls all K). The
//! micro-batch MIP's optimum equals the enumeration's at every cap, infeasible ones included,
//! and its smallest peak the smallest of every schedule.

mod common;

use common::{every_schedule, launches, placements};
use shardplan_scheduler::Error;
use shardplan_scheduler::groups::{secondary_group, shard_groups};
use shardplan_scheduler::ilp::{Objective, SolveOptions, solve};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Accumulation, Launch, ReplicaReduce, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::{Level, Op, Timeline};
use std::collections::BTreeMap;

/// The first two units of `common::three_units_on_two_nodes` (N = 4 on nodes of 2) at K
/// micro-batches, u2 reading u1's parameters where `tied`: u1 may be fsdp and keep a secondary
/// shard of H = 2 (its window after B1 is one slot, too short for a shard group); u2, the last
/// unit, may shard over the node's group of S = 2 (its window holds RS, RA and a gather) but not
/// be fsdp. The third unit would multiply the space by about 1,900 placements.
fn two_units_on_two_nodes(micro_batches: u32, tied: bool) -> Profile {
    let mut p = common::three_units_on_two_nodes();
    p.units.truncate(2);
    p.micro_batches = micro_batches;
    if tied {
        p.units[1].reads_params_of = Some(p.units[0].name.clone());
    }
    p.validate("two units on two nodes").unwrap();
    p
}

/// A unit's choices across micro-batches (DESIGN §3.10, §3.11.1): accumulate, keep, and where it
/// reduces every micro-batch over a shard group, when its replica AllReduce runs.
#[derive(Clone, Copy)]
struct MicroChoice {
    accumulate: bool,
    keep: bool,
    replica_reduce: ReplicaReduce,
}

/// Every (accumulate, keep, replica_reduce) a unit at `level` over a shard group (`over_shard`)
/// or the world may take: keep only where sharded and not at fsdp for a `lender` of its
/// parameters, `last` only over a shard group without accumulating.
fn micro_choices(level: Level, over_shard: bool, lender: bool) -> Vec<MicroChoice> {
    let can_keep = level == Level::Sdp || (level == Level::Fsdp && !lender);
    let mut all = Vec::new();
    for accumulate in [false, true] {
        for keep in [false, true].into_iter().filter(|&k| !k || can_keep) {
            let reduces_every_micro_batch = over_shard && !accumulate;
            for replica_reduce in [ReplicaReduce::Every, ReplicaReduce::Last]
                .into_iter()
                .filter(|&r| r == ReplicaReduce::Every || reduces_every_micro_batch)
            {
                all.push(MicroChoice {
                    accumulate,
                    keep,
                    replica_reduce,
                });
            }
        }
    }
    all
}

/// Every assignment of one block per unit to `ops`, each over its window: a reduction over a
/// shard group whose replica AllReduce follows it (`followed`) one position short of its end;
/// with `gap` (the step boundary) a forward gather at least `gap` positions after the last
/// reduction block (0 over the world, 2 over a shard group: RS, RA, then the gather).
fn assignments(
    timeline: Timeline,
    (unit, nb): (usize, u32),
    ops: &[Op],
    (followed, gap): (bool, Option<usize>),
) -> Vec<BTreeMap<Op, Vec<Launch>>> {
    let mut all = vec![(BTreeMap::new(), 0usize)];
    for &op in ops {
        let len = timeline.window(unit, op.window_kind()).len;
        let short = usize::from(followed && op == Op::ReduceScatter);
        let mut next = Vec::new();
        for (chosen, last_reduction) in &all {
            let from = match gap {
                Some(gap) if op.is_forward_gather() => *last_reduction + gap,
                _ => 0,
            };
            for positions in placements(nb, from.min(len), len - short) {
                let mut more = chosen.clone();
                more.insert(op, launches(timeline, unit, op, &positions));
                let last = if op.is_reduction() {
                    positions[positions.len() - 1]
                } else {
                    *last_reduction
                };
                next.push((more, last));
            }
        }
        all = next;
    }
    all.into_iter().map(|(a, _)| a).collect()
}

/// Every valid choice of one unit at K ≥ 2 on nodes.
fn unit_options(profile: &Profile, unit: usize) -> Vec<UnitSchedule> {
    let timeline = Timeline::new(profile.unit_count());
    let nb = profile.blocks(unit);
    let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len;
    let can_fsdp = timeline.window(unit, Op::GatherBackward.window_kind()).len > 0;
    // (level, shard group, secondary group): none; sdp and fsdp over the world and each shard
    // group whose window holds RS, RA and a gather; hpz where a smaller secondary group exists.
    let mut levels = vec![(Level::None, None, None)];
    let shards = std::iter::once(None).chain(
        shard_groups(profile)
            .into_iter()
            .filter(|_| after >= 3)
            .map(Some),
    );
    for shard in shards {
        let ranks = shard.unwrap_or(profile.world_size);
        levels.push((Level::Sdp, shard, None));
        if can_fsdp {
            levels.push((Level::Fsdp, shard, None));
            if let Some(h) = secondary_group(profile).filter(|&h| h < ranks) {
                levels.push((Level::Fsdp, shard, Some(h)));
            }
        }
    }
    let mut options = Vec::new();
    for (level, shard_group, secondary) in levels {
        let over_shard = shard_group.is_some();
        let step_gap = if over_shard { 2 } else { 0 };
        let step = assignments(
            timeline,
            (unit, nb),
            level.ops(),
            (over_shard, Some(step_gap)),
        );
        let lender = profile.borrower(unit).is_some();
        for choice in micro_choices(level, over_shard, lender) {
            let accumulation = Accumulation {
                accumulate: choice.accumulate,
                keep: choice.keep,
                replica_reduce: choice.replica_reduce,
                inner: BTreeMap::new(),
            };
            // The inner RS's replica AllReduce follows it only where it runs every micro-batch.
            let followed = over_shard && choice.replica_reduce == ReplicaReduce::Every;
            let inner = assignments(
                timeline,
                (unit, nb),
                &accumulation.inner_ops(level),
                (followed, None),
            );
            for recompute in [false, true] {
                for s in &step {
                    for i in &inner {
                        options.push(UnitSchedule {
                            level,
                            recompute,
                            launches: s.clone(),
                            accumulation: Accumulation {
                                inner: i.clone(),
                                ..accumulation.clone()
                            },
                            shard_group,
                            secondary_group: secondary,
                        });
                    }
                }
            }
        }
    }
    options
}

/// (step time, peak, whether a unit is over a shard or secondary group) of every valid schedule.
fn enumerate(profile: &Profile) -> Vec<(f64, f64, bool)> {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u))
        .collect();
    let mut results = Vec::new();
    every_schedule(profile, &per_unit, |schedule| {
        let hierarchical = schedule
            .units()
            .iter()
            .any(|u| u.shard_group.is_some() || u.secondary_group.is_some());
        let sim = simulate(profile, &schedule, Semantics::Strict);
        results.push((sim.iteration_time_us, sim.peak_memory_bytes, hierarchical));
    });
    results
}

/// The fastest step of the schedules peaking within `cap`, and whether every schedule over the
/// world alone is slower (the optimum needs a shard or secondary group).
fn fastest_within(results: &[(f64, f64, bool)], cap: f64) -> (f64, bool) {
    let fastest = |hierarchical_too: bool| {
        results
            .iter()
            .filter(|r| r.1 <= cap && (hierarchical_too || !r.2))
            .map(|r| r.0)
            .fold(f64::INFINITY, f64::min)
    };
    let best = fastest(true);
    (best, fastest(false) > best * (1.0 + 1e-9))
}

/// The MIP's optimum against the enumeration at caps from infeasible through every eighth of
/// the peaks to the largest, and its smallest peak; returns (caps solved, caps whose optimum
/// needs a group, infeasible caps, schedules).
fn check_against_exhaustive_search(profile: &Profile) -> (usize, usize, usize, usize) {
    let results = enumerate(profile);
    let mut peaks: Vec<f64> = results.iter().map(|r| r.1).collect();
    peaks.sort_by(f64::total_cmp);
    peaks.dedup();
    let mut caps = vec![(peaks[0] * 0.98).floor()];
    caps.extend(
        (0..=8)
            .map(|k| peaks[k * (peaks.len() - 1) / 8].ceil())
            .collect::<Vec<_>>(),
    );
    let (mut solved_caps, mut infeasible, mut hierarchical_optima) = (0, 0, 0);
    for cap in caps {
        let (best, hierarchical) = fastest_within(&results, cap);
        let options = SolveOptions {
            memory_cap_bytes: Some(cap as u64),
            relative_gap: 0.0,
            ..SolveOptions::default()
        };
        match solve(profile, &options) {
            Ok(solved) => {
                solved_caps += 1;
                let t = solved.simulation.iteration_time_us;
                assert!(
                    solved.simulation.peak_memory_bytes <= cap,
                    "cap {cap}: the answer peaks over the cap"
                );
                assert!(
                    (t - best).abs() <= 1e-6 * best,
                    "cap {cap}: the MIP found {t} µs, the search {best} µs"
                );
                hierarchical_optima += usize::from(hierarchical);
            }
            Err(Error::Infeasible(_)) => {
                infeasible += 1;
                assert!(
                    best.is_infinite(),
                    "cap {cap}: infeasible, the space has {best} µs"
                );
            }
            Err(e) => panic!("cap {cap}: {e}"),
        }
    }
    // The memory objective: the smallest peak of every schedule.
    let smallest = peaks[0];
    let options = SolveOptions {
        objective: Objective::Memory {
            max_iteration_time_us: None,
        },
        memory_cap_bytes: None,
        relative_gap: 0.0,
        ..SolveOptions::default()
    };
    let peak = solve(profile, &options).unwrap().report.objective;
    assert!(
        (peak - smallest).abs() <= 1e-6 * smallest,
        "the MIP's smallest peak {peak}, the search's {smallest}"
    );
    (solved_caps, hierarchical_optima, infeasible, results.len())
}

#[test]
fn micro_batch_optimum_on_nodes_equals_exhaustive_search() {
    // K = 2; K = 4, one steady micro-batch standing for two; K = 3 with u2 tied to u1.
    for (k, tied) in [(2, false), (4, false), (3, true)] {
        let profile = two_units_on_two_nodes(k, tied);
        let (solved, hierarchical, infeasible, schedules) =
            check_against_exhaustive_search(&profile);
        eprintln!(
            "K = {k}, tied {tied}: {schedules} schedules; {solved} caps solved ({hierarchical} \
             with a hierarchical optimum only), {infeasible} infeasible"
        );
        assert!(infeasible >= 1 && solved >= 8, "K = {k}");
        assert!(
            hierarchical >= 1,
            "K = {k}: the instance exercises the groups"
        );
    }
}
