//! Hand-computed examples of FSDP2's execution semantics (DESIGN §3.12): what its hooks issue at
//! each module boundary, the schedule the simulator runs for a set of `fully_shard` settings, and
//! the time and memory that follow. Every figure is worked out in the comments.

mod common;

use common::{affine, close, profile, three_units_on_two_nodes};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::export::fsdp2 as export;
use shardplan_scheduler::fsdp2::{Reshard, Settings, Sharding, UnitSettings, evaluate};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, ReplicaReduce};
use shardplan_scheduler::timeline::Op;

/// Four units of Ψ 1000 (one block), f 10, b 20, act 100, N = 4, p = g = 2, o = 12, κ = 0; every
/// collective t = 1 + bytes/100: a gather or a reduction of 2000 bytes takes 21.
fn four_units(micro_batches: u32) -> Profile {
    let unit = (1000, 10.0, 20.0, 100, 10, 0, 0);
    let mut p = profile(
        4,
        1 << 20,
        0.0,
        0.0,
        (2, 2, 12),
        &[unit; 4],
        affine(1.0, 100.0),
        affine(1.0, 100.0),
        affine(1.0, 100.0),
    );
    p.micro_batches = micro_batches;
    p
}

fn sharded(shard_group: Option<u32>, reshard_after_forward: Reshard) -> UnitSettings {
    UnitSettings::new(Sharding::Sharded {
        shard_group,
        reshard_after_forward,
    })
}

/// u1–u3 fsdp, u4 sdp (FSDP2's root keeps its last module), each forward prefetching the next.
fn fsdp_chain() -> Vec<UnitSettings> {
    let mut units = vec![
        sharded(None, Reshard::Free),
        sharded(None, Reshard::Free),
        sharded(None, Reshard::Free),
        sharded(None, Reshard::Keep),
    ];
    for (j, u) in units.iter_mut().enumerate().take(3) {
        u.forward_prefetch = vec![j + 1];
    }
    units
}

fn entry<'a>(
    e: &'a shardplan_scheduler::fsdp2::Evaluation,
    at: &str,
) -> &'a shardplan_scheduler::fsdp2::evaluate::TimelineEntry {
    e.timeline.iter().find(|t| t.at == at).unwrap()
}

/// Default backward prefetch: u4's pre-backward issues u3 (B4), u3's u2 (B3), u2's u1 (B2).
/// Strict (κ = 0: d = max(c, Q)), slots F1 F2 F3 F4 B4 B3 B2 B1 E:
/// F1 AGF2 21 | F2 AGF3 21 | F3 AG4 21 | F4 10 | B4 AGB3 21 | B3 RS4 + AGB2 42 | B2 RS3 + AGB1 42 |
/// B1 RS2 21 | E RS1 + AGF1 42 → 241.
/// Memory of B4: persistent 4 · 1000 · 16/4 = 16000, activations 400, u4's gather 2000, u3's
/// backward gather 2000, u4's gradient 2000 → 22400; FSDP2 adds u4's reduce-scatter input beside
/// its gradient, 2000 → 24400 (u4 is not copied out again: it stayed unsharded since F3).
/// B3: 16000 + 300 + gathers u3, u2 4000 + gradients u4, u3 4000 = 24300; FSDP2 adds u3's
/// all-gather output at its copy-out (2000) and its reduce-scatter input (2000) → 28300, the peak.
///
/// u4's backward list [u3, u2] switches its default off: u3 and u2 both start at B4 (B4 42, B3
/// RS4 21: still 241); B4 holds u2's gather too, 26400.
///
/// u4's list [u2] alone leaves u3 to its own pre-backward: exposed, refused naming u3.
#[test]
fn an_explicit_backward_list_switches_off_the_default_prefetch() {
    let p = four_units(1);
    let default = Settings::new(&p, fsdp_chain()).unwrap();
    let slot = |s: &Settings, unit: usize, op: Op| {
        let t = s.schedule().timeline();
        t.slot(s.schedule().launches(unit, op)[0].slot).to_string()
    };
    assert_eq!(slot(&default, 2, Op::GatherBackward), "B4");
    assert_eq!(slot(&default, 1, Op::GatherBackward), "B3");
    assert_eq!(slot(&default, 0, Op::GatherForward), "E");
    assert_eq!(slot(&default, 3, Op::ReduceScatter), "B3");
    let e = evaluate(&p, &default);
    close(e.iteration_time_us(), 241.0, "time");
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(
        durations,
        [21.0, 21.0, 21.0, 10.0, 21.0, 42.0, 42.0, 21.0, 42.0]
    );
    close(e.memory_bytes[4], 24400.0, "B4");
    close(e.memory_bytes[5], 28300.0, "B3");
    assert_eq!((e.peak_memory_bytes, e.peak_slot.as_str()), (28300, "B3"));
    let b4 = entry(&e, "B:u4");
    assert_eq!(
        (b4.unsharded.clone(), b4.issued.clone()),
        (vec!["u3".into(), "u4".into()], vec!["u3".to_string()])
    );

    let mut units = fsdp_chain();
    units[3].backward_prefetch = vec![2, 1];
    let explicit = Settings::new(&p, units).unwrap();
    assert_eq!(slot(&explicit, 1, Op::GatherBackward), "B4");
    let e = evaluate(&p, &explicit);
    close(e.iteration_time_us(), 241.0, "time");
    close(e.memory_bytes[4], 26400.0, "B4 with u2's gather");
    assert_eq!(entry(&e, "B:u4").unsharded, ["u2", "u3", "u4"]);
    assert_eq!(entry(&e, "B:u3").unsharded, ["u2", "u3"]);

    let mut units = fsdp_chain();
    units[3].backward_prefetch = vec![1];
    let refused = Settings::new(&p, units).unwrap_err().to_string();
    assert!(
        refused.contains("u3.backward_gather") && refused.contains("own pre-backward"),
        "{refused}"
    );
}

