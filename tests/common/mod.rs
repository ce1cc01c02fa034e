//! Test fixtures of the root crate: the runtime's (`runtime/tests/common`, with the scheduler's),
//! the binary run on MPI ranks, and the test MLP's two-rank setup.
#![allow(dead_code)]

#[path = "../../runtime/tests/common/mod.rs"]
mod runtime_fixtures;

pub use runtime_fixtures::*;
use shardplan_runtime::mlp::MlpSpec;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::plan::{Producer, plan_with_prediction};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Writes `schedule` of `profile` as plan `name` (with its prediction) in `dir`.
pub fn write_plan(dir: &Path, name: &str, profile: &Profile, schedule: &Schedule) -> PathBuf {
    let (plan, _) = plan_with_prediction(
        profile,
        schedule,
        Producer {
            name: name.into(),
            details: Default::default(),
        },
        None,
    );
    let path = dir.join(format!("{name}.plan.toml"));
    plan.save(&path).unwrap();
    path
}

/// A two-rank setup in `dir`: the model file, the profile file and a baseline's plan file.
pub struct TwoRanks {
    pub spec: MlpSpec,
    pub model: PathBuf,
    pub profile: Profile,
    pub profile_path: PathBuf,
    pub plan: PathBuf,
}

impl TwoRanks {
    /// `mpirun -np 2 [launcher] shardplan run --backend cpu` of this plan, `extra` after.
    pub fn mpirun(&self, launcher: &[&str], extra: &[&str]) -> Command {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
            .args(launcher)
            .arg(env!("CARGO_BIN_EXE_shardplan"))
            .args(["run", "--backend", "cpu", "--profile"])
            .arg(&self.profile_path)
            .arg("--plan")
            .arg(&self.plan)
            .arg("--model")
            .arg(&self.model)
            .args(extra)
            .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
        cmd
    }
}

/// The test MLP at N = 2 with `kind`'s plan, in `dir`.
pub fn two_ranks(dir: &Path, kind: BaselineKind) -> TwoRanks {
    let (spec, model) = spec(dir);
    let profile = profile(&spec, 2);
    let profile_path = dir.join("profile.toml");
    profile.save(&profile_path).unwrap();
    let schedule = baseline(&profile, kind, false, None).unwrap().schedule;
    let plan = write_plan(dir, kind.name(), &profile, &schedule);
    TwoRanks {
        spec,
        model,
        profile,
        profile_path,
        plan,
    }
}
