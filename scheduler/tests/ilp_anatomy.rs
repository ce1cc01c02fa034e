//! The full-window LP relaxation read back (`ilp::full_lp_anatomy`, DESIGN §4.5 "what the gap is
//! made of"): held to a plan's levels its optimum bounds every plan of those levels from below
//! (exhaustive enumeration of tiny instances), and on the demo it says where the gap lives.

mod common;

use common::{Rng, every_schedule, tiny_instance, unit_options};
use shardplan_scheduler::ilp::{
    HeldLevels, LpAnatomy, SolveOptions, Target, describe_levels, full_lp_anatomy,
    lp_relaxation_bound,
};
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::Level;
use std::collections::BTreeMap;
use std::path::Path;

fn print(what: &str, a: &LpAnatomy) {
    eprintln!(
        "{what}: bound {:.1} ms (full LP: {}), restricted LP {:.1} ms, {:.1} s; {} units with \
         fractional levels, {} with fractional recompute (Σr = {:.3}); launches {} nonzero, {} \
         fractional; {} binding memory rows; placed: {:?} ms, recompute free: {:?} ms, among the LP's levels: {:?} ms (LP iterations {:?})",
        a.bound_us / 1e3,
        a.full_lp,
        a.restricted_us / 1e3,
        a.seconds,
        a.fractional_levels(),
        a.fractional_recompute(),
        a.recompute.iter().sum::<f64>(),
        a.launches.0,
        a.launches.1,
        a.binding_memory.len(),
        a.placed_us.map(|t| t / 1e3),
        a.placed_recompute_free_us.map(|t| t / 1e3),
        a.placed_among_lp_us.map(|t| t / 1e3),
        a.placement_iterations,
    );
    for (i, (levels, r)) in a.levels.iter().zip(&a.recompute).enumerate() {
        eprintln!("  unit {i}: {} r {r:.3}", describe_levels(levels));
    }
    for (s, activity, dual) in &a.binding_memory {
        eprintln!("  memory slot {s}: activity {activity:.6} dual {dual:.1}");
    }
}

/// The demo's full-window LP, free, at the plan in `SHARDPLAN_ANATOMY_PLAN` (a `solve` of the
/// demo) and at its own rounded levels. Run by hand:
/// `SHARDPLAN_ANATOMY_PLAN=plan.toml cargo test --release -p shardplan-scheduler --test
/// ilp_anatomy demo -- --ignored --nocapture`.
#[test]
#[ignore = "a diagnosis of the demo (tens of seconds), run by hand"]
fn demo_anatomy() {
    let root = common::repo_root();
    let profile = Profile::load(&root.join("profiles/llama2-70b-h100-8x8.toml")).unwrap();
    let options = SolveOptions {
        memory_cap_bytes: Some(85_523_536_281),
        time_limit_s: 600.0,
        ..SolveOptions::default()
    };
    let free = full_lp_anatomy(&profile, &options, HeldLevels::Free)
        .unwrap()
        .unwrap();
    print("free", &free);
    if let Ok(path) = std::env::var("SHARDPLAN_ANATOMY_PLAN") {
        let plan = Plan::load(Path::new(&path)).unwrap();
        let schedule = plan.schedule(&profile, &path).unwrap();
        match full_lp_anatomy(&profile, &options, HeldLevels::OfPlan(&schedule)).unwrap() {
            Some(a) => print("at the plan's levels", &a),
            None => eprintln!("at the plan's levels: no bound"),
        }
    }
    for (what, held) in [
        ("rounded", HeldLevels::RoundedLp),
        ("spread", HeldLevels::SpreadLp),
    ] {
        match full_lp_anatomy(&profile, &options, held).unwrap() {
            Some(a) => print(&format!("at the LP's {what} levels"), &a),
            None => eprintln!("at the LP's {what} levels: no bound (they do not fit)"),
        }
    }
}

