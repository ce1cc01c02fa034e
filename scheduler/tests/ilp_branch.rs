//! Branch and price on levels and recompute (DESIGN §4.5): on tiny instances (1–3 units, flat and
//! on nodes, recompute allowed or not) at caps from infeasible through each plan's peak to loose
//! and without one, the tree's bound after every node is never above the optimum of an exhaustive
//! search judged by the simulator, and with an unlimited budget the tree closes at that optimum
//! (its incumbent too), or, where no plan fits, at no plan.

mod common;

use common::{Rng, enumerate_plans, fastest_within, tiny_instance};
use shardplan_scheduler::ilp::{Effort, SolveOptions, WindowLimits, branched_bound};
use shardplan_scheduler::profile::Profile;
use std::num::{NonZeroU64, NonZeroUsize};

/// Whole-byte caps: below the smallest peak, on the smallest, median and largest peaks (rounded
/// up: a plan peaking exactly at the cap fits), between the smallest two, and none.
fn caps(results: &[(f64, f64)]) -> Vec<Option<f64>> {
    let mut peaks: Vec<f64> = results.iter().map(|r| r.1).collect();
    peaks.sort_by(f64::total_cmp);
    peaks.dedup_by(|a, b| (*a - *b).abs() < 1e-3);
    let mut caps = vec![(peaks[0] * 0.98).floor()];
    caps.extend([0, peaks.len() / 2, peaks.len() - 1].map(|k| peaks[k].ceil()));
    if peaks.len() > 1 {
        caps.push(((peaks[0] + peaks[1]) / 2.0).floor());
    }
    caps.sort_by(f64::total_cmp);
    caps.dedup();
    let mut caps: Vec<Option<f64>> = caps.into_iter().map(Some).collect();
    caps.push(None);
    caps
}

#[test]
fn the_trees_bound_never_exceeds_the_optimum_and_closes_at_it() {
    let (mut checked, mut branched, mut infeasible) = (0, 0, 0);
    for seed in 0..12u64 {
        let (profile, recompute) = tiny_instance(seed, Rng(seed * 104_729 + 3));
        let results = enumerate_plans(&profile, recompute, &|s| WindowLimits::FULL.admit(s));
        for cap in caps(&results) {
            let best = fastest_within(&results, cap.unwrap_or(f64::INFINITY));
            let options = SolveOptions {
                memory_cap_bytes: cap.map(|c| c as u64),
                allow_recompute: recompute,
                relative_gap: 0.0,
                time_limit_s: f64::INFINITY,
                ..SolveOptions::default()
            };
            let unlimited = Effort::new(NonZeroU64::new(1_000_000).unwrap());
            let tree = branched_bound(&profile, &options, (NonZeroUsize::MIN, unlimited))
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed} cap {cap:?}: no bound"));
            let tolerance = 1e-6 * best.abs().max(1.0);
            for step in &tree.steps {
                assert!(
                    step.bound <= best + tolerance,
                    "seed {seed} cap {cap:?}: bound {} after {} nodes above the optimum {best}",
                    step.bound,
                    step.nodes
                );
            }
            assert!(
                tree.closed,
                "seed {seed} cap {cap:?}: the tree did not close"
            );
            if best.is_infinite() {
                assert!(
                    tree.incumbent.is_infinite() && tree.bound.is_infinite(),
                    "seed {seed} cap {cap:?}: no plan fits, the tree says {tree:?}"
                );
                infeasible += 1;
                continue;
            }
            assert!(
                (tree.bound - best).abs() <= tolerance
                    && (tree.incumbent - best).abs() <= tolerance,
                "seed {seed} cap {cap:?}: the tree closed at {} (incumbent {}), the optimum is \
                 {best}",
                tree.bound,
                tree.incumbent
            );
            checked += 1;
            branched += usize::from(tree.steps.len() > 1);
        }
    }
    eprintln!(
        "{checked} caps closed at the optimum ({branched} branched), {infeasible} at no plan"
    );
    assert!(
        checked >= 40 && branched >= 5 && infeasible >= 1,
        "{checked} checked, {branched} branched, {infeasible} infeasible"
    );
}

/// The tree on the demo (Llama-2 70B on 8 nodes of 8 H100s, 79.65 GiB), priced from depth 4,
/// within `SHARDPLAN_BRANCH_EFFORT` thousand LP iterations (default 60, the solve's effort): the
/// bound after each node. Run by hand: `cargo test --release -p shardplan-scheduler --test
/// ilp_branch demo -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement on the demo (minutes), run by hand"]
fn demo_tree() {
    let root = common::repo_root();
    let profile = Profile::load(&root.join("profiles/llama2-70b-h100-8x8.toml")).unwrap();
    let options = SolveOptions {
        memory_cap_bytes: Some(85_523_536_281),
        time_limit_s: 1200.0,
        ..SolveOptions::default()
    };
    let thousands: u64 = std::env::var("SHARDPLAN_BRANCH_EFFORT").map_or(60, |e| {
        e.parse().expect("SHARDPLAN_BRANCH_EFFORT: thousands")
    });
    let effort = Effort::new(NonZeroU64::new(thousands).unwrap());
    let depth = NonZeroUsize::new(4).unwrap();
    let started = std::time::Instant::now();
    let tree = branched_bound(&profile, &options, (depth, effort))
        .unwrap()
        .expect("a bound");
    eprintln!("| nodes | LP iterations | bound (ms) | incumbent (ms) |");
    for step in &tree.steps {
        eprintln!(
            "| {} | {} | {:.1} | {:.1} |",
            step.nodes,
            step.lp_iterations,
            step.bound / 1e3,
            step.incumbent / 1e3
        );
    }
    eprintln!(
        "bound {:.1} ms, closed {}, {:.0} s",
        tree.bound / 1e3,
        tree.closed,
        started.elapsed().as_secs_f64()
    );
}
