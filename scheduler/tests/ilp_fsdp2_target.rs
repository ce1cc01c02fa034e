//! `solve --target fsdp2` (DESIGN §4.9) against an independent truth: on tiny instances (≤ 3
//! units, N ∈ {2, 4, 8}, nodes and hpz on some, a tied head on some, recompute on and off) its
//! optimum equals the fastest of every FSDP2 setting enumerated unit by unit — sharding
//! (replicated, kept, freed, freed to a secondary group H, over the world or a shard group),
//! recompute, which earlier unit's forward list and which later unit's backward list names it,
//! and at K = 2 micro-batches the three switches (`requires_gradient_sync`,
//! `reshard_after_backward`, `requires_all_reduce`) — and judged by `fsdp2::evaluate` alone, at
//! caps from infeasible through every setting's peak to none. Every plan it returns exports
//! exactly, with FSDP2's time equal to the plan's and FSDP2's peak within the cap.

mod common;

use common::{Rng, random_profile, with_topology};
use shardplan_scheduler::Error;
use shardplan_scheduler::export::fsdp2 as export;
use shardplan_scheduler::fsdp2::{Reshard, Settings, Sharding, UnitSettings, evaluate};
use shardplan_scheduler::groups::{secondary_group, shard_groups};
use shardplan_scheduler::ilp::{Objective, SolveOptions, Target, solve};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::timeline::{Op, Timeline};

/// One unit's settings without its place in other units' lists: its sharding, recompute, the
/// unit whose forward (backward) list names it (None: no gather to issue, or unit 1's own at
/// E), and its micro-batch switches.
#[derive(Clone, Copy)]
struct Choice {
    sharding: Sharding,
    recompute: bool,
    forward_issuer: Option<usize>,
    backward_issuer: Option<usize>,
    switches: Switches,
}

/// FSDP2's micro-batch switches of one unit (true: FSDP2's default).
#[derive(Clone, Copy)]
struct Switches {
    requires_gradient_sync: bool,
    reshard_after_backward: bool,
    requires_all_reduce: bool,
}

/// Every switch setting of a unit placed as `sharding` with `micro_batches` per step: none but
/// the defaults at K = 1; at K ≥ 2 gradient sync on or off, resharding after backward off only
/// for a sharded unit, the replica all-reduce off only over a shard group with gradient sync.
fn switch_choices(sharding: Sharding, micro_batches: u32) -> Vec<Switches> {
    let defaults = Switches {
        requires_gradient_sync: true,
        reshard_after_backward: true,
        requires_all_reduce: true,
    };
    if micro_batches < 2 {
        return vec![defaults];
    }
    let meshed = matches!(
        sharding,
        Sharding::Sharded {
            shard_group: Some(_),
            ..
        }
    );
    let mut all = Vec::new();
    for requires_gradient_sync in [true, false] {
        for reshard_after_backward in [true, false] {
            if !reshard_after_backward && sharding == Sharding::Replicated {
                continue;
            }
            // The replica all-reduce can be deferred only over a mesh with gradient sync.
            let deferrable = meshed && requires_gradient_sync;
            for requires_all_reduce in [true, false] {
                if requires_all_reduce || deferrable {
                    all.push(Switches {
                        requires_gradient_sync,
                        reshard_after_backward,
                        requires_all_reduce,
                    });
                }
            }
        }
    }
    all
}

