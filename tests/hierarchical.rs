//! Hierarchical plans through the binary (DESIGN §3.11): the `hsdp` and `hpz` baselines on a
//! profile with nodes, bad shard and secondary groups refused naming the field (plain and under
//! `--json`), a plan for another node size refused, and hierarchical plans run on 4 MPI ranks as
//! 2 nodes of 2; with micro-batches (DESIGN §3.11.1) the baselines' micro-batch forms planned at
//! K = 2 and refused at K = 1 naming the option (tests/gpt2.rs runs them).

mod common;

use common::shardplan;
use serde_json::Value;
use shardplan_runtime::mlp::{max_relative_error, reference_training};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::ilp::{SolveOptions, solve};

use shardplan_scheduler::schedule::{Recompute, Schedule};
use std::path::Path;

/// Runs `args`, expecting success.
fn ok(args: &[&str]) {
    let out = shardplan(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `args`, expecting a failure whose one-line error holds each of `expected`, and the same
/// under `--json` as one JSON object with the same exit code.
fn refused(args: &[&str], expected: &[&str]) {
    let out = shardplan(args);
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "{args:?} succeeded");
    for e in expected {
        assert!(stderr.contains(e), "{args:?}: `{stderr}` lacks `{e}`");
    }
    let json = shardplan(&[args, &["--json"]].concat());
    assert_eq!(json.status.code(), out.status.code(), "{args:?} --json");
    let v: Value = serde_json::from_slice(&json.stdout).expect("one JSON object");
    let message = v["error"].as_str().unwrap_or_default();
    assert!(message.contains(expected[0]), "{v}");
}

/// The command line of gpt2-small's analytic profile on 8 ranks as nodes of `node`, into `out`.
fn analytic<'a>(node: &'a str, out: &'a str) -> Vec<&'a str> {
    let model = ["--model", "models/gpt2-small.toml", "--device", "h100-sxm"];
    let nodes = ["--world-size", "8", "--gpus-per-node", node, "--out", out];
    [&["profile", "analytic"][..], &model, &nodes].concat()
}

/// gpt2-small's analytic profile on 8 ranks as nodes of `node`.
fn nodes(dir: &Path, node: &str) -> String {
    let out = dir.join(format!("nodes-{node}.toml")).display().to_string();
    ok(&analytic(node, &out));
    out
}

#[test]
fn hierarchical_baselines_plan_and_bad_groups_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let profile = nodes(dir.path(), "2");
    let plan = |name: &str| dir.path().join(name).display().to_string();
    for kind in ["hsdp", "hpz"] {
        ok(&[
            "baseline",
            "--profile",
            &profile,
            "--kind",
            kind,
            "--out",
            &plan(kind),
        ]);
        ok(&["simulate", "--profile", &profile, "--plan", &plan(kind)]);
    }
    let hsdp = std::fs::read_to_string(plan("hsdp")).unwrap();
    assert!(hsdp.contains("shard_group = 2"), "{hsdp}");
    let hpz = std::fs::read_to_string(plan("hpz")).unwrap();
    assert!(hpz.contains("secondary_group = 2"), "{hpz}");
    let edited = |name: &str, text: String| {
        let path = plan(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    // A shard group that does not divide N, one the topology lacks, a secondary group that does
    // not divide its shard group.
    let bad_s = edited(
        "s3.toml",
        hsdp.replace("shard_group = 2", "shard_group = 3"),
    );
    refused(
        &["simulate", "--profile", &profile, "--plan", &bad_s],
        &["shard_group", "a divisor of world_size 8", "got 3"],
    );
    let bad_h = edited(
        "h3.toml",
        hpz.replace("secondary_group = 2", "secondary_group = 3"),
    );
    refused(
        &["simulate", "--profile", &profile, "--plan", &bad_h],
        &["secondary_group", "got 3"],
    );
    // A node size that does not divide the world.
    refused(
        &analytic("3", &plan("p3.toml")),
        &[
            "gpus_per_node",
            "a positive divisor of the world size 8, got 3",
        ],
    );
    assert!(!dir.path().join("p3.toml").exists());
    // A plan for another node size: by digest, and written by hand (no digest) by its groups.
    let other = nodes(dir.path(), "4");
    refused(
        &["simulate", "--profile", &other, "--plan", &plan("hsdp")],
        &["the plan was made for profile"],
    );
    let undigested: String = hsdp
        .lines()
        .filter(|l| !l.starts_with("profile_digest"))
        .map(|l| format!("{l}\n"))
        .collect();
    let by_hand = edited("by-hand.toml", undigested);
    refused(
        &["simulate", "--profile", &other, "--plan", &by_hand],
        &["shard_group", "(offered: 4), got 2"],
    );
}

/// Hierarchical plans on 4 MPI ranks declared as 2 nodes of 2 (DESIGN §6.11): the `hsdp` and
/// `hpz` baselines with and without checkpointing and the ILP's plans at three caps (each with a
/// shard group or a secondary group) end with the weights of a single process training on the
/// union of the ranks' batches (≤ 1e-5 relative, as every flat plan in tests/runtime.rs), strict
/// and relaxed alike, and the arena is the predicted peak to the byte. Negative control: the
/// reference of another world size is told apart.
#[test]
fn hierarchical_plans_train_like_the_reference_on_two_nodes_of_two() {
    const STEPS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = common::spec(dir.path());
    let profile = common::two_nodes_of_two(common::profile(&spec, 4));
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    let (reference, _) = reference_training(&spec, 4, STEPS);
    let (other_data, _) = reference_training(&spec, 5, STEPS);
    let mut plans: Vec<(String, Schedule)> = Vec::new();
    let mut peaks = Vec::new();
    for kind in [BaselineKind::Hsdp, BaselineKind::Hpz] {
        for ckpt in [Recompute::Off, Recompute::On] {
            let b = baseline(&profile, kind, ckpt, None).unwrap();
            peaks.push(b.simulation.peak_memory_bytes as u64);
            plans.push((kind.label(ckpt), b.schedule));
        }
    }
    let (low, high) = (*peaks.iter().min().unwrap(), *peaks.iter().max().unwrap());
    for cap in [low, (low + high) / 2, high] {
        let options = SolveOptions {
            memory_cap_bytes: Some(cap),
            time_limit_s: 10.0,
            threads: 1,
            ..Default::default()
        };
        let solved = solve(&profile, &options).unwrap();
        plans.push((format!("ilp@{cap}"), solved.schedule));
    }
    for (name, schedule) in &plans {
        let grouped = schedule.units().iter();
        let hierarchical = grouped
            .filter(|u| u.shard_group.is_some() || u.secondary_group.is_some())
            .count();
        assert!(hierarchical > 0, "{name} has no shard or secondary group");
        let plan = common::write_plan(dir.path(), name, &profile, schedule);
        let files = (profile_path.as_path(), plan.as_path(), model.as_path());
        for run in common::train_strict_and_relaxed(dir.path(), name, 4, files, STEPS as u64) {
            let (report, semantics) = (&run.report, run.semantics);
            assert_eq!(
                report["arena_bytes"], report["predicted_peak_memory_bytes"],
                "{name} {semantics}"
            );
            let error = max_relative_error(&run.params, &reference).unwrap();
            assert!(error <= 1e-5, "{name} {semantics}: {error:e}");
            let control = max_relative_error(&run.params, &other_data).unwrap();
            assert!(control > 1e-3, "{name}: control {control:e}");
        }
    }
}

/// `profile measure --gpus-per-node` refuses a node size that does not divide the world, naming
/// the option.
#[test]
fn a_measured_node_size_must_divide_the_world() {
    let dir = tempfile::tempdir().unwrap();
    let (_, model) = common::spec(dir.path());
    let out = dir.path().join("p.toml");
    let (model, out) = (model.to_str().unwrap(), out.to_str().unwrap());
    refused(
        &[
            "profile",
            "measure",
            "--backend",
            "cpu",
            "--model",
            model,
            "--world-size",
            "4",
            "--device",
            "h100-sxm",
            "--gpus-per-node",
            "3",
            "--out",
            out,
        ],
        &["--gpus-per-node", "divisor of the world size 4"],
    );
}

/// gpt2-small on 8 ranks as nodes of 2: at K = 2 `hsdp-ra-once` writes `replica_reduce = "last"`
/// and simulates; at K = 1 it and the other micro-batch forms are refused naming
/// `--micro-batches` (plain and under `--json`).
#[test]
fn micro_batch_forms_plan_at_two_micro_batches_and_are_refused_at_one() {
    let dir = tempfile::tempdir().unwrap();
    let at_two = dir.path().join("k2.toml").display().to_string();
    ok(&[analytic("2", &at_two), vec!["--micro-batches", "2"]].concat());
    let plan = dir.path().join("ra-once.plan.toml").display().to_string();
    let kind = ["--kind", "hsdp-ra-once"];
    ok(&[
        &["baseline", "--profile", &at_two][..],
        &kind,
        &["--out", &plan],
    ]
    .concat());
    let written = std::fs::read_to_string(&plan).unwrap();
    assert!(written.contains("replica_reduce = \"last\""), "{written}");
    ok(&["simulate", "--profile", &at_two, "--plan", &plan]);
    let profile = nodes(dir.path(), "2");
    for kind in ["hsdp-nosync", "hsdp-ra-once", "hpz-nosync"] {
        let out = dir
            .path()
            .join(format!("{kind}.toml"))
            .display()
            .to_string();
        refused(
            &[
                "baseline",
                "--profile",
                &profile,
                "--kind",
                kind,
                "--out",
                &out,
            ],
            &["--kind", "--micro-batches", kind],
        );
    }
}