/// The demo's LP over the fsdp2 space (`--target fsdp2`, DESIGN §4.9): free, and held to the
/// levels of the plan in `SHARDPLAN_ANATOMY_PLAN` (a `solve --target fsdp2` of the demo), each
/// bound at most the plan's time (docs/fsdp2-export.md has the figures). Run by hand:
/// `SHARDPLAN_ANATOMY_PLAN=plan.toml cargo test --release -p shardplan-scheduler --test
/// ilp_anatomy fsdp2 -- --ignored --nocapture`.
#[test]
#[ignore = "a diagnosis of the demo (minutes), run by hand"]
fn demo_fsdp2_anatomy() {
    let root = common::repo_root();
    let profile = Profile::load(&root.join("profiles/llama2-70b-h100-8x8.toml")).unwrap();
    let options = SolveOptions {
        memory_cap_bytes: Some(85_523_536_281),
        time_limit_s: 1800.0,
        target: Target::Fsdp2,
        ..SolveOptions::default()
    };
    let free = full_lp_anatomy(&profile, &options, HeldLevels::Free)
        .unwrap()
        .unwrap();
    print("fsdp2 space, free", &free);
    if let Ok(path) = std::env::var("SHARDPLAN_ANATOMY_PLAN") {
        let plan = Plan::load(Path::new(&path)).unwrap();
        let schedule = plan.schedule(&profile, &path).unwrap();
        let time = simulate(&profile, &schedule, Semantics::Strict).iteration_time_us;
        let held = full_lp_anatomy(&profile, &options, HeldLevels::OfPlan(&schedule))
            .unwrap()
            .unwrap();
        print("fsdp2 space at the plan's levels", &held);
        assert!(free.bound_us <= held.bound_us + 1e-6 * time);
        assert!(held.bound_us <= time * (1.0 + 1e-9));
        assert!(held.placed_us.is_some_and(|p| p <= time * (1.0 + 1e-9)));
    }
}

/// What a plan fixes before its launches, per unit: (level, shard group, secondary group,
/// recompute).
type LevelsKey = Vec<(Level, Option<u32>, Option<u32>, bool)>;

/// Whether two level patterns differ at most in recompute.
fn same_choices(a: &LevelsKey, b: &LevelsKey) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| (x.0, x.1, x.2) == (y.0, y.1, y.2))
}

fn levels_key(schedule: &Schedule) -> LevelsKey {
    schedule
        .units()
        .iter()
        .map(|u| (u.level, u.shard_group, u.secondary_group, u.recompute))
        .collect()
}

