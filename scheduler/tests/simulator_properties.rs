//! Property tests of the simulator on random valid plans: relaxed never slower than strict, a
//! plan survives its own file format, and every rule-breaking mutation is rejected.

mod common;

use common::{Rng, random_profile, random_schedule, with_topology};
use proptest::prelude::*;
use shardplan_scheduler::Error;
use shardplan_scheduler::plan::{Plan, Producer, plan_with_prediction};
use shardplan_scheduler::schedule::{Launch, Recompute, Schedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::{Level, Op};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn relaxed_is_never_slower_than_strict(seed in any::<u64>(), units in 1usize..7, kappa in prop::sample::select(vec![0.0, 0.1, 0.5]), comm_kappa in prop::sample::select(vec![0.0, 0.2, 1.0]), update_kappa in prop::sample::select(vec![None, Some(0.0), Some(1.0)])) {
        let mut rng = Rng(seed);
        let mut profile = random_profile(&mut rng, units, kappa, 1500);
        profile.comm_slowdown = comm_kappa;
        profile.update_slowdown = update_kappa;
        let schedule = random_schedule(&mut rng, &profile);
        let strict = simulate(&profile, &schedule, Semantics::Strict);
        let relaxed = simulate(&profile, &schedule, Semantics::Relaxed);
        prop_assert!(relaxed.iteration_time_us <= strict.iteration_time_us * (1.0 + 1e-12) + 1e-9,
            "relaxed {} > strict {}", relaxed.iteration_time_us, strict.iteration_time_us);
        // Strict time is never below the compute alone nor below the communication alone.
        prop_assert!(strict.iteration_time_us + 1e-9 >= strict.compute_us.max(strict.comm_us));
        prop_assert!(relaxed.iteration_time_us + 1e-9 >= relaxed.compute_us);
    }

    /// The same on nodes (DESIGN §3.11): random plans with shard groups (RA a slot after RS, on
    /// the other link) and secondary groups, and they survive their file format. Strict time is
    /// never below the compute.
    #[test]
    fn relaxed_is_never_slower_than_strict_on_nodes(seed in any::<u64>(), units in 1usize..7, comm_kappa in prop::sample::select(vec![0.0, 0.2, 1.0])) {
        let mut rng = Rng(seed);
        let mut profile = random_profile(&mut rng, units, 0.1, 1500);
        profile.comm_slowdown = comm_kappa;
        with_topology(&mut rng, &mut profile);
        let schedule = random_schedule(&mut rng, &profile);
        let strict = simulate(&profile, &schedule, Semantics::Strict);
        let relaxed = simulate(&profile, &schedule, Semantics::Relaxed);
        prop_assert!(relaxed.iteration_time_us <= strict.iteration_time_us * (1.0 + 1e-12) + 1e-9,
            "relaxed {} > strict {}", relaxed.iteration_time_us, strict.iteration_time_us);
        prop_assert!(strict.iteration_time_us + 1e-9 >= strict.compute_us);
        let (plan, _) = plan_with_prediction(&profile, &schedule, Producer { name: "random".into(), details: Default::default() }, None);
        let parsed: Plan = shardplan_scheduler::io::parse_toml(&plan.to_toml(), "round trip").unwrap();
        prop_assert_eq!(parsed.schedule(&profile, "round trip").unwrap(), schedule);
    }

    #[test]
    fn plans_round_trip_through_toml(seed in any::<u64>(), units in 1usize..7) {
        let mut rng = Rng(seed);
        let profile = random_profile(&mut rng, units, 0.0, 1500);
        let schedule = random_schedule(&mut rng, &profile);
        let (plan, _) = plan_with_prediction(&profile, &schedule, Producer { name: "random".into(), details: Default::default() }, None);
        let parsed: Plan = shardplan_scheduler::io::parse_toml(&plan.to_toml(), "round trip").unwrap();
        prop_assert_eq!(&parsed, &plan);
        prop_assert_eq!(parsed.schedule(&profile, "round trip").unwrap(), schedule);
    }

    #[test]
    fn every_rule_breaking_mutation_is_rejected(seed in any::<u64>(), units in 2usize..7, which in 0usize..8) {
        let mut rng = Rng(seed);
        let profile = random_profile(&mut rng, units, 0.0, 1500);
        let schedule = random_schedule(&mut rng, &profile);
        let timeline = schedule.timeline();
        let mut edited = schedule.into_units();
        let unit = rng.range(0, units as u64 - 1) as usize;
        let level = edited[unit].level;
        let op = level.ops()[rng.range(0, level.ops().len() as u64 - 1) as usize];
        let launches = edited[unit].launches.get_mut(&op).unwrap();
        match which {
            // Window: a launch moved onto the unit's own F_i (an end point of both windows).
            0 => launches[0].slot = timeline.forward(unit),
            // Coverage: one block too many, then one too few.
            1 => launches[0].blocks += 1,
            2 => if launches[0].blocks > 1 { launches[0].blocks -= 1 } else { launches.remove(0); },
            // A zero-block launch.
            3 => launches[0].blocks = 0,
            // The same slot listed twice.
            4 => { let first = launches[0]; launches.push(first); }
            // An op of another level.
            5 => {
                let foreign = if level == Level::None { Op::ReduceScatter } else { Op::AllReduce };
                let slot = timeline.window(unit, Op::AllReduce.window_kind()).slot_at(0);
                edited[unit].launches.insert(foreign, vec![Launch { slot, blocks: 1 }]);
            }
            // The last unit made fsdp (its backward-gather window is empty).
            6 => {
                let last = units - 1;
                let u = &mut edited[last];
                let nb = profile.blocks(last);
                let slot = timeline.window(last, Op::ReduceScatter.window_kind()).slot_at(0);
                u.level = Level::Fsdp;
                u.launches = [(Op::ReduceScatter, slot), (Op::GatherForward, slot)]
                    .into_iter().map(|(op, slot)| (op, vec![Launch { slot, blocks: nb }])).collect();
            }
            // Order: a forward gather before the unit's last reduction block (needs a unit past
            // the first, whose window has at least 3 slots).
            _ => {
                let target = units - 1;
                let nb = profile.blocks(target);
                let window = timeline.window(target, Op::ReduceScatter.window_kind());
                let u = &mut edited[target];
                u.level = Level::Sdp;
                u.launches = [(Op::ReduceScatter, window.len - 1), (Op::Gather, 0)]
                    .into_iter().map(|(op, pos)| (op, vec![Launch { slot: window.slot_at(pos), blocks: nb }])).collect();
            }
        }
        let result = Schedule::new(&profile, edited);
        let expected = ["outside its window", "(coverage)", "(coverage)", "at least one block", "listed twice",
            "not an op of level", "window is empty", "order rule"][which];
        match result {
            Err(e @ Error::Rule { .. }) => prop_assert!(e.to_string().contains(expected), "mutation {}: {}", which, e),
            other => prop_assert!(false, "mutation {} accepted or wrong error: {:?}", which, other),
        }
    }
}

