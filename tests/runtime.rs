//! The runtime end to end: plans executed by `shardplan run` (one rank, and N = 2, 4 MPI ranks
//! under mpirun) end with the same weights as a single process training on the union of the
//! ranks' batches, in strict and relaxed semantics; bad runs are refused; a measured profile
//! carries every interference factor. Faults (stalls, kills, checkpoints, memory) are
//! tests/faults.rs.

mod common;

use common::{MlpJob, Rng, profile, random_schedule, run_plan, spec, two_ranks, write_plan};
use shardplan_runtime::measure::{UnitTime, workload_profile};
use shardplan_runtime::mlp::{Mlp, max_relative_error, reference_training};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, Schedule};
use std::path::Path;
use std::process::Output;

const STEPS: usize = 4;

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
            baseline(
                &profile,
                k,
                if k == BaselineKind::Zero2 {
                    Recompute::On
                } else {
                    Recompute::Off
                },
                None,
            )
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

#[test]
fn mismatched_runs_are_refused_before_any_step() {
    let dir = tempfile::tempdir().unwrap();
    let MlpJob {
        spec,
        model,
        profile,
        profile_path,
        plan,
        ..
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

/// `profile measure` on the CPU at N = 2 (mpirun): the profile describes the workload (its units
/// and the runtime's buffers, so a baseline's arena is its predicted peak up to alignment), carries the three
/// interference factors in their ranges — one κ_c for every collective, κ_c,RS and κ_c,AG left
/// out (DESIGN §3.4: where the host computes, the collectives slow a run's compute alike) — and
/// its ddp baseline runs; the simulator's prediction of that plan moves with κ_u exactly as
/// DESIGN §3.4's L_s says.
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
    let per_collective = [
        p.overlap_slowdown_reduce_scatter,
        p.overlap_slowdown_all_gather,
    ];
    assert_eq!(per_collective, [None, None], "one κ_c on the CPU");
    for kappa in [p.overlap_slowdown, p.comm_slowdown, update] {
        assert!((0.0..=1.0).contains(&kappa), "{p:?}");
    }
    let ddp = baseline(&p, BaselineKind::Ddp, Recompute::Off, None).unwrap();
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
    let without = baseline(&p, BaselineKind::Ddp, Recompute::Off, None)
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

/// README's exit codes: `run` of a plan whose predicted peak is above its own cap exits 3 before
/// allocating (no step runs); under a cap above its peak and its arena the same plan runs.
#[test]
fn a_plan_above_its_own_cap_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = spec(dir.path());
    let profile = profile(&spec, 1);
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    let ddp = baseline(&profile, BaselineKind::Ddp, Recompute::Off, None).unwrap();
    let peak = ddp.plan.predicted.as_ref().unwrap().peak_memory_bytes;
    let capped = |cap: u64| {
        let mut plan = ddp.plan.clone();
        plan.memory_cap_bytes = Some(cap);
        let path = dir.path().join(format!("capped-{cap}.plan.toml"));
        plan.save(&path).unwrap();
        path
    };
    let out = run_two_steps(&profile_path, &capped(peak - 1), &model);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{msg}");
    assert!(
        msg.contains(&format!("({peak} bytes), above its own memory_cap_bytes")),
        "{msg}"
    );
    assert!(out.stdout.is_empty(), "no step may run");
    let out = run_two_steps(&profile_path, &capped(2 * peak), &model);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
