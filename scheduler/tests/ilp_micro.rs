//! The micro-batch MIP's optimum (DESIGN §4.8) equals an exhaustive search over every valid
//! schedule of tiny instances with K = 2, 3 and 4 micro-batches (K = 4: one steady micro-batch
//! standing for two): levels, accumulate and keep, recompute on and off, every placement of the
//! step's and the inner boundary's blocks, judged by the simulator alone (which unrolls all K),
//! at caps from infeasible through each plan's peak to loose, tied embeddings on a third.

mod common;

use common::{Rng, every_schedule, launches, placements, random_profile, reported_minimum};
use shardplan_scheduler::Error;
use shardplan_scheduler::ilp::{Objective, SolveOptions, solve};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Accumulation, Launch, Schedule, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::whole_bytes;
use shardplan_scheduler::timeline::{Level, Op, Timeline};
use std::collections::BTreeMap;

/// Every assignment of blocks to `ops`, each op over its whole window (`order`: a forward
/// gather at or after the last reduction block, the step boundary's rule).
fn assignments(
    timeline: Timeline,
    unit: usize,
    nb: u32,
    ops: &[Op],
    order: bool,
) -> Vec<BTreeMap<Op, Vec<Launch>>> {
    let mut all = vec![(BTreeMap::new(), 0usize)];
    for &op in ops {
        let len = timeline.window(unit, op.window_kind()).len;
        let mut next = Vec::new();
        for (chosen, last_reduction) in &all {
            let from = if order && op.is_forward_gather() {
                *last_reduction
            } else {
                0
            };
            for positions in placements(nb, from, len) {
                let mut more: BTreeMap<Op, Vec<Launch>> = chosen.clone();
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

/// Every valid choice for one unit at K ≥ 2.
fn unit_options(profile: &Profile, unit: usize, recompute: bool) -> Vec<UnitSchedule> {
    let timeline = Timeline::new(profile.unit_count());
    let nb = profile.blocks(unit);
    let last = unit + 1 == profile.unit_count();
    let lender = profile.borrower(unit).is_some();
    let mut options = Vec::new();
    for level in Level::ALL {
        if last && level == Level::Fsdp {
            continue;
        }
        for accumulate in [false, true] {
            for keep in [false, true] {
                if keep && (level == Level::None || (lender && level == Level::Fsdp)) {
                    continue;
                }
                let step = assignments(timeline, unit, nb, level.ops(), true);
                let inner = assignments(
                    timeline,
                    unit,
                    nb,
                    &Accumulation {
                        accumulate,
                        keep,
                        ..Accumulation::default()
                    }
                    .inner_ops(level),
                    false,
                );
                for r in [false, true].into_iter().filter(|&r| recompute || !r) {
                    for s in &step {
                        for i in &inner {
                            options.push(UnitSchedule {
                                shard_group: None,
                                secondary_group: None,
                                level,
                                recompute: r,
                                launches: s.clone(),
                                accumulation: Accumulation {
                                    accumulate,
                                    keep,
                                    inner: i.clone(),
                                    ..Accumulation::default()
                                },
                            });
                        }
                    }
                }
            }
        }
    }
    options
}

/// (step time, peak) of every valid schedule.
fn enumerate(profile: &Profile, recompute: bool) -> Vec<(f64, f64)> {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u, recompute))
        .collect();
    let mut results = Vec::new();
    every_schedule(profile, &per_unit, |schedule| {
        let sim = simulate(profile, &schedule, Semantics::Strict);
        results.push((sim.iteration_time_us, sim.peak_memory_bytes));
    });
    results
}

#[test]
fn micro_batch_optimum_equals_exhaustive_search() {
    let (mut solves, mut infeasible, mut schedules, mut memory_solves) = (0, 0, 0, 0);
    for seed in 0..18u64 {
        let mut rng = Rng(seed * 104_729 + 7);
        let units = 1 + (seed % 2) as usize;
        let recompute = seed % 4 < 2;
        let mut profile =
            random_profile(&mut rng, units, if seed % 2 == 0 { 0.0 } else { 0.1 }, 1000);
        profile.micro_batches = [2, 3, 4][(seed % 3) as usize];
        profile.comm_slowdown = if seed % 5 == 4 { 0.3 } else { 0.0 };
        if units == 2 && seed % 3 == 1 {
            profile.units[1].reads_params_of = Some(profile.units[0].name.clone());
        }
        profile.validate("tiny").unwrap();
        let results = enumerate(&profile, recompute);
        schedules += results.len();
        let mut peaks: Vec<f64> = results.iter().map(|r| r.1).collect();
        peaks.sort_by(f64::total_cmp);
        peaks.dedup();
        let mut caps = vec![(peaks[0] * 0.98).floor()];
        for k in [
            0,
            peaks.len() / 3,
            peaks.len() / 2,
            2 * peaks.len() / 3,
            peaks.len() - 1,
        ] {
            caps.push(peaks[k].ceil());
        }
        caps.push((peaks[peaks.len() - 1] * 1.01).ceil());
        // The memory objective: the smallest peak of every schedule, and under a ceiling of the
        // median time the smallest peak of the schedules that meet it.
        let mut times: Vec<f64> = results.iter().map(|r| r.0).collect();
        times.sort_by(f64::total_cmp);
        let ceiling = times[times.len() / 2];
        for max_iteration_time_us in [None, Some(ceiling)] {
            let smallest = results
                .iter()
                .filter(|r| max_iteration_time_us.is_none_or(|t| r.0 <= t))
                .map(|r| r.1)
                .fold(f64::INFINITY, f64::min);
            let options = SolveOptions {
                objective: Objective::Memory {
                    max_iteration_time_us,
                },
                memory_cap_bytes: None,
                relative_gap: 0.0,
                allow_recompute: recompute,
                ..SolveOptions::default()
            };
            let solved = solve(&profile, &options).unwrap();
            let peak = solved.report.objective;
            assert!(
                (peak - smallest).abs() <= 1e-6 * smallest,
                "seed {seed}, ceiling {max_iteration_time_us:?}: the MIP's smallest peak {peak}, the search's {smallest}"
            );
            if max_iteration_time_us.is_none() {
                memory_solves += 1;
            }
        }
        for cap in caps {
            let best = results
                .iter()
                .filter(|r| r.1 <= cap)
                .map(|r| r.0)
                .fold(f64::INFINITY, f64::min);
            let options = SolveOptions {
                memory_cap_bytes: Some(cap as u64),
                relative_gap: 0.0,
                allow_recompute: recompute,
                ..SolveOptions::default()
            };
            solves += 1;
            let what = format!("seed {seed}, K = {}, cap {cap}", profile.micro_batches);
            match solve(&profile, &options) {
                Ok(solved) => {
                    let t = solved.report.objective;
                    assert!(
                        (t - best).abs() <= 1e-6 * best,
                        "{what}: the MIP found {t}, the search {best}"
                    );
                    assert!(
                        solved.simulation.peak_memory_bytes <= cap,
                        "{what}: over the cap"
                    );
                }
                Err(Error::Infeasible(message)) => {
                    infeasible += 1;
                    assert!(
                        best.is_infinite(),
                        "{what}: infeasible, but the search found {best}"
                    );
                    // It names the smallest feasible cap, the smallest peak of every schedule.
                    let named = reported_minimum(&message);
                    assert_eq!(named, whole_bytes(peaks[0]), "{what}: {message}");
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
    println!("{solves} solves ({infeasible} infeasible) over {schedules} schedules");
    assert!(memory_solves == 18);
    assert!(infeasible >= 18 && solves > 100);
}

/// Checks the MIP's rows read at `schedule` against the simulator: the step time, and slot by
/// slot the memory of the first, steady and last micro-batch; false where the MIP cannot express
/// the schedule (a group of ranks it does not offer).
fn rows_equal_the_simulator(profile: &Profile, schedule: &Schedule, what: &str) -> bool {
    let Some((time, memory)) = shardplan_scheduler::ilp::micro_rows_at(profile, schedule) else {
        return false;
    };
    let sim = simulate(profile, schedule, Semantics::Strict);
    common::close(time, sim.iteration_time_us, &format!("{what}: step time"));
    let width = 2 * profile.unit_count() + 1;
    let k = profile.micro_batches as usize;
    let simulated = [0, 1, k - 1];
    for (s, m) in memory.iter().enumerate() {
        let mb = if memory.len() == 2 * width {
            [0, k - 1][s / width]
        } else {
            simulated[s / width]
        };
        let slot = &sim.slots[mb * width + s % width];
        common::close(
            *m,
            slot.memory_bytes,
            &format!("{what}: memory of {}", slot.label()),
        );
    }
    true
}

/// The MIP's rows read at any schedule give the simulator's step time and, slot by slot, its
/// memory (the first, steady and last micro-batch of the simulator's K), on random profiles and
/// plans with random accumulate and keep.
#[test]
fn micro_batch_rows_equal_the_simulator() {
    let mut rng = Rng(2026);
    for case in 0..300 {
        let mut profile = random_profile(&mut rng, 1 + case % 4, 0.2, 5000);
        profile.micro_batches = [2, 3, 5][case % 3];
        if profile.unit_count() >= 2 && case % 4 == 1 {
            let (first, last) = (profile.units[0].name.clone(), profile.unit_count() - 1);
            profile.units[last].reads_params_of = Some(first);
        }
        let schedule = common::random_schedule(&mut rng, &profile);
        let what = format!("case {case}, K = {}", profile.micro_batches);
        assert!(
            rows_equal_the_simulator(&profile, &schedule, &what),
            "{what}"
        );
    }
}

/// The same on nodes (DESIGN §3.11.1, §4.8): random hierarchical plans — shard groups with the
/// replica AllReduce every micro-batch or once, hpz, accumulate and keep — on random profiles
/// with a topology, tied embeddings on a quarter, the MIP's rows equal to the simulator's step
/// and every class slot's memory wherever it offers the plan's groups.
#[test]
fn micro_batch_rows_equal_the_simulator_on_nodes() {
    let mut rng = Rng(6301);
    let (mut checked, mut over_shard_groups, mut hpz) = (0, 0, 0);
    for case in 0..400 {
        let mut profile = random_profile(&mut rng, 2 + case % 3, 0.2, 5000);
        profile.comm_slowdown = [0.0, 0.3][case % 2];
        if !common::with_topology(&mut rng, &mut profile) {
            continue;
        }
        profile.micro_batches = [2, 3, 5][case % 3];
        if case % 4 == 1 {
            let (first, last) = (profile.units[0].name.clone(), profile.unit_count() - 1);
            profile.units[last].reads_params_of = Some(first);
        }
        let schedule = common::random_schedule(&mut rng, &profile);
        let what = format!("case {case}, K = {}", profile.micro_batches);
        if rows_equal_the_simulator(&profile, &schedule, &what) {
            checked += 1;
            let units = schedule.units();
            over_shard_groups += usize::from(units.iter().any(|u| u.shard_group.is_some()));
            hpz += usize::from(units.iter().any(|u| u.secondary_group.is_some()));
        }
    }
    eprintln!("{checked} plans checked, {over_shard_groups} over a shard group, {hpz} with hpz");
    assert!(
        checked >= 100 && over_shard_groups >= 30 && hpz >= 30,
        "{checked} plans checked, {over_shard_groups} over a shard group, {hpz} with hpz"
    );
}
