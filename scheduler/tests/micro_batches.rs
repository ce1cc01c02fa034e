//! Micro-batches and gradient accumulation (DESIGN §3.10) in the simulator, the plan file and
//! the baselines: hand-computed steps of K = 2 for a unit reducing every micro-batch and for one
//! accumulating and keeping, the unrolled step against the flat timeline (K identical
//! micro-batches take K times one iteration), relaxed ≤ strict, and the errors of bad plans.

mod common;

use common::{Rng, affine, close, profile, random_profile, random_schedule, schedule};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::plan::{Plan, Producer, plan_with_prediction};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Accumulation, Recompute, Schedule, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, Simulation, simulate};

/// Two units, K = 2, N = 2, p = g = 2, o = 4, one block each, κ = 0, E's compute 15.
/// u1: Ψ 100, f 10, b 20, act 1000, ws 50/70. u2: Ψ 200, f 30, b 60, act 2000.
/// Curves: AG 2 + B/100, RS 4 + B/100, AR 10 + B/100: u1's AG (200 B) 4, RS 6; u2's AR 14.
/// Persistent: u1 sdp 100·8/2 = 400, u2 none 200·8 = 1600: 2000 in every slot.
fn two_micro_batches() -> Profile {
    let mut p = profile(
        2,
        1 << 20,
        0.0,
        15.0,
        (2, 2, 4),
        &[
            (100, 10.0, 20.0, 1000, 100, 50, 70),
            (200, 30.0, 60.0, 2000, 200, 0, 0),
        ],
        affine(2.0, 100.0),
        affine(4.0, 100.0),
        affine(10.0, 100.0),
    );
    p.micro_batches = 2;
    p.validate("test profile").unwrap();
    p
}

fn names(sim: &Simulation) -> Vec<String> {
    sim.slots
        .iter()
        .map(|s| format!("{}.{}", s.slot, s.micro_batch.unwrap()))
        .collect()
}

fn check(sim: &Simulation, time: f64, durations: &[f64], memory: &[f64]) {
    close(sim.iteration_time_us, time, "step time");
    assert_eq!(sim.slots.len(), durations.len());
    for ((s, d), m) in sim.slots.iter().zip(durations).zip(memory) {
        let at = format!("{}.{}", s.slot, s.micro_batch.unwrap());
        close(s.duration_us, *d, &format!("duration of {at}"));
        close(s.memory_bytes, *m, &format!("memory of {at}"));
    }
}