fn three(first: UnitSettings, second: UnitSettings) -> Vec<UnitSettings> {
    let mut units = vec![first, second, sharded(None, Reshard::Keep)];
    units[0].forward_prefetch = vec![1];
    units[1].forward_prefetch = vec![2];
    units
}

/// u1 with `reshard_after_forward = 2` (hpZ), u2 fsdp, u3 sdp. Blocks: u1 AG 800 B: 90 across
/// nodes, 10 inside its node (the backward gather); RS 45. u2 AG 50, RS 25. u3 AG 30, RS 15.
/// Issued: u1's AGF at E (own), u2's at F1, u3's at F2; backward defaults: u2 at B3, u1 at B2.
/// Strict: F1 max(10, 50) = 50 | F2 max(20, 30) = 30 | F3 5 | B3 max(10, 50) = 50 |
/// B2 max(40, inter RS3 15, intra AGB1 10) = 40 | B1 max(20, 25) = 25 | E 45 + 90 = 135 → 335.
/// With `reshard_after_forward = True` u1's backward gather runs across nodes: B2 max(40, 15 +
/// 90) = 105 → 400.
/// Memory of B2: persistent 800 + 400 + 200 = 1400, communicators (world, node) 200, u1's
/// secondary shard 800/2 = 400, activations 3000, gathers u2 400 + u1 800, gradients u3 200 + u2
/// 400 → 6800; FSDP2 adds u2's all-gather output (400) and reduce-scatter input (400) → 7600.
#[test]
fn reshard_after_forward_h_gathers_the_backward_inside_the_node() {
    let p = three_units_on_two_nodes();
    let hpz = Settings::new(
        &p,
        three(
            sharded(None, Reshard::ToSecondary(2)),
            sharded(None, Reshard::Free),
        ),
    )
    .unwrap();
    assert_eq!(hpz.schedule().units()[0].secondary_group, Some(2));
    let e = evaluate(&p, &hpz);
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [50.0, 30.0, 5.0, 50.0, 40.0, 25.0, 135.0]);
    close(e.memory_bytes[4], 7600.0, "B2");
    let b2 = entry(&e, "B:u2");
    assert_eq!(
        (b2.unsharded.clone(), b2.issued.clone()),
        (vec!["u1".into(), "u2".into()], vec!["u1".to_string()])
    );
    let world = Settings::new(
        &p,
        three(sharded(None, Reshard::Free), sharded(None, Reshard::Free)),
    )
    .unwrap();
    close(evaluate(&p, &world).iteration_time_us(), 400.0, "without H");
    let too_big = Settings::new(
        &p,
        three(
            sharded(None, Reshard::ToSecondary(4)),
            sharded(None, Reshard::Free),
        ),
    );
    assert!(too_big.is_err());
}