/// The optimizer step rides on the unit's reduction: o_i/nb_i per AllReduce block, o_i/(N·nb_i)
/// per ReduceScatter block (a rank steps its shard), nothing on gathers; one replicated unit's
/// AllReduce runs after its backward with nothing left to hide behind, so its whole step adds to
/// the iteration, and a sharded unit's a quarter of it at N = 4.
#[test]
fn the_optimizer_step_follows_the_reduction() {
    use shardplan_scheduler::baselines::{BaselineKind, baseline};
    use shardplan_scheduler::cost::block_time_us;
    // 1000 parameters of 2 bytes in 1000-byte blocks: nb = 2; N = 4.
    let unit = [(1000, 10.0, 20.0, 100, 50, 0, 0)];
    let curve = || common::affine(3.0, 100.0);
    let without = common::profile(
        4,
        1000,
        0.0,
        0.0,
        (2, 2, 12),
        &unit,
        curve(),
        curve(),
        curve(),
    );
    let mut with = without.clone();
    with.units[0].optimizer_us = 80.0;
    let added = |op| block_time_us(&with, 0, op) - block_time_us(&without, 0, op);
    assert!((added(Op::AllReduce) - 40.0).abs() < 1e-9);
    assert!((added(Op::ReduceScatter) - 10.0).abs() < 1e-9);
    assert_eq!(added(Op::GatherForward), 0.0);
    for (kind, step) in [(BaselineKind::Ddp, 80.0), (BaselineKind::Fsdp2, 20.0)] {
        let plan = baseline(&without, kind, Recompute::Off, None)
            .unwrap()
            .schedule;
        let time = |p| simulate(p, &plan, Semantics::Strict).iteration_time_us;
        let grown = time(&with) - time(&without);
        assert!(
            (grown - step).abs() < 1e-9,
            "{kind:?}: {grown} µs more, expected {step}"
        );
    }
}
