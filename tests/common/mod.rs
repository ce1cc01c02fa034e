//! Test fixtures of the root crate: the runtime's (`runtime/tests/common`, with the scheduler's),
//! the binary run on MPI ranks, and the test MLP's two-rank setup.
#![allow(dead_code)]

pub mod cli;
#[path = "../../runtime/tests/common/mod.rs"]
mod runtime_fixtures;

pub use runtime_fixtures::*;
use shardplan_runtime::mlp::MlpSpec;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::profile::{GroupCurves, Link, Profile, Topology};
use shardplan_scheduler::schedule::{Recompute, Schedule};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the binary with `args` in the repository root (so that `models/…` resolves).
pub fn shardplan(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// Fails the test with the command's stderr unless `out` is a success.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// Writes `schedule` of `profile` as plan `name` (with its prediction) in `dir`.
pub fn write_plan(dir: &Path, name: &str, profile: &Profile, schedule: &Schedule) -> PathBuf {
    let plan = uncapped_plan(name, profile, schedule);
    let path = dir.join(format!("{name}.plan.toml"));
    plan.save(&path).unwrap();
    path
}

/// A run of a plan file under one semantics: its `--json` report and its trained parameters.
pub struct Trained {
    pub semantics: &'static str,
    pub report: serde_json::Value,
    pub params: Vec<Vec<f32>>,
}

/// Trains `plan` for `steps` steps on `ranks` ranks, strict and then relaxed, each dumping its
/// parameters into `dir`; asserts that both runs succeed and that they end bit for bit alike
/// (relaxed semantics changes when work runs, never what it computes).
pub fn train_strict_and_relaxed(
    dir: &Path,
    name: &str,
    ranks: usize,
    (profile, plan, model): (&Path, &Path, &Path),
    steps: u64,
) -> [Trained; 2] {
    let run = |semantics: &'static str| {
        let dump = dir.join(format!("{name}-{semantics}.json"));
        let extra = [
            "--semantics",
            semantics,
            "--dump-params",
            dump.to_str().unwrap(),
            "--json",
        ];
        let out = run_plan(ranks, profile, plan, model, steps, &extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name} {semantics}: {stderr}");
        Trained {
            semantics,
            report: serde_json::from_slice(&out.stdout).unwrap(),
            params: serde_json::from_slice(&std::fs::read(&dump).unwrap()).unwrap(),
        }
    };
    let runs = [run("strict"), run("relaxed")];
    assert_eq!(
        runs[0].params, runs[1].params,
        "{name}: strict and relaxed differ"
    );
    runs
}

/// The test MLP's job in `dir` on `ranks` MPI ranks: the model file, the profile file and a
/// baseline's plan file.
pub struct MlpJob {
    pub ranks: usize,
    pub spec: MlpSpec,
    pub model: PathBuf,
    pub profile: Profile,
    pub profile_path: PathBuf,
    pub plan: PathBuf,
}

impl MlpJob {
    /// `mpirun -np <ranks> [launcher] shardplan run --backend cpu` of this plan, `extra` after.
    pub fn mpirun(&self, launcher: &[&str], extra: &[&str]) -> Command {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(self.ranks.to_string())
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
pub fn two_ranks(dir: &Path, kind: BaselineKind) -> MlpJob {
    mlp_job(dir, kind, |spec| profile(spec, 2))
}

/// The test MLP at N = 4 as 2 nodes of 2 ([`two_nodes_of_two`]) with `kind`'s plan, in `dir`.
pub fn four_ranks_on_two_nodes(dir: &Path, kind: BaselineKind) -> MlpJob {
    mlp_job(dir, kind, |spec| two_nodes_of_two(profile(spec, 4)))
}

/// The MLP's job in `dir` with `kind`'s plan on the profile `profile_of` makes for it.
fn mlp_job(dir: &Path, kind: BaselineKind, profile_of: impl Fn(&MlpSpec) -> Profile) -> MlpJob {
    let (spec, model) = spec(dir);
    let profile = profile_of(&spec);
    let profile_path = dir.join("profile.toml");
    profile.save(&profile_path).unwrap();
    let schedule = baseline(&profile, kind, Recompute::Off, None)
        .unwrap()
        .schedule;
    let plan = write_plan(dir, kind.name(), &profile, &schedule);
    MlpJob {
        ranks: profile.world_size as usize,
        spec,
        model,
        profile,
        profile_path,
        plan,
    }
}

/// `profile` (4 ranks) as 2 nodes of 2: both groups of 2 with the world's curves, no
/// communicator bytes (the CPU's communicators are outside the arena).
pub fn two_nodes_of_two(mut profile: Profile) -> Profile {
    let group = |link| GroupCurves {
        ranks: 2,
        link,
        comm: profile.comm.clone(),
    };
    profile.topology = Some(Topology {
        gpus_per_node: 2,
        groups: vec![group(Link::Intra), group(Link::Inter)],
        communicator_bytes: 0,
    });
    profile
}

/// ‖a − b‖ / ‖b − w0‖ per unit, the worst.
pub fn relative_update_error(a: &[Vec<f32>], b: &[Vec<f32>], w0: &[Vec<f32>]) -> f64 {
    let norm = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| f64::from(p - q).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    (0..a.len())
        .map(|u| norm(&a[u], &b[u]) / norm(&b[u], &w0[u]).max(1e-30))
        .fold(0.0, f64::max)
}
