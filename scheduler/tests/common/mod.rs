//! Test fixtures: tiny profiles with affine collective curves, plans written as TOML text, the
//! zoo's analytic profiles; random profiles and schedules (`random`), the exhaustive searches'
//! plan spaces (`enumerate`, `offload_space`). The root crate's tests include this file too
//! (`tests/common`).
#![allow(dead_code)]

mod enumerate;
mod offload_space;
mod random;

// Each test uses some of the fixtures.
#[allow(unused_imports)]
pub use enumerate::*;
#[allow(unused_imports)]
pub use offload_space::*;
#[allow(unused_imports)]
pub use random::*;
use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::{
    BytesPerParam, CommCurves, GroupCurves, Link, Profile, Topology, UnitProfile,
};
use shardplan_scheduler::schedule::Schedule;
use std::collections::BTreeMap;

/// One unit: (params, forward µs, backward µs, act, ckpt, ws_f, ws_b).
pub type UnitSpec = (u64, f64, f64, u64, u64, u64, u64);

/// The repository's root (this file is compiled from the root crate and from the scheduler's).
pub fn repo_root() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if dir.join("models").is_dir() {
        dir.to_path_buf()
    } else {
        dir.join("..")
    }
}

/// The analytic profile of zoo model `name` on 64 H100s on one link (`profile analytic --flat`:
/// the library builds no topology unless asked, and these tests check the flat model).
pub fn zoo_profile(name: &str) -> Profile {
    let path = repo_root().join(format!("models/{name}.toml"));
    analytic_profile(
        &ModelSpec::load(&path).unwrap(),
        &Catalog::bundled().unwrap(),
        &AnalyticOptions::new("h100-sxm", 64),
    )
    .unwrap()
}

/// A curve with t(bytes) = latency + bytes / bytes_per_us (exact for any message of ≥ 1 byte).
pub fn affine(latency_us: f64, bytes_per_us: f64) -> CommCurve {
    let far = 1u64 << 40;
    CommCurve {
        points: vec![
            (1, latency_us + 1.0 / bytes_per_us),
            (far, latency_us + far as f64 / bytes_per_us),
        ],
    }
}

/// Builds a valid profile.
#[allow(clippy::too_many_arguments)]
pub fn profile(
    world_size: u32,
    block_size_bytes: u64,
    overlap_slowdown: f64,
    iteration_extra_us: f64,
    bytes_per_param: (u64, u64, u64),
    units: &[UnitSpec],
    all_gather: CommCurve,
    reduce_scatter: CommCurve,
    all_reduce: CommCurve,
) -> Profile {
    let profile = Profile {
        schema: 1,
        name: "test".into(),
        source: BTreeMap::new(),
        world_size,
        block_size_bytes,
        overlap_slowdown,
        overlap_slowdown_reduce_scatter: None,
        overlap_slowdown_all_gather: None,
        comm_slowdown: 0.0,
        update_slowdown: None,
        iteration_extra_us,
        bytes_per_param: BytesPerParam {
            param: bytes_per_param.0,
            grad: bytes_per_param.1,
            optimizer: bytes_per_param.2,
        },
        micro_batches: 1,
        shard_quantum_params: 1,
        units: units
            .iter()
            .enumerate()
            .map(|(k, &(params, f, b, act, ckpt, wsf, wsb))| UnitProfile {
                name: format!("u{}", k + 1),
                params,
                forward_us: f,
                checkpointed_forward_us: None,
                backward_us: b,
                recompute_us: None,
                optimizer_us: 0.0,
                activation_bytes: act,
                checkpoint_activation_bytes: ckpt,
                forward_workspace_bytes: wsf,
                backward_workspace_bytes: wsb,
                reads_params_of: None,
            })
            .collect(),
        comm: CommCurves {
            all_gather,
            reduce_scatter,
            all_reduce,
        },
        topology: None,
        host: None,
    };
    profile.validate("test profile").unwrap();
    profile
}

