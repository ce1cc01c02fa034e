//! `--time-limit` bounds the whole command, baselines and warm starts included: a solve of
//! K = 65,536 micro-batches (whose baselines, each plan simulated over all K, took 41.7 s before
//! plans were evaluated by their micro-batch classes) ends within 2 s of wall clock at
//! `--time-limit 1` — a generous bound proving the limit holds, not a speed target — and its
//! plan is the fastest baseline's or better.

mod common;

use common::{assert_success, shardplan};
use std::time::{Duration, Instant};

#[test]
fn a_solve_of_many_micro_batches_ends_within_its_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("k.toml").display().to_string();
    let out = shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "h100-sxm",
        "--world-size",
        "8",
        "--micro-batches",
        "65536",
        "--out",
        &profile,
    ]);
    assert_success(&out);
    let plan = dir.path().join("k.plan.toml").display().to_string();
    let started = Instant::now();
    let out = shardplan(&[
        "solve",
        "--profile",
        &profile,
        "--memory-cap",
        "4GiB",
        "--time-limit",
        "1",
        "--out",
        &plan,
        "--json",
    ]);
    let took = started.elapsed();
    assert_success(&out);
    assert!(
        took <= Duration::from_secs(2),
        "solve --time-limit 1 took {took:?}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let time = report["iteration_time_us"].as_f64().unwrap();
    let warm = report["warm_start"]["iteration_time_us"].as_f64().unwrap();
    assert!(time <= warm, "{time} above the warm start's {warm}");
    assert!(report["peak_memory_bytes"].as_u64().unwrap() <= 4 << 30);
}