/// u2 over shard groups of 2 (HSDP: its node), u1 fsdp and u3 sdp over the world. u2's blocks in
/// its node: AG 2 + 400/100 = 6, RS 1 + 4 = 5; its replica AllReduce of the 200-byte shard across
/// nodes 3 + 20 = 23, one slot after the reduce-scatter (FSDP2 runs it on its all-reduce stream
/// after the reduce-scatter).
/// Strict: F1 max(10, intra AGF2 6) = 10 | F2 max(20, AG3 30) = 30 | F3 5 | B3 max(10, intra 6)
/// = 10 | B2 max(40, RS3 15 + AGB1 90) = 105 | B1 max(20, intra RS2 5) = 20 |
/// E inter RS1 45 + RA2 23 + AGF1 90 = 158 → 338.
#[test]
fn hsdp_all_reduces_across_replicas_after_the_reduce_scatter() {
    let p = three_units_on_two_nodes();
    let hsdp = Settings::new(
        &p,
        three(
            sharded(None, Reshard::Free),
            sharded(Some(2), Reshard::Free),
        ),
    )
    .unwrap();
    let s = hsdp.schedule();
    let at = |op| s.timeline().slot(s.launches(1, op)[0].slot).to_string();
    assert_eq!(
        (at(Op::ReduceScatter), at(Op::ReplicaAllReduce)),
        ("B1".into(), "E".into())
    );
    let e = evaluate(&p, &hsdp);
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [10.0, 30.0, 5.0, 10.0, 105.0, 20.0, 158.0]);
    close(e.iteration_time_us(), 338.0, "time");
    // The hsdp baseline exports exactly: its replica AllReduce is where FSDP2 issues it.
    let plan = baseline(&p, BaselineKind::Hsdp, Recompute::Off, None).unwrap();
    let exported = export(&p, &plan.schedule).unwrap();
    assert!(exported.exact, "{:?}", exported.approximations);
    assert!(
        plan.schedule
            .units()
            .iter()
            .any(|u| u.shard_group.is_some())
    );
}

/// K = 2 micro-batches of fsdp_chain with u2 accumulating (`set_requires_gradient_sync(False)`
/// on the first) and u3 keeping its parameters (`set_reshard_after_backward(False)`).
/// Micro-batch 1: B:u2 reduces nothing (its unsharded gradient accumulates), B:u3 leaves u3
/// unsharded; micro-batch 2: F:u2's forward list finds u3 still whole and issues nothing, and u3
/// is not copied out again at F:u3; both reduce and reshard in the last backward.
/// FSDP2's copies beside the model's memory (unrolled slots: micro-batch m's B2 is 9m + 6, F3
/// 9m + 2): B2 of micro-batch 1 adds u2's all-gather output only (2000), of micro-batch 2 its
/// reduce-scatter input too (4000); F3 of micro-batch 1 adds u3's all-gather output, of
/// micro-batch 2 nothing.
#[test]
fn micro_batch_switches_skip_the_reduction_and_the_reshard() {
    let p = four_units(2);
    let mut units = fsdp_chain();
    units[1].requires_gradient_sync = false;
    units[2].reshard_after_backward = false;
    let settings = Settings::new(&p, units).unwrap();
    let u = &settings.schedule().units();
    assert!(u[1].accumulation.accumulate && u[2].accumulation.keep);
    let e = evaluate(&p, &settings);
    let at = |m: u32, at: &str| {
        e.timeline
            .iter()
            .find(|t| t.micro_batch == Some(m) && t.at == at)
            .unwrap()
    };
    assert_eq!(at(1, "F:u2").issued, ["u3"]);
    assert!(at(2, "F:u2").issued.is_empty());
    assert_eq!(at(2, "F:u2").unsharded, ["u2", "u3"]);
    assert_eq!(at(1, "B:u2").unsharded, ["u1", "u2", "u3"]);
    let extra = |s: usize| e.memory_bytes[s] - e.strict.slots[s].memory_bytes;
    close(extra(6), 2000.0, "B2 of micro-batch 1");
    close(extra(9 + 6), 4000.0, "B2 of micro-batch 2");
    close(extra(2), 2000.0, "F3 of micro-batch 1");
    close(extra(9 + 2), 0.0, "F3 of micro-batch 2");
    // One micro-batch per step has no switches to set.
    let mut one = fsdp_chain();
    one[1].requires_gradient_sync = false;
    let refused = Settings::new(&four_units(1), one).unwrap_err().to_string();
    assert!(refused.contains("u2.requires_gradient_sync"), "{refused}");
}

