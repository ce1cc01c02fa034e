//! The ILP with offload (DESIGN §4.10) against an exhaustive search of its plan space on tiny
//! instances (1–3 units, ≤ 2 blocks per unit, N ∈ {2, 4, 8}, recompute on and off, random host
//! links and host steps): every level, recompute and launch within depth 4, and every unit that
//! reduces whole at the first position after B_i on the device, `optimizer` or `full` (steps
//! overlapped), each schedule judged by the strict simulator only. At device caps below the
//! smallest that fits without offload, and at host caps from ample down to the best plan's host
//! bytes (inclusive) and one byte less.

mod common;

use common::{
    Judged, OffloadSpace, Rng, affine, launches, offload_space, placements, random_profile,
};
use shardplan_scheduler::Error;
use shardplan_scheduler::ilp::{SolveOptions, WindowLimits, solve};
use shardplan_scheduler::offload::host_node_bytes;
use shardplan_scheduler::profile::{Host, Profile};
use shardplan_scheduler::schedule::{Schedule, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::{Level, Op, Timeline};
use std::collections::BTreeMap;
use std::num::NonZeroUsize;

/// Every level, recompute and launch placement of one unit over the world.
fn unit_options(profile: &Profile, unit: usize, recompute: bool) -> Vec<UnitSchedule> {
    let timeline = Timeline::new(profile.unit_count());
    let nb = profile.blocks(unit);
    let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len;
    let between = timeline.window(unit, Op::GatherBackward.window_kind()).len;
    let unit_schedule = |level, r, launches| UnitSchedule {
        shard_group: None,
        secondary_group: None,
        level,
        recompute: r,
        launches,
        accumulation: Default::default(),
    };
    let mut options = Vec::new();
    for r in [false, true].into_iter().take(1 + usize::from(recompute)) {
        for ar in placements(nb, 0, after) {
            let l = BTreeMap::from([(Op::AllReduce, launches(timeline, unit, Op::AllReduce, &ar))]);
            options.push(unit_schedule(Level::None, r, l));
        }
        for rs in placements(nb, 0, after) {
            for ag in placements(nb, 0, after)
                .into_iter()
                .filter(|ag| ag[0] >= *rs.last().unwrap())
            {
                let rs_launches = launches(timeline, unit, Op::ReduceScatter, &rs);
                options.push(unit_schedule(
                    Level::Sdp,
                    r,
                    BTreeMap::from([
                        (Op::ReduceScatter, rs_launches.clone()),
                        (Op::Gather, launches(timeline, unit, Op::Gather, &ag)),
                    ]),
                ));
                for agb in placements(nb, 0, between) {
                    options.push(unit_schedule(
                        Level::Fsdp,
                        r,
                        BTreeMap::from([
                            (Op::ReduceScatter, rs_launches.clone()),
                            (
                                Op::GatherForward,
                                launches(timeline, unit, Op::GatherForward, &ag),
                            ),
                            (
                                Op::GatherBackward,
                                launches(timeline, unit, Op::GatherBackward, &agb),
                            ),
                        ]),
                    ));
                }
            }
        }
    }
    options
}

/// The offload space of a tiny instance over the world within depth 4 (its device-only plans
/// within no limits).
fn enumerate(profile: &Profile, recompute: bool) -> OffloadSpace {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u, recompute))
        .collect();
    let depth4 = WindowLimits::depth(NonZeroUsize::new(4).unwrap());
    offload_space(profile, &per_unit, &|s| depth4.admit(s))
}

/// A tiny random profile with a host: no device optimizer time, κ_q = 0 (DESIGN §4.10's space).
fn offload_instance(seed: u64) -> (Profile, bool) {
    let mut rng = Rng(seed * 104_729 + 17);
    let units = 1 + (seed % 3) as usize;
    let kappa = if seed.is_multiple_of(2) { 0.0 } else { 0.1 };
    let recompute = seed % 4 < 2;
    let mut profile = random_profile(&mut rng, units, kappa, 1000);
    for unit in &mut profile.units {
        unit.optimizer_us = 0.0;
    }
    let n = profile.world_size;
    profile.host = Some(Host {
        ranks_per_node: n,
        ranks_per_link: 1,
        memory_bytes: 1 << 40,
        optimizer_us_per_param: rng.range(1, 40) as f64 / 100.0,
        host_to_device: affine(rng.range(1, 10) as f64, rng.range(5, 50) as f64),
        device_to_host: affine(rng.range(1, 10) as f64, rng.range(5, 50) as f64),
    });
    profile.validate("offload instance").unwrap();
    (profile, recompute)
}

fn options(cap: f64, recompute: bool) -> SolveOptions {
    SolveOptions {
        memory_cap_bytes: Some(cap.ceil() as u64),
        relative_gap: 0.0,
        allow_recompute: recompute,
        two_phase: false,
        ..SolveOptions::default()
    }
}