/// Every choice of unit `i` FSDP2 can execute in the slot model.
fn unit_choices(profile: &Profile, i: usize, recompute: bool) -> Vec<Choice> {
    let l = profile.unit_count();
    let timeline = Timeline::new(l);
    let after = timeline.window(i, Op::ReduceScatter.window_kind()).len;
    let mut shardings = vec![Sharding::Replicated];
    let shards = std::iter::once(None).chain(shard_groups(profile).into_iter().map(Some));
    for shard_group in shards.filter(|s| s.is_none() || after >= 3) {
        let ranks = shard_group.unwrap_or(profile.world_size);
        let mut kinds = vec![Reshard::Keep];
        // A tied lender is never freed after its forward (DESIGN §3.12); the last unit has no
        // backward gather to issue.
        if i + 1 < l && profile.borrower(i).is_none() {
            kinds.push(Reshard::Free);
            if let Some(h) = secondary_group(profile).filter(|&h| h < ranks) {
                kinds.push(Reshard::ToSecondary(h));
            }
        }
        shardings.extend(
            kinds
                .into_iter()
                .map(|reshard_after_forward| Sharding::Sharded {
                    shard_group,
                    reshard_after_forward,
                }),
        );
    }
    let mut choices = Vec::new();
    for sharding in shardings {
        let gathered = sharding != Sharding::Replicated;
        let freed = matches!(
            sharding,
            Sharding::Sharded {
                reshard_after_forward: Reshard::Free | Reshard::ToSecondary(_),
                ..
            }
        );
        let forward: Vec<Option<usize>> = if gathered && i > 0 {
            (0..i).map(Some).collect()
        } else {
            vec![None]
        };
        let backward: Vec<Option<usize>> = if freed {
            (i + 1..l).map(Some).collect()
        } else {
            vec![None]
        };
        for &recompute in if recompute {
            &[false, true][..]
        } else {
            &[false][..]
        } {
            for &forward_issuer in &forward {
                for &backward_issuer in &backward {
                    for switches in switch_choices(sharding, profile.micro_batches) {
                        choices.push(Choice {
                            sharding,
                            recompute,
                            forward_issuer,
                            backward_issuer,
                            switches,
                        });
                    }
                }
            }
        }
    }
    choices
}

/// (time, FSDP2 peak) of every valid setting of the profile.
fn enumerate(profile: &Profile, recompute: bool) -> Vec<(f64, u64)> {
    let per_unit: Vec<Vec<Choice>> = (0..profile.unit_count())
        .map(|i| unit_choices(profile, i, recompute))
        .collect();
    let mut results = Vec::new();
    let mut pick = vec![0usize; per_unit.len()];
    loop {
        let chosen: Vec<Choice> = pick.iter().zip(&per_unit).map(|(&k, c)| c[k]).collect();
        let mut units: Vec<UnitSettings> = chosen
            .iter()
            .map(|c| UnitSettings {
                recompute: c.recompute,
                requires_gradient_sync: c.switches.requires_gradient_sync,
                reshard_after_backward: c.switches.reshard_after_backward,
                requires_all_reduce: c.switches.requires_all_reduce,
                ..UnitSettings::new(c.sharding)
            })
            .collect();
        for (i, c) in chosen.iter().enumerate() {
            if let Some(j) = c.forward_issuer {
                units[j].forward_prefetch.push(i);
            }
            if let Some(j) = c.backward_issuer {
                units[j].backward_prefetch.push(i);
            }
        }
        for u in &mut units {
            u.forward_prefetch.sort_unstable();
            u.backward_prefetch.sort_unstable_by(|a, b| b.cmp(a));
        }
        if let Ok(settings) = Settings::new(profile, units) {
            let eval = evaluate(profile, &settings);
            results.push((eval.iteration_time_us(), eval.peak_memory_bytes));
        }
        // The next combination, odometer-wise.
        let mut u = 0;
        loop {
            if u == pick.len() {
                return results;
            }
            pick[u] += 1;
            if pick[u] < per_unit[u].len() {
                break;
            }
            pick[u] = 0;
            u += 1;
        }
    }
}

fn fastest_within(results: &[(f64, u64)], cap: Option<u64>) -> Option<f64> {
    results
        .iter()
        .filter(|(_, peak)| cap.is_none_or(|c| *peak <= c))
        .map(|(t, _)| *t)
        .min_by(f64::total_cmp)
}

/// What the solves at every cap of one instance found.
#[derive(Default)]
struct AtCaps {
    solves: usize,
    infeasible: usize,
    /// Plans that set a micro-batch switch on some unit.
    switched: usize,
}