/// A forward list naming an earlier unit, and one naming a unit twice, are refused.
#[test]
fn prefetch_lists_run_in_their_pass_direction() {
    let p = four_units(1);
    let mut units = fsdp_chain();
    units[2].forward_prefetch = vec![1];
    let e = Settings::new(&p, units).unwrap_err().to_string();
    assert!(
        e.contains("u3.forward_prefetch") && e.contains("after it"),
        "{e}"
    );
    let mut units = fsdp_chain();
    units[3].backward_prefetch = vec![2, 2];
    let e = Settings::new(&p, units).unwrap_err().to_string();
    assert!(e.contains("u4.backward_prefetch"), "{e}");
}

/// u4 reads u1's parameters (a tied head, DESIGN §3.9): FSDP2 holds u1 with u4's tied module in
/// one group. fsdp_chain with u1 sdp (FSDP2 cannot free it between the two). Post-forward order
/// u2 u3 u4 u1 (the group's forward ends with u4's), so u1's pre-backward runs first, before
/// u4's compute, and its default prefetch names u4 (unsharded: nothing issued); u4's names u3,
/// u3's u2, and u2, first in that order, prefetches nothing. u1's post-backward follows the
/// step's last compute. Ψ = 1000, p = 2: 2000 bytes a unit.
///
/// | boundary | unsharded | issued | resharded after | reduced after | bytes |
/// | F:u1 | u1 u2 | u1 u2 | | | 4000 |
/// | F:u2 | u1 u2 u3 | u3 | u2 | | 6000 |
/// | F:u3 | u1 u3 u4 | u4 | u3 | | 6000 |
/// | F:u4 | u1 u4 | | | | 4000 |
/// | B:u1 | u1 u4 | | | | 4000 |
/// | B:u4 | u1 u3 u4 | u3 | u4 | u4 | 6000 |
/// | B:u3 | u1 u2 u3 | u2 | u3 | u3 | 6000 |
/// | B:u2 | u1 u2 | | u2 u1 | u2 u1 | 4000 |
///
/// u1 freed after its forward (fsdp) is refused; the fsdp1 baseline's export keeps it, noted.
#[test]
fn a_tied_lender_is_one_group_with_its_borrower() {
    let mut p = four_units(1);
    p.units[3].reads_params_of = Some("u1".into());
    let mut units = fsdp_chain();
    units[0].sharding = Sharding::Sharded {
        shard_group: None,
        reshard_after_forward: Reshard::Keep,
    };
    let e = evaluate(&p, &Settings::new(&p, units).unwrap());
    let names = |list: &[String]| list.join(" ");
    let got: Vec<_> = e
        .timeline
        .iter()
        .map(|t| {
            (
                t.at.as_str(),
                names(&t.unsharded),
                names(&t.issued),
                names(&t.resharded),
                names(&t.reduced),
                t.unsharded_bytes,
            )
        })
        .collect();
    let expected = [
        ("F:u1", "u1 u2", "u1 u2", "", "", 4000),
        ("F:u2", "u1 u2 u3", "u3", "u2", "", 6000),
        ("F:u3", "u1 u3 u4", "u4", "u3", "", 6000),
        ("F:u4", "u1 u4", "", "", "", 4000),
        ("B:u1", "u1 u4", "", "", "", 4000),
        ("B:u4", "u1 u3 u4", "u3", "u4", "u4", 6000),
        ("B:u3", "u1 u2 u3", "u2", "u3", "u3", 6000),
        ("B:u2", "u1 u2", "", "u2 u1", "u2 u1", 4000),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|&(at, u, i, r, d, b)| (at, u.into(), i.into(), r.into(), d.into(), b))
        .collect::<Vec<(&str, String, String, String, String, u64)>>();
    assert_eq!(got, expected);

    let refused = Settings::new(&p, fsdp_chain()).unwrap_err().to_string();
    assert!(
        refused.contains("u1.reshard_after_forward") && refused.contains("tied to u4"),
        "{refused}"
    );
    let plan = baseline(&p, BaselineKind::Fsdp1, Recompute::Off, None).unwrap();
    let exported = export(&p, &plan.schedule).unwrap();
    assert_eq!(
        (
            exported.units[0].level,
            exported.units[0].reshard_after_forward
        ),
        ("fsdp", Some(false))
    );
    assert!(!exported.exact);
    assert!(
        exported.approximations[0].starts_with("u1: fsdp, but one FSDP2 group with u4's"),
        "{:?}",
        exported.approximations
    );
    assert_eq!(exported.fsdp2_timeline[4].at, "B:u1");
}

