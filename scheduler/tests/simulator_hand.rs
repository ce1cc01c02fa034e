//! Hand-computed simulator examples: every figure below is worked out in the comments from
//! DESIGN §3 and compared with the simulator, in strict and relaxed semantics.

mod common;

use common::{affine, check, check_memory, close, profile, schedule};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::sim::{Semantics, simulate};

/// Two replicated units (DDP; κ_c = `kappa`). N = 2, p = g = 2, o = 4; one block each.
/// u1: Ψ 100, f 10, b 20, act 1000, ws_f 50, ws_b 70. u2: Ψ 200, f 30, b 60, act 2000.
/// AR curve t = 10 + bytes/100: AR1 = 10 + 200/100 = 12, AR2 = 10 + 400/100 = 14.
/// Slots F1 F2 B2 B1 E; AR2 at B1, AR1 at E.
fn two_units(kappa: f64) -> shardplan_scheduler::profile::Profile {
    profile(
        2,
        1 << 20,
        kappa,
        0.0,
        (2, 2, 4),
        &[
            (100, 10.0, 20.0, 1000, 100, 50, 70),
            (200, 30.0, 60.0, 2000, 200, 0, 0),
        ],
        affine(1.0, 1.0),
        affine(1.0, 1.0),
        affine(10.0, 100.0),
    )
}

const DDP_PLAN: &str = r#"
    [[units]]
    name = "u1"
    level = "none"
    ar = [["E", 1]]
    [[units]]
    name = "u2"
    level = "none"
    ar = [["B1", 1]]
"#;

#[test]
fn ddp_two_units() {
    let p = two_units(0.0);
    let s = schedule(&p, DDP_PLAN).unwrap();
    // Strict: F1 10, F2 30, B2 60, B1 max(20, 14) = 20, E max(0, 12) = 12 → 132.
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 132.0, &[10.0, 30.0, 60.0, 20.0, 12.0]);
    close(strict.comm_us, 26.0, "comm");
    close(strict.exposed_comm_us, 12.0, "exposed");
    // Relaxed: E's compute is empty, so the next F1 could start at once, but a replicated unit's
    // forward waits for its AllReduce (the optimizer step): F1 waits 12 then computes 10 → 22.
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    check(&relaxed, 132.0, &[22.0, 30.0, 60.0, 20.0, 0.0]);
    // Memory: persistent Ψ(p+g+o) = 800 + 1600 = 2400 in every slot.
    // F1: 2400 + act1 1000 + ws 50 = 3450; F2 and B2: 2400 + 1000 + 2000 = 5400;
    // B1: 2400 + 1000 + ws 70 = 3470; E: 2400. Peak 5400 first reached at F2.
    let memory = [3450.0, 5400.0, 5400.0, 3470.0, 2400.0];
    check_memory(&strict, &memory, "F2");
    check_memory(&relaxed, &memory, "F2");
}

/// The same DDP plan with optimizer steps (o_1 = 8, o_2 = 6 µs, carried by each unit's AllReduce
/// block: AR1 = 12 + 8 = 20, AR2 = 14 + 6 = 20), κ_c = 0.5 and κ_u = 1 (DESIGN §3.4): a block
/// costs its slot's compute L = κ_c·t_AR + κ_u·upd, AR2 0.5·14 + 6 = 13 and AR1 0.5·12 + 8 = 14.
/// Strict: F1 10, F2 30, B2 60, B1 max(20 + 13, 20) = 33, E max(0 + 14, 20) = 20 → 153; Σ L = 27.
/// With κ_u absent it is κ_c: B1 max(20 + 0.5·20, 20) = 30, E 20 → 150; Σ L = 20.
#[test]
fn optimizer_steps_slow_compute_by_their_own_factor() {
    let mut p = two_units(0.5);
    p.units[0].optimizer_us = 8.0;
    p.units[1].optimizer_us = 6.0;
    let s = schedule(&p, DDP_PLAN).unwrap();
    let same = simulate(&p, &s, Semantics::Strict);
    check(&same, 150.0, &[10.0, 30.0, 60.0, 30.0, 20.0]);
    close(same.overlap_slowdown_us, 20.0, "Σ L with κ_u = κ_c");
    p.update_slowdown = Some(1.0);
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 153.0, &[10.0, 30.0, 60.0, 33.0, 20.0]);
    close(strict.overlap_slowdown_us, 27.0, "Σ L");
    close(strict.comm_us, 40.0, "comm");
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= 153.0 + 1e-9);
}