/// Below the device-only minimum, the offload MIP's own answer is the fastest plan of its space
/// (its bound never above it), the solve's answer never slower, and the host cap is inclusive.
#[test]
fn offload_mip_equals_exhaustive_search() {
    let (mut solves, mut offloaded, mut host_caps) = (0, 0, 0);
    for seed in 0..24u64 {
        let (mut profile, recompute) = offload_instance(seed);
        let enumerated = enumerate(&profile, recompute);
        let device_only = enumerated.device_only_minimum();
        let space = enumerated.plans;
        let mut below: Vec<f64> = space
            .iter()
            .filter(|j| j.offloads && j.peak.ceil() < device_only.floor())
            .map(|j| j.peak)
            .collect();
        below.sort_by(f64::total_cmp);
        below.dedup();
        let picks = [0, below.len() / 2, below.len().saturating_sub(1)];
        for cap in picks.iter().filter_map(|&k| below.get(k).copied()) {
            let cap = cap.ceil();
            let fastest = |host_cap: f64| {
                space
                    .iter()
                    .filter(|j| j.peak <= cap && j.host <= host_cap)
                    .min_by(|a, b| a.time.total_cmp(&b.time))
            };
            let ample = fastest(f64::INFINITY).expect("a plan of the space fits");
            let host_cap = ample.host;
            for (host_bytes, expect_same) in [
                (1u64 << 40, true),
                (host_cap as u64, true),
                (host_cap as u64 - 1, false),
            ] {
                profile.host.as_mut().unwrap().memory_bytes = host_bytes;
                let expected = fastest(host_bytes as f64);
                let result = solve(&profile, &options(cap, recompute));
                solves += 1;
                if host_bytes != 1 << 40 {
                    host_caps += 1;
                }
                let Some(expected) = expected else {
                    // Nothing of the space fits: a plan outside it (an offload baseline) may.
                    match result {
                        Ok(solved) => assert!(solved.simulation.peak_memory_bytes <= cap),
                        Err(Error::Infeasible(_)) => {}
                        Err(e) => panic!("seed {seed} cap {cap}: {e}"),
                    }
                    continue;
                };
                let solved = result.unwrap_or_else(|e| panic!("seed {seed} cap {cap}: {e}"));
                let answer = solved.report.objective;
                assert!(
                    answer <= expected.time * (1.0 + 1e-6),
                    "seed {seed} cap {cap} host {host_bytes}: answer {answer}, space {}",
                    expected.time
                );
                let phase = &solved.report.phases[0];
                assert!(
                    phase.best_bound <= expected.time * (1.0 + 1e-6),
                    "seed {seed} cap {cap}: bound {} over the space's optimum {}",
                    phase.best_bound,
                    expected.time
                );
                assert!(
                    (phase.objective - expected.time).abs() <= 1e-6 * expected.time,
                    "seed {seed} cap {cap} host {host_bytes}: MIP {}, exhaustive {}",
                    phase.objective,
                    expected.time
                );
                if expect_same {
                    assert!((expected.time - ample.time).abs() <= 1e-9 * ample.time);
                }
                let sim = simulate(&profile, &solved.schedule, Semantics::Strict);
                assert!(sim.peak_memory_bytes <= cap);
                assert!(
                    host_node_bytes(
                        &profile,
                        solved.schedule.units(),
                        solved.schedule.offload_modes()
                    ) <= host_bytes as f64
                );
                offloaded += usize::from(solved.schedule.offloads());
            }
            profile.host.as_mut().unwrap().memory_bytes = 1 << 40;
        }
    }
    assert!(solves >= 30, "{solves} solves");
    assert!(offloaded >= 20, "{offloaded} answers offload");
    assert!(host_caps >= 20, "{host_caps} solves at a tight host cap");
}

/// At device caps from the device-only minimum up (where a plan fits on the device alone), the
/// solve is never slower than the fastest device-only plan, and an answer that offloads is the
/// fastest plan of the offload space (its bound never above it); at a cap one byte under an
/// offloading answer's peak, the answer fits that cap (the cap is inclusive).
#[test]
fn offload_above_the_device_only_minimum() {
    let (mut solves, mut offloaded) = (0, 0);
    for seed in 0..12u64 {
        let (profile, recompute) = offload_instance(seed);
        let OffloadSpace {
            plans: space,
            device_only: device,
        } = enumerate(&profile, recompute);
        let minimum = device
            .iter()
            .map(|j| j.peak)
            .fold(f64::INFINITY, f64::min)
            .ceil();
        let fastest = |plans: &[Judged], cap: f64| {
            plans
                .iter()
                .filter(|j| j.peak <= cap)
                .map(|j| j.time)
                .fold(f64::INFINITY, f64::min)
        };
        for cap in [minimum, minimum * 1.05] {
            let cap = cap.ceil();
            let solved = solve(&profile, &options(cap, recompute))
                .unwrap_or_else(|e| panic!("seed {seed} cap {cap}: {e}"));
            solves += 1;
            let answer = solved.report.objective;
            let sim = simulate(&profile, &solved.schedule, Semantics::Strict);
            assert!(sim.peak_memory_bytes <= cap);
            assert!((sim.iteration_time_us - answer).abs() <= 1e-6 * answer);
            let device_best = fastest(&device, cap);
            assert!(
                answer <= device_best * (1.0 + 1e-6),
                "seed {seed} cap {cap}: answer {answer}, device-only {device_best}"
            );
            if !solved.schedule.offloads() {
                continue;
            }
            offloaded += 1;
            let space_best = fastest(&space, cap);
            assert!(
                (answer - space_best).abs() <= 1e-6 * space_best,
                "seed {seed} cap {cap}: answer {answer}, offload space {space_best}"
            );
            assert!(solved.report.best_bound <= space_best * (1.0 + 1e-6));
            let under = (sim.peak_memory_bytes.ceil() - 1.0).max(0.0);
            if let Ok(again) = solve(&profile, &options(under, recompute)) {
                let peak = simulate(&profile, &again.schedule, Semantics::Strict).peak_memory_bytes;
                assert!(
                    peak <= under,
                    "seed {seed}: peak {peak} over the cap {under}"
                );
                assert!(
                    again.report.objective <= fastest(&space, under) * (1.0 + 1e-6),
                    "seed {seed} cap {under}"
                );
            }
        }
    }
    assert!(solves >= 20, "{solves} solves");
    assert!(
        offloaded >= 1,
        "{offloaded} answers offload above the device-only minimum"
    );
}

