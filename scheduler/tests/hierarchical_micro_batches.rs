//! Hierarchical levels with micro-batches (DESIGN §3.11.1): a hand-computed HSDP step of K = 2
//! whose shard-group unit reduce-scatters every micro-batch and all-reduces across replicas once
//! (and, against it, after every micro-batch, and accumulating unsharded); the refusals of
//! `replica_reduce`; random hierarchical plans at K ≥ 2 (relaxed ≤ strict, their file format);
//! the hierarchical baselines at K ≥ 2, their FSDP2 export and their refusal at K = 1; `solve` at
//! K ≥ 2 on nodes never worse than the best hierarchical baseline.

mod common;

use common::{Rng, check, close, random_profile, random_schedule, schedule, with_topology};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::baselines::{Preference, best_baseline};
use shardplan_scheduler::export::fsdp2;
use shardplan_scheduler::ilp::{SolveOptions, solve};
use shardplan_scheduler::plan::{Plan, Producer, plan_with_prediction};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, RecomputeChoice, ReplicaReduce};
use shardplan_scheduler::sim::{Semantics, Simulation, simulate};
use shardplan_scheduler::timeline::Op;

/// `common::three_units_on_two_nodes` with K = 2 micro-batches per step.
fn two_micro_batches() -> Profile {
    let mut p = common::three_units_on_two_nodes();
    p.micro_batches = 2;
    p.validate("test profile").unwrap();
    p
}

/// u2 sdp over the shard group of 2 (HSDP), reduce-scattering after every micro-batch's B1 and
/// all-reducing its shard across the replica group once, after the step's; u1 fsdp and u3 sdp
/// over the world. Every inner launch sits where the step's does (I in place of E).
const RA_ONCE: &str = r#"
    [[units]]
    name = "u1"
    level = "fsdp"
    rs = [["E", 1]]
    agf = [["E", 1]]
    agb = [["F3", 1]]
    rs_inner = [["I", 1]]
    agf_inner = [["I", 1]]
    [[units]]
    name = "u2"
    level = "sdp"
    shard_group = 2
    replica_reduce = "last"
    rs = [["B1", 1]]
    ag = [["F1", 1]]
    rs_inner = [["B1", 1]]
    ag_inner = [["F1", 1]]
    [[units]]
    name = "u3"
    level = "sdp"
    rs = [["B2", 1]]
    ag = [["B2", 1]]
    rs_inner = [["B2", 1]]
    ag_inner = [["B2", 1]]
"#;

/// The slots of micro-batch m (1-based) of a step of 7-slot micro-batches.
fn micro_batch(sim: &Simulation, m: usize) -> &[shardplan_scheduler::sim::SlotReport] {
    &sim.slots[7 * (m - 1)..7 * m]
}

/// The (slot, micro-batch) of every RA block of unit u2.
fn replica_all_reduces(sim: &Simulation) -> Vec<(String, Option<u32>, f64)> {
    sim.blocks
        .iter()
        .filter(|b| b.op == Op::ReplicaAllReduce)
        .map(|b| (b.slot.to_string(), b.micro_batch, b.end_us - b.start_us))
        .collect()
}