/// Three units, N = 4, p = g = 2, o = 12, B = 400 bytes, κ = 0.1, E compute 5.
/// u1 Ψ 400 (2 blocks of 400 B), f 10, b 20, act 1000, ckpt 100, ws 11/44: fsdp.
/// u2 Ψ 200 (1 block of 400 B), f 20, b 40, act 2000, ckpt 200, ws 22/55: sdp, recompute.
/// u3 Ψ 100 (1 block of 200 B), f 30, b 60, act 3000, ckpt 300, ws 33/66: none.
/// Curves: AG 10 + B/10 (400 B → 50), RS 5 + B/20 (400 B → 25), AR 2 + B/100 (200 B → 4).
/// u2's gather is launched at B1 together with its reduction: a gather launched in the previous
/// iteration's backward (the cyclic case).
fn mixed_profile() -> shardplan_scheduler::profile::Profile {
    profile(
        4,
        400,
        0.1,
        5.0,
        (2, 2, 12),
        &[
            (400, 10.0, 20.0, 1000, 100, 11, 44),
            (200, 20.0, 40.0, 2000, 200, 22, 55),
            (100, 30.0, 60.0, 3000, 300, 33, 66),
        ],
        affine(10.0, 10.0),
        affine(5.0, 20.0),
        affine(2.0, 100.0),
    )
}

const MIXED_PLAN: &str = r#"
    [[units]]
    name = "u1"
    level = "fsdp"
    rs = [["E", 2]]
    agf = [["E", 2]]
    agb = [["F3", 1], ["B2", 1]]
    [[units]]
    name = "u2"
    level = "sdp"
    recompute = true
    rs = [["B1", 1]]
    ag = [["B1", 1]]
    [[units]]
    name = "u3"
    level = "none"
    ar = [["B2", 1]]
"#;

