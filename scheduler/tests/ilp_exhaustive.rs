//! The ILP's optimum equals an exhaustive search over every valid schedule of tiny instances
//! (≤ 3 units, ≤ 2 blocks per unit, N ∈ {2, 4, 8}, κ_c ∈ {0, 0.1}, κ_q ∈ {0, 0.3}, recompute on
//! and off), at caps from infeasible through tight to loose, at caps equal (to the byte, rounded
//! up) to plans' peaks (among them the fastest hpz plan's where a topology offers hpz), without a
//! cap, and at the smallest feasible cap an infeasible solve reports. The search judges schedules
//! with the simulator only. (The ILP's bounds against the same search: `ilp_exhaustive_bounds`.)

mod common;

use common::{
    Rng, caps, enumerate_plans, every_schedule, fastest_within, random_profile, reported_minimum,
    unit_options, valid_shard_groups, with_topology,
};
use shardplan_scheduler::Error;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::ilp::{Objective, SolveOptions, WindowLimits, solve};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::whole_bytes;
use shardplan_scheduler::timeline::Timeline;
use std::num::NonZeroUsize;

/// The peak of the fastest schedule with an hpz unit (DESIGN §3.11), if any: a cap where hpz
/// may be the optimum.
fn fastest_hpz_peak(profile: &Profile, recompute: bool) -> Option<f64> {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u, recompute))
        .collect();
    let mut best: Option<(f64, f64)> = None;
    every_schedule(profile, &per_unit, |schedule| {
        if schedule.units().iter().any(|u| u.secondary_group.is_some()) {
            let sim = simulate(profile, &schedule, Semantics::Strict);
            let key = (sim.iteration_time_us, sim.peak_memory_bytes);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
    });
    best.map(|(_, peak)| peak.ceil())
}

