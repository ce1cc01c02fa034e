//! Options that do not apply are refused (exit 2, usage), each named, before any work: `run`'s
//! GPT-2 options of the MLP and its MLP option of a GPT-2, `profile measure`'s replay options of
//! a trained model and its --device on ranks that measure their collectives, `sweep`'s solver and
//! range options without their method or range; and the methods that need a node layout in
//! `sweep` and `baseline` alike, with `demo` saying which it left out.

mod common;

use common::{assert_success, profile, shardplan, spec, write_plan};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::schedule::Recompute;
use std::path::Path;

/// Exit code, the JSON error's `field` and its message of a failing command run with `--json`.
fn refused<S: AsRef<str>>(args: &[S]) -> (i32, String, String) {
    let mut args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    args.push("--json");
    let out = shardplan(&args);
    let error: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON object ({e})"));
    (
        out.status.code().unwrap(),
        error["field"].as_str().unwrap_or_default().to_string(),
        error["error"].as_str().unwrap_or_default().to_string(),
    )
}

/// Asserts that `args` is refused as a usage error naming `flag`, with `fragment` in its message.
fn refuses<S: AsRef<str> + std::fmt::Debug>(args: &[S], flag: &str, fragment: &str) {
    let (code, field, message) = refused(args);
    assert_eq!((code, field.as_str()), (2, flag), "{args:?}: {message}");
    assert!(message.contains(fragment), "{args:?}: {message}");
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn run_refuses_what_the_model_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = spec(dir.path());
    let profile = profile(&spec, 1);
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    let ddp = baseline(&profile, BaselineKind::Ddp, Recompute::Off, None).unwrap();
    let plan = write_plan(dir.path(), "ddp", &profile, &ddp.schedule);
    let data = dir.path().join("good.bin");
    std::fs::write(&data, [1u8, 0, 2, 0]).unwrap();
    let saved = dir.path().join("sw.safetensors");
    let (profile_path, plan, model) = (text(&profile_path), text(&plan), text(&model));
    let run = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "run",
            "--backend",
            "cpu",
            "--profile",
            profile_path,
            "--plan",
            plan,
            "--model",
            model,
            "--steps",
            "1",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_string).collect()
    };
    refuses(&run(&["--data", text(&data)]), "--data", "is an MLP");
    refuses(
        &run(&["--init-weights", text(&data)]),
        "--init-weights",
        "is an MLP",
    );
    refuses(
        &run(&["--save-weights", text(&saved)]),
        "--save-weights",
        "is an MLP",
    );
    assert!(!saved.exists(), "nothing is written");
    // Negative control: the same run without them trains.
    let args = run(&[]);
    let out = shardplan(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_success(&out);
}

#[test]
fn run_of_a_gpt2_refuses_the_mlp_reference() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("gpt2.toml");
    let out = shardplan(&[
        "profile",
        "measure",
        "--backend",
        "cpu",
        "--model",
        "models/gpt2-tiny.toml",
        "--world-size",
        "1",
        "--repeats",
        "1",
        "--out",
        text(&profile),
    ]);
    assert_success(&out);
    let plan = dir.path().join("ddp.plan.toml");
    let out = shardplan(&[
        "baseline",
        "--profile",
        text(&profile),
        "--kind",
        "ddp",
        "--out",
        text(&plan),
    ]);
    assert_success(&out);
    let data = dir.path().join("tokens.txt");
    std::fs::write(
        &data,
        "a small text to train on, long enough for one sequence. ".repeat(64),
    )
    .unwrap();
    refuses(
        &[
            "run",
            "--backend",
            "cpu",
            "--profile",
            text(&profile),
            "--plan",
            text(&plan),
            "--model",
            "models/gpt2-tiny.toml",
            "--steps",
            "1",
            "--data",
            text(&data),
            "--compare-reference",
        ],
        "--compare-reference",
        "is a GPT-2",
    );
}

#[test]
fn measure_refuses_replay_options_of_a_trained_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.toml");
    for (flag, value) in [("--micro-batch", "4"), ("--seq-len", "64")] {
        refuses(
            &[
                "profile",
                "measure",
                "--backend",
                "cpu",
                "--model",
                "models/mlp-small.toml",
                "--world-size",
                "1",
                flag,
                value,
                "--out",
                text(&out),
            ],
            flag,
            "a zoo transformer replayed",
        );
        assert!(!out.exists(), "{flag}: nothing is measured or written");
    }
}

