//! The offload MIP on nodes (DESIGN §3.13 "Offload on nodes", §4.10) against an exhaustive search
//! of its plan space on tiny instances with a topology (N ∈ {4, 8} on nodes of 2 or N/2, every
//! offered shard group and hpZ, random curves, host links and host steps; and the
//! three-units-on-two-nodes fixture): every level over every group, recompute and launch within
//! depth 4, and every unit that reduces whole at the first position after B_i on the device,
//! `optimizer` or `full` (not `full` at hpZ; steps overlapped), each schedule judged by the strict
//! simulator only, at device caps below the smallest that fits without offload.

mod common;

use common::{
    OffloadSpace, Rng, affine, offload_space, random_profile, three_units_on_two_nodes,
    with_topology,
};
use shardplan_scheduler::ilp::{SolveOptions, WindowLimits, solve};
use shardplan_scheduler::profile::{Host, Profile};
use shardplan_scheduler::schedule::UnitSchedule;
use shardplan_scheduler::sim::{Semantics, simulate};
use std::num::NonZeroUsize;

/// The offload MIP's space on nodes within depth 4 (its device-only plans within no limits).
fn enumerate(profile: &Profile, recompute: bool) -> OffloadSpace {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| common::unit_options(profile, u, recompute))
        .collect();
    let depth4 = WindowLimits::depth(NonZeroUsize::new(4).unwrap());
    offload_space(profile, &per_unit, &|s| depth4.admit(s))
}

/// A host on `profile`'s nodes: random links and host step, ample memory.
fn with_host(rng: &mut Rng, profile: &mut Profile) {
    for unit in &mut profile.units {
        unit.optimizer_us = 0.0;
    }
    let node = profile
        .topology
        .as_ref()
        .map_or(profile.world_size, |t| t.gpus_per_node);
    profile.host = Some(Host {
        ranks_per_node: node,
        ranks_per_link: 1,
        memory_bytes: 1 << 40,
        optimizer_us_per_param: rng.range(1, 40) as f64 / 100.0,
        host_to_device: affine(rng.range(1, 10) as f64, rng.range(5, 50) as f64),
        device_to_host: affine(rng.range(1, 10) as f64, rng.range(5, 50) as f64),
    });
    profile.validate("offload instance").unwrap();
}

/// The tiny instances on nodes: random ones of 1–2 units whose world spans nodes, and the
/// three-units-on-two-nodes fixture.
fn instances() -> Vec<(u64, Profile, bool)> {
    let mut out = Vec::new();
    for seed in 0..40u64 {
        let mut rng = Rng(seed * 6_151 + 5);
        let units = 1 + (seed % 2) as usize;
        let kappa = if seed.is_multiple_of(3) { 0.1 } else { 0.0 };
        let mut profile = random_profile(&mut rng, units, kappa, 1000);
        if !with_topology(&mut rng, &mut profile) {
            continue;
        }
        with_host(&mut rng, &mut profile);
        out.push((seed, profile, seed % 4 < 2));
    }
    let mut rng = Rng(99);
    let mut fixture = three_units_on_two_nodes();
    with_host(&mut rng, &mut fixture);
    out.push((1000, fixture, false));
    out
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

/// Below the device-only minimum on nodes, the offload MIP's own answer is the fastest plan of
/// its space (its bound never above it), the solve's answer never slower and the simulator's
/// time, within the cap; some answers offload a unit over a shard group.
#[test]
fn offload_mip_on_nodes_equals_exhaustive_search() {
    let (mut solves, mut offloaded, mut over_groups) = (0, 0, 0);
    for (seed, profile, recompute) in instances() {
        let enumerated = enumerate(&profile, recompute);
        let device_only = enumerated.device_only_minimum();
        let space = enumerated.plans;
        let mut below: Vec<f64> = space
            .iter()
            .filter(|j| j.offloads && j.peak.ceil() < device_only.floor())
            .map(|j| j.peak.ceil())
            .collect();
        below.sort_by(f64::total_cmp);
        below.dedup();
        let picks = [0, below.len() / 2, below.len().saturating_sub(1)];
        let mut caps: Vec<f64> = picks
            .iter()
            .filter_map(|&k| below.get(k).copied())
            .collect();
        caps.dedup();
        for cap in caps {
            let expected = space
                .iter()
                .filter(|j| j.peak <= cap && j.host <= (1u64 << 40) as f64)
                .map(|j| j.time)
                .fold(f64::INFINITY, f64::min);
            let solved = solve(&profile, &options(cap, recompute))
                .unwrap_or_else(|e| panic!("seed {seed} cap {cap}: {e}"));
            solves += 1;
            let answer = solved.report.objective;
            let sim = simulate(&profile, &solved.schedule, Semantics::Strict);
            assert!(sim.peak_memory_bytes <= cap, "seed {seed} cap {cap}");
            assert!((sim.iteration_time_us - answer).abs() <= 1e-6 * answer);
            assert!(
                answer <= expected * (1.0 + 1e-6),
                "seed {seed} cap {cap}: answer {answer}, space {expected}"
            );
            let phase = &solved.report.phases[0];
            assert!(
                phase.best_bound <= expected * (1.0 + 1e-6),
                "seed {seed} cap {cap}: bound {} over the space's optimum {expected}",
                phase.best_bound
            );
            assert!(
                (phase.objective - expected).abs() <= 1e-6 * expected,
                "seed {seed} cap {cap}: MIP {}, exhaustive {expected}",
                phase.objective
            );
            offloaded += usize::from(solved.schedule.offloads());
            over_groups += usize::from((0..profile.unit_count()).any(|u| {
                let unit = &solved.schedule.units()[u];
                !solved.schedule.offload(u).is_none()
                    && (unit.shard_group.is_some() || unit.secondary_group.is_some())
            }));
        }
    }
    assert!(solves >= 20, "{solves} solves");
    assert!(offloaded >= 15, "{offloaded} answers offload");
    assert!(
        over_groups >= 1,
        "{over_groups} answers offload a unit over a shard or secondary group"
    );
}