#[test]
fn mixed_levels_with_recompute_and_a_cyclic_gather() {
    let p = mixed_profile();
    let s = schedule(&p, MIXED_PLAN).unwrap();
    // Compute: F1 10, F2 20, F3 30, B3 60, B2 40 + 20 (recompute) = 60, B1 20, E 5.
    // Q: F3 50 (AGB1); B2 4 + 50 = 54; B1 25 + 50 = 75; E 2·25 + 2·50 = 150.
    // Strict d = max(c + 0.1·Q, Q): 10, 20, max(35, 50) = 50, 60, max(65.4, 54) = 65.4,
    // max(27.5, 75) = 75, max(20, 150) = 150 → T = 430.4.
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 430.4, &[10.0, 20.0, 50.0, 60.0, 65.4, 75.0, 150.0]);
    // Relaxed, stationary cycle: E's 150 µs of blocks start when the channel frees from B1's
    // blocks; F1 waits for AGF1 (the end of E's blocks); then F1 10, F2 20, F3 35, B3 60,
    // B2 65.4 bring B1's launch 190.4 later; B1's 75 µs of blocks delay E's blocks, whose
    // launch (B1 compute 27.5 later) is earlier: period 190.4 + 75 + 150 = 415.4.
    // Per slot (compute end minus previous compute end): F1 waits 167.5 then computes 10 = 187.5
    // (E's compute ended 20 after E's launch, E's blocks end 150 + 37.5 after it), F2 20,
    // F3 30 + 5 = 35, B3 60, B2 65.4, B1 20 + 7.5 = 27.5, E 5 + 15 = 20.
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    check(
        &relaxed,
        415.4,
        &[187.5, 20.0, 35.0, 60.0, 65.4, 27.5, 20.0],
    );
    // Memory. Persistent: u1 400·16/4 = 1600, u2 200·16/4 = 800, u3 100·16 = 1600 → 4000.
    // Gathered: AGF1 2×400 at E, F1; AGB1 block at F3 alive F3, B3, B2, B1, block at B2 alive
    // B2, B1; AG2 400 from B1 around to B2 (every slot).
    // Gradient: RS1 2×400 at B1, E; RS2 400 at B2, B1.
    // Activations: u1 1000 on F1..B1; u2 ckpt 200 on F2..B2 plus act 2000 at B2; u3 3000 on F3, B3.
    // F1 4000 + 1200 + 1000 + 11 = 6211     F2 4000 + 400 + 1200 + 22 = 5622
    // F3 4000 + 800 + 4200 + 33 = 9033      B3 4000 + 800 + 4200 + 66 = 9066
    // B2 4000 + 1200 + 400 + 3200 + 55 = 8855  B1 4000 + 1200 + 1200 + 1000 + 44 = 7444
    // E  4000 + 1200 + 800 = 6000
    let memory = [6211.0, 5622.0, 9033.0, 9066.0, 8855.0, 7444.0, 6000.0];
    check_memory(&strict, &memory, "B3");
    check_memory(&relaxed, &memory, "B3");
    let b2 = &strict.slots[4].memory;
    close(b2.persistent, 4000.0, "B2 persistent");
    close(b2.gathered, 1200.0, "B2 gathered");
    close(b2.gradient, 400.0, "B2 gradient");
    close(b2.activation, 3200.0, "B2 activation");
    close(b2.workspace, 55.0, "B2 workspace");
}

/// The same plan with recomputations cheaper than their forwards (f'_1 = 1, f'_2 = 8 µs, DESIGN
/// §3.6): only u2 recomputes, so B2's compute is 40 + 8 = 48 and its duration max(48 + 0.1·54,
/// 54) = 54 (was 65.4), T = 430.4 − 11.4 = 419; u1's f'_1 changes nothing. Without f'_i the
/// recomputation costs f_i, as before.
#[test]
fn a_recomputation_costs_its_own_time() {
    let mut p = mixed_profile();
    p.units[0].recompute_us = Some(1.0);
    p.units[1].recompute_us = Some(8.0);
    let s = schedule(&p, MIXED_PLAN).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 419.0, &[10.0, 20.0, 50.0, 60.0, 54.0, 75.0, 150.0]);
    p.units[1].recompute_us = None;
    let s = schedule(&p, MIXED_PLAN).unwrap();
    close(
        simulate(&p, &s, Semantics::Strict).iteration_time_us,
        430.4,
        "f'_2 absent: f_2",
    );
}

/// The same plan with checkpointed forwards of their own (f^c_1 = 5, f^c_2 = 14 µs, DESIGN §3.6):
/// only u2 recomputes, so F2 (no communication) takes 14 (was 20): strict T = 430.4 − 6 = 424.4,
/// relaxed (F2 on the cycle's path) 415.4 − 6 = 409.4; u1's f^c_1 changes nothing. A
/// checkpointed forward slower than the plain one (f^c_2 = 26) costs its own time too: 436.4 and
/// 421.4. Without f^c_i the forward costs f_i, as before.
#[test]
fn a_checkpointed_forward_costs_its_own_time() {
    let mut p = mixed_profile();
    p.units[0].checkpointed_forward_us = Some(5.0);
    for f_c in [14.0, 26.0] {
        p.units[1].checkpointed_forward_us = Some(f_c);
        let s = schedule(&p, MIXED_PLAN).unwrap();
        check(
            &simulate(&p, &s, Semantics::Strict),
            410.4 + f_c,
            &[10.0, f_c, 50.0, 60.0, 65.4, 75.0, 150.0],
        );
        check(
            &simulate(&p, &s, Semantics::Relaxed),
            395.4 + f_c,
            &[187.5, f_c, 35.0, 60.0, 65.4, 27.5, 20.0],
        );
    }
    p.units[1].checkpointed_forward_us = None;
    let s = schedule(&p, MIXED_PLAN).unwrap();
    close(
        simulate(&p, &s, Semantics::Strict).iteration_time_us,
        430.4,
        "f^c_2 absent: f_2",
    );
}

