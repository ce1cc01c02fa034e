//! Offload (DESIGN §3.13), hand-computed: a unit whose optimizer step runs on the host while the
//! next forward computes, a parameter fetched from the host before its gather, the frameworks'
//! step after the whole backward; the device and host memory; and the refusals (no host, a host
//! too small, a replicated unit).

mod common;

use common::{
    Rng, affine, check, check_memory, close, plan_toml, profile, random_profile, random_schedule,
    schedule, with_topology,
};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::offload::{HostStep, Offload};
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::{Host, Profile};
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::sim::{HostTrack, Semantics, simulate};
use shardplan_scheduler::timeline::Level;

/// N = 2, p = g = 2, o = 12, one block per unit, no activations. u1: Ψ 100, f 10, b 20;
/// u2: Ψ 200, f 30, b 60. AG and RS t = 1 + bytes/100: u1's 200-byte blocks 3, u2's 400-byte
/// blocks 5. Host: two ranks per node, D2H t = 1 + bytes/100, H2D t = 1 + bytes/`h2d_rate`, a
/// rank's step `step_us_per_param` µs per parameter, `memory` bytes.
fn offload_profile(step_us_per_param: f64, h2d_rate: f64, memory: u64) -> Profile {
    let mut p = profile(
        2,
        1 << 20,
        0.0,
        0.0,
        (2, 2, 12),
        &[(100, 10.0, 20.0, 0, 0, 0, 0), (200, 30.0, 60.0, 0, 0, 0, 0)],
        affine(1.0, 100.0),
        affine(1.0, 100.0),
        affine(1.0, 100.0),
    );
    p.host = Some(Host {
        ranks_per_node: 2,
        ranks_per_link: 1,
        memory_bytes: memory,
        optimizer_us_per_param: step_us_per_param,
        host_to_device: affine(1.0, h2d_rate),
        device_to_host: affine(1.0, 100.0),
    });
    p.validate("offload test profile").unwrap();
    p
}

/// Both units sdp; u1 reduces and gathers at E; u2 reduces at B1 and gathers at F1 (its last
/// window position, for F2), offloaded as `mode`.
fn plan(mode: &str) -> String {
    format!(
        r#"
    [[units]]
    name = "u1"
    level = "sdp"
    rs = [["E", 1]]
    ag = [["E", 1]]
    [[units]]
    name = "u2"
    level = "sdp"
    rs = [["B1", 1]]
    ag = [["F1", 1]]
    offload = "{mode}"
"#
    )
}

/// Slots F1 F2 B2 B1 E. On the device alone: F1 10, F2 30, B2 60, B1 max(20, RS2 5) = 20,
/// E RS1 + AG1 = 6 → 126. With u2's optimizer on the host, from t0 = B1's start: RS2 ends at
/// t0 + 5; its 200-byte gradient shard's D2H 3 → t0 + 8; the step over its 100 parameters
/// (0.2 µs each) 20 → t0 + 28, overlapping B1 (to t0 + 20), E (to t0 + 26) and the next F1
/// (t0 + 26 … 36); the 200-byte parameter shard's H2D 3 → t0 + 31; AG2 at F1 5 → t0 + 36, F1's
/// end: hidden, T = 126. At 0.3 µs per parameter the step ends at t0 + 38, the H2D at t0 + 41,
/// AG2 at t0 + 46: strict F1 lasts 46 − 26 = 20 → 136; relaxed F1 computes 26 … 36 (it needs
/// only AG1) and F2 waits for AG2: F1 36 − 20 = 16, F2 76 − 36 = 40, E 0 → 136.
#[test]
fn a_host_step_overlaps_the_next_forward() {
    let hidden = offload_profile(0.2, 100.0, 1 << 20);
    let s = schedule(&hidden, &plan("optimizer")).unwrap();
    check(
        &simulate(&hidden, &s, Semantics::Strict),
        126.0,
        &[10.0, 30.0, 60.0, 20.0, 6.0],
    );
    check(
        &simulate(&hidden, &s, Semantics::Relaxed),
        126.0,
        &[16.0, 30.0, 60.0, 20.0, 0.0],
    );
    let longer = offload_profile(0.3, 100.0, 1 << 20);
    let s = schedule(&longer, &plan("optimizer")).unwrap();
    let strict = simulate(&longer, &s, Semantics::Strict);
    check(&strict, 136.0, &[20.0, 30.0, 60.0, 20.0, 6.0]);
    check(
        &simulate(&longer, &s, Semantics::Relaxed),
        136.0,
        &[16.0, 40.0, 60.0, 20.0, 0.0],
    );
    // Device: u1 persistent 100·16/2 = 800 and its gathered 200 everywhere, its RS block 200 at
    // B1 and E; u2 persistent only its parameter shard 200·2/2 = 200, gathered 400 at F1, F2, B2,
    // its RS block 400 at B2 and B1 and the reduced shard 200 there until its copy.
    // F1 800 + 200 + 200 + 400 = 1600, F2 1600, B2 1600 + 400 + 200 = 2200,
    // B1 800 + 200 + 200 + 200 + 400 + 200 = 2000, E 800 + 200 + 200 + 200 = 1400.
    check_memory(&strict, &[1600.0, 1600.0, 2200.0, 2000.0, 1400.0], "B2");
    // From F1's start: B1 starts at 20 + 30 + 60 = 110, so the D2H runs 115 … 118, the step
    // 118 … 148 and the H2D 148 … 151: the step runs past the iteration's end (136), into the
    // next F1 (136 … 156).
    let tracks: Vec<(HostTrack, f64, f64)> = strict
        .host_events
        .iter()
        .map(|e| (e.track, e.start_us, e.end_us))
        .collect();
    assert_eq!(
        tracks,
        [
            (HostTrack::DeviceToHost, 115.0, 118.0),
            (HostTrack::Step, 118.0, 148.0),
            (HostTrack::HostToDevice, 148.0, 151.0),
        ]
    );
    // Host: 2 ranks · 200·(2 + 12)/2 = 2800; per iteration D2H 3, step 30, H2D 3.
    let host = strict.host.unwrap();
    close(host.memory_bytes, 2800.0, "host memory");
    close(host.step_us, 30.0, "host step");
    close(
        host.device_to_host_us + host.host_to_device_us,
        6.0,
        "copies",
    );
}

