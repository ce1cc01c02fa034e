//! Malformed and edge-case inputs, table-driven: each case is an input (a file edited from a
//! valid one, or a command line), the command run on it, the exit code expected and a fragment
//! its one-line error must carry. Every case also runs under `--json`, where the error must be
//! one JSON object on stdout with the same code, and no case may leave an output behind.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "malformed_inputs/cases.rs"]
mod cases;

use cases::cases;

/// Runs the binary from the repository root, killed after `deadline` (a hang fails the test).
fn shardplan(args: &[String], deadline: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > deadline {
            child.kill().unwrap();
            panic!("{args:?} still running after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The inputs the cases edit: a valid profile and plan, a model file and an nccl-tests output.
struct Inputs {
    dir: tempfile::TempDir,
    profile: String,
    plan: String,
    /// Edited copies made so far (each gets its own file).
    edits: std::cell::Cell<usize>,
}

impl Inputs {
    fn new() -> Inputs {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("profile.toml").display().to_string();
        let plan = dir.path().join("plan.toml").display().to_string();
        let made = shardplan(
            &words(&format!(
                "profile analytic --model models/gpt2-small.toml --device h100-sxm --world-size 8 --out {profile}"
            )),
            Duration::from_secs(60),
        );
        assert!(made.status.success());
        let planned = shardplan(
            &words(&format!(
                "baseline --profile {profile} --kind fsdp2 --out {plan}"
            )),
            Duration::from_secs(60),
        );
        assert!(planned.status.success());
        Inputs {
            dir,
            profile,
            plan,
            edits: std::cell::Cell::new(0),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` (or the bytes) to `name` in the case's directory; returns the path.
    fn write(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.path(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }

    /// A copy of the profile with its first `count` occurrences of `from` replaced by `to`.
    fn profile_with(&self, from: &str, to: &str, count: usize) -> String {
        let text = std::fs::read_to_string(&self.profile).unwrap();
        assert!(text.contains(from), "the profile has no `{from}`");
        self.edits.set(self.edits.get() + 1);
        let name = format!("edited-{}.toml", self.edits.get());
        self.write(&name, text.replacen(from, to, count).as_bytes())
    }
}

/// A command line split at spaces; `''` stands for an empty argument.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|w| {
            if w == "''" {
                String::new()
            } else {
                w.to_string()
            }
        })
        .collect()
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nccl-tests")
        .join(name)
        .display()
        .to_string()
}

/// The field a message names (`field `X``), which its JSON must carry with the file.
fn named_field(message: &str) -> Option<&str> {
    let (_, after) = message.split_once("field `")?;
    after.split_once('`').map(|(field, _)| field)
}

#[test]
fn every_malformed_input_exits_non_zero_with_one_line_naming_what_is_wrong() {
    let inputs = Inputs::new();
    let profile_before = std::fs::read(&inputs.profile).unwrap();
    for case in cases(&inputs) {
        let plain = shardplan(&case.args, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&plain.stderr);
        assert_eq!(
            plain.status.code(),
            Some(case.code),
            "{}: {stderr}",
            case.name
        );
        assert!(stderr.contains(case.fragment), "{}: {stderr}", case.name);
        assert!(plain.stdout.is_empty(), "{}: wrote to stdout", case.name);
        if !stderr.contains("For more information, try '--help'") {
            assert_eq!(stderr.trim().lines().count(), 1, "{}: {stderr}", case.name);
        }
        assert!(
            stderr.matches("os error").count() <= 1,
            "{}: cause repeated: {stderr}",
            case.name
        );

        let mut json_args = case.args.clone();
        json_args.push("--json".into());
        let json = shardplan(&json_args, Duration::from_secs(60));
        assert_eq!(json.status.code(), Some(case.code), "{} --json", case.name);
        let error: Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
            panic!(
                "{} --json: stdout is not one JSON object ({e}): {}",
                case.name,
                String::from_utf8_lossy(&json.stdout)
            )
        });
        assert!(
            error["error"].as_str().unwrap().contains(case.fragment),
            "{}: {error}",
            case.name
        );
        assert_eq!(error["exit_code"], case.code, "{}: {error}", case.name);
        assert!(error["kind"].is_string(), "{}: {error}", case.name);
        if let Some(field) = case.field {
            assert_eq!(error["field"], field, "{}: {error}", case.name);
        }
        if let Some(named) = named_field(error["error"].as_str().unwrap()) {
            assert_eq!(error["field"], named, "{}: {error}", case.name);
            assert!(error["file"].is_string(), "{}: {error}", case.name);
        }
        assert!(
            !inputs.path("out.toml").exists(),
            "{}: a failed command left an output",
            case.name
        );
    }
    assert_eq!(
        std::fs::read(&inputs.profile).unwrap(),
        profile_before,
        "an input was overwritten"
    );
}

#[test]
fn a_sweep_without_the_ilp_finishes_and_writes_its_files() {
    let inputs = Inputs::new();
    let dir = inputs.path("sweep");
    let started = Instant::now();
    let out = shardplan(
        &words(&format!(
            "sweep --profile {} --methods ddp,zero3 --points 4 --out-dir {} --json",
            inputs.profile,
            dir.display()
        )),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["caps"].as_array().unwrap().len(), 4);
    // The top cap fits each method's fastest plan; no ILP, so no level chart.
    let top = &report["caps"][3];
    assert!(top["best_baseline"].is_string(), "{report}");
    for file in ["sweep.csv", "summary.md", "sweep.svg", "sweep.png"] {
        assert!(dir.join(file).exists(), "{file}");
    }
    assert!(!dir.join("levels.svg").exists());
    eprintln!("sweep without the ILP: {:?}", started.elapsed());
}

#[test]
fn export_of_a_plan_above_its_cap_needs_force() {
    let inputs = Inputs::new();
    let text = std::fs::read_to_string(&inputs.plan).unwrap();
    let over = inputs.write(
        "over.toml",
        format!("memory_cap_bytes = 1048576\n{text}").as_bytes(),
    );
    let out = inputs.path("fsdp2.json");
    let forced = shardplan(
        &words(&format!(
            "export fsdp2 --profile {} --plan {over} --out {} --force",
            inputs.profile,
            out.display()
        )),
        Duration::from_secs(60),
    );
    assert!(forced.status.success());
    assert!(out.exists());
}