/// The same plan with each kind of collective costing compute its own κ_c (DESIGN §3.4):
/// κ_c,RS = 1, κ_c,AG = 0.5, AllReduces still 0.1. L per slot: F3 0.5·50 = 25, B2 0.1·4 +
/// 0.5·50 = 25.4, B1 1·25 + 0.5·50 = 50, E 1·50 + 0.5·100 = 100; d = max(c + L, Q): F3 55 (was
/// 50), B2 85.4 (was 65.4), B1 max(70, 75) = 75, E max(105, 150) = 150 → T = 455.4. Absent, the
/// factors are κ_c and T is 430.4 as above.
#[test]
fn each_collective_costs_compute_its_own_factor() {
    let mut p = mixed_profile();
    p.overlap_slowdown_reduce_scatter = Some(1.0);
    p.overlap_slowdown_all_gather = Some(0.5);
    let s = schedule(&p, MIXED_PLAN).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 455.4, &[10.0, 20.0, 55.0, 60.0, 85.4, 75.0, 150.0]);
    close(
        strict.overlap_slowdown_us,
        25.0 + 25.4 + 50.0 + 100.0,
        "Σ L",
    );
}

/// The same plan with communication slowed by compute as well (κ_q = 0.5, DESIGN §3.3), strict:
/// d = max(c + 0.1·Q, Q + 0.5·c) per slot, from the (c, Q) pairs worked out above:
/// F1 (10, 0) max(10, 5) = 10; F2 (20, 0) 20; F3 (30, 50) max(35, 65) = 65; B3 (60, 0) 60;
/// B2 (60, 54) max(65.4, 84) = 84; B1 (20, 75) max(27.5, 85) = 85; E (5, 150) max(20, 152.5) =
/// 152.5 → T = 476.5. Each block of a slot is stretched by (Q + 0.5·c)/Q: E's first RS block
/// (25 µs) ends at 25·152.5/150 = 25.4167 after E starts.
#[test]
fn communication_slowed_by_compute() {
    let mut p = mixed_profile();
    p.comm_slowdown = 0.5;
    let s = schedule(&p, MIXED_PLAN).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 476.5, &[10.0, 20.0, 65.0, 60.0, 84.0, 85.0, 152.5]);
    close(
        strict.comm_slowdown_us,
        0.5 * (30.0 + 60.0 + 20.0 + 5.0),
        "comm slowdown",
    );
    let e = strict.slots[6].start_us;
    let first = strict
        .blocks
        .iter()
        .find(|b| b.slot.to_string() == "E")
        .unwrap();
    close(first.end_us - e, 25.0 * 152.5 / 150.0, "E's first block");
    // Relaxed keeps every wait of strict's but the slot barriers: never slower.
    let relaxed = simulate(&p, &s, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= 476.5 + 1e-9);
}