/// Blocks (κ = 0, no optimizer time): u1 AG 800 B among the world 10 + 80 = 90, RS 5 + 40 = 45
/// (inter link); u2 over the node: RS 400 B 1 + 4 = 5, AG 2 + 4 = 6 (intra), its RA of the
/// 200-byte shard 3 + 20 = 23 (inter); u3 AG 200 B 10 + 20 = 30, RS 5 + 10 = 15 (inter).
///
/// Strict, each micro-batch F1 F2 F3 B3 B2 B1 and its boundary: F1 max(10, u2 AG 6) = 10, F2 20,
/// F3 max(5, u1 AGB 90) = 90, B3 10, B2 max(40, u3 RS 15 + AG 30) = 45, B1 max(20, u2 RS 5) = 20;
/// I (micro-batch 1) u1 RS 45 + AGF 90 = 135 — u2's RS^1 adds into its shard, no RA; E
/// (micro-batch 2) 45 + 90 + u2's RA 23 = 158. T = 330 + 353 = 683.
///
/// Memory, the same in both micro-batches: persistent 800 (u1 Ψ·8/4) + 800 (u2 Ψ·8/2, over the
/// node) + 200 (u3) = 1800, communicators (world, u2's shard and replica groups) 300. Activations
/// 1000 / 3000 / 3500 / 3500 / 3000 / 1000 / 0. Gathered: u1's AGF 800 at the boundary and F1,
/// its AGB 800 at F3, B3, B2, B1; u2's AG 400 from F1 to B2; u3's AG 200 in every slot (each
/// micro-batch's launched at the B2 before). Gradients: u1 800 at B1 and the boundary, u2 400 at
/// B2 and B1 (its RS^m launches at B1 of micro-batch m: nothing beyond the shard), u3 200 at B3
/// and B2.
/// F1 2100 + 1000 + 1400 = 4500   F2 2100 + 3000 + 600 = 5700   F3 2100 + 3500 + 1400 = 7000
/// B3 7000 + 200 = 7200   B2 2100 + 3000 + 1400 + 600 = 7100   B1 2100 + 1000 + 1000 + 1200 =
/// 5300   I/E 2100 + 1000 + 800 = 3900: the peak at B3 of micro-batch 1 (the first of equals).
#[test]
fn hsdp_reduce_scatters_every_micro_batch_and_all_reduces_once() {
    let p = two_micro_batches();
    let s = schedule(&p, RA_ONCE).unwrap();
    assert_eq!(
        s.units()[1].accumulation.replica_reduce,
        ReplicaReduce::Last
    );
    let strict = simulate(&p, &s, Semantics::Strict);
    let durations = [10.0, 20.0, 90.0, 10.0, 45.0, 20.0];
    let first: Vec<f64> = durations.iter().copied().chain([135.0]).collect();
    let last: Vec<f64> = durations.iter().copied().chain([158.0]).collect();
    check(&strict, 683.0, &[first, last].concat());
    let memory = [4500.0, 5700.0, 7000.0, 7200.0, 7100.0, 5300.0, 3900.0];
    for m in [1, 2] {
        for (slot, expected) in micro_batch(&strict, m).iter().zip(memory) {
            close(
                slot.memory_bytes,
                expected,
                &format!("memory of {}", slot.label()),
            );
        }
    }
    assert_eq!(strict.peak_at(), "B3 of micro-batch 1");
    assert_eq!(
        replica_all_reduces(&strict),
        [("E".to_string(), Some(2), 23.0)]
    );
    let rs: Vec<_> = strict
        .blocks
        .iter()
        .filter(|b| b.unit == 1 && b.op == Op::ReduceScatter)
        .map(|b| (b.slot.to_string(), b.micro_batch))
        .collect();
    assert_eq!(
        rs,
        [("B1".to_string(), Some(1)), ("B1".to_string(), Some(2))]
    );
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= strict.iteration_time_us + 1e-9);
}

/// The same plan with the replica AllReduce after every micro-batch (`"every"`, FSDP2's
/// default): u2's RA^1 runs at I of micro-batch 1, beside u1's RS and AGF on the inter link:
/// I = 135 + 23 = 158, T = 353 + 353 = 706 (23 more); memory unchanged (RA reduces the shard in
/// place).
#[test]
fn hsdp_all_reducing_every_micro_batch_adds_one_replica_all_reduce() {
    let p = two_micro_batches();
    let plan = RA_ONCE.replace("replica_reduce = \"last\"\n", "");
    let s = schedule(&p, &plan).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    close(strict.iteration_time_us, 706.0, "step time");
    close(strict.slots[6].duration_us, 158.0, "I of micro-batch 1");
    assert_eq!(
        replica_all_reduces(&strict),
        [
            ("I".to_string(), Some(1), 23.0),
            ("E".to_string(), Some(2), 23.0)
        ]
    );
    close(strict.peak_memory_bytes, 7200.0, "peak");
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= strict.iteration_time_us + 1e-9);
    // Relaxed: each RA starts after its own micro-batch's RS is done.
    let blocks = |op: Op| -> Vec<(f64, f64)> {
        relaxed
            .blocks
            .iter()
            .filter(|b| b.unit == 1 && b.op == op)
            .map(|b| (b.start_us, b.end_us))
            .collect()
    };
    for (rs, ra) in blocks(Op::ReduceScatter)
        .iter()
        .zip(blocks(Op::ReplicaAllReduce))
    {
        assert!(ra.0 >= rs.1 - 1e-9, "RA {ra:?} before RS {rs:?}");
    }
}

