//! `shardplan sweep` end to end, and the ILP against every baseline at nine caps between the
//! smallest feasible cap and the peak of the fastest plan, on zoo models at N = 64.

mod common;

use common::{shardplan, zoo_profile};
use shardplan_scheduler::baselines::BaselineKind;
use shardplan_scheduler::ilp::{SolveOptions, Target};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sweep::{
    BaselineComparison, Method, SweepRow, best_baseline_row, cap_range, even_caps, ilp_rows,
};

/// ILP times never rise with the cap and never exceed a feasible baseline's.
fn check_frontier(name: &str, rows: &[SweepRow]) {
    let ilp: Vec<&SweepRow> = rows.iter().filter(|r| r.method == "ilp").collect();
    for pair in ilp.windows(2) {
        let (a, b) = (
            pair[0].iteration_time_us.unwrap(),
            pair[1].iteration_time_us.unwrap(),
        );
        assert!(
            b <= a,
            "{name}: ILP time rose from {a} at {} to {b} at {}",
            pair[0].cap_bytes,
            pair[1].cap_bytes
        );
    }
    for r in rows.iter().filter(|r| r.method != "ilp" && r.feasible) {
        let i = ilp.iter().find(|i| i.cap_bytes == r.cap_bytes).unwrap();
        assert!(
            i.feasible,
            "{name}: ILP infeasible where {} fits at {}",
            r.method, r.cap_bytes
        );
        let (ti, tb) = (i.iteration_time_us.unwrap(), r.iteration_time_us.unwrap());
        assert!(
            ti <= tb * (1.0 + 1e-9),
            "{name} at {}: ILP {ti} > {} {tb}",
            r.cap_bytes,
            r.method
        );
        assert!(
            r.peak_memory_bytes.unwrap() <= r.cap_bytes
                && i.peak_memory_bytes.unwrap() <= r.cap_bytes
        );
    }
}

#[test]
fn sweep_writes_csv_charts_summary_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml").display().to_string();
    let out = shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "a100-80g",
        "--world-size",
        "16",
        "--flat",
        "--micro-batch",
        "8",
        "--out",
        &profile,
    ]);
    assert!(out.status.success());
    let sweep_dir = dir.path().join("sweep");
    let out = shardplan(&[
        "sweep",
        "--profile",
        &profile,
        "--caps",
        "2GiB,3GiB,4GiB,40GiB",
        "--out-dir",
        sweep_dir.to_str().unwrap(),
        "--time-limit",
        "5",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["caps"].as_array().unwrap().len(), 4);
    for f in [
        "sweep.csv",
        "sweep.svg",
        "sweep.png",
        "levels.svg",
        "levels.png",
        "summary.md",
    ] {
        assert!(sweep_dir.join(f).is_file(), "{f} missing");
    }
    assert_eq!(
        &std::fs::read(sweep_dir.join("sweep.png")).unwrap()[..8],
        b"\x89PNG\r\n\x1a\n"
    );
    assert!(
        std::fs::read_to_string(sweep_dir.join("sweep.svg"))
            .unwrap()
            .contains("memory cap per rank (GiB)")
    );
    let csv = std::fs::read_to_string(sweep_dir.join("sweep.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(lines.next().unwrap().starts_with(
        "cap_bytes,method,feasible,iteration_time_us,peak_memory_bytes,exposed_comm_us"
    ));
    // The ILP, the six baselines and, the A100's catalog entry having a host, the two offload
    // baselines (DESIGN §3.13).
    assert_eq!(lines.count(), 4 * 9, "one row per (cap, method)");
    // The host's memory is filled exactly for the offload rows that fit; FSDP2's figures only
    // under `--target fsdp2`.
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        let fitting_offload = cells[1].ends_with("-offload") && cells[2] == "true";
        assert_eq!(
            fitting_offload,
            !cells[column("host_memory_bytes")].is_empty(),
            "{line}"
        );
        assert!(
            cells[column("fsdp2_peak_memory_bytes")].is_empty(),
            "{line}"
        );
    }
    assert!(
        std::fs::read_dir(&sweep_dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')),
        "temporary files left"
    );
}

