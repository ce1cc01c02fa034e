//! Hand-computed simulator examples of hierarchical sharding (DESIGN §3.11): an hpz unit whose
//! backward gather runs inside its node on the intra link while another unit's gather runs across
//! nodes in the same slot; an HSDP unit whose replica AllReduce follows its ReduceScatter a slot
//! later on the other link; the secondary shard, the shard group's persistent state and the
//! communicators in memory. Every figure is worked out in the comments.

mod common;

use common::{check, check_memory, close, schedule, three_units_on_two_nodes};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::Op;

/// Three units, N = 4 on nodes of G = 2, p = g = 2, o = 4, one block each, κ = 0, no extra time.
const HPZ_PLAN: &str = r#"
    [[units]]
    name = "u1"
    level = "fsdp"
    secondary_group = 2
    rs = [["E", 1]]
    agf = [["E", 1]]
    agb = [["F3", 1]]
    [[units]]
    name = "u2"
    level = "fsdp"
    rs = [["B1", 1]]
    agf = [["B1", 1]]
    agb = [["F3", 1]]
    [[units]]
    name = "u3"
    level = "sdp"
    rs = [["B2", 1]]
    ag = [["B2", 1]]
"#;

/// Blocks: u1 AG 800 B: 10 + 80 = 90 across nodes, 2 + 8 = 10 inside (its AGB); RS 800 B: 45.
/// u2 AG 400 B: 50, RS 25. u3 AG 200 B: 30, RS 15.
///
/// Strict, slots F1 F2 F3 B3 B2 B1 E: F1 10, F2 20, F3 max(5, inter 50, intra 10) = 50 (on one
/// link it would be 5 + … = 60), B3 10, B2 max(40, 15 + 30) = 45, B1 max(20, 25 + 50) = 75,
/// E max(0, 45 + 90) = 135 → 345. At F3 both gathers start at the slot's start, 30: u1's on the
/// intra link [30, 40], u2's on the inter link [30, 80].
///
/// Relaxed (inter channel FIFO, intra beside it), from F1's start at 0 (u1's AGF just done):
/// F1 0–10, F2 10–30, F3 launches at 30: u2's AGB [30, 80], u1's AGB [30, 40]; F3 30–35, B3
/// 35–45; B2 launches at 45: u3's RS [80, 95], AG [95, 125]; B2 waits for u2's AGB: 80–120; B1
/// launches at 120: u2's RS [125, 150], AGF [150, 200]; B1 (u1's AGB done at 40) 120–140; E
/// launches at 140: u1's RS [200, 245], AGF [245, 335]; the next F1 waits for it → 335.
///
/// Memory: persistent Ψ(p+g+o)/4 = 800 + 400 + 200 = 1400; communicators (world, node group)
/// 2·100 = 200; u1's secondary shard Ψp/H = 400 from F1 to B1. Gathered: AGF1 800 at E, F1;
/// AGB1 800 at F3, B3, B2, B1; AGF2 400 at B1, E, F1, F2; AGB2 400 at F3, B3, B2; AG3 200
/// everywhere. Gradient: RS1 800 at B1, E; RS2 400 at B2, B1; RS3 200 at B3, B2.
/// F1 1400 + 200 + 400 + 1400 + 1000 = 4400     F2 1400 + 200 + 400 + 600 + 3000 = 5600
/// F3 1400 + 200 + 400 + 1400 + 3500 = 6900     B3 6900 + 200 = 7100
/// B2 1400 + 200 + 400 + 1400 + 600 + 3000 = 7000
/// B1 1400 + 200 + 400 + 1400 + 1200 + 1000 = 5600   E 1400 + 200 + 1400 + 800 = 3800
#[test]
fn an_hpz_gather_inside_the_node_runs_beside_a_gather_across_nodes() {
    let p = three_units_on_two_nodes();
    let s = schedule(&p, HPZ_PLAN).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 345.0, &[10.0, 20.0, 50.0, 10.0, 45.0, 75.0, 135.0]);
    let gathers: Vec<(usize, f64, f64)> = strict
        .blocks
        .iter()
        .filter(|b| b.op == Op::GatherBackward)
        .map(|b| (b.unit, b.start_us, b.end_us))
        .collect();
    // In the slot's canonical order: u2's gather, needed first (at B2), then u1's.
    assert_eq!(gathers, [(1, 30.0, 80.0), (0, 30.0, 40.0)]);
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    close(relaxed.iteration_time_us, 335.0, "relaxed time");
    let memory = [4400.0, 5600.0, 6900.0, 7100.0, 7000.0, 5600.0, 3800.0];
    for sim in [&strict, &relaxed] {
        check_memory(sim, &memory, "B3");
        close(sim.slots[0].memory.communicators, 200.0, "communicators");
    }
}

/// The same plan without the secondary group is fsdp among the world: u1's AGB takes 90 on the
/// inter link beside u2's 50 (F3 = 140, strict 435), no secondary shard, one communicator.
#[test]
fn without_the_secondary_group_the_gather_runs_across_nodes() {
    let p = three_units_on_two_nodes();
    let s = schedule(&p, &HPZ_PLAN.replace("secondary_group = 2\n", "")).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    close(strict.slots[2].duration_us, 140.0, "F3");
    close(strict.iteration_time_us, 435.0, "strict time");
    // B3: 7100 − 400 (secondary) − 100 (the node group's communicator).
    close(strict.slots[3].memory_bytes, 6600.0, "memory of B3");
}