/// Every unit replicated (ddp): a replicated unit's unsharded copy lives beside its parameters
/// while FSDP2 holds it unsharded. Untied, u1's copy is made at F:u1 and B:u1 and freed after
/// each; tied to u4, its group holds it from F1 until u4's forward ends, copies it again at its
/// pre-backward before u4's backward and frees it after B1. The tied settings' memory is the
/// untied's plus Ψ'_1·p in F2, F3, F4, B4, B3 and B2 (the model's own memory is the same: a
/// replicated lender adds nothing, DESIGN §3.9).
#[test]
fn a_tied_replicated_lender_keeps_its_copy_from_its_forward_to_its_post_backward() {
    let untied = four_units(1);
    let mut tied = four_units(1);
    tied.units[3].reads_params_of = Some("u1".into());
    let ddp = || vec![UnitSettings::new(Sharding::Replicated); 4];
    let memory = |p: &Profile| evaluate(p, &Settings::new(p, ddp()).unwrap()).memory_bytes;
    let copy = (untied.laid_out_params(0) * 2) as f64;
    let held = [0.0, copy, copy, copy, copy, copy, copy, 0.0, 0.0];
    for (s, (t, u)) in memory(&tied).iter().zip(memory(&untied)).enumerate() {
        close(t - u, held[s], &format!("slot {s}"));
    }
}