/// u2 `full` (CPUOffloadPolicy), H2D t = 1 + bytes/20, 0.1 µs per parameter: RS2 ends at
/// t0 + 5, D2H 3 → t0 + 8, step 10 → t0 + 18 (the parameters updated on the host). The gather
/// launched at F1 (t0 + 26) first fetches its 200-byte shard: H2D 11 → t0 + 37, then AG2 5 →
/// t0 + 42. Strict F1 lasts 42 − 26 = 16 → 132. Relaxed launches F1's copy when compute reaches
/// F1, at E's compute end t0 + 20, beside E's collectives on the device link (t0 + 20 … 26): H2D
/// t0 + 20 … 31, AG2 t0 + 31 … 36, ready when F1's compute (t0 + 26 … 36) ends: F1 16, F2 30,
/// E 0 → 126.
#[test]
fn a_parameter_is_fetched_from_the_host_before_its_gather() {
    let p = offload_profile(0.1, 20.0, 1 << 20);
    let s = schedule(&p, &plan("full")).unwrap();
    let strict = simulate(&p, &s, Semantics::Strict);
    check(&strict, 132.0, &[16.0, 30.0, 60.0, 20.0, 6.0]);
    check(
        &simulate(&p, &s, Semantics::Relaxed),
        126.0,
        &[16.0, 30.0, 60.0, 20.0, 0.0],
    );
    // u2 keeps nothing on the device; its fetched shard (200) lives with its gathered block
    // (400): F1 800 + 200 + 600 = 1600, F2 1600, B2 1600 + 400 + 200 = 2200,
    // B1 800 + 200 + 200 + 400 + 200 = 1800, E 800 + 200 + 200 = 1200.
    check_memory(&strict, &[1600.0, 1600.0, 2200.0, 1800.0, 1200.0], "B2");
    close(
        strict.host.unwrap().memory_bytes,
        3200.0,
        "host memory: 2 ranks · 200·16/2",
    );
}

/// The frameworks' `optimizer.step()` (host_step = "after-backward") on the 0.3 µs case: the
/// step waits for every gradient (u2's alone, at t0 + 8) and E ends when the step (t0 + 38) and
/// its H2D (t0 + 41) are done: strict E lasts 41 − 20 = 21, F1's AG2 starts at t0 + 41 with no
/// wait of its own → 10 + 30 + 60 + 20 + 21 = 141, against 136 overlapped. Relaxed: E's compute
/// ends at t0 + 41 (E 21), F1 41 … 51, F2 waits for AG2 (t0 + 46) and starts at 51 → 141.
#[test]
fn the_frameworks_step_after_the_backward_ends_e() {
    let p = offload_profile(0.3, 100.0, 1 << 20);
    let text = format!(
        "host_step = \"after-backward\"\n{}",
        plan_toml(&p, &plan("optimizer"))
    );
    let plan: Plan = shardplan_scheduler::io::parse_toml(&text, "test plan").unwrap();
    let s = plan.schedule(&p, "test plan").unwrap();
    check(
        &simulate(&p, &s, Semantics::Strict),
        141.0,
        &[10.0, 30.0, 60.0, 20.0, 21.0],
    );
    check(
        &simulate(&p, &s, Semantics::Relaxed),
        141.0,
        &[10.0, 30.0, 60.0, 20.0, 21.0],
    );
}