/// u1 sdp reduces and re-gathers at every boundary (RS and AG at I and at E), u2 replicated
/// AllReduces after each micro-batch's B1.
/// Strict: F1 10, F2 30, B2 60, B1 max(20, 14) = 20, I max(0, 6 + 4) = 10, then F1 10, F2 30,
/// B2 60, B1 20, E max(15, 10) = 15: 265 (one iteration at K = 1 takes 135).
/// Relaxed: the I slot has no compute, so F1 of micro-batch 2 waits for the inner gather:
/// launched at 120, RS 6 then AG 4, ready at 130, F1 runs 130–140 (20 after its launch); the
/// other slots take their compute: 265 again.
/// Memory: F1 2000 + act 1000 + ws 50 + gathered 200 = 3250; F2, B2 + act 2000 = 5200; B1
/// 2000 + 1000 + ws 70 + gathered 200 + unreduced gradient 200 = 3470; I and E 2000 + the
/// gradient until its launch 200 + the next gather 200 = 2400.
#[test]
fn a_unit_reducing_every_micro_batch() {
    let p = two_micro_batches();
    let plan_text = r#"
        [[units]]
        name = "u1"
        level = "sdp"
        rs = [["E", 1]]
        ag = [["E", 1]]
        rs_inner = [["I", 1]]
        ag_inner = [["I", 1]]
        [[units]]
        name = "u2"
        level = "none"
        ar = [["B1", 1]]
        ar_inner = [["B1", 1]]
        "#;
    let s = schedule(&p, plan_text).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    assert_eq!(
        names(&strict),
        [
            "F1.1", "F2.1", "B2.1", "B1.1", "I.1", "F1.2", "F2.2", "B2.2", "B1.2", "E.2"
        ]
    );
    let memory = [
        3250.0, 5200.0, 5200.0, 3470.0, 2400.0, 3250.0, 5200.0, 5200.0, 3470.0, 2400.0,
    ];
    let durations = [10.0, 30.0, 60.0, 20.0, 10.0, 10.0, 30.0, 60.0, 20.0, 15.0];
    check(&strict, 265.0, &durations, &memory);
    assert_eq!(
        (strict.peak_slot.to_string(), strict.peak_micro_batch),
        ("F2".into(), Some(1))
    );
    close(strict.comm_us, 2.0 * (14.0 + 6.0 + 4.0), "comm");
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    let durations = [10.0, 30.0, 60.0, 20.0, 0.0, 20.0, 30.0, 60.0, 20.0, 15.0];
    check(&relaxed, 265.0, &durations, &memory);
    // An optimizer step of 10 µs for u2 follows the step's AllReduce alone: B1.2 takes
    // max(20, 14 + 10) = 24, B1.1 still 20: 269.
    let mut with_step = p.clone();
    with_step.units[1].optimizer_us = 10.0;
    let s = schedule(&with_step, plan_text).unwrap();
    let durations = [10.0, 30.0, 60.0, 20.0, 10.0, 10.0, 30.0, 60.0, 24.0, 15.0];
    check(
        &simulate(&with_step, &s, Semantics::Strict),
        269.0,
        &durations,
        &memory,
    );
}

/// Relaxed: with a = 0 the backward that writes u1's gradient in micro-batch 2 (B1.2) prepares
/// the buffer micro-batch 1's ReduceScatter reads and writes, so it starts when that reduction
/// ends; with a slow RS (202 µs, launched at I.1) the wait binds, while F1.2 (u1 keeps its
/// gathered parameters) starts with I.1 and F2.2, B2.2 follow without waiting.
#[test]
fn the_next_micro_batch_waits_for_the_reduction_its_gradient_buffer_prepares() {
    let mut p = two_micro_batches();
    p.comm.reduce_scatter = affine(200.0, 100.0);
    let plan_text = r#"
        [[units]]
        name = "u1"
        level = "sdp"
        keep = true
        rs = [["E", 1]]
        ag = [["E", 1]]
        rs_inner = [["I", 1]]
        [[units]]
        name = "u2"
        level = "none"
        ar = [["B1", 1]]
        ar_inner = [["B1", 1]]
        "#;
    let s = schedule(&p, plan_text).unwrap();
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    let slot = |name: &str| {
        let i = names(&relaxed).iter().position(|n| n == name).unwrap();
        &relaxed.slots[i]
    };
    let inner_rs = relaxed
        .blocks
        .iter()
        .find(|b| b.unit == 0 && b.op.is_reduction() && b.launched_at() == "I [1]")
        .expect("u1's inner ReduceScatter at I.1");
    close(inner_rs.end_us - inner_rs.start_us, 202.0, "RS time");
    close(
        slot("F1.2").compute_start_us,
        slot("I.1").start_us,
        "F1.2 waits for nothing",
    );
    close(
        slot("B2.2").compute_start_us,
        slot("F2.2").compute_start_us + 30.0,
        "B2.2",
    );
    assert!(slot("B2.2").compute_start_us + 60.0 < inner_rs.end_us);
    close(
        slot("B1.2").compute_start_us,
        inner_rs.end_us,
        "B1.2 waits for the inner RS",
    );
    assert!(relaxed.iteration_time_us <= simulate(&p, &s, Semantics::Strict).iteration_time_us);
}