/// u2 accumulating its unsharded gradient instead (`accumulate = true`: one RS and RA a step,
/// FSDP2's `set_requires_gradient_sync(False)`): no RS^1, the same time (u2's RS of 5 hid under
/// B1's 20), but its 400-byte gradient lives from B2 of micro-batch 1 to B1 of micro-batch 2:
/// B3 of micro-batch 2 holds 7200 + 400 = 7600, the peak.
#[test]
fn hsdp_accumulating_unsharded_holds_the_gradient_across_micro_batches() {
    let p = two_micro_batches();
    let plan = RA_ONCE.replace(
        "replica_reduce = \"last\"\n    rs = [[\"B1\", 1]]\n    ag = [[\"F1\", 1]]\n    rs_inner = [[\"B1\", 1]]",
        "accumulate = true\n    rs = [[\"B1\", 1]]\n    ag = [[\"F1\", 1]]",
    );
    let s = schedule(&p, &plan).unwrap();
    assert!(s.units()[1].accumulation.accumulate);
    let strict = simulate(&p, &s, Semantics::Strict);
    close(strict.iteration_time_us, 683.0, "step time");
    let second = micro_batch(&strict, 2);
    close(second[3].memory_bytes, 7600.0, "B3 of micro-batch 2");
    close(
        micro_batch(&strict, 1)[6].memory_bytes,
        4300.0,
        "I of micro-batch 1",
    );
    assert_eq!(strict.peak_at(), "B3 of micro-batch 2");
}

/// `replica_reduce = "last"` is refused naming the field on a unit over the world, on an
/// accumulating unit and at K = 1; an inner RS in its window's last slot is refused where its RA
/// would follow it out of the window.
#[test]
fn bad_replica_reductions_are_refused_naming_the_field() {
    let p = two_micro_batches();
    let refused = |profile: &Profile, plan: &str, expected: &str| {
        let e = schedule(profile, plan).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    };
    refused(
        &p,
        &RA_ONCE.replace("shard_group = 2\n", ""),
        "replica_reduce = \"last\" needs a unit over a shard group",
    );
    refused(
        &p,
        &RA_ONCE.replace(
            "replica_reduce = \"last\"",
            "replica_reduce = \"last\"\n    accumulate = true",
        ),
        "replica_reduce = \"last\" needs accumulate = false",
    );
    let one = common::three_units_on_two_nodes();
    let flat = RA_ONCE
        .lines()
        .filter(|l| !l.contains("_inner"))
        .collect::<Vec<_>>()
        .join("\n");
    refused(
        &one,
        &flat,
        "replica_reduce and inner launches need micro-batches",
    );
    refused(
        &p,
        &RA_ONCE
            .replace("replica_reduce = \"last\"\n", "")
            .replace("rs_inner = [[\"B1\", 1]]", "rs_inner = [[\"F1\", 1]]"),
        "replica AllReduce follows in the next slot",
    );
    let unknown = RA_ONCE.replace("\"last\"", "\"sometimes\"");
    let e = schedule(&p, &unknown).unwrap_err().to_string();
    assert!(e.contains("replica_reduce"), "{e}");
}

/// Random plans on nodes at K = 2, 3, 4 (shard groups, random `replica_reduce`, secondary
/// groups): relaxed never above strict, and the plan file round-trips to the same schedule.
#[test]
fn random_hierarchical_plans_with_micro_batches() {
    let mut rng = Rng(6363);
    let mut over_shard_groups = 0;
    for case in 0..200 {
        let mut profile = random_profile(&mut rng, 2 + case % 4, 0.2, 5000);
        profile.comm_slowdown = [0.0, 0.3][case % 2];
        if !with_topology(&mut rng, &mut profile) {
            continue;
        }
        profile.micro_batches = [2, 3, 4][case % 3];
        let s = random_schedule(&mut rng, &profile);
        over_shard_groups += usize::from(s.units().iter().any(|u| u.shard_group.is_some()));
        let strict = simulate(&profile, &s, Semantics::Strict);
        let relaxed = simulate(&profile, &s, Semantics::Relaxed);
        assert!(
            relaxed.iteration_time_us <= strict.iteration_time_us * (1.0 + 1e-9),
            "case {case}: relaxed {} > strict {}",
            relaxed.iteration_time_us,
            strict.iteration_time_us
        );
        let (plan, _) = plan_with_prediction(&profile, &s, Producer::default(), None);
        let back: Plan =
            shardplan_scheduler::io::parse_toml(&plan.to_toml(), "round trip").unwrap();
        assert_eq!(
            back.schedule(&profile, "round trip").unwrap(),
            s,
            "case {case}"
        );
    }
    assert!(
        over_shard_groups >= 30,
        "only {over_shard_groups} over a shard group"
    );
}