/// Solves `profile` for the FSDP2 target at caps from below every setting's peak through every
/// quarter of the peaks to none, each answer against the fastest of `results` within the cap:
/// the same time, an exact export at the plan's time, FSDP2's peak within the cap.
fn solve_at_every_cap(
    seed: u64,
    profile: &Profile,
    recompute: bool,
    results: &[(f64, u64)],
) -> AtCaps {
    let mut peaks: Vec<u64> = results.iter().map(|r| r.1).collect();
    peaks.sort_unstable();
    peaks.dedup();
    let mut caps: Vec<Option<u64>> = vec![None, Some(peaks[0] - 1)];
    let step = (peaks.len() / 4).max(1);
    caps.extend(peaks.iter().step_by(step).map(|&p| Some(p)));
    let mut found = AtCaps::default();
    for cap in caps {
        let options = SolveOptions {
            memory_cap_bytes: cap,
            relative_gap: 0.0,
            allow_recompute: recompute,
            target: Target::Fsdp2,
            ..SolveOptions::default()
        };
        let best = fastest_within(results, cap);
        match (solve(profile, &options), best) {
            (Ok(solved), Some(best)) => {
                let t = solved.report.objective;
                assert!(
                    (t - best).abs() <= 1e-6 * best,
                    "seed {seed} cap {cap:?}: ILP {t}, exhaustive {best}"
                );
                let exported = export(profile, &solved.schedule).unwrap();
                assert!(exported.exact, "seed {seed}: {:?}", exported.approximations);
                let plan_time = solved.simulation.iteration_time_us;
                assert_eq!(exported.fsdp2_iteration_time_us, plan_time);
                assert!((plan_time - t).abs() <= 1e-9 * t);
                assert!(cap.is_none_or(|c| exported.fsdp2_peak_memory_bytes <= c));
                let switched = exported.units.iter().any(|u| {
                    !u.requires_gradient_sync || !u.reshard_after_backward || !u.requires_all_reduce
                });
                found.switched += usize::from(switched);
                found.solves += 1;
            }
            (Err(Error::Infeasible(_)), None) => found.infeasible += 1,
            (answer, best) => panic!(
                "seed {seed} cap {cap:?}: ILP {:?}, exhaustive {best:?}",
                answer.map(|s| s.report.objective)
            ),
        }
    }
    found
}

/// K = 2 micro-batches (DESIGN §4.9, "The fsdp2 space at K ≥ 2"): the micro-batch MIP over
/// FSDP2's space equals the enumeration of every setting with the three switches, on 2 and 3
/// units (recompute on the 2-unit ones), nodes and hpz on some, a tied head on some.
#[test]
fn fsdp2_target_at_two_micro_batches_equals_exhaustive_enumeration() {
    let (mut at_caps, mut tied, mut hierarchical) = (AtCaps::default(), 0, 0);
    for seed in 0..12u64 {
        let mut rng = Rng(seed * 15485863 + 5);
        let units = 2 + (seed % 2) as usize;
        let kappa = if seed % 3 == 0 { 0.0 } else { 0.1 };
        let recompute = units == 2;
        let mut profile = random_profile(&mut rng, units, kappa, 2000);
        profile.micro_batches = 2;
        if seed % 4 == 1 {
            profile.units[units - 1].reads_params_of = Some(profile.units[0].name.clone());
            tied += 1;
        }
        if seed % 4 != 3 && with_topology(&mut rng, &mut profile) {
            hierarchical += 1;
        }
        let results = enumerate(&profile, recompute);
        assert!(!results.is_empty(), "seed {seed}: no FSDP2 setting");
        let checked = solve_at_every_cap(seed, &profile, recompute, &results);
        at_caps.solves += checked.solves;
        at_caps.infeasible += checked.infeasible;
        at_caps.switched += checked.switched;
    }
    assert!(at_caps.solves >= 48, "{} solves", at_caps.solves);
    assert!(
        at_caps.infeasible >= 12,
        "{} infeasible",
        at_caps.infeasible
    );
    assert!(
        at_caps.switched >= 12,
        "{} plans with switches",
        at_caps.switched
    );
    assert!(
        tied >= 3 && hierarchical >= 3,
        "{tied} tied, {hierarchical} with nodes"
    );
}