/// The fsdp1 baseline on the same profile: u1, u2 fsdp, u3 (the last) sdp, depth 1.
#[test]
fn fsdp1_baseline_placement_time_and_memory() {
    let p = mixed_profile();
    let b = baseline(&p, BaselineKind::Fsdp1, Recompute::Off, None).unwrap();
    // Placement (depth 1): u1 RS E, AGF E (window {E}), AGB B2; u2 RS B1, AGF F1, AGB B3;
    // u3 RS B2, AG F2.
    let text = b.plan.to_toml();
    for expected in [
        r#"rs = [["E", 2]]"#,
        r#"agf = [["E", 2]]"#,
        r#"agb = [["B2", 2]]"#,
        r#"rs = [["B1", 1]]"#,
        r#"agf = [["F1", 1]]"#,
        r#"agb = [["B3", 1]]"#,
        r#"rs = [["B2", 1]]"#,
        r#"ag = [["F2", 1]]"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    // u3 blocks carry 200 B: AG 10 + 20 = 30, RS 5 + 10 = 15.
    // Q: F1 50, F2 30, F3 0, B3 50, B2 15 + 100 = 115, B1 25, E 150.
    // d: max(15, 50) = 50, max(23, 30) = 30, 30, max(65, 50) = 65, max(51.5, 115) = 115,
    // max(22.5, 25) = 25, max(20, 150) = 150 → 465.
    check(
        &b.simulation,
        465.0,
        &[50.0, 30.0, 30.0, 65.0, 115.0, 25.0, 150.0],
    );
    // Relaxed: every slot's compute waits on a chain through the one channel; the stationary
    // cycle (E blocks → F1 → AGF2 → AG3 → F3 → B3/AGB2 → B2 → AGB1 → B1 → RS2 → E blocks) is
    // also 465. Slot by slot: F1 147.5, F2 58, F3 37, B3 65, B2 51.5, B1 86, E 20.
    let relaxed = simulate(&p, &b.schedule, Semantics::Relaxed);
    check(
        &relaxed,
        465.0,
        &[147.5, 58.0, 37.0, 65.0, 51.5, 86.0, 20.0],
    );
    // Memory. Persistent 1600 + 800 + 100·16/4 = 2800.
    // Gathered: AGF1 800 at E, F1; AGB1 800 at B2, B1; AGF2 400 at F1, F2; AGB2 400 at B3, B2;
    // AG3 200 at F2, F3, B3. Gradient: RS1 800 at B1, E; RS2 400 at B2, B1; RS3 200 at B3, B2.
    // F1 2800 + 1200 + 1000 + 11 = 5011   F2 2800 + 600 + 3000 + 22 = 6422
    // F3 2800 + 200 + 6000 + 33 = 9033    B3 2800 + 600 + 200 + 6000 + 66 = 9666
    // B2 2800 + 1200 + 600 + 3000 + 55 = 7655  B1 2800 + 800 + 1200 + 1000 + 44 = 5844
    // E  2800 + 800 + 800 = 4400
    check_memory(
        &b.simulation,
        &[5011.0, 6422.0, 9033.0, 9666.0, 7655.0, 5844.0, 4400.0],
        "B3",
    );
}

/// κ_q = 0 is the model before communication could be slowed: a profile file without
/// `comm_slowdown` keeps its digest (its plans stay valid) and its plans simulate, strict and
/// relaxed, to the figures the binary gave before the two-sided model (shardplan 72dddb7,
/// `baseline --kind fsdp2 --checkpoint` and `simulate --semantics relaxed` on this profile).
#[test]
fn without_comm_slowdown_the_predictions_are_unchanged() {
    let path = common::repo_root().join("profiles/llama2-7b-h100-n64.toml");
    let p = shardplan_scheduler::profile::Profile::load(&path).unwrap();
    assert_eq!(p.comm_slowdown, 0.0);
    assert_eq!(
        p.digest(),
        "sha256:191da969d56c2502a24c057f02ac9709601a89d28fc6b97bcd2442f652d460ed"
    );
    let plan = baseline(&p, BaselineKind::Fsdp2, Recompute::On, None)
        .unwrap()
        .schedule;
    close(
        simulate(&p, &plan, Semantics::Strict).iteration_time_us,
        935447.9103126398,
        "strict",
    );
    close(
        simulate(&p, &plan, Semantics::Relaxed).iteration_time_us,
        935447.910312674,
        "relaxed",
    );
}