/// The host cap is inclusive: 2800 bytes hold the optimizer case's state, 2799 refuse it, naming
/// the profile's field.
#[test]
fn the_host_memory_is_an_inclusive_cap() {
    assert!(schedule(&offload_profile(0.2, 100.0, 2800), &plan("optimizer")).is_ok());
    let e = schedule(&offload_profile(0.2, 100.0, 2799), &plan("optimizer"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test plan") && e.contains("host.memory_bytes") && e.contains("units"),
        "{e}"
    );
}

/// A plan that offloads on a profile without a host, or offloads a replicated unit, is refused
/// naming the unit's field.
#[test]
fn offload_without_a_host_or_a_shard_is_refused() {
    let mut p = offload_profile(0.2, 100.0, 1 << 20);
    p.host = None;
    let e = schedule(&p, &plan("optimizer")).unwrap_err().to_string();
    assert!(
        e.contains("units[1].offload") && e.contains("no [host]"),
        "{e}"
    );
    let p = offload_profile(0.2, 100.0, 1 << 20);
    let replicated = plan("full").replace(
        "level = \"sdp\"\n    rs = [[\"B1\", 1]]\n    ag = [[\"F1\", 1]]",
        "level = \"none\"\n    ar = [[\"B1\", 1]]",
    );
    let e = schedule(&p, &replicated).unwrap_err().to_string();
    assert!(
        e.contains("units[1].offload") && e.contains("replicated"),
        "{e}"
    );
}

/// The offload baselines on llama3-8b on one H100 (analytic): each fits the H100's 79.65 GiB
/// where fsdp2 does not, relaxed is never slower than strict, and a plan file round-trips its
/// offload; on a profile without a host they are unavailable, naming why.
#[test]
fn offload_baselines_fit_one_gpu_where_fsdp2_does_not() {
    let path = common::repo_root().join("models/llama3-8b.toml");
    let profile = shardplan_scheduler::analytic::analytic_profile(
        &shardplan_scheduler::model::ModelSpec::load(&path).unwrap(),
        &shardplan_scheduler::hardware::Catalog::bundled().unwrap(),
        &shardplan_scheduler::analytic::AnalyticOptions::new("h100-sxm", 1),
    )
    .unwrap();
    let cap = 85_523_536_281.0; // 79.65 GiB
    let fsdp2 = baseline(&profile, BaselineKind::Fsdp2, Recompute::On, None).unwrap();
    assert!(fsdp2.simulation.peak_memory_bytes > cap);
    for kind in BaselineKind::OFFLOAD {
        let b = baseline(&profile, kind, Recompute::On, None).unwrap();
        assert!(b.simulation.peak_memory_bytes <= cap, "{}", kind.name());
        let relaxed = simulate(&profile, &b.schedule, Semantics::Relaxed);
        assert!(relaxed.iteration_time_us <= b.simulation.iteration_time_us * (1.0 + 1e-12));
        let text = b.plan.to_toml();
        assert!(text.contains("offload = ") && text.contains("host_step = \"after-backward\""));
        let again: Plan = shardplan_scheduler::io::parse_toml(&text, "round trip").unwrap();
        assert_eq!(again.schedule(&profile, "round trip").unwrap(), b.schedule);
    }
    let mut without = profile.clone();
    without.host = None;
    let why = BaselineKind::Fsdp2Offload.unavailable_on(&without).unwrap();
    assert!(why.contains("needs a profile with a host link"), "{why}");
    assert!(BaselineKind::offload_of(&without).is_empty());
}

/// On 400 random plans (a third on nodes, over shard and secondary groups) with every sharded
/// unit offloaded at random (none, optimizer, full) and either host step, relaxed is never slower than strict, strict is never below the compute, and
/// every host step is in the time: T ≥ Σ steps (the host stream is serial).
#[test]
fn relaxed_is_never_slower_than_strict_with_offload() {
    let (mut checked, mut grouped) = (0, 0);
    for seed in 0..400u64 {
        let mut rng = Rng(seed);
        let units = rng.range(1, 6) as usize;
        let mut profile = random_profile(&mut rng, units, [0.0, 0.1][seed as usize % 2], 1500);
        // Nodes (shard groups, hpZ, two links) on a third of the worlds of 4 and 8.
        if seed % 3 == 0 {
            with_topology(&mut rng, &mut profile);
        }
        let node = (profile.topology.as_ref()).map_or(profile.world_size, |t| t.gpus_per_node);
        profile.host = Some(Host {
            ranks_per_node: node,
            ranks_per_link: 1,
            memory_bytes: 1 << 40,
            optimizer_us_per_param: rng.range(0, 20) as f64 / 100.0 + 0.01,
            host_to_device: affine(rng.range(1, 20) as f64, rng.range(1, 100) as f64),
            device_to_host: affine(rng.range(1, 20) as f64, rng.range(1, 100) as f64),
        });
        let schedule = random_schedule(&mut rng, &profile);
        let modes: Vec<Offload> = schedule
            .units()
            .iter()
            .map(|u| match (u.level, rng.range(0, 2)) {
                (Level::None, _) | (_, 0) => Offload::None,
                (_, 1) => Offload::Optimizer,
                _ => Offload::Full,
            })
            .collect();
        let step = [HostStep::Overlapped, HostStep::AfterBackward][rng.range(0, 1) as usize];
        let over_groups = (schedule.units().iter().zip(&modes))
            .any(|(u, m)| !m.is_none() && (u.shard_group.is_some() || u.secondary_group.is_some()));
        let Ok(offloaded) = schedule.offloaded(&profile, modes, step, "random plan") else {
            continue;
        };
        grouped += usize::from(over_groups);
        let strict = simulate(&profile, &offloaded, Semantics::Strict);
        let relaxed = simulate(&profile, &offloaded, Semantics::Relaxed);
        assert!(
            relaxed.iteration_time_us <= strict.iteration_time_us * (1.0 + 1e-12) + 1e-9,
            "seed {seed}: relaxed {} > strict {}",
            relaxed.iteration_time_us,
            strict.iteration_time_us
        );
        assert!(
            strict.iteration_time_us + 1e-9 >= strict.compute_us,
            "seed {seed}"
        );
        if let Some(host) = strict.host {
            assert!(
                strict.iteration_time_us + 1e-9 >= host.step_us,
                "seed {seed}"
            );
            assert!(
                relaxed.iteration_time_us + 1e-9 >= host.step_us,
                "seed {seed}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} plans offloaded");
    assert!(grouped >= 10, "only {grouped} plans offload over a group");
}

/// A `[host]` is checked field by field, each error naming it: more ranks per link than per
/// node, more ranks per node than the world, a curve out of order; a profile without one loads
/// and keeps its digest (the bundled n64 profile predates hosts).
#[test]
fn a_host_is_checked_field_by_field() {
    let error = |edit: &dyn Fn(&mut Host)| {
        let mut p = offload_profile(0.2, 100.0, 1 << 20);
        edit(p.host.as_mut().unwrap());
        p.validate("p.toml").unwrap_err().to_string()
    };
    let e = error(&|h| h.ranks_per_link = 3);
    assert!(
        e.contains("p.toml") && e.contains("host.ranks_per_link"),
        "{e}"
    );
    let e = error(&|h| h.ranks_per_node = 3);
    assert!(
        e.contains("host.ranks_per_node") && e.contains("world size 2"),
        "{e}"
    );
    let e = error(&|h| h.host_to_device.points.reverse());
    assert!(e.contains("host.host_to_device.points"), "{e}");
    let e = error(&|h| h.optimizer_us_per_param = 0.0);
    assert!(e.contains("host.optimizer_us_per_param"), "{e}");
    let path = common::repo_root().join("profiles/llama2-7b-h100-n64.toml");
    let old = Profile::load(&path).unwrap();
    assert!(old.host.is_none());
    assert!(!old.to_toml().contains("[host]"));
}

/// Offload over a shard group, by hand (DESIGN §3.13, "Offload on nodes"): the fixture of three
/// units on two nodes of 2 (`three_units_on_two_nodes`), u1 and u3 sdp over the world, u2 sdp
/// over its node (S = 2) with `optimizer`: RS2 at B1 on the intra link, its RA at E on the inter
/// link, AG2 at F1. Slots F1 F2 F3 B3 B2 B1 E; compute 10, 20, 5, 10, 40, 20, 0. Blocks: AG2
/// 2 + 400/100 = 6 (intra), RS2 1 + 400/100 = 5 (intra), RA2 3 + 200/10 = 23 (inter; the
/// 200-byte shard), RS1 5 + 800/20 = 45, AG1 10 + 800/10 = 90, RS3 5 + 200/20 = 15, AG3
/// 10 + 200/10 = 30 (world, inter). E's inter queue: RA2 (position 1 of its window) before RS1
/// (position 0), then AG1: 158. On the device alone T = 10 + 30 + 5 + 10 + 40 + 20 + 158 = 273.
/// With u2's optimizer on the host (2 µs per parameter of its 100-parameter shard), from F1's
/// start: E starts at F1 + 135; the chain waits for RA2, not RS2: RA2 ends at +23, the 200-byte
/// gradient shard's D2H (1 + 200/100 = 3), the step 200, the parameter shard's H2D 3 → 411 −
/// F1 = E's start + 229; the iteration ends at F1 + 77 + 263 = 340 where F1 lasts 77: AG2 starts
/// at 411 − 340 = 71 and ends at 77. T = 340 (263 + 77), stationary.
#[test]
fn a_shard_group_units_chain_starts_after_its_replica_all_reduce() {
    let mut p = common::three_units_on_two_nodes();
    p.host = Some(Host {
        ranks_per_node: 2,
        ranks_per_link: 1,
        memory_bytes: 1 << 20,
        optimizer_us_per_param: 2.0,
        host_to_device: affine(1.0, 100.0),
        device_to_host: affine(1.0, 100.0),
    });
    p.validate("nodes offload profile").unwrap();
    let units = |offload: &str| {
        format!(
            r#"
    [[units]]
    name = "u1"
    level = "sdp"
    rs = [["E", 1]]
    ag = [["E", 1]]
    [[units]]
    name = "u2"
    level = "sdp"
    shard_group = 2
    rs = [["B1", 1]]
    ag = [["F1", 1]]
    {offload}
    [[units]]
    name = "u3"
    level = "sdp"
    rs = [["B2", 1]]
    ag = [["F2", 1]]
"#
        )
    };
    let device = schedule(&p, &units("")).unwrap();
    check(
        &simulate(&p, &device, Semantics::Strict),
        273.0,
        &[10.0, 30.0, 5.0, 10.0, 40.0, 20.0, 158.0],
    );
    let offloaded = schedule(&p, &units("offload = \"optimizer\"")).unwrap();
    let strict = simulate(&p, &offloaded, Semantics::Strict);
    check(&strict, 340.0, &[77.0, 30.0, 5.0, 10.0, 40.0, 20.0, 158.0]);
    let tracks: Vec<(HostTrack, f64, f64)> = strict
        .host_events
        .iter()
        .map(|e| (e.track, e.start_us, e.end_us))
        .collect();
    assert_eq!(
        tracks,
        [
            (HostTrack::DeviceToHost, 205.0, 208.0),
            (HostTrack::Step, 208.0, 408.0),
            (HostTrack::HostToDevice, 408.0, 411.0),
        ]
    );
    // The reduced 200-byte shard stays on the device to the end of RA2's slot, E: there, u1's
    // RS block (800) and the shard; at B1 also u2's RS block (400). Host: 2 ranks × Ψ'(g + o)/S
    // = 2 × 200·6/2.
    let gradient = |slot: usize| strict.slots[slot].memory.gradient;
    assert_eq!((gradient(5), gradient(6)), (1400.0, 1000.0));
    assert_eq!(strict.host.unwrap().memory_bytes, 1200.0);
    let relaxed = simulate(&p, &offloaded, Semantics::Relaxed);
    assert!(relaxed.iteration_time_us <= strict.iteration_time_us + 1e-9);
    // `full` with a secondary group is refused, naming the unit's offload.
    let hpz = units("offload = \"full\"")
        .replace("level = \"sdp\"\n    shard_group = 2\n    rs = [[\"B1\", 1]]\n    ag = [[\"F1\", 1]]", "level = \"fsdp\"\n    secondary_group = 2\n    rs = [[\"B1\", 1]]\n    agf = [[\"F1\", 1]]\n    agb = [[\"F3\", 1]]");
    let e = schedule(&p, &hpz).unwrap_err().to_string();
    assert!(
        e.contains("units[1].offload") && e.contains("secondary group"),
        "{e}"
    );
}