/// K = 2 micro-batches of fsdp_chain: gradient sync every micro-batch (FSDP2's default) against
/// u2 with `set_requires_gradient_sync(False)` on the first (no_sync).
/// Default: each micro-batch is K = 1's timeline, I in place of E (u1's RS^1 and u1's gather for
/// micro-batch 2 there, 21 + 21): 21 21 21 10 21 42 42 21 42 twice → 482.
/// no_sync: micro-batch 1's B1 loses RS2 (21): max(20, 0) = 20 → 481; micro-batch 2 unchanged.
/// Memory at F1 of micro-batch 2 (unrolled slot 9): persistent 16000, u1's activations 100, u1's
/// gather (launched at I) 2000 and u2's (launched at F1) 2000 → 20100; FSDP2 adds u1's all-gather
/// output at its copy-out, 2000 → 22100. With no_sync u2's unsharded gradient (2000) lives on from
/// B2 of micro-batch 1 → 22100, FSDP2 24100. FSDP2's timeline: B:u2 of micro-batch 1 reduces u2
/// by default, nothing under no_sync; micro-batch 2's reduces it either way.
#[test]
fn no_sync_skips_the_reduce_scatter_of_every_micro_batch_but_the_last() {
    let p = four_units(2);
    let every = Settings::new(&p, fsdp_chain()).unwrap();
    let e = evaluate(&p, &every);
    let once: Vec<f64> = [21.0, 21.0, 21.0, 10.0, 21.0, 42.0, 42.0, 21.0, 42.0].to_vec();
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [once.clone(), once.clone()].concat());
    close(e.iteration_time_us(), 482.0, "RS every micro-batch");
    close(
        e.strict.slots[9].memory_bytes,
        20100.0,
        "F1 of micro-batch 2, model",
    );
    close(e.memory_bytes[9], 22100.0, "F1 of micro-batch 2, FSDP2");
    let reduced = |e: &shardplan_scheduler::fsdp2::Evaluation, m: u32| {
        let b2 = e
            .timeline
            .iter()
            .find(|t| t.micro_batch == Some(m) && t.at == "B:u2");
        b2.unwrap().reduced.clone()
    };
    assert_eq!(reduced(&e, 1), ["u2"]);

    let mut units = fsdp_chain();
    units[1].requires_gradient_sync = false;
    let no_sync = Settings::new(&p, units).unwrap();
    let u2 = &no_sync.schedule().units()[1];
    assert!(u2.accumulation.accumulate);
    let e = evaluate(&p, &no_sync);
    let mut first = once.clone();
    first[7] = 20.0;
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [first, once].concat());
    close(e.iteration_time_us(), 481.0, "no_sync");
    close(
        e.strict.slots[9].memory_bytes,
        22100.0,
        "F1 of micro-batch 2, model",
    );
    close(e.memory_bytes[9], 24100.0, "F1 of micro-batch 2, FSDP2");
    assert!(reduced(&e, 1).is_empty());
    assert_eq!(reduced(&e, 2), ["u2"]);
    // The export of the settings' own schedule is exact and sets the switch.
    let exported = export(&p, no_sync.schedule()).unwrap();
    assert!(exported.exact, "{:?}", exported.approximations);
    assert!(!exported.units[1].requires_gradient_sync);
    assert_eq!(exported.fsdp2_iteration_time_us, 481.0);
}

/// K = 2 on three_units_on_two_nodes, u2 HSDP over its node (as in
/// hsdp_all_reduces_across_replicas_after_the_reduce_scatter): by default each micro-batch runs
/// K = 1's slots, I in place of E with RS1 45, u2's replica AllReduce 23 and u1's gather 90 on the
/// inter link (158): 10 30 5 10 105 20 158 twice → 676. With `set_requires_all_reduce(False)` on
/// the first micro-batch, u2 reduce-scatters in its node after B2 (B1: max(20, 5) = 20 as before)
/// and all-reduces only after the last: I = 45 + 90 = 135 → 653.
#[test]
fn hsdp_all_reduces_once_without_requires_all_reduce() {
    let mut p = three_units_on_two_nodes();
    p.micro_batches = 2;
    let hsdp = || {
        three(
            sharded(None, Reshard::Free),
            sharded(Some(2), Reshard::Free),
        )
    };
    let every = Settings::new(&p, hsdp()).unwrap();
    let e = evaluate(&p, &every);
    let each = [10.0, 30.0, 5.0, 10.0, 105.0, 20.0, 158.0];
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [each, each].concat());
    close(e.iteration_time_us(), 676.0, "RA every micro-batch");

    let mut units = hsdp();
    units[1].requires_all_reduce = false;
    let once = Settings::new(&p, units).unwrap();
    let u2 = &once.schedule().units()[1];
    assert_eq!(u2.accumulation.replica_reduce, ReplicaReduce::Last);
    let e = evaluate(&p, &once);
    let mut first = each;
    first[6] = 135.0;
    let durations: Vec<f64> = e.strict.slots.iter().map(|s| s.duration_us).collect();
    assert_eq!(durations, [first, each].concat());
    close(e.iteration_time_us(), 653.0, "RA once");
    let exported = export(&p, once.schedule()).unwrap();
    assert!(exported.exact, "{:?}", exported.approximations);
    assert!(!exported.units[1].requires_all_reduce);
    assert_eq!(exported.fsdp2_iteration_time_us, 653.0);
}