/// At K = 2 every hierarchical baseline builds a plan the simulator accepts (its file converts
/// back to its schedule), over the shard group or with the secondary shard its kind names, with
/// the switches its kind sets; each exports to FSDP2 exactly, FSDP2's time equal to the plan's.
#[test]
fn hierarchical_baselines_at_two_micro_batches() {
    let p = two_micro_batches();
    for kind in BaselineKind::HIERARCHICAL {
        assert!(BaselineKind::of(&p).contains(&kind), "{}", kind.name());
        for checkpoint in [Recompute::Off, Recompute::On] {
            let label = kind.label(checkpoint);
            let b = baseline(&p, kind, checkpoint, None).unwrap();
            let back = b.plan.schedule(&p, &label).unwrap();
            assert_eq!(back, b.schedule, "{label}");
            let units = b.schedule.units();
            let hsdp = kind.name().starts_with("hsdp");
            assert_eq!(units[1].shard_group.is_some(), hsdp, "{label}");
            assert_eq!(units[1].secondary_group.is_some(), !hsdp, "{label}");
            let accumulate = kind.name().ends_with("-nosync");
            assert_eq!(units[1].accumulation.accumulate, accumulate, "{label}");
            let once = kind == BaselineKind::HsdpRaOnce;
            let expected = if once {
                ReplicaReduce::Last
            } else {
                ReplicaReduce::Every
            };
            assert_eq!(units[1].accumulation.replica_reduce, expected, "{label}");
            let e = fsdp2(&p, &b.schedule).unwrap();
            assert!(e.exact, "{label}: {:?}", e.approximations);
            assert_eq!(e.units[1].requires_all_reduce, !once, "{label}");
            assert_eq!(e.units[1].requires_gradient_sync, !accumulate, "{label}");
            close(
                e.fsdp2_iteration_time_us,
                e.plan_iteration_time_us,
                &format!("{label}: FSDP2's time"),
            );
        }
    }
    // hsdp-ra-once saves one RA per inner boundary against hsdp; hsdp-nosync all inner RS too.
    let time = |kind| {
        baseline(&p, kind, Recompute::Off, None)
            .unwrap()
            .simulation
            .iteration_time_us
    };
    assert!(time(BaselineKind::HsdpRaOnce) <= time(BaselineKind::Hsdp));
    assert!(time(BaselineKind::HsdpNoSync) <= time(BaselineKind::HsdpRaOnce));
}

/// The micro-batch forms are refused at K = 1, naming `--micro-batches` and the baseline they
/// are there; hsdp and hpz are not.
#[test]
fn micro_batch_forms_are_refused_at_one_micro_batch() {
    let p = common::three_units_on_two_nodes();
    for (kind, base) in [
        (BaselineKind::HsdpNoSync, "hsdp"),
        (BaselineKind::HsdpRaOnce, "hsdp"),
        (BaselineKind::HpzNoSync, "hpz"),
    ] {
        assert!(!BaselineKind::of(&p).contains(&kind));
        let why = kind.unavailable_on(&p).unwrap();
        assert!(why.contains("--micro-batches"), "{why}");
        assert!(why.contains(&format!("it is {base}")), "{why}");
        let e = baseline(&p, kind, Recompute::Off, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(kind.name()), "{e}");
    }
    for kind in [BaselineKind::Hsdp, BaselineKind::Hpz] {
        assert!(kind.unavailable_on(&p).is_none());
    }
}

/// llama2-70b on 8 nodes of 8 H100s at K = 8 and 79.65 GiB: the fastest baseline that fits is
/// hierarchical (hpz+ckpt, 55,316 ms); the micro-batch MIP (over the world and the node's shard
/// and secondary groups, DESIGN §4.8) starts from it, and `solve` returns a plan at least as
/// fast: the MIP's, or that baseline where a 5-second limit stops the MIP before it improves.
#[test]
fn solve_at_micro_batches_on_nodes_is_never_worse_than_a_hierarchical_baseline() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../profiles/llama2-70b-h100-8x8.toml");
    let mut profile = Profile::load(&path).unwrap();
    profile.micro_batches = 8;
    let cap = (79.65 * f64::from(1u32 << 30)) as u64;
    let best = best_baseline(
        &profile,
        &BaselineKind::of(&profile),
        RecomputeChoice::Allowed,
        Some(cap),
        Preference::Fastest,
    )
    .unwrap();
    assert!(
        BaselineKind::HIERARCHICAL.contains(&best.kind),
        "{}",
        best.label()
    );
    let options = SolveOptions {
        memory_cap_bytes: Some(cap),
        time_limit_s: 5.0,
        ..SolveOptions::default()
    };
    let solved = solve(&profile, &options).unwrap();
    let time = solved.simulation.iteration_time_us;
    assert!(time <= best.plan.simulation.iteration_time_us * (1.0 + 1e-9));
    assert!(solved.simulation.peak_memory_bytes <= cap as f64);
    if time < best.plan.simulation.iteration_time_us {
        return; // the MIP found a faster plan
    }
    let units = solved.schedule.units();
    assert!(
        units
            .iter()
            .any(|u| u.shard_group.is_some() || u.secondary_group.is_some())
    );
    assert_eq!(solved.report.warm_start.as_ref().unwrap().0, best.label());
}
