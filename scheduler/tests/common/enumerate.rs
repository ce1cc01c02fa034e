//! The exhaustive searches' plan spaces on tiny instances: block placements, their launches,
//! every valid choice for one unit, and every schedule made of one choice per unit.

use super::valid_shard_groups;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Schedule, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use std::collections::BTreeMap;

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

/// (iteration time, peak) of every valid schedule that `admit` admits (a window limit's
/// `WindowLimits::admit`; the fixtures do not name the ILP, which the runtime's tests build
/// without).
pub fn enumerate_plans(
    profile: &Profile,
    recompute: bool,
    admit: &dyn Fn(&Schedule) -> bool,
) -> Vec<(f64, f64)> {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u, recompute))
        .collect();
    let mut results = Vec::new();
    every_schedule(profile, &per_unit, |schedule| {
        if admit(&schedule) {
            let sim = simulate(profile, &schedule, Semantics::Strict);
            results.push((sim.iteration_time_us, sim.peak_memory_bytes));
        }
    });
    results
}

/// Whole-byte caps: below the smallest peak, between distinct peaks (tight above the smallest, a
/// third and two thirds up), above the largest, and on peaks themselves (the smallest, the
/// median, the largest, rounded up to a byte: a plan peaking exactly at the cap fits).
pub fn caps(results: &[(f64, f64)]) -> Vec<f64> {
    let mut peaks: Vec<f64> = results.iter().map(|r| r.1).collect();
    peaks.sort_by(f64::total_cmp);
    peaks.dedup_by(|a, b| (*a - *b).abs() < 1e-3);
    let between = |k: usize| ((peaks[k] + peaks[k + 1]) / 2.0).floor();
    let mut caps = vec![(peaks[0] * 0.98).floor()];
    if peaks.len() > 1 {
        let last = peaks.len() - 2;
        caps.extend([between(0), between(last / 3), between(2 * last / 3)]);
    }
    caps.push((peaks[peaks.len() - 1] * 1.01 + 1.0).floor());
    let on = [0, peaks.len() / 2, peaks.len() - 1].map(|k| peaks[k].ceil());
    caps.extend(on);
    caps.sort_by(f64::total_cmp);
    caps.dedup();
    caps
}

/// The shortest iteration among `results` (time, peak) whose peak fits `cap`; ∞ when none does.
pub fn fastest_within(results: &[(f64, f64)], cap: f64) -> f64 {
    results
        .iter()
        .filter(|r| r.1 <= cap)
        .map(|r| r.0)
        .fold(f64::INFINITY, f64::min)
}