/// Held to a plan's levels, the full-window LP (column generation from depth 4 with the levels'
/// rows) is never above the fastest enumerated plan of those levels and never below the free full
/// LP, and the placement at those levels returns a plan no faster than that fastest one (equal to
/// it where it proves optimality); the free anatomy's bound is the full LP's, never above the
/// optimum over every plan. Over 24 random instances, at the fastest plan's, the median and the
/// smallest peak (whole bytes, rounded up) and the 3 fastest level patterns that fit each.
#[test]
fn held_levels_bound_every_plan_of_those_levels() {
    let (mut checked, mut stronger, mut placed_exact, mut recompute_gained) = (0, 0, 0, 0);
    for seed in 0..24u64 {
        let (profile, recompute) = tiny_instance(seed, Rng(seed * 7_919 + 11));
        let per_unit: Vec<_> = (0..profile.unit_count())
            .map(|u| unit_options(&profile, u, recompute))
            .collect();
        // Per level pattern, its plans' (time, peak) and one plan of it.
        let mut by_levels: BTreeMap<LevelsKey, (Vec<(f64, f64)>, Schedule)> = BTreeMap::new();
        every_schedule(&profile, &per_unit, |schedule| {
            let sim = simulate(&profile, &schedule, Semantics::Strict);
            let entry = by_levels
                .entry(levels_key(&schedule))
                .or_insert_with(|| (Vec::new(), schedule.clone()));
            entry.0.push((sim.iteration_time_us, sim.peak_memory_bytes));
        });
        let mut peaks: Vec<(f64, f64)> = by_levels.values().flat_map(|(r, _)| r.clone()).collect();
        peaks.sort_by(|a, b| a.0.total_cmp(&b.0));
        let fastest_peak = peaks[0].1;
        peaks.sort_by(|a, b| a.1.total_cmp(&b.1));
        let caps = [fastest_peak, peaks[peaks.len() / 2].1, peaks[0].1].map(f64::ceil);
        for cap in caps {
            let within = |results: &[(f64, f64)]| {
                results
                    .iter()
                    .filter(|r| r.1 <= cap)
                    .map(|r| r.0)
                    .fold(f64::INFINITY, f64::min)
            };
            let optimum = by_levels
                .values()
                .map(|(r, _)| within(r))
                .fold(f64::INFINITY, f64::min);
            let options = SolveOptions {
                memory_cap_bytes: Some(cap as u64),
                allow_recompute: recompute,
                relative_gap: 1e-9,
                ..SolveOptions::default()
            };
            let free = full_lp_anatomy(&profile, &options, HeldLevels::Free)
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed} cap {cap}: no free bound"));
            let lp = lp_relaxation_bound(&profile, &options).unwrap().unwrap();
            assert!(
                free.full_lp && (free.bound_us - lp).abs() <= 1e-6 * lp.max(1.0),
                "seed {seed} cap {cap}: anatomy's bound {} against the full LP's {lp}",
                free.bound_us
            );
            assert!(free.bound_us <= optimum * (1.0 + 1e-9));
            let mut patterns: Vec<(f64, &Schedule)> = by_levels
                .values()
                .map(|(r, plan)| (within(r), plan))
                .filter(|(t, _)| t.is_finite())
                .collect();
            patterns.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (best, plan) in patterns.into_iter().take(3) {
                let held = full_lp_anatomy(&profile, &options, HeldLevels::OfPlan(plan))
                    .unwrap()
                    .unwrap_or_else(|| {
                        panic!("seed {seed} cap {cap}: no bound at a plan's levels")
                    });
                let tolerance = 1e-9 * best;
                assert!(
                    held.bound_us <= best + tolerance,
                    "seed {seed} cap {cap}: held bound {} above the fastest plan {best} of its levels",
                    held.bound_us
                );
                assert!(
                    held.bound_us >= free.bound_us - 1e-6 * best,
                    "seed {seed} cap {cap}: held bound {} below the free LP's {}",
                    held.bound_us,
                    free.bound_us
                );
                assert_eq!(held.fractional_levels() + held.fractional_recompute(), 0);
                let placed = held
                    .placed_us
                    .unwrap_or_else(|| panic!("seed {seed} cap {cap}: no placement"));
                assert!(
                    placed >= best - tolerance,
                    "seed {seed} cap {cap}: placed plan {placed} faster than the fastest {best}"
                );
                // Recompute free, no faster than the fastest plan of the same levels whatever
                // its recompute, and no slower than the placement it starts from.
                let same_levels = by_levels
                    .iter()
                    .filter(|(key, _)| same_choices(key, &levels_key(plan)))
                    .map(|(_, (r, _))| within(r))
                    .fold(f64::INFINITY, f64::min);
                let free_placed = held.placed_recompute_free_us.unwrap_or_else(|| {
                    panic!("seed {seed} cap {cap}: no recompute-free placement")
                });
                assert!(
                    free_placed >= same_levels - tolerance && free_placed <= placed + tolerance,
                    "seed {seed} cap {cap}: recompute free {free_placed}, fastest of the levels \
                     {same_levels}, placed {placed}"
                );
                recompute_gained += usize::from(free_placed < best - tolerance);
                checked += 1;
                stronger += usize::from(held.bound_us > free.bound_us + 1e-6 * best);
                placed_exact += usize::from(placed <= best * (1.0 + 1e-6));
            }
        }
    }
    eprintln!(
        "{checked} level patterns checked: held bound above the free LP's at {stronger}, \
         placement at the fastest plan of its levels at {placed_exact}, recompute free faster \
         than the fastest plan of its levels and recompute at {recompute_gained}"
    );
    assert!(checked >= 100 && stronger >= 10 && placed_exact >= checked / 2);
    assert!(recompute_gained >= 1);
}