#[test]
fn ilp_optimum_equals_exhaustive_search() {
    let mut instances = 0;
    let mut solves = 0;
    let mut infeasible = 0;
    let mut schedules = 0;
    let mut tied = 0;
    let mut hierarchical = 0;
    let mut hpz_chosen = 0;
    let mut hsdp_chosen = 0;
    for seed in 0..36u64 {
        let mut rng = Rng(seed * 7919 + 1);
        let units = 1 + (seed % 3) as usize;
        let kappa = if seed % 2 == 0 { 0.0 } else { 0.1 };
        let recompute = seed % 4 < 2;
        // Up to 1000 parameters: at most 2 blocks per unit.
        let mut profile = random_profile(&mut rng, units, kappa, 1000);
        // Communication slowed by compute too, on a third of the instances. Across those
        // thirds, on a third of each (`seed / 3`), optimizer steps slowing compute by their own
        // factor, with compute long enough that slots carrying them are compute-bound.
        profile.comm_slowdown = if seed % 3 == 2 { 0.3 } else { 0.0 };
        if (seed / 3) % 3 == 0 {
            profile.update_slowdown = Some(0.7);
            for unit in &mut profile.units {
                unit.optimizer_us *= 5.0;
                unit.forward_us *= 10.0;
                unit.backward_us *= 10.0;
            }
        }
        // The last unit reads the first's parameters (a tied head) on a third of the others.
        if units > 1 && seed % 3 == 1 {
            profile.units[units - 1].reads_params_of = Some(profile.units[0].name.clone());
            tied += 1;
        }
        // Nodes, a second link and hpz (DESIGN §3.11) on three quarters of the worlds of 4 and 8
        // ranks.
        if (seed / 2) % 4 != 3 && with_topology(&mut rng, &mut profile) {
            hierarchical += 1;
        }
        let results = enumerate_plans(&profile, recompute, &|s| WindowLimits::FULL.admit(s));
        instances += 1;
        schedules += results.len();
        // Without a cap: the fastest schedule of all.
        let fastest = fastest_within(&results, f64::INFINITY);
        let uncapped = SolveOptions {
            memory_cap_bytes: None,
            relative_gap: 0.0,
            allow_recompute: recompute,
            two_phase: false,
            ..SolveOptions::default()
        };
        let t = solve(&profile, &uncapped).unwrap().report.objective;
        assert!(
            (t - fastest).abs() <= 1e-6 * fastest,
            "seed {seed} uncapped: ILP {t}, exhaustive {fastest}"
        );
        let mut caps = caps(&results);
        caps.extend(fastest_hpz_peak(&profile, recompute));
        for cap in caps {
            let best = fastest_within(&results, cap);
            let options = SolveOptions {
                memory_cap_bytes: Some(cap as u64),
                relative_gap: 0.0,
                allow_recompute: recompute,
                two_phase: false,
                objective: Objective::Time,
                ..SolveOptions::default()
            };
            solves += 1;
            match solve(&profile, &options) {
                Ok(solved) => {
                    let t = solved.report.objective;
                    assert!(
                        (t - solved.simulation.iteration_time_us).abs() <= 1e-6 * t,
                        "objective vs simulation"
                    );
                    let units = solved.schedule.units();
                    hpz_chosen += usize::from(units.iter().any(|u| u.secondary_group.is_some()));
                    hsdp_chosen += usize::from(units.iter().any(|u| u.shard_group.is_some()));
                    assert!(
                        (t - best).abs() <= 1e-6 * best,
                        "seed {seed} cap {cap}: ILP {t}, exhaustive {best} ({} schedules)",
                        results.len()
                    );
                    assert!(
                        solved.simulation.peak_memory_bytes <= cap,
                        "seed {seed}: peak over cap"
                    );
                }
                Err(Error::Infeasible(msg)) => {
                    infeasible += 1;
                    assert!(
                        best.is_infinite(),
                        "seed {seed} cap {cap}: ILP says infeasible ({msg}), exhaustive finds {best}"
                    );
                    let smallest = results.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
                    assert!(
                        msg.contains(&format!("({} bytes)", whole_bytes(smallest))),
                        "seed {seed}: {msg} (smallest peak {smallest})"
                    );
                    // Given back, the reported minimum is feasible and gives its optimum.
                    let minimum = reported_minimum(&msg);
                    let at_minimum = fastest_within(&results, minimum as f64);
                    let solved = solve(
                        &profile,
                        &SolveOptions {
                            memory_cap_bytes: Some(minimum),
                            ..options.clone()
                        },
                    )
                    .unwrap_or_else(|e| panic!("seed {seed}: the reported minimum {minimum}: {e}"));
                    let t = solved.report.objective;
                    assert!(
                        (t - at_minimum).abs() <= 1e-6 * at_minimum,
                        "seed {seed} at the reported minimum {minimum}: ILP {t}, exhaustive {at_minimum}"
                    );
                }
                Err(e) => panic!("seed {seed} cap {cap}: {e}"),
            }
        }
    }
    eprintln!(
        "{instances} instances ({tied} tied, {hierarchical} on nodes), {schedules} schedules enumerated, {solves} solves ({hpz_chosen} optima with hpz, {hsdp_chosen} with a shard group), {infeasible} infeasible caps"
    );
    assert!(
        instances >= 30
            && tied >= 6
            && hierarchical >= 6
            && hpz_chosen >= 2
            && hsdp_chosen >= 5
            && infeasible >= instances
            && solves >= 5 * instances,
        "{instances} instances, {solves} solves, {infeasible} infeasible"
    );
}

/// For every baseline plan P (checkpointing off and on) of random small profiles, a solve capped
/// at P's peak (rounded up to a byte) finds a plan at least as fast as P.
#[test]
fn a_cap_equal_to_a_baselines_peak_admits_that_baseline() {
    let mut checked = 0;
    for seed in 0..12u64 {
        let mut rng = Rng(seed * 104729 + 3);
        let profile = random_profile(
            &mut rng,
            2 + (seed % 3) as usize,
            0.05 * (seed % 2) as f64,
            4000,
        );
        for kind in BaselineKind::ALL {
            for checkpoint in [Recompute::Off, Recompute::On] {
                let Ok(plan) = baseline(&profile, kind, checkpoint, None) else {
                    continue;
                };
                let cap = whole_bytes(plan.simulation.peak_memory_bytes);
                let options = SolveOptions {
                    memory_cap_bytes: Some(cap),
                    relative_gap: 0.0,
                    objective: Objective::Time,
                    ..SolveOptions::default()
                };
                let solved = solve(&profile, &options).unwrap_or_else(|e| {
                    panic!(
                        "seed {seed} {} (ckpt {checkpoint:?}) at its peak {cap}: {e}",
                        kind.name()
                    )
                });
                let (t, p) = (solved.report.objective, plan.simulation.iteration_time_us);
                assert!(
                    t <= p * (1.0 + 1e-9),
                    "seed {seed} {} (ckpt {checkpoint:?}) at its peak {cap}: ILP {t} > baseline {p}",
                    kind.name()
                );
                assert!(solved.simulation.peak_memory_bytes <= cap as f64);
                checked += 1;
            }
        }
    }
    assert!(checked >= 100, "{checked} baseline plans checked");
}

