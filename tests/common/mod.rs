//! Test fixtures of the root crate: the scheduler's (`scheduler/tests/common`), the runtime's own
//! profile of a workload, and the binary run on MPI ranks.
#![allow(dead_code)]

#[path = "../../scheduler/tests/common/mod.rs"]
mod scheduler_fixtures;

pub use scheduler_fixtures::*;
use shardplan_scheduler::profile::{CommCurves, Profile};

/// models/gpt2-tiny.toml.
pub fn gpt2_tiny_path() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gpt2-tiny.toml")
}

/// gpt2-tiny as rank 0 of `world` lays it out (synthetic tokens, the model's initialisation).
pub fn gpt2_tiny(world: usize) -> shardplan_runtime::gpt2::Gpt2 {
    let model = shardplan_scheduler::model::ModelSpec::load(&gpt2_tiny_path()).unwrap();
    shardplan_runtime::gpt2::Gpt2::synthetic(&model, "gpt2-tiny", 0, world).unwrap()
}

/// The runtime's own profile of `workload` on `world` ranks with blocks of `block_size_bytes`,
/// arbitrary unit times (unit u: forward 10 + u, backward 20 + u, recompute 8 + u, optimizer
/// 3 + u µs) and affine curves: times only shape random plans.
pub fn runtime_profile(
    workload: &dyn shardplan_runtime::workload::Workload,
    world: u32,
    block_size_bytes: u64,
) -> Profile {
    use shardplan_runtime::measure::{UnitTime, workload_profile};
    let times = (0..workload.unit_count())
        .map(|u| UnitTime {
            forward_us: 10.0 + u as f64,
            checkpointed_forward_us: 9.0 + u as f64,
            backward_us: 20.0 + u as f64,
            recompute_us: 8.0 + u as f64,
            optimizer_us: 3.0 + u as f64,
        })
        .collect();
    let comm = CommCurves {
        all_gather: affine(5.0, 100.0),
        reduce_scatter: affine(5.0, 100.0),
        all_reduce: affine(8.0, 100.0),
    };
    workload_profile(
        workload,
        world,
        &times,
        comm,
        Some(block_size_bytes),
        Default::default(),
    )
    .unwrap()
}

/// Runs the binary on `world` ranks: directly for one, under `mpirun --oversubscribe` otherwise.
pub fn run(world: usize, args: &[&str]) -> std::process::Output {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_shardplan");
    let mut cmd = if world == 1 {
        Command::new(bin)
    } else {
        let mut c = Command::new("mpirun");
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &world.to_string(),
            bin,
        ]);
        c.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
        c
    };
    cmd.args(args).output().expect("mpirun or shardplan starts")
}

/// `shardplan run --backend cpu` of `plan` (for `profile` and `model`) for `steps` steps on
/// `world` ranks, with `extra` arguments after.
pub fn run_plan(
    world: usize,
    profile: &std::path::Path,
    plan: &std::path::Path,
    model: &std::path::Path,
    steps: u64,
    extra: &[&str],
) -> std::process::Output {
    let [profile, plan, model] = [profile, plan, model].map(|p| p.to_str().unwrap());
    let steps = steps.to_string();
    let mut args = vec![
        "run",
        "--backend",
        "cpu",
        "--profile",
        profile,
        "--plan",
        plan,
        "--model",
        model,
        "--steps",
        &steps,
    ];
    args.extend_from_slice(extra);
    run(world, &args)
}