/// The offload MIP's plan as a schedule is the plan the simulator times: solving for it again
/// from its own plan file's profile gives the same time, and its offload is in the plan file.
#[test]
fn an_offloading_answer_round_trips_through_its_plan_file() {
    let (profile, recompute) = offload_instance(4);
    let space = enumerate(&profile, recompute);
    let cap = space
        .plans
        .iter()
        .filter(|j| j.offloads)
        .map(|j| j.peak)
        .fold(f64::INFINITY, f64::min)
        .ceil();
    let solved = solve(&profile, &options(cap, recompute)).unwrap();
    assert!(solved.schedule.offloads());
    let text = solved.plan(&profile, Some(cap as u64)).to_toml();
    assert!(text.contains("offload = \""), "{text}");
    let dir = std::env::temp_dir().join(format!("shardplan-ilp-offload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.toml");
    std::fs::write(&path, &text).unwrap();
    let plan = shardplan_scheduler::plan::Plan::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let schedule: Schedule = plan.schedule(&profile, "plan.toml").unwrap();
    let sim = simulate(&profile, &schedule, Semantics::Strict);
    assert!(
        (sim.iteration_time_us - solved.report.objective).abs() <= 1e-6 * sim.iteration_time_us
    );
}

/// Issue 64's one-GPU target: Llama 3 8B on one H100 at 79.65 GiB, where nothing fits on the
/// device alone, is solved with offload at least 1.5× faster than `fsdp2-offload`'s fastest
/// variant that fits (the simulator's times), by the offload MIP's own plan too.
#[test]
fn llama3_8b_on_one_h100_beats_fsdp2_offload_by_half() {
    use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
    use shardplan_scheduler::baselines::{BaselineKind, baseline};
    use shardplan_scheduler::hardware::Catalog;
    use shardplan_scheduler::ilp::Effort;
    use shardplan_scheduler::model::ModelSpec;
    use shardplan_scheduler::schedule::Recompute;
    let path = common::repo_root().join("models/llama3-8b.toml");
    let profile = analytic_profile(
        &ModelSpec::load(&path).unwrap(),
        &Catalog::bundled().unwrap(),
        &AnalyticOptions::new("h100-sxm", 1),
    )
    .unwrap();
    let cap = (79.65 * f64::from(1u32 << 30)) as u64;
    let fsdp2_offload = [Recompute::Off, Recompute::On]
        .into_iter()
        .filter_map(|r| baseline(&profile, BaselineKind::Fsdp2Offload, r, Some(cap)).ok())
        .filter(|b| b.simulation.peak_memory_bytes <= cap as f64)
        .map(|b| b.simulation.iteration_time_us)
        .fold(f64::INFINITY, f64::min);
    assert!(fsdp2_offload.is_finite(), "fsdp2-offload fits");
    let options = SolveOptions {
        memory_cap_bytes: Some(cap),
        effort: Effort::new(std::num::NonZeroU64::new(20).unwrap()),
        time_limit_s: f64::INFINITY,
        ..SolveOptions::default()
    };
    let solved = solve(&profile, &options).unwrap();
    assert!(solved.schedule.offloads());
    let sim = simulate(&profile, &solved.schedule, Semantics::Strict);
    assert!(sim.peak_memory_bytes <= cap as f64);
    assert!(
        (sim.iteration_time_us - solved.report.objective).abs() <= 1e-6 * sim.iteration_time_us
    );
    assert!(
        fsdp2_offload >= 1.5 * sim.iteration_time_us,
        "fsdp2-offload {fsdp2_offload} µs, the answer {} µs",
        sim.iteration_time_us
    );
    let own = solved.report.phases[0].objective;
    assert!(
        fsdp2_offload >= 1.5 * own,
        "fsdp2-offload {fsdp2_offload} µs, the MIP's own plan {own} µs"
    );
}