/// A solve limited to window depth 1 returns a plan within depth 1 — never a warm start (a
/// baseline launching its gathers earlier) from outside the limit — and says so.
#[test]
fn a_limited_search_returns_a_plan_within_its_limit() {
    for seed in 0..40u64 {
        let mut rng = Rng(seed * 15485863 + 5);
        let profile = random_profile(&mut rng, 4, 0.0, 40_000);
        // At fsdp2's peak its plan (gathers prefetched one slot early) is a warm start.
        let fsdp2 = baseline(&profile, BaselineKind::Fsdp2, Recompute::Off, None).unwrap();
        let options = SolveOptions {
            memory_cap_bytes: Some(whole_bytes(fsdp2.simulation.peak_memory_bytes)),
            limits: WindowLimits::depth(NonZeroUsize::MIN),
            ..SolveOptions::default()
        };
        let solved = solve(&profile, &options).unwrap();
        assert_eq!(solved.report.window_depth, options.limits, "seed {seed}");
        let timeline = Timeline::new(profile.unit_count());
        for (unit, u) in solved.schedule.units().iter().enumerate() {
            for (op, launches) in &u.launches {
                let window = timeline.window(unit, op.window_kind());
                for launch in launches {
                    let pos = window.position(launch.slot).unwrap();
                    let inside = if op.is_reduction() {
                        pos == 0
                    } else {
                        pos + 1 == window.len
                    };
                    assert!(
                        inside,
                        "seed {seed}: unit {unit} {op:?} at {} outside depth 1",
                        launch.slot
                    );
                }
            }
        }
    }
}

/// Gathers and reductions limited separately (either alone, or both at different depths): the
/// limited solve's optimum equals the best plan an exhaustive search finds within the same
/// limits, at caps across the limited space's peaks; the returned plan lies within them; and
/// where the limited space has no plan under the cap, the error says so and names its
/// smallest cap, which is feasible when given back.
#[test]
fn separately_limited_solves_equal_exhaustive_search_of_the_limited_space() {
    let depth = |d: usize| NonZeroUsize::new(d);
    let limits = [
        (depth(1), None),
        (None, depth(1)),
        (depth(1), depth(2)),
        (depth(2), depth(1)),
    ]
    .map(|(gather, reduce)| WindowLimits { gather, reduce });
    let mut solves = 0;
    for seed in 0..16u64 {
        let mut rng = Rng(seed * 104729 + 3);
        let units = 2 + (seed % 2) as usize;
        let mut profile = random_profile(&mut rng, units, 0.1 * (seed % 2) as f64, 1000);
        if seed % 3 == 0 {
            with_topology(&mut rng, &mut profile);
        }
        let limits = limits[(seed % 4) as usize];
        let full = enumerate_plans(&profile, true, &|s| WindowLimits::FULL.admit(s));
        let results = enumerate_plans(&profile, true, &|s| limits.admit(s));
        assert!(
            results.len() < full.len(),
            "seed {seed}: {limits} limits nothing"
        );
        let mut caps = caps(&results);
        caps.extend(fastest_hpz_peak(&profile, true));
        for cap in caps {
            let best = fastest_within(&results, cap);
            let options = SolveOptions {
                memory_cap_bytes: Some(cap as u64),
                relative_gap: 0.0,
                two_phase: false,
                limits,
                ..SolveOptions::default()
            };
            solves += 1;
            match solve(&profile, &options) {
                Ok(solved) => {
                    let t = solved.report.objective;
                    assert!(
                        (t - best).abs() <= 1e-6 * best,
                        "seed {seed} {limits} cap {cap}: ILP {t}, exhaustive {best}"
                    );
                    assert!(
                        limits.admit(&solved.schedule),
                        "seed {seed}: outside {limits}"
                    );
                    assert_eq!(solved.report.window_depth, limits);
                }
                Err(Error::Infeasible(msg)) => {
                    assert!(
                        best.is_infinite(),
                        "seed {seed} {limits} cap {cap}: ILP infeasible ({msg}), exhaustive {best}"
                    );
                    assert!(
                        msg.contains(&format!("no plan within {limits} fits")),
                        "{msg}"
                    );
                    let minimum = reported_minimum(&msg);
                    let given_back = SolveOptions {
                        memory_cap_bytes: Some(minimum),
                        ..options.clone()
                    };
                    solve(&profile, &given_back).unwrap_or_else(|e| {
                        panic!("seed {seed} {limits}: the reported minimum {minimum}: {e}")
                    });
                }
                Err(e) => panic!("seed {seed} {limits} cap {cap}: {e}"),
            }
        }
    }
    assert!(solves >= 80, "{solves} solves");
}

