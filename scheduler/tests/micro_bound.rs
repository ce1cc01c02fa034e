//! The bound over every plan at K ≥ 2 micro-batches (DESIGN §4.8; §4.5's pricing and column
//! generation over the micro-batch model): on tiny instances, flat and on nodes, at K = 2, 3 and 4
//! and caps from the smallest feasible to none, the full-window LP relaxation's optimum never
//! exceeds the best plan (the MIP over every window, which `ilp_micro` and
//! `micro_batches_on_nodes_exhaustive` prove equal to exhaustive enumeration); the bound priced
//! from the LP of depth-1 windows never exceeds that LP optimum; and column generation from
//! depth 1 ends at it, solved outright by HiGHS, on every instance — among them instances where
//! the depth-1 LP stands above it, so the pricing has positions to add.

mod common;

use common::{Rng, random_profile, with_topology};
use shardplan_scheduler::ilp::{
    Objective, SolveOptions, WindowLimits, generated_lp_bound, lp_relaxation_bound,
    priced_lp_bound, solve,
};
use std::num::NonZeroUsize;

#[test]
fn micro_batch_bound_from_depth_one_reaches_the_full_lp_and_stays_below_every_plan() {
    let (mut checked, mut on_nodes, mut widened) = (0, 0, 0);
    for seed in 0..24u64 {
        let mut rng = Rng(seed * 7_919 + 63);
        let units = 2 + (seed % 3) as usize;
        let mut profile = random_profile(&mut rng, units, [0.0, 0.1][(seed % 2) as usize], 3000);
        profile.micro_batches = [2, 3, 4][(seed % 3) as usize];
        profile.comm_slowdown = [0.0, 0.3][(seed / 2 % 2) as usize];
        let nodes = seed % 4 >= 2 && with_topology(&mut rng, &mut profile);
        profile.validate("tiny").unwrap();
        let smallest = solve(
            &profile,
            &SolveOptions {
                objective: Objective::Memory {
                    max_iteration_time_us: None,
                },
                memory_cap_bytes: None,
                ..SolveOptions::default()
            },
        )
        .unwrap()
        .report
        .objective;
        let caps = [1.0, 1.1, 1.5].map(|f| Some((smallest * f).ceil() as u64));
        for cap in caps.into_iter().chain([None]) {
            let what = format!("seed {seed}, K = {}, cap {cap:?}", profile.micro_batches);
            let options = SolveOptions {
                memory_cap_bytes: cap,
                relative_gap: 0.0,
                ..SolveOptions::default()
            };
            let best = solve(&profile, &options).unwrap().report.objective;
            let full_lp = lp_relaxation_bound(&profile, &options)
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no LP optimum"));
            assert!(
                full_lp <= best * (1.0 + 1e-9),
                "{what}: the LP optimum {full_lp} above the best plan {best}"
            );
            let depth_one = WindowLimits::depth(NonZeroUsize::MIN);
            let restricted = lp_relaxation_bound(
                &profile,
                &SolveOptions {
                    limits: depth_one,
                    ..options.clone()
                },
            )
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: no depth-1 LP optimum"));
            let priced = priced_lp_bound(&profile, &options, depth_one)
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no priced bound"));
            assert!(
                priced <= full_lp * (1.0 + 1e-9) + 1e-6,
                "{what}: the priced bound {priced} above the LP optimum {full_lp}"
            );
            let (generated, reached) = generated_lp_bound(&profile, &options, NonZeroUsize::MIN)
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no generated bound"));
            assert!(reached, "{what}: column generation stopped short");
            assert!(
                (generated - full_lp).abs() <= 1e-6 * full_lp.max(1.0),
                "{what}: column generation ended at {generated}, the LP optimum is {full_lp}"
            );
            checked += 1;
            on_nodes += usize::from(nodes);
            widened += usize::from(restricted > full_lp * (1.0 + 1e-6));
        }
    }
    assert!(checked >= 80, "{checked} caps checked");
    assert!(on_nodes >= 16, "{on_nodes} caps on nodes");
    assert!(
        widened >= 10,
        "only {widened} caps where depth 1's LP stands above the full one"
    );
}
