//! Test fixtures: tiny profiles with affine collective curves, and plans written as TOML text.
#![allow(dead_code)]

use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::plan::{Plan, Schedule};
use shardplan_scheduler::profile::{BytesPerParam, CommCurves, Profile, UnitProfile};
use std::collections::BTreeMap;

/// One unit: (params, forward µs, backward µs, act, ckpt, ws_f, ws_b).
pub type UnitSpec = (u64, f64, f64, u64, u64, u64, u64);

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
        iteration_extra_us,
        bytes_per_param: BytesPerParam {
            param: bytes_per_param.0,
            grad: bytes_per_param.1,
            optimizer: bytes_per_param.2,
        },
        units: units
            .iter()
            .enumerate()
            .map(|(k, &(params, f, b, act, ckpt, wsf, wsb))| UnitProfile {
                name: format!("u{}", k + 1),
                params,
                forward_us: f,
                backward_us: b,
                activation_bytes: act,
                checkpoint_activation_bytes: ckpt,
                forward_workspace_bytes: wsf,
                backward_workspace_bytes: wsb,
            })
            .collect(),
        comm: CommCurves {
            all_gather,
            reduce_scatter,
            all_reduce,
        },
    };
    profile.validate("test profile").unwrap();
    profile
}

/// A plan file for `profile` whose `[[units]]` tables are `units_toml`.
pub fn plan_toml(profile: &Profile, units_toml: &str) -> String {
    format!(
        "schema = 1\nprofile_digest = \"{}\"\nworld_size = {}\n\n[producer]\nname = \"hand\"\n\n\
         [predicted]\niteration_time_us = 0.0\npeak_memory_bytes = 0\npeak_slot = \"E\"\n\n{units_toml}",
        profile.digest(),
        profile.world_size
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