/// Shard groups of several nodes (MiCS, DESIGN §3.11): on tiny worlds of 4 nodes of 2 ranks
/// (S ∈ {2, 4}) and 6 nodes of 2 (S ∈ {2, 4, 6}: a group of 3 nodes) the ILP offers every group of
/// whole nodes a plan may name, and its optimum equals the exhaustive search over every valid
/// plan at every cap — among them caps where only a group of several nodes gives the optimum
/// (no plan over the node, the world or none is as fast), and the peak of the fastest such plan.
#[test]
fn groups_of_several_nodes_are_in_the_ilps_space() {
    let (mut solves, mut needed, mut chosen) = (0, 0, 0);
    for seed in 0..12u64 {
        let mut rng = Rng(seed * 6271 + 5);
        let units = 2 + (seed % 2) as usize;
        let mut profile = random_profile(&mut rng, units, 0.1 * (seed % 2) as f64, 1000);
        profile.world_size = if seed % 3 == 2 { 12 } else { 8 };
        profile.comm_slowdown = if seed % 4 == 3 { 0.3 } else { 0.0 };
        common::with_nodes(&mut rng, &mut profile, 2);
        let groups = valid_shard_groups(&profile);
        let expected: &[u32] = if profile.world_size == 12 {
            &[2, 4, 6]
        } else {
            &[2, 4]
        };
        assert_eq!(groups, expected, "seed {seed}: the valid shard groups");
        assert_eq!(shardplan_scheduler::groups::shard_groups(&profile), groups);
        let recompute = seed % 2 == 0;
        let per_unit: Vec<Vec<UnitSchedule>> = (0..units)
            .map(|u| unit_options(&profile, u, recompute))
            .collect();
        // (time, peak, over a group of several nodes) of every valid plan.
        let mut plans = Vec::new();
        every_schedule(&profile, &per_unit, |schedule| {
            let several = schedule.units().iter().any(|u| u.shard_group > Some(2));
            let sim = simulate(&profile, &schedule, Semantics::Strict);
            plans.push((sim.iteration_time_us, sim.peak_memory_bytes, several));
        });
        let every: Vec<(f64, f64)> = plans.iter().map(|p| (p.0, p.1)).collect();
        let within_a_node: Vec<(f64, f64)> =
            plans.iter().filter(|p| !p.2).map(|p| (p.0, p.1)).collect();
        let fastest_several = plans
            .iter()
            .filter(|p| p.2)
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut caps = caps(&every);
        caps.extend(fastest_several.map(|p| p.1.ceil()));
        for cap in caps {
            let best = fastest_within(&every, cap);
            needed += usize::from(best < fastest_within(&within_a_node, cap) * (1.0 - 1e-9));
            let options = SolveOptions {
                memory_cap_bytes: Some(cap as u64),
                relative_gap: 0.0,
                allow_recompute: recompute,
                two_phase: false,
                ..SolveOptions::default()
            };
            solves += 1;
            match solve(&profile, &options) {
                Ok(solved) => {
                    let t = solved.report.objective;
                    let sim = &solved.simulation;
                    assert!(
                        (t - sim.iteration_time_us).abs() <= 1e-6 * t,
                        "seed {seed} cap {cap}: objective {t}, simulation {}",
                        sim.iteration_time_us
                    );
                    assert!(
                        (t - best).abs() <= 1e-6 * best,
                        "seed {seed} cap {cap}: ILP {t}, exhaustive {best} ({} plans)",
                        plans.len()
                    );
                    assert!(sim.peak_memory_bytes <= cap, "seed {seed}: peak over cap");
                    let units = solved.schedule.units();
                    chosen += usize::from(units.iter().any(|u| u.shard_group > Some(2)));
                }
                Err(Error::Infeasible(msg)) => assert!(
                    best.is_infinite(),
                    "seed {seed} cap {cap}: ILP infeasible ({msg}), exhaustive {best}"
                ),
                Err(e) => panic!("seed {seed} cap {cap}: {e}"),
            }
        }
    }
    eprintln!(
        "{solves} solves, {needed} caps whose optimum needs a group of several nodes, {chosen} \
         ILP optima over one"
    );
    assert!(
        solves >= 60 && needed >= 3 && chosen >= needed,
        "{solves} solves, {needed} caps needing a group of several nodes, {chosen} chosen"
    );
}