/// u1 sdp accumulates and keeps: one RS and one AG a step, both at E; u2 accumulates its
/// AllReduce to micro-batch 2's B1. Nothing runs at I. Strict: F1 10, F2 30, B2 60, B1 20, I 0,
/// F1 10, F2 30, B2 60, B1 20, E 15: 255, relaxed alike (no compute waits).
/// Memory: the gathered 200 lives through the whole step (launched at E, used F1.1 … B1.2); the
/// accumulated gradient 200 from B1.1 to its launch at E: F1.1 3250, F2.1 5200, B2.1 5200, B1.1
/// 3470, I 2400, F1.2 3450, F2.2 5400, B2.2 5400, B1.2 3470, E 2400: the peak is in micro-batch 2.
#[test]
fn a_unit_accumulating_and_keeping() {
    let p = two_micro_batches();
    let plan_text = r#"
        [[units]]
        name = "u1"
        level = "sdp"
        accumulate = true
        keep = true
        rs = [["E", 1]]
        ag = [["E", 1]]
        [[units]]
        name = "u2"
        level = "none"
        accumulate = true
        ar = [["B1", 1]]
        "#;
    let s = schedule(&p, plan_text).unwrap();
    let memory = [
        3250.0, 5200.0, 5200.0, 3470.0, 2400.0, 3450.0, 5400.0, 5400.0, 3470.0, 2400.0,
    ];
    let durations = [10.0, 30.0, 60.0, 20.0, 0.0, 10.0, 30.0, 60.0, 20.0, 15.0];
    for semantics in [Semantics::Strict, Semantics::Relaxed] {
        let sim = simulate(&p, &s, semantics);
        check(&sim, 255.0, &durations, &memory);
        assert_eq!(
            (sim.peak_slot.to_string(), sim.peak_micro_batch),
            ("F2".into(), Some(2))
        );
    }
    // u2 reading u1's parameters (tied, DESIGN §3.9): u1's full gradient is written from B2.1,
    // one slot before its own B1.1 (+200 at B2.1); from B1.1 on the accumulated gradient holds
    // it, so micro-batch 2 adds nothing.
    let mut tied = p.clone();
    tied.units[1].reads_params_of = Some("u1".into());
    let s = schedule(&tied, plan_text).unwrap();
    let mut memory = memory;
    memory[2] += 200.0;
    check(
        &simulate(&tied, &s, Semantics::Strict),
        255.0,
        &durations,
        &memory,
    );
}

/// The same plan at every boundary: inner launches where the step's are, no accumulation.
fn repeated(profile: &Profile, flat: &Schedule) -> Schedule {
    let units = flat
        .units()
        .iter()
        .map(|u| {
            let inner = Accumulation::default()
                .inner_ops(u.level)
                .into_iter()
                .map(|op| (op, u.launches[&op].clone()))
                .collect();
            UnitSchedule {
                shard_group: None,
                secondary_group: None,
                accumulation: Accumulation {
                    accumulate: false,
                    keep: false,
                    inner,
                    ..Accumulation::default()
                },
                ..u.clone()
            }
        })
        .collect();
    Schedule::new(profile, units).unwrap()
}

