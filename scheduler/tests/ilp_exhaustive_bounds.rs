//! The ILP's bounds against an exhaustive search over every valid schedule of tiny instances
//! (1–3 units, ≤ 2 blocks per unit, N ∈ {2, 4, 8}, κ_c ∈ {0, 0.1}, κ_q ∈ {0, 0.3}, recompute on
//! and off, nodes and hpz on some): the LP relaxation, the bound priced from depth-1 windows,
//! column generation and the far-band relaxation are never above the optimum over every plan.
//! The search judges schedules with the simulator only.

mod common;

use common::{Rng, caps, enumerate_plans, fastest_within, tiny_instance};
use shardplan_scheduler::ilp::{
    SolveOptions, WindowLimits, far_band_bound, generated_lp_bound, lp_relaxation_bound,
    priced_lp_bound,
};
use std::num::NonZeroUsize;

/// The LP relaxation's optimum is never above the exhaustive optimum, at every cap of the random
/// instances and without one, and is not a trivial bound: it is within 50% of the optimum
/// everywhere and equal to it on some instances. The bound a large solve claims over every plan,
/// priced from the LP of depth-1 windows, is never above the full-window LP's optimum (so never
/// above any plan), and equals it where the launches depth 1 leaves out price out; column
/// generation from depth 1 ends at the full-window LP's optimum, solved outright by HiGHS.
#[test]
fn the_lp_relaxation_bounds_every_plan_from_below() {
    let (mut checked, mut exact) = (0, 0);
    let (mut priced_exact, mut priced_below) = (0, 0);
    for seed in 0..24u64 {
        let (profile, recompute) = tiny_instance(seed, Rng(seed * 104_729 + 3));
        let results = enumerate_plans(&profile, recompute, &|s| WindowLimits::FULL.admit(s));
        let mut caps: Vec<Option<f64>> = caps(&results).into_iter().map(Some).collect();
        caps.push(None);
        for cap in caps {
            let best = fastest_within(&results, cap.unwrap_or(f64::INFINITY));
            if best.is_infinite() {
                continue;
            }
            let options = SolveOptions {
                memory_cap_bytes: cap.map(|c| c as u64),
                allow_recompute: recompute,
                ..SolveOptions::default()
            };
            let bound = lp_relaxation_bound(&profile, &options)
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed} cap {cap:?}: the LP did not finish"));
            assert!(
                bound <= best * (1.0 + 1e-9),
                "seed {seed} cap {cap:?}: LP bound {bound} above the optimum {best}"
            );
            assert!(
                bound >= 0.5 * best,
                "seed {seed} cap {cap:?}: bound {bound}, optimum {best}"
            );
            checked += 1;
            exact += usize::from(bound >= best * (1.0 - 1e-9));
            let priced =
                priced_lp_bound(&profile, &options, WindowLimits::depth(NonZeroUsize::MIN))
                    .unwrap()
                    .unwrap_or_else(|| panic!("seed {seed} cap {cap:?}: no priced bound"));
            assert!(
                priced <= bound + 1e-9 * bound.abs().max(1.0),
                "seed {seed} cap {cap:?}: priced bound {priced} above the full LP's {bound}"
            );
            if priced >= bound * (1.0 - 1e-9) {
                priced_exact += 1;
            } else {
                priced_below += 1;
            }
            let (generated, full_lp) = generated_lp_bound(&profile, &options, NonZeroUsize::MIN)
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed} cap {cap:?}: no generated bound"));
            assert!(
                full_lp && (generated - bound).abs() <= 1e-6 * bound.abs().max(1.0),
                "seed {seed} cap {cap:?}: column generation ended at {generated} (at the full LP: \
                 {full_lp}), the full LP's optimum is {bound}"
            );
        }
    }
    eprintln!(
        "{checked} bounds checked, {exact} equal to the optimum; priced from depth 1: {priced_exact} equal to the full LP, {priced_below} below"
    );
    assert!(
        checked >= 60 && exact >= 1 && priced_exact >= 10 && priced_below >= 1,
        "{checked} checked, {exact} exact, priced {priced_exact} exact and {priced_below} below"
    );
}

/// The far-band relaxation of depth-1 windows (DESIGN §4.5, "far bands"), solved as a MIP, is
/// never above the exhaustive optimum over every plan, at caps equal to plans' peaks (to the byte,
/// rounded up), between them and without one; it is never above depth 1's own optimum (whose plans
/// it holds), and it is exact where launching away from the consumer does not pay.
#[test]
fn the_far_band_relaxation_bounds_every_plan_from_below() {
    let depth_1 = WindowLimits::depth(NonZeroUsize::MIN);
    let (mut checked, mut exact, mut below_depth_1) = (0, 0, 0);
    for seed in 0..24u64 {
        let (profile, recompute) = tiny_instance(seed, Rng(seed * 7_919 + 11));
        let every = enumerate_plans(&profile, recompute, &|s| WindowLimits::FULL.admit(s));
        let limited = enumerate_plans(&profile, recompute, &|s| depth_1.admit(s));
        let mut caps: Vec<Option<f64>> = caps(&every).into_iter().map(Some).collect();
        let stride = every.len().div_ceil(4).max(1);
        caps.extend(every.iter().step_by(stride).map(|r| Some(r.1.ceil())));
        caps.push(None);
        for cap in caps {
            let best = fastest_within(&every, cap.unwrap_or(f64::INFINITY));
            let options = SolveOptions {
                memory_cap_bytes: cap.map(|c| c as u64),
                allow_recompute: recompute,
                relative_gap: 0.0,
                ..SolveOptions::default()
            };
            let bound = far_band_bound(&profile, &options, depth_1).unwrap();
            let Some(bound) = bound else {
                assert!(
                    best.is_infinite(),
                    "seed {seed} cap {cap:?}: no bound, optimum {best}"
                );
                continue;
            };
            if best.is_infinite() {
                continue;
            }
            assert!(
                bound <= best * (1.0 + 1e-9),
                "seed {seed} cap {cap:?}: far-band bound {bound} above the optimum {best}"
            );
            let depth_1_best = fastest_within(&limited, cap.unwrap_or(f64::INFINITY));
            assert!(bound <= depth_1_best * (1.0 + 1e-9));
            checked += 1;
            exact += usize::from(bound >= best * (1.0 - 1e-9));
            below_depth_1 += usize::from(best < depth_1_best * (1.0 - 1e-9));
        }
    }
    eprintln!(
        "{checked} far-band bounds checked, {exact} equal to the optimum over every plan; {below_depth_1} caps where a plan outside depth 1 is faster"
    );
    assert!(
        checked >= 60 && exact >= 10 && below_depth_1 >= 5,
        "{checked} checked, {exact} exact, {below_depth_1} beyond depth 1"
    );
}
