//! The runtime end to end: plans executed by `shardplan run` (one rank, and N = 2, 4 MPI ranks
//! under mpirun) end with the same weights as a single process training on the union of the
//! ranks' batches, in strict and relaxed semantics; bad runs are refused; a killed rank ends the
//! job.

mod common;

use common::{Rng, profile, random_schedule, run_plan, spec};
use shardplan_runtime::measure::{UnitTime, workload_profile};
use shardplan_runtime::mlp::{Mlp, MlpSpec, max_relative_error, reference_training};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::plan::{Producer, plan_with_prediction};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const STEPS: usize = 4;

fn write_plan(dir: &Path, name: &str, profile: &Profile, schedule: &Schedule) -> PathBuf {
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

/// `shardplan run` of two steps on one rank (no mpirun).
fn run_two_steps(profile: &Path, plan: &Path, model: &Path) -> Output {
    run_plan(1, profile, plan, model, 2, &[])
}

fn params(path: &Path) -> Vec<Vec<f32>> {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Baselines and random plans at `world` ranks, strict and relaxed, against the reference.
fn check_world(world: usize, random_plans: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = spec(dir.path());
    let profile = profile(&spec, world as u32);
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    let (reference, _) = reference_training(&spec, world, STEPS);
    // Negative control: the reference of another world size trains on other data and must be
    // told apart by the same check.
    let (other_data, _) = reference_training(&spec, world + 1, STEPS);
    let mut plans: Vec<(String, Schedule)> = [
        BaselineKind::Ddp,
        BaselineKind::Zero2,
        BaselineKind::Fsdp1,
        BaselineKind::Zero3,
    ]
    .into_iter()
    .map(|k| {
        (
            k.name().to_string(),
            baseline(&profile, k, k == BaselineKind::Zero2, None)
                .unwrap()
                .schedule,
        )
    })
    .collect();
    let mut rng = Rng(world as u64 * 1_000_003);
    plans.extend(
        (0..random_plans).map(|k| (format!("random{k}"), random_schedule(&mut rng, &profile))),
    );
    let mut worst = 0.0f64;
    for (name, schedule) in &plans {
        let plan = write_plan(dir.path(), name, &profile, schedule);
        let mut results = Vec::new();
        for semantics in ["strict", "relaxed"] {
            let dump = dir.path().join(format!("{name}-{semantics}.json"));
            let out = run_plan(
                world,
                &profile_path,
                &plan,
                &model,
                STEPS as u64,
                &[
                    "--semantics",
                    semantics,
                    "--dump-params",
                    dump.to_str().unwrap(),
                    "--json",
                ],
            );
            assert!(
                out.status.success(),
                "N={world} {name} {semantics}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let trained = params(&dump);
            let error = max_relative_error(&trained, &reference).unwrap();
            assert!(
                error <= 1e-5,
                "N={world} {name} {semantics}: relative error {error:e} against the reference"
            );
            worst = worst.max(error);
            let control = max_relative_error(&trained, &other_data).unwrap();
            assert!(
                control > 1e-3,
                "N={world} {name}: the check cannot tell other data apart ({control:e})"
            );
            results.push(trained);
        }
        assert_eq!(
            results[0], results[1],
            "N={world} {name}: strict and relaxed runs differ"
        );
    }
    eprintln!(
        "N={world}: {} plans x 2 semantics, worst relative error {worst:e} against the reference",
        plans.len()
    );
}

#[test]
fn one_rank_matches_the_reference() {
    check_world(1, 3);
}

#[test]
fn two_mpi_ranks_match_the_reference() {
    check_world(2, 6);
}

#[test]
fn four_mpi_ranks_match_the_reference() {
    check_world(4, 6);
}

/// A two-rank setup in `dir`: the model file, the profile file and a baseline's plan file.
struct TwoRanks {
    spec: MlpSpec,
    model: PathBuf,
    profile: Profile,
    profile_path: PathBuf,
    plan: PathBuf,
}

impl TwoRanks {
    /// `mpirun -np 2 [launcher] shardplan run --backend cpu` of this plan, `extra` after.
    fn mpirun(&self, launcher: &[&str], extra: &[&str]) -> Command {
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

fn two_ranks(dir: &Path, kind: BaselineKind) -> TwoRanks {
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

#[test]
fn mismatched_runs_are_refused_before_any_step() {
    let dir = tempfile::tempdir().unwrap();
    let TwoRanks {
        spec,
        model,
        profile,
        profile_path,
        plan,
    } = two_ranks(dir.path(), BaselineKind::Zero2);
    let out = run_two_steps(&profile_path, &plan, &model);
    assert_eq!(out.status.code(), Some(2));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("the plan is for 2 ranks, this run has 1") && msg.contains("mpirun -np 2"),
        "{msg}"
    );
    assert!(out.stdout.is_empty(), "no step may run");

    let other = dir.path().join("other.toml");
    workload_profile(
        &Mlp::new(spec.clone(), 0, 2),
        2,
        &vec![
            UnitTime {
                forward_us: 1.0,
                checkpointed_forward_us: 1.0,
                backward_us: 2.0,
                recompute_us: 1.0,
                optimizer_us: 0.5,
            };
            spec.units()
        ],
        profile.comm.clone(),
        Some(2048),
        Default::default(),
    )
    .unwrap()
    .save(&other)
    .unwrap();
    let out = run_two_steps(&other, &plan, &model);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("made for profile"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Under mpirun, `--json`'s failure is one JSON document on stdout (rank 0's), however many
/// ranks fail: here all three, refused for a plan of two.
#[test]
fn a_failed_jobs_json_is_one_document_from_rank_0() {
    let dir = tempfile::tempdir().unwrap();
    let TwoRanks {
        model,
        profile_path,
        plan,
        ..
    } = two_ranks(dir.path(), BaselineKind::Zero2);
    let out = run_plan(3, &profile_path, &plan, &model, 2, &["--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let error: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"));
    assert_eq!(error["kind"], "mismatch", "{error}");
    let message = error["error"].as_str().unwrap();
    assert!(
        message.contains("the plan is for 2 ranks, this run has 3"),
        "{message}"
    );
}

#[test]
fn a_killed_rank_ends_every_rank_with_an_error_within_30_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Fsdp1);
    let mut child = setup
        .mpirun(&[], &["--steps", "1000000", "--timeout", "10"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let ranks = String::from_utf8(
        Command::new("pgrep")
            .args(["-P", &child.id().to_string()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let victim = ranks
        .split_whitespace()
        .next()
        .expect("mpirun has rank processes");
    let killed_at = std::time::Instant::now();
    assert!(
        Command::new("kill")
            .args(["-9", victim])
            .status()
            .unwrap()
            .success()
    );
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed().as_secs() < 30,
            "ranks still running 30 s after one was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(!status.success(), "the job must fail when a rank dies");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.trim().is_empty(), "a message says what happened");
}

/// A run whose buffers exceed this rank's share of the host's available memory (given by
/// `SHARDPLAN_HOST_MEMORY_AVAILABLE`) is refused before it allocates or runs a step, with both
/// figures named; with the memory there it runs.
#[test]
fn memory_the_host_lacks_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Zero3);
    let run = |available: &str| {
        setup
            .mpirun(
                &["-x", "SHARDPLAN_HOST_MEMORY_AVAILABLE"],
                &["--steps", "2", "--json"],
            )
            .env("SHARDPLAN_HOST_MEMORY_AVAILABLE", available)
            .output()
            .unwrap()
    };
    let refused = run("4000");
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let error: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(error["kind"], "memory", "{error}");
    let message = error["error"].as_str().unwrap();
    for part in [
        "needs",
        "on each rank",
        "3.91 KiB available (SHARDPLAN_HOST_MEMORY_AVAILABLE) for its 2 ranks: 1.95 KiB each",
        "make the batch smaller",
    ] {
        assert!(message.contains(part), "`{part}` missing: {message}");
    }
    let ran = run("1000000000000");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// A two-rank run checkpointing every 20 steps is killed (SIGKILL of a rank) between two
/// checkpoints; resumed to 15 steps past its newest one, it ends with the losses (of the steps
/// it ran) and the weights of an uninterrupted run to that step, bit for bit. With that newest
/// checkpoint torn (a rank file truncated), the resume refuses it, saying why, and continues from
/// the one before, again bit for bit.
#[test]
fn a_killed_run_resumes_from_its_checkpoint_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Zero3);
    let checkpoints = dir.path().join("checkpoints");
    let run = |extra: &[&str]| {
        let out = setup
            .mpirun(&[], &[&["--json"], extra].concat())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let every = [
        "--steps",
        "1000000",
        "--checkpoint-every",
        "20",
        "--checkpoint-dir",
    ];
    let mut child = setup
        .mpirun(
            &[],
            &[&every[..], &[checkpoints.to_str().unwrap()]].concat(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let complete = |step: usize| checkpoints.join(format!("step-{step:010}/complete"));
    let started = std::time::Instant::now();
    while !complete(40).exists() {
        assert!(
            started.elapsed().as_secs() < 60,
            "no second checkpoint in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ranks = rank_processes(child.id());
    signal("-KILL", &rank_of(&ranks, 1));
    assert!(!child.wait().unwrap().success());
    let mut kept: Vec<usize> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix("step-")?.parse().ok()
        })
        .filter(|&step| complete(step).exists())
        .collect();
    kept.sort();
    let newest = *kept.last().unwrap();
    assert!(
        kept.len() == 2 && newest >= 40,
        "the last two are kept: {kept:?}"
    );
    let total = newest + 15;
    let steps = total.to_string();
    let params = |name: &str| dir.path().join(name);
    let whole = run(&[
        "--steps",
        &steps,
        "--dump-params",
        params("whole.json").to_str().unwrap(),
    ]);
    let check = |resumed: &serde_json::Value, from: usize, dumped: &str| {
        assert_eq!(resumed["first_step"], from, "{resumed}");
        assert_eq!(
            resumed["losses"].as_array().unwrap()[..],
            whole["losses"].as_array().unwrap()[from..],
            "the resumed steps' losses"
        );
        assert_eq!(
            std::fs::read(params(dumped)).unwrap(),
            std::fs::read(params("whole.json")).unwrap(),
            "the trained weights"
        );
    };
    let resume = |dumped: &str| {
        run(&[
            "--steps",
            &steps,
            "--resume",
            checkpoints.to_str().unwrap(),
            "--dump-params",
            params(dumped).to_str().unwrap(),
        ])
    };
    check(&resume("resumed.json"), newest, "resumed.json");
    let torn = checkpoints.join(format!("step-{newest:010}/rank-1"));
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() - 100]).unwrap();
    let resumed = resume("resumed-earlier.json");
    let refused = resumed["refused_checkpoints"].to_string();
    assert!(refused.contains("truncated or torn"), "{refused}");
    check(&resumed, kept[0], "resumed-earlier.json");
}

/// A rank stopped (SIGSTOP: a hung process, a stuck driver call, a paused node) mid-run with
/// `--timeout 5`: the other rank's watchdog finds its collective overdue, names the slot, the
/// collective and the peer it waits for, and ends the job (MPI_Abort) within the timeout + 10 s;
/// no process is left behind. Each rank is stopped once, one early and one later in the run.
#[test]
fn a_stopped_rank_ends_the_job_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Fsdp1);
    for (victim, after) in [(1usize, 1.5f64), (0, 3.0)] {
        let mut child = setup
            .mpirun(&[], &["--steps", "1000000", "--timeout", "5"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_secs_f64(after));
        let ranks = rank_processes(child.id());
        assert_eq!(ranks.len(), 2, "mpirun's ranks: {ranks:?}");
        let stopped = rank_of(&ranks, victim);
        signal("-STOP", &stopped);
        let stopped_at = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if stopped_at.elapsed().as_secs() >= 15 {
                signal("-KILL", &stopped);
                let _ = child.kill();
                panic!("rank {victim} stopped: the job still runs 15 s later");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let took = stopped_at.elapsed().as_secs_f64();
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "rank {victim} stopped: {stderr}");
        for part in [
            "global slot",
            "did not complete within 5.0 s",
            "waiting for its peers, rank",
        ] {
            assert!(
                stderr.contains(part),
                "rank {victim} stopped: `{part}` missing: {stderr}"
            );
        }
        let peer = format!("rank {victim} (stopped");
        assert!(stderr.contains(&peer), "the peer named: {stderr}");
        assert!(took < 15.0, "{took} s");
        let left = ranks.iter().filter(|pid| alive(pid)).count();
        assert_eq!(left, 0, "rank {victim} stopped: processes left behind");
    }
}

/// The rank processes mpirun `mpirun` started, in rank order (OMPI_COMM_WORLD_RANK).
fn rank_processes(mpirun: u32) -> Vec<(usize, String)> {
    let children = Command::new("pgrep")
        .args(["-P", &mpirun.to_string()])
        .output()
        .unwrap();
    let mut ranks: Vec<(usize, String)> = String::from_utf8(children.stdout)
        .unwrap()
        .split_whitespace()
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let rank = environ
                .split(|&b| b == 0)
                .find_map(|v| v.strip_prefix(b"OMPI_COMM_WORLD_RANK="))?;
            Some((
                std::str::from_utf8(rank).ok()?.parse().ok()?,
                pid.to_string(),
            ))
        })
        .collect();
    ranks.sort();
    ranks
}

fn rank_of(ranks: &[(usize, String)], rank: usize) -> String {
    ranks.iter().find(|(r, _)| *r == rank).unwrap().1.clone()
}

fn signal(which: &str, pid: &str) {
    let _ = Command::new("kill").args([which, pid]).status();
}

/// Whether process `pid` still runs (a zombie of mpirun's counts as gone).
fn alive(pid: &(usize, String)) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.1))
        .is_ok_and(|stat| !stat.contains(") Z "))
}

/// `profile measure` on the CPU at N = 2 (mpirun): the profile describes the workload (its units
/// and the runtime's buffers, so a baseline's arena is its predicted peak up to alignment), carries the three
/// interference factors in their ranges, and its ddp baseline runs; the simulator's prediction
/// of that plan moves with κ_u exactly as DESIGN §3.4's L_s says.
#[test]
fn a_measured_profile_carries_every_interference_factor() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = spec(dir.path());
    let out = dir.path().join("measured.toml");
    let measured = common::run(
        2,
        &[
            "profile",
            "measure",
            "--backend",
            "cpu",
            "--model",
            model.to_str().unwrap(),
            "--world-size",
            "2",
            "--repeats",
            "2",
            "--max-message",
            "64KiB",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        measured.status.success(),
        "{}",
        String::from_utf8_lossy(&measured.stderr)
    );
    let mut p = Profile::load(&out).unwrap();
    assert_eq!(p.unit_count(), spec.units());
    let update = p.update_slowdown.expect("κ_u is measured");
    for kappa in [p.overlap_slowdown, p.comm_slowdown, update] {
        assert!((0.0..=1.0).contains(&kappa), "{p:?}");
    }
    let ddp = baseline(&p, BaselineKind::Ddp, false, None).unwrap();
    let plan = write_plan(dir.path(), "ddp", &p, &ddp.schedule);
    let ran = run_plan(2, &out, &plan, &model, 3, &["--json"]);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
    let arena = report["arena_bytes"].as_f64().unwrap();
    let predicted = report["predicted_peak_memory_bytes"].as_f64().unwrap();
    // Equal up to the arena's 64-byte alignment of each buffer (this model's are tiny).
    assert!(
        predicted <= arena && arena <= predicted * 1.01,
        "{arena} against {predicted}"
    );
    // The AllReduce blocks carry every unit's optimizer step: the prediction's compute load
    // changes by (κ_u − κ_c)·Σ o_i in the slots where compute binds, and never by more.
    let optimizer: f64 = p.units.iter().map(|u| u.optimizer_us).sum();
    let with = ddp.simulation.overlap_slowdown_us;
    p.update_slowdown = None;
    let without = baseline(&p, BaselineKind::Ddp, false, None)
        .unwrap()
        .simulation;
    let expected = (update - p.overlap_slowdown) * optimizer;
    assert!(
        (with - without.overlap_slowdown_us - expected).abs() <= 1e-6 * with.max(1.0),
        "Σ L {with} against {} + {expected}",
        without.overlap_slowdown_us
    );
    let moved = ddp.simulation.iteration_time_us - without.iteration_time_us;
    assert!(
        moved.abs() <= expected.abs() + 1e-6,
        "{moved} against {expected}"
    );
}
