//! Hierarchical plans through the binary (DESIGN §3.11): the `hsdp` and `hpz` baselines on a
//! profile with nodes, bad shard and secondary groups refused naming the field (plain and under
//! `--json`), a plan for another node size refused, and `run` refusing a plan it cannot execute
//! yet, naming the unit.

mod common;

use serde_json::Value;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::profile::{CommCurves, GroupCurves, Link, Topology};
use std::path::Path;
use std::process::{Command, Output};

fn shardplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

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

/// `run` refuses a plan over a shard group or with a secondary group before it allocates
/// anything, naming the unit (the runtime's sub-communicators are not built yet).
#[test]
fn run_refuses_hierarchical_plans_naming_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = common::spec(dir.path());
    let mut profile = common::profile(&spec, 4);
    let curves = profile.comm.clone();
    let group = |link| GroupCurves {
        ranks: 2,
        link,
        comm: CommCurves { ..curves.clone() },
    };
    profile.topology = Some(Topology {
        gpus_per_node: 2,
        groups: vec![group(Link::Intra), group(Link::Inter)],
        communicator_bytes: 0,
    });
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    for kind in [BaselineKind::Hsdp, BaselineKind::Hpz] {
        let schedule = baseline(&profile, kind, false, None).unwrap().schedule;
        let plan = common::write_plan(dir.path(), kind.name(), &profile, &schedule);
        let out = common::run_plan(1, &profile_path, &plan, &model, 1, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kind:?} ran");
        assert!(
            stderr.contains("has a shard_group or secondary_group") && stderr.contains("unit `"),
            "{stderr}"
        );
    }
}