/// A secondary group is refused, naming the field and what was expected, at sdp, with a group
/// the topology lacks, and on a profile without a topology.
#[test]
fn bad_secondary_groups_are_refused_naming_the_field() {
    let p = three_units_on_two_nodes();
    let refused = |profile: &Profile, plan: &str, expected: &str| {
        let e = schedule(profile, plan).unwrap_err().to_string();
        assert!(e.contains("secondary_group") && e.contains(expected), "{e}");
    };
    refused(
        &p,
        &HPZ_PLAN.replace(
            "ag = [[\"B2\", 1]]",
            "ag = [[\"B2\", 1]]\nsecondary_group = 2",
        ),
        "only an fsdp unit keeps a secondary shard, this one is `sdp`",
    );
    refused(
        &p,
        &HPZ_PLAN.replace("secondary_group = 2", "secondary_group = 4"),
        "whose curves the profile's [topology] has (2), got 4",
    );
    let mut flat = p.clone();
    flat.topology = None;
    refused(&flat, HPZ_PLAN, "a profile with a [topology]");
}

/// u2 sdp over the shard group of 2 (HSDP), u1 fsdp and u3 sdp over the world:
const HSDP_PLAN: &str = r#"
    [[units]]
    name = "u1"
    level = "fsdp"
    rs = [["E", 1]]
    agf = [["E", 1]]
    agb = [["F3", 1]]
    [[units]]
    name = "u2"
    level = "sdp"
    shard_group = 2
    rs = [["B1", 1]]
    ag = [["F1", 1]]
    [[units]]
    name = "u3"
    level = "sdp"
    rs = [["B2", 1]]
    ag = [["B2", 1]]
"#;

/// u2's RS over the node group, 400 B: 1 + 4 = 5 on the intra link at B1; its replica AllReduce
/// of the reduced shard, 400/2 = 200 B: 3 + 20 = 23 on the inter link a slot later, at E; its
/// gather 400 B inside the node: 2 + 4 = 6 at F1. u1: RS 45, AGF 90, AGB 90 across nodes; u3:
/// RS 15, AG 30.
///
/// Strict: F1 max(10, 6) = 10, F2 20, F3 max(5, 90) = 90, B3 10, B2 max(40, 15 + 30) = 45, B1
/// max(20, intra 5) = 20, E inter 45 + 90 + 23 = 158 → 353.
///
/// Memory: persistent 800 (u1, /4) + 200·8/2 = 800 (u2, over 2) + 200 (u3) = 1800;
/// communicators: the world's, u2's shard and replica groups: 300. Gathered: AGF1 800 at E, F1;
/// AGB1 800 at F3, B3, B2, B1; AG2 400 at F1, F2, F3, B3, B2; AG3 200 everywhere. Gradient: RS1
/// 800 at B1, E; RS2 400 at B2, B1; RS3 200 at B3, B2.
/// F1 2100 + 1400 + 1000 = 4500   F2 2100 + 600 + 3000 = 5700   F3 2100 + 1400 + 3500 = 7000
/// B3 7000 + 200 = 7200   B2 2100 + 1400 + 600 + 3000 = 7100   B1 2100 + 1000 + 1200 + 1000 =
/// 5300   E 2100 + 1000 + 800 = 3900.
///
/// Relaxed: never slower than strict; RA starts after u2's RS is done, u2's next gather after
/// RA is done.
#[test]
fn an_hsdp_unit_reduces_inside_the_node_and_all_reduces_its_shard_across_nodes() {
    let p = three_units_on_two_nodes();
    let s = schedule(&p, HSDP_PLAN).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 353.0, &[10.0, 20.0, 90.0, 10.0, 45.0, 20.0, 158.0]);
    let memory = [4500.0, 5700.0, 7000.0, 7200.0, 7100.0, 5300.0, 3900.0];
    check_memory(&strict, &memory, "B3");
    close(strict.slots[0].memory.communicators, 300.0, "communicators");
    let ra: Vec<_> = strict
        .blocks
        .iter()
        .filter(|b| b.op == Op::ReplicaAllReduce)
        .map(|b| (b.unit, b.slot.to_string(), b.end_us - b.start_us))
        .collect();
    assert_eq!(ra, [(1, "E".to_string(), 23.0)]);
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= strict.iteration_time_us + 1e-9);
    let end = |op: Op| {
        let b = relaxed
            .blocks
            .iter()
            .find(|b| b.unit == 1 && b.op == op)
            .unwrap();
        (b.start_us, b.end_us)
    };
    let (rs, ra, ag) = (
        end(Op::ReduceScatter),
        end(Op::ReplicaAllReduce),
        end(Op::Gather),
    );
    assert!(ra.0 >= rs.1 - 1e-9, "RA {ra:?} before RS {rs:?}");
    // The gather launched at F1 serves the next iteration: it waits for this iteration's RA,
    // reported in the same iteration's time frame shifted by one iteration.
    assert!(
        ag.0 + relaxed.iteration_time_us >= ra.1 - 1e-9,
        "AG {ag:?}, RA {ra:?}"
    );
}

/// Shard groups are refused, naming the field, at none, when not offered, and with an RS block
/// whose replica AllReduce would leave the window.
#[test]
fn bad_shard_groups_are_refused_naming_the_field() {
    let p = three_units_on_two_nodes();
    let refused = |plan: &str, expected: &str| {
        let e = schedule(&p, plan).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    };
    refused(
        &HSDP_PLAN.replace("shard_group = 2", "shard_group = 3"),
        "shard_group: a divisor of world_size 4 below it, inside a node or whole nodes, whose shard \
         and replica groups have curves",
    );
    refused(
        &HSDP_PLAN.replace(r#"ag = [["F1", 1]]"#, r#"ag = [["E", 1]]"#),
        "order rule RS, then RA a slot later, then AG a slot after that",
    );
    refused(
        &HSDP_PLAN.replace(r#"rs = [["B1", 1]]"#, r#"rs = [["F1", 1]]"#),
        "replica AllReduce follows in the next slot",
    );
}