/// On ranks that measure their own collectives, `--device` (the catalog's curves for one rank)
/// has nothing to stand in for.
#[test]
fn measure_on_several_ranks_refuses_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let (_, model) = spec(dir.path());
    let out = dir.path().join("p.toml");
    let measure = |extra: &[&str]| {
        let mut args = vec![
            "profile",
            "measure",
            "--backend",
            "cpu",
            "--model",
            text(&model),
            "--world-size",
            "2",
            "--repeats",
            "1",
            "--max-message",
            "64KiB",
            "--out",
            text(&out),
        ];
        args.extend_from_slice(extra);
        common::run(2, &args)
    };
    let refused = measure(&["--device", "h100-sxm"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{message}");
    assert!(message.contains("--device: expected one rank"), "{message}");
    assert!(!out.exists(), "nothing is measured or written");
    // Negative control: without it the ranks measure.
    let measured = measure(&[]);
    assert_success(&measured);
}

/// A profile without nodes (`profile analytic --flat`), in `dir`.
fn flat_profile(dir: &Path) -> String {
    let path = dir.join("flat.toml").display().to_string();
    let out = shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "h100-sxm",
        "--world-size",
        "16",
        "--flat",
        "--out",
        &path,
    ]);
    assert_success(&out);
    path
}

#[test]
fn node_layout_methods_need_a_node_layout_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let flat = flat_profile(dir.path());
    let out_dir = dir.path().join("sweep").display().to_string();
    let plan = dir.path().join("p.plan.toml").display().to_string();
    for method in ["hsdp", "hpz"] {
        let needs = format!("{method} needs a profile with a node layout");
        let sweep = [
            "sweep",
            "--profile",
            &flat,
            "--methods",
            method,
            "--out-dir",
            &out_dir,
        ];
        refuses(&sweep, "--methods", &needs);
        let kind = [
            "baseline",
            "--profile",
            &flat,
            "--kind",
            method,
            "--out",
            &plan,
        ];
        refuses(&kind, "--kind", &needs);
    }
    assert!(!Path::new(&out_dir).join("sweep.csv").exists());
    // Negative control: a profile with nodes offers both.
    let nodes = dir.path().join("nodes.toml").display().to_string();
    let out = shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "h100-sxm",
        "--world-size",
        "16",
        "--gpus-per-node",
        "8",
        "--out",
        &nodes,
    ]);
    assert_success(&out);
    let out = shardplan(&[
        "baseline",
        "--profile",
        &nodes,
        "--kind",
        "hpz",
        "--out",
        &plan,
    ]);
    assert_success(&out);
    // `demo --flat` names the node layout's baselines it leaves out.
    let out = shardplan(&["demo", "--flat", "--time-limit", "1", "--json"]);
    assert_success(&out);
    let demo: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let left_out: Vec<&str> = demo["left_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["method"].as_str().unwrap())
        .collect();
    assert_eq!(left_out, ["hsdp", "hpz"]);
    // Its one-node part is on one link already, and says so.
    let not_applied = demo["one_node"]["not_applied"].as_array().unwrap();
    assert!(
        not_applied[0]
            .as_str()
            .unwrap()
            .starts_with("--flat does not apply"),
        "{not_applied:?}"
    );
}

#[test]
fn sweep_refuses_options_it_would_not_use() {
    let dir = tempfile::tempdir().unwrap();
    let flat = flat_profile(dir.path());
    let out_dir = dir.path().join("sweep").display().to_string();
    let sweep = |extra: &[&'static str]| {
        let mut args = vec![
            "sweep",
            "--profile",
            flat.as_str(),
            "--out-dir",
            out_dir.as_str(),
        ];
        args.extend_from_slice(extra);
        args
    };
    let cases: [(&[&str], &str, &str); 3] = [
        (
            &["--methods", "ddp", "--time-limit", "2"],
            "--time-limit",
            "the ilp method",
        ),
        (
            &["--methods", "ddp,zero3", "--gap", "0.01"],
            "--gap",
            "the ilp method",
        ),
        (
            &["--methods", "ddp", "--caps", "2GiB,4GiB", "--points", "3"],
            "--points",
            "a range of caps",
        ),
    ];
    for (extra, flag, fragment) in cases {
        refuses(&sweep(extra), flag, fragment);
    }
    // Negative control: a range takes --points.
    let out = shardplan(&sweep(&[
        "--methods",
        "ddp",
        "--caps",
        "2GiB..4GiB",
        "--points",
        "3",
    ]));
    assert_success(&out);
}