/// `sweep --target fsdp2`: every feasible row is a plan FSDP2 runs exactly within the cap, its
/// FSDP2 time (the plan's, exports being exact) and FSDP2 peak in the CSV; infeasible rows leave
/// them empty. Each baseline row's FSDP2 peak equals `export fsdp2`'s of that baseline's plan.
#[test]
fn sweep_for_the_fsdp2_target_reports_fsdp2s_time_and_peak() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = at("p.toml");
    let made = shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "h100-sxm",
        "--world-size",
        "8",
        "--out",
        &profile,
    ]);
    assert!(made.status.success());
    let sweep_dir = at("sweep");
    let out = shardplan(&[
        "sweep",
        "--profile",
        &profile,
        "--caps",
        "700MiB,3GiB,40GiB",
        "--methods",
        "ilp,zero2,fsdp2",
        "--target",
        "fsdp2",
        "--time-limit",
        "20",
        "--out-dir",
        &sweep_dir,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(dir.path().join("sweep/sweep.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (mut feasible, mut infeasible) = (0, 0);
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let cap: u64 = cells[column("cap_bytes")].parse().unwrap();
        let (time, peak) = (
            cells[column("fsdp2_iteration_time_us")],
            cells[column("fsdp2_peak_memory_bytes")],
        );
        if cells[column("feasible")] == "false" {
            assert!(time.is_empty() && peak.is_empty(), "{line}");
            infeasible += 1;
            continue;
        }
        feasible += 1;
        let peak: u64 = peak.parse().unwrap();
        assert!(peak <= cap, "{line}");
        let model_peak: u64 = cells[column("peak_memory_bytes")].parse().unwrap();
        assert!(
            peak > model_peak,
            "FSDP2's copies beside the model's buffers: {line}"
        );
        assert_eq!(time, cells[column("iteration_time_us")], "{line}");
        let method = cells[column("method")];
        if method == "fsdp2" {
            let recompute = cells[column("recomputed_units")] != "0";
            let plan = at(&format!("{method}-{cap}.toml"));
            let mut args = vec![
                "baseline",
                "--profile",
                &profile,
                "--kind",
                method,
                "--out",
                &plan,
            ];
            if recompute {
                args.push("--checkpoint");
            }
            assert!(shardplan(&args).status.success());
            let exported = shardplan(&[
                "export",
                "fsdp2",
                "--profile",
                &profile,
                "--plan",
                &plan,
                "--out",
                &at("e.json"),
                "--json",
            ]);
            let e: serde_json::Value = serde_json::from_slice(&exported.stdout).unwrap();
            assert_eq!(e["fsdp2_peak_memory_bytes"].as_u64(), Some(peak), "{line}");
        }
    }
    assert!(
        feasible >= 5 && infeasible >= 1,
        "{feasible} feasible, {infeasible} infeasible"
    );
}

#[test]
fn sweep_rejects_bad_caps_and_methods() {
    let bad = shardplan(&[
        "sweep",
        "--profile",
        "profiles/llama2-7b-h100-n64.toml",
        "--caps",
        "80GiB..20GiB",
        "--out-dir",
        "/tmp/never",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("LOW < HIGH"));
    let bad = shardplan(&[
        "sweep",
        "--profile",
        "profiles/llama2-7b-h100-n64.toml",
        "--methods",
        "ilp,zero9",
        "--out-dir",
        "/tmp/never",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("zero9"));
}

#[test]
fn ilp_beats_every_fitting_baseline_and_never_slows_as_the_cap_grows() {
    for name in ["gpt2-small", "llama2-7b"] {
        let profile = zoo_profile(name);
        let template = SolveOptions {
            time_limit_s: 5.0,
            relative_gap: 1e-3,
            ..SolveOptions::default()
        };
        let (low, high) = cap_range(&profile, &Method::all(&profile), &template).unwrap();
        let caps = even_caps(low, high, 9);
        let mut rows = ilp_rows(&profile, &caps, &template, &|| {}).unwrap();
        for &cap in &caps {
            rows.extend(
                BaselineKind::ALL
                    .iter()
                    .map(|&k| best_baseline_row(&profile, k, cap, Target::Runtime)),
            );
        }
        check_frontier(name, &rows);
        let ilp: Vec<&SweepRow> = rows.iter().filter(|r| r.method == "ilp").collect();
        assert!(
            ilp.iter().all(|r| r.feasible),
            "{name}: the smallest feasible cap must be feasible"
        );
        // Less memory moves units toward fsdp.
        assert!(
            ilp[0].units_fsdp >= ilp[8].units_fsdp,
            "{name}: {} fsdp units at the smallest cap, {} at the largest",
            ilp[0].units_fsdp,
            ilp[8].units_fsdp
        );
    }
}

/// Same input, no limit hit: the same plan, every run.
#[test]
fn the_ilp_is_deterministic_when_no_limit_is_hit() {
    use shardplan_scheduler::ilp::{SolveStatus, solve};
    let profile = zoo_profile("gpt2-small");
    // Above the smallest feasible cap (608.57 MiB, the tied head's lifetimes counted).
    let options = SolveOptions {
        memory_cap_bytes: Some(650 << 20),
        time_limit_s: 60.0,
        relative_gap: 1e-3,
        ..SolveOptions::default()
    };
    let first = solve(&profile, &options).unwrap();
    assert_ne!(
        first.report.status,
        SolveStatus::TimeLimit,
        "the limit was hit; the check needs a solve that finishes"
    );
    for _ in 0..2 {
        let again = solve(&profile, &options).unwrap();
        assert_eq!(again.schedule, first.schedule);
        assert_eq!(again.report.objective, first.report.objective);
    }
}

/// `demo`'s comparison at the H100's memory: every baseline built at the cap, checkpointing off
/// before on; the fastest is the fastest of those that fit; without a node layout hsdp and hpz
/// are left out, each with its reason, and with one none is.
#[test]
fn a_baseline_comparison_builds_every_baseline_and_names_those_left_out() {
    let bundled = |name: &str| {
        Profile::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
    };
    let cap = 80 << 30;
    let flat = BaselineComparison::at(&bundled("profiles/llama2-70b-h100-n64.toml"), cap);
    let labels: Vec<String> = flat.built.iter().map(|b| b.label()).collect();
    let at = |label: &str| labels.iter().position(|l| l == label);
    assert!(
        at("ddp") < at("ddp+ckpt") && at("fsdp2+ckpt").is_some(),
        "{labels:?}"
    );
    let left_out: Vec<BaselineKind> = flat.left_out.iter().map(|(kind, _)| *kind).collect();
    // At one micro-batch per step the micro-batch forms (hsdp-nosync, …) are not listed.
    assert_eq!(left_out, [BaselineKind::Hsdp, BaselineKind::Hpz]);
    assert!(
        flat.left_out[0]
            .1
            .contains("needs a profile with a node layout")
    );
    let fastest = flat.fastest().unwrap();
    let fitting = flat
        .built
        .iter()
        .filter(|b| b.plan.simulation.peak_memory_bytes <= cap as f64);
    for b in fitting {
        assert!(fastest.plan.simulation.iteration_time_us <= b.plan.simulation.iteration_time_us);
    }
    let nodes = BaselineComparison::at(&bundled("profiles/llama2-70b-h100-8x8.toml"), cap);
    assert!(nodes.left_out.is_empty());
}