/// A plan file for `profile` whose `[[units]]` tables are `units_toml`.
pub fn plan_toml(profile: &Profile, units_toml: &str) -> String {
    format!(
        "schema = 1\nprofile_digest = \"{}\"\nworld_size = {}\nmicro_batches = {}\n\n\
         [producer]\nname = \"hand\"\n\n[predicted]\niteration_time_us = 0.0\n\
         peak_memory_bytes = 0\npeak_slot = \"E\"\n\n{units_toml}",
        profile.digest(),
        profile.world_size,
        profile.micro_batches
    )
}

/// Parses and validates a plan written as TOML.
pub fn schedule(profile: &Profile, units_toml: &str) -> shardplan_scheduler::Result<Schedule> {
    let plan: Plan =
        shardplan_scheduler::io::parse_toml(&plan_toml(profile, units_toml), "test plan")?;
    plan.schedule(profile, "test plan")
}

/// Asserts two floats agree to 1e-9 relative.
pub fn close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{what}: got {actual}, expected {expected}"
    );
}

/// Asserts a simulation's iteration time and its slots' durations (in slot order), and that the
/// durations sum to the time.
pub fn check(sim: &shardplan_scheduler::sim::Simulation, time: f64, durations: &[f64]) {
    close(sim.iteration_time_us, time, "iteration time");
    for (s, d) in sim.slots.iter().zip(durations) {
        close(s.duration_us, *d, &format!("duration of {}", s.slot));
    }
    close(
        sim.slots.iter().map(|s| s.duration_us).sum(),
        time,
        "sum of slot durations",
    );
}

/// Asserts a simulation's per-slot memory (in slot order) and the slot of its peak.
pub fn check_memory(sim: &shardplan_scheduler::sim::Simulation, memory: &[f64], peak_slot: &str) {
    for (s, m) in sim.slots.iter().zip(memory) {
        close(s.memory_bytes, *m, &format!("memory of {}", s.slot));
    }
    assert_eq!(sim.peak_slot.to_string(), peak_slot);
}

/// The smallest feasible cap an infeasible solve names: `(N bytes)`.
pub fn reported_minimum(message: &str) -> u64 {
    let end = message
        .find(" bytes)")
        .expect("the message names a cap in bytes");
    let start = message[..end].rfind('(').expect("an opening parenthesis") + 1;
    message[start..end]
        .parse()
        .expect("a whole number of bytes")
}

/// Three units, N = 4 on nodes of 2: u1 Ψ 400, f 10, b 20, act 1000; u2 Ψ 200, f 20, b 40, act
/// 2000; u3 Ψ 100, f 5, b 10, act 500; p = g = 2, o = 4, κ = 0.
/// World curves: AG 10 + B/10, RS 5 + B/20; the node group of 2: AG 2 + B/100, RS 1 + B/100; the
/// replica group of 2 across nodes: AR 3 + B/10. 100 bytes per communicator.
pub fn three_units_on_two_nodes() -> Profile {
    let mut p = profile(
        4,
        1 << 20,
        0.0,
        0.0,
        (2, 2, 4),
        &[
            (400, 10.0, 20.0, 1000, 100, 0, 0),
            (200, 20.0, 40.0, 2000, 200, 0, 0),
            (100, 5.0, 10.0, 500, 50, 0, 0),
        ],
        affine(10.0, 10.0),
        affine(5.0, 20.0),
        affine(1.0, 1.0),
    );
    p.topology = Some(Topology {
        gpus_per_node: 2,
        groups: vec![
            GroupCurves {
                ranks: 2,
                link: Link::Intra,
                comm: CommCurves {
                    all_gather: affine(2.0, 100.0),
                    reduce_scatter: affine(1.0, 100.0),
                    all_reduce: affine(1.0, 1.0),
                },
            },
            GroupCurves {
                ranks: 2,
                link: Link::Inter,
                comm: CommCurves {
                    all_gather: affine(1.0, 1.0),
                    reduce_scatter: affine(1.0, 1.0),
                    all_reduce: affine(3.0, 10.0),
                },
            },
        ],
        communicator_bytes: 100,
    });
    p
}