/// Without E's compute and optimizer steps an inner boundary is the step's, so K micro-batches
/// that reduce and re-gather as one iteration does take K iterations' time (strict), each slot
/// holding what the flat timeline's holds; relaxed drops the waits of replicated units' later
/// forwards, so it takes at most that. On 200 random profiles and plans, K = 2, 3, 5.
#[test]
fn repeated_micro_batches_take_k_iterations() {
    let mut rng = Rng(44);
    for case in 0..200 {
        let units = 1 + case % 5;
        let mut flat_profile = random_profile(&mut rng, units, 0.3, 5000);
        flat_profile.iteration_extra_us = 0.0;
        for u in &mut flat_profile.units {
            u.optimizer_us = 0.0;
        }
        let flat = random_schedule(&mut rng, &flat_profile);
        let flat_strict = simulate(&flat_profile, &flat, Semantics::Strict);
        let flat_relaxed = simulate(&flat_profile, &flat, Semantics::Relaxed);
        let k = [2, 3, 5][case % 3];
        let mut profile = flat_profile.clone();
        profile.micro_batches = k;
        let step = repeated(&profile, &flat);
        let strict = simulate(&profile, &step, Semantics::Strict);
        let what = format!("case {case}, K = {k}");
        close(
            strict.iteration_time_us,
            f64::from(k) * flat_strict.iteration_time_us,
            &what,
        );
        for (s, slot) in strict.slots.iter().enumerate() {
            let same = &flat_strict.slots[s % flat_strict.slots.len()];
            close(
                slot.memory_bytes,
                same.memory_bytes,
                &format!("{what}: memory"),
            );
            close(
                slot.duration_us,
                same.duration_us,
                &format!("{what}: duration"),
            );
        }
        close(
            strict.peak_memory_bytes,
            flat_strict.peak_memory_bytes,
            &what,
        );
        let relaxed = simulate(&profile, &step, Semantics::Relaxed);
        let bound = f64::from(k) * flat_relaxed.iteration_time_us;
        assert!(
            relaxed.iteration_time_us <= bound * (1.0 + 1e-9),
            "{what}: relaxed {} above K × {}",
            relaxed.iteration_time_us,
            flat_relaxed.iteration_time_us
        );
    }
}

/// Random plans with random accumulate and keep: relaxed never above strict, every plan file
/// round-trips to the same schedule, and accumulating everything never reduces more often.
#[test]
fn random_accumulating_plans() {
    let mut rng = Rng(4242);
    for case in 0..200 {
        let mut profile = random_profile(&mut rng, 1 + case % 5, 0.2, 5000);
        profile.micro_batches = [2, 3, 4][case % 3];
        let s = random_schedule(&mut rng, &profile);
        let strict = simulate(&profile, &s, Semantics::Strict);
        let relaxed = simulate(&profile, &s, Semantics::Relaxed);
        assert!(
            relaxed.iteration_time_us <= strict.iteration_time_us * (1.0 + 1e-9),
            "case {case}: relaxed {} > strict {}",
            relaxed.iteration_time_us,
            strict.iteration_time_us
        );
        let slots = profile.micro_batches as usize * (2 * profile.unit_count() + 1);
        assert_eq!(strict.slots.len(), slots);
        let (plan, _) = plan_with_prediction(&profile, &s, Producer::default(), None);
        let text = plan.to_toml();
        let back: Plan = shardplan_scheduler::io::parse_toml(&text, "round trip").unwrap();
        assert_eq!(
            back.schedule(&profile, "round trip").unwrap(),
            s,
            "case {case}"
        );
    }
}

/// fsdp2 reduces every micro-batch, fsdp2-nosync once: fewer collectives, a longer-lived
/// unsharded gradient; zero2 keeps its gathered parameters. The no-sync baselines need K ≥ 2.
#[test]
fn baselines_with_micro_batches() {
    let mut profile = common::zoo_profile("llama2-7b");
    assert!(baseline(&profile, BaselineKind::Fsdp2NoSync, Recompute::Off, None).is_err());
    profile.micro_batches = 4;
    let plan = |kind| {
        baseline(&profile, kind, Recompute::Off, None)
            .unwrap()
            .simulation
    };
    let (sync, nosync) = (plan(BaselineKind::Fsdp2), plan(BaselineKind::Fsdp2NoSync));
    assert!(nosync.comm_us < sync.comm_us);
    assert!(nosync.peak_memory_bytes > sync.peak_memory_bytes);
    let (ddp, ddp_nosync) = (plan(BaselineKind::Ddp), plan(BaselineKind::DdpNoSync));
    assert!(ddp_nosync.comm_us < ddp.comm_us);
    close(
        ddp_nosync.peak_memory_bytes,
        ddp.peak_memory_bytes,
        "replicated gradients are full anyway",
    );
    let zero2 = baseline(&profile, BaselineKind::Zero2, Recompute::Off, None).unwrap();
    assert!(zero2.schedule.units().iter().all(|u| u.accumulation.keep));
    for kind in BaselineKind::of(&profile) {
        for checkpoint in [Recompute::Off, Recompute::On] {
            let b = baseline(&profile, kind, checkpoint, None).unwrap();
            assert_eq!(b.plan.micro_batches, 4);
        }
    }
}