#[test]
fn fsdp2_target_optimum_equals_exhaustive_enumeration_of_fsdp2_settings() {
    let (mut instances, mut solves, mut infeasible, mut tied, mut hierarchical) = (0, 0, 0, 0, 0);
    for seed in 0..18u64 {
        let mut rng = Rng(seed * 104729 + 3);
        let units = 1 + (seed % 3) as usize;
        let kappa = if seed % 2 == 0 { 0.0 } else { 0.1 };
        let recompute = seed % 4 < 2;
        // Up to 2000 parameters: up to 4 blocks per unit, gathered whole.
        let mut profile = random_profile(&mut rng, units, kappa, 2000);
        profile.comm_slowdown = if seed % 3 == 2 { 0.3 } else { 0.0 };
        if units > 1 && seed % 3 == 1 {
            profile.units[units - 1].reads_params_of = Some(profile.units[0].name.clone());
            tied += 1;
        }
        if (seed / 2) % 3 != 2 && with_topology(&mut rng, &mut profile) {
            hierarchical += 1;
        }
        let results = enumerate(&profile, recompute);
        assert!(!results.is_empty(), "seed {seed}: no FSDP2 setting");
        instances += 1;
        let checked = solve_at_every_cap(seed, &profile, recompute, &results);
        (solves, infeasible) = (solves + checked.solves, infeasible + checked.infeasible);
    }
    assert_eq!(instances, 18);
    assert!(solves >= 80, "{solves} solves");
    assert!(infeasible >= 18, "{infeasible} infeasible caps");
    assert!(
        tied >= 4 && hierarchical >= 4,
        "{tied} tied, {hierarchical} with nodes"
    );
}

/// The smallest FSDP2 peak among `results` whose time meets `ceiling`.
fn smallest_within(results: &[(f64, u64)], ceiling: Option<f64>) -> Option<u64> {
    results
        .iter()
        .filter(|(t, _)| ceiling.is_none_or(|c| *t <= c))
        .map(|(_, p)| *p)
        .min()
}

/// `--objective memory --target fsdp2`: the smallest FSDP2 peak within an iteration-time ceiling
/// equals the enumeration's, at ceilings from below every setting's time (infeasible) through
/// every quarter of the settings' times to none; every plan exports exactly, its FSDP2 peak the
/// objective and its FSDP2 time within the ceiling.
#[test]
fn fsdp2_target_smallest_peak_equals_exhaustive_enumeration_of_fsdp2_settings() {
    let (mut solves, mut infeasible) = (0, 0);
    for seed in 0..12u64 {
        let mut rng = Rng(seed * 7919 + 11);
        let units = 1 + (seed % 3) as usize;
        let kappa = if seed % 2 == 0 { 0.0 } else { 0.1 };
        let recompute = seed % 4 < 2;
        let mut profile = random_profile(&mut rng, units, kappa, 2000);
        if units > 1 && seed % 3 == 1 {
            profile.units[units - 1].reads_params_of = Some(profile.units[0].name.clone());
        }
        if seed % 3 != 2 {
            with_topology(&mut rng, &mut profile);
        }
        let results = enumerate(&profile, recompute);
        let mut times: Vec<f64> = results.iter().map(|r| r.0).collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        let mut ceilings: Vec<Option<f64>> = vec![None, Some(times[0] * (1.0 - 1e-6))];
        let step = (times.len() / 4).max(1);
        ceilings.extend(times.iter().step_by(step).map(|&t| Some(t * (1.0 + 1e-12))));
        for ceiling in ceilings {
            let options = SolveOptions {
                objective: Objective::Memory {
                    max_iteration_time_us: ceiling,
                },
                memory_cap_bytes: None,
                relative_gap: 0.0,
                allow_recompute: recompute,
                target: Target::Fsdp2,
                ..SolveOptions::default()
            };
            let best = smallest_within(&results, ceiling);
            match (solve(&profile, &options), best) {
                (Ok(solved), Some(best)) => {
                    let peak = solved.report.objective;
                    let exported = export(&profile, &solved.schedule).unwrap();
                    assert!(exported.exact, "seed {seed}: {:?}", exported.approximations);
                    assert_eq!(
                        exported.fsdp2_peak_memory_bytes, best,
                        "seed {seed} ceiling {ceiling:?}: ILP {peak}, exhaustive {best}"
                    );
                    assert_eq!(peak, best as f64);
                    assert!(ceiling.is_none_or(|c| exported.fsdp2_iteration_time_us <= c));
                    solves += 1;
                }
                (Err(Error::Infeasible(_)), None) => infeasible += 1,
                (answer, best) => panic!(
                    "seed {seed} ceiling {ceiling:?}: ILP {:?}, exhaustive {best:?}",
                    answer.map(|s| s.report.objective)
                ),
            }
        }
    }
    assert!(solves >= 40, "{solves} solves");
    assert!(infeasible >= 12, "{infeasible} infeasible ceilings");
}
