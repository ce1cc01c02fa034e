//! Test fixtures of the root crate: the runtime's (`runtime/tests/common`, with the scheduler's)
//! and the binary run on MPI ranks.
#![allow(dead_code)]

#[path = "../../runtime/tests/common/mod.rs"]
mod runtime_fixtures;

pub use runtime_fixtures::*;

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