/// Plans that break the rules of micro-batches are refused, naming the unit, op or field.
#[test]
fn bad_accumulating_plans_are_refused() {
    let p = two_micro_batches();
    let refused = |units: &str, expected: &str| {
        let e = schedule(&p, units).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}\nexpected: {expected}");
    };
    let u2 = "[[units]]\nname = \"u2\"\nlevel = \"none\"\naccumulate = true\nar = [[\"B1\", 1]]\n";
    refused(
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"none\"\nkeep = true\naccumulate = true\nar = [[\"E\", 1]]\n{u2}"
        ),
        "keep = true needs sdp or fsdp",
    );
    refused(
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"sdp\"\nrs = [[\"E\", 1]]\nag = [[\"E\", 1]]\nrs_inner = [[\"I\", 1]]\n{u2}"
        ),
        "AG",
    );
    refused(
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"sdp\"\naccumulate = true\nkeep = true\nrs = [[\"E\", 1]]\nag = [[\"E\", 1]]\nrs_inner = [[\"I\", 1]]\n{u2}"
        ),
        "does not run at the inner boundary",
    );
    refused(
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"sdp\"\nkeep = true\naccumulate = true\nrs = [[\"I\", 1]]\nag = [[\"E\", 1]]\n{u2}"
        ),
        "units[0].rs",
    );
    refused(
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"sdp\"\nkeep = true\nrs = [[\"E\", 1]]\nag = [[\"E\", 1]]\nrs_inner = [[\"E\", 1]]\n{u2}"
        ),
        "units[0].rs_inner",
    );
    // An fsdp lender that keeps: its borrower would read the parameters AGB rewrites.
    let mut tied = p.clone();
    tied.units[1].reads_params_of = Some("u1".into());
    let e = schedule(
        &tied,
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"fsdp\"\nkeep = true\naccumulate = true\nrs = [[\"E\", 1]]\nagf = [[\"E\", 1]]\nagb = [[\"F2\", 1]]\n{u2}"
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("keep = true is not available to an fsdp unit whose parameters unit 2 (`u2`)"),
        "{e}"
    );
    // A plan for another K, and accumulation at K = 1.
    let mut one = p.clone();
    one.micro_batches = 1;
    let text = common::plan_toml(
        &p,
        &format!(
            "[[units]]\nname = \"u1\"\nlevel = \"none\"\nar = [[\"E\", 1]]\naccumulate = true\n{u2}"
        ),
    )
    .replace(&p.digest(), &one.digest());
    let plan: Plan = shardplan_scheduler::io::parse_toml(&text, "plan").unwrap();
    let e = plan.schedule(&one, "plan").unwrap_err().to_string();
    assert!(
        e.contains("micro_batches") && e.contains("another number"),
        "{e}"
    );
    let flat = common::plan_toml(
        &one,
        &format!("[[units]]\nname = \"u1\"\nlevel = \"none\"\nar = [[\"E\", 1]]\n{u2}"),
    );
    let plan: Plan = shardplan_scheduler::io::parse_toml(&flat, "plan").unwrap();
    let e = plan.schedule(&one, "plan").unwrap_err().to_string();
    assert!(e.contains("need micro-batches"), "{e}");
    // K = 0 in a profile.
    let mut zero = p.clone();
    zero.micro_batches = 0;
    let e = zero.validate("p.toml").unwrap_err().to_string();
    assert!(e.contains("micro_batches"), "{e}");
}
