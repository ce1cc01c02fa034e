//! `demo`'s one-node part (issue 64): Llama-2 70B on one node of 8 H100s at 79.65 GiB, where no
//! plan fits on the device alone, against the offload baselines.

mod common;

use common::{assert_success, shardplan};
use serde_json::Value;
use std::path::Path;

const PROFILE: &str = "profiles/llama2-70b-h100-n8.toml";

fn json_of(args: &[&str]) -> Value {
    let out = shardplan(args);
    assert_success(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row<'a>(rows: &'a [Value], method: &str) -> &'a Value {
    (rows.iter())
        .find(|row| row["method"] == method)
        .unwrap_or_else(|| panic!("no {method} row in {rows:?}"))
}

/// The profile's parameters, summed from its units (the truth the host figures are checked on).
fn parameters() -> f64 {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PROFILE)).unwrap();
    let profile: toml::Value = toml::from_str(&text).unwrap();
    (profile["units"].as_array().unwrap().iter())
        .map(|unit| unit["params"].as_integer().unwrap() as f64)
        .sum()
}

/// The one-node ILP row fits the device cap and the host's memory, offloads, is at least as fast
/// as every baseline that fits, and its time and peaks are `simulate`'s of the plan it wrote; the
/// device-only baselines do not fit; the offload baselines' host memory is one node's state by
/// hand (16 bytes per parameter for `full`, 14 for `optimizer`: bf16 gradient and 12 of Adam).
#[test]
fn the_one_node_ilp_fits_beats_every_fitting_baseline_and_is_its_plans_simulation() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().display().to_string();
    let demo = json_of(&[
        "demo",
        "--json",
        "--target",
        "runtime",
        "--time-limit",
        "4",
        "--out-dir",
        &out_dir,
    ]);
    let one = &demo["one_node"];
    assert_eq!(one["micro_batches"], 1, "{one}");
    let cap = one["memory_cap_bytes"].as_u64().unwrap();
    assert_eq!(cap, demo["memory_cap_bytes"].as_u64().unwrap());
    let host_cap = one["host_memory_cap_bytes"].as_u64().unwrap();
    let rows = one["methods"].as_array().unwrap();
    let time = |row: &Value| row["iteration_time_us"].as_f64().unwrap();
    let peak = |row: &Value| row["peak_memory_bytes"].as_u64().unwrap();
    for row in rows {
        assert_eq!(row["fits_cap"].as_bool(), Some(peak(row) <= cap), "{row}");
    }
    for method in ["ddp", "zero2", "fsdp1+ckpt", "fsdp2+ckpt", "zero3+ckpt"] {
        assert_eq!(row(rows, method)["fits_cap"], false, "{method}");
    }
    let params = parameters();
    for (method, bytes_per_param, mode) in [
        ("fsdp2-offload+ckpt", 16.0, "units_offload_full"),
        ("zero3-offload+ckpt", 14.0, "units_offload_optimizer"),
    ] {
        let baseline = row(rows, method);
        assert_eq!(baseline["fits_cap"], true, "{baseline}");
        assert_eq!(baseline[mode], 82, "{baseline}");
        let host = baseline["host_memory_bytes"].as_f64().unwrap();
        let truth = params * bytes_per_param;
        // The shards' padding to whole blocks is all that separates them.
        assert!(
            (host - truth).abs() <= 1e-3 * truth,
            "{method}: {host} vs {truth}"
        );
    }
    let ilp = row(rows, "ilp");
    assert_eq!(ilp["fits_cap"], true, "{ilp}");
    let host = ilp["host_memory_bytes"].as_u64().expect("the ILP offloads");
    assert!(host <= host_cap, "{ilp}");
    let offloaded = ilp["units_offload_optimizer"].as_u64().unwrap()
        + ilp["units_offload_full"].as_u64().unwrap();
    assert!(offloaded > 0, "{ilp}");
    let fitting: Vec<&Value> = (rows.iter())
        .filter(|row| row["method"] != "ilp" && row["fits_cap"] == true)
        .collect();
    assert!(!fitting.is_empty());
    for baseline in &fitting {
        assert!(
            time(ilp) <= time(baseline) * (1.0 + 1e-9),
            "{ilp} vs {baseline}"
        );
    }
    let best = &one["ilp_vs_fastest_fitting_baseline"];
    let fastest = fitting
        .iter()
        .map(|row| time(row))
        .fold(f64::INFINITY, f64::min);
    assert_eq!(best["iteration_time_us"].as_f64(), Some(fastest));
    assert!((best["speedup"].as_f64().unwrap() - fastest / time(ilp)).abs() < 1e-12);
    let plan = dir
        .path()
        .join("one-node-ilp.plan.toml")
        .display()
        .to_string();
    let sim = json_of(&["simulate", "--profile", PROFILE, "--plan", &plan, "--json"]);
    assert_eq!(sim["iteration_time_us"], ilp["iteration_time_us"]);
    assert_eq!(sim["peak_memory_bytes"], ilp["peak_memory_bytes"]);
    assert_eq!(sim["fits_cap"], true);
    assert_eq!(
        sim["host"]["memory_bytes"]
            .as_f64()
            .map(|b| b.ceil() as u64),
        Some(host)
    );
}
