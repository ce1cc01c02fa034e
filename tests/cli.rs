//! The `shardplan` binary end to end: outputs, JSON fields, traces, claims and the errors of
//! solves. (Its refusals of bad usage, inputs and plans: `tests/cli_errors.rs`.)

mod common;

use common::cli::{analytic, fails, ok_json, path};
use common::shardplan;
use serde_json::Value;
use std::path::Path;

#[test]
fn profile_baseline_simulate_inspect_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "llama2-7b", "64");
    let plan = path(dir.path(), "fsdp2.plan.toml");
    let b = ok_json(&[
        "baseline",
        "--profile",
        &profile,
        "--kind",
        "fsdp2",
        "--memory-cap",
        "80GiB",
        "--out",
        &plan,
        "--json",
    ]);
    assert_eq!(b["fits_cap"], Value::Bool(true));
    let trace = path(dir.path(), "trace.json");
    for semantics in ["strict", "relaxed"] {
        let sim = ok_json(&[
            "simulate",
            "--profile",
            &profile,
            "--plan",
            &plan,
            "--semantics",
            semantics,
            "--trace",
            &trace,
            "--json",
        ]);
        for field in [
            "iteration_time_us",
            "compute_us",
            "comm_us",
            "exposed_comm_us",
            "peak_memory_bytes",
        ] {
            assert!(
                sim[field].as_f64().is_some_and(|v| v >= 0.0),
                "{semantics}: {field} = {}",
                sim[field]
            );
        }
        assert_eq!(sim["semantics"], semantics);
        assert!(sim["peak_slot"].is_string());
        if semantics == "strict" {
            // The plan's recorded prediction is the strict simulation.
            assert_eq!(sim["iteration_time_us"], b["iteration_time_us"]);
        }
        let trace: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        for phase in ["M", "X", "C"] {
            assert!(
                events.iter().any(|e| e["ph"] == phase),
                "trace has no {phase} event"
            );
        }
    }
    let inspect = shardplan(&["inspect", "--profile", &profile, "--plan", &plan]);
    let text = String::from_utf8(inspect.stdout).unwrap();
    assert!(
        text.contains("block.32") && text.contains("memory peak") && text.contains("activation"),
        "{text}"
    );
    let json = ok_json(&["inspect", "--profile", &profile, "--plan", &plan, "--json"]);
    assert_eq!(json["units"].as_array().unwrap().len(), 34);
}

/// The demo's ILP row fits the cap and is at least as fast as the fastest baseline that fits
/// (its warm start), and every row's `fits_cap` agrees with its peak and the cap; the fsdp2
/// target's row (DESIGN §4.9) exports exactly, FSDP2's time its own, FSDP2's peak within the cap.
#[test]
fn demo_runs_on_the_bundled_profile() {
    let json = ok_json(&["demo", "--json", "--time-limit", "4"]);
    let cap = json["memory_cap_bytes"].as_u64().unwrap();
    let rows = json["methods"].as_array().unwrap();
    for row in rows {
        let fits = row["peak_memory_bytes"].as_u64().unwrap() <= cap;
        assert_eq!(row["fits_cap"].as_bool(), Some(fits), "{row}");
    }
    let time = |row: &Value| row["iteration_time_us"].as_f64().unwrap();
    let (ilps, baselines): (Vec<&Value>, Vec<&Value>) = rows
        .iter()
        .partition(|row| row["method"].as_str().unwrap().starts_with("ilp"));
    let fsdp2 = ilps
        .iter()
        .find(|row| row["method"] == "ilp --target fsdp2")
        .expect("the fsdp2 target's row");
    assert_eq!(fsdp2["fsdp2_approximations"], 0, "{fsdp2}");
    assert_eq!(fsdp2["fsdp2_iteration_time_us"], fsdp2["iteration_time_us"]);
    assert!(fsdp2["fsdp2_peak_memory_bytes"].as_u64().unwrap() <= cap);
    let ilp: Vec<&&Value> = ilps.iter().filter(|row| row["method"] == "ilp").collect();
    let fastest = baselines
        .iter()
        .filter(|row| row["fits_cap"] == true)
        .map(|row| time(row))
        .fold(f64::INFINITY, f64::min);
    assert!(fastest.is_finite(), "no baseline fits: {rows:?}");
    let ilp = ilp.first().expect("an ILP row");
    assert_eq!(ilp["fits_cap"], true, "{ilp}");
    assert!(time(ilp) <= fastest * (1.0 + 1e-9), "{ilp} vs {fastest}");
}

/// `--gather-depth` and `--reduce-depth` limit gathers and reductions separately (either alone);
/// the JSON names the limits the gap holds under; `--window-depth` sets both and cannot be
/// combined with them; a depth of 0 is refused.
#[test]
fn gathers_and_reductions_are_limited_separately() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "64");
    let plan = path(dir.path(), "limited.toml");
    let solve = |extra: &[&str]| {
        let mut args = vec![
            "solve",
            "--profile",
            &profile,
            "--memory-cap",
            "700MiB",
            "--out",
            &plan,
            "--json",
        ];
        args.extend(extra);
        ok_json(&args)
    };
    let gather = solve(&["--gather-depth", "1"]);
    assert_eq!(
        gather["window_depth"],
        serde_json::json!({"gather": 1, "reduce": null})
    );
    let reduce = solve(&["--reduce-depth", "2"]);
    assert_eq!(
        reduce["window_depth"],
        serde_json::json!({"gather": null, "reduce": 2})
    );
    assert_eq!(solve(&["--window-depth", "3"])["window_depth"], 3);
    // No cap at all: at least as fast as under 700 MiB, and the JSON says there was none.
    let unlimited = ok_json(&[
        "solve",
        "--profile",
        &profile,
        "--memory-cap",
        "unlimited",
        "--out",
        &plan,
        "--json",
    ]);
    assert!(unlimited["memory_cap_bytes"].is_null());
    let capped = solve(&[]);
    assert!(
        unlimited["iteration_time_us"].as_f64().unwrap()
            <= capped["iteration_time_us"].as_f64().unwrap() * (1.0 + 1e-9)
    );
    assert!(capped["window_depth"].is_null());
    assert!(gather.get("best_bound").is_none() && gather["best_bound_us"].is_number());
    for bad in [
        &[
            "--memory-cap",
            "1GiB",
            "--window-depth",
            "2",
            "--gather-depth",
            "1",
        ][..],
        &["--memory-cap", "1GiB", "--reduce-depth", "0"][..],
        &["--memory-cap", "lots"][..],
    ] {
        let mut args = vec!["solve", "--profile", &profile, "--out", &plan];
        args.extend(bad);
        let (code, msg) = fails(&args);
        assert_eq!(code, 2, "{bad:?}: {msg}");
    }
}

#[test]
fn solve_reports_its_claim_and_explains_infeasible_caps_and_ceilings() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "64");
    let plan = path(dir.path(), "ilp.toml");
    let json = ok_json(&[
        "solve",
        "--profile",
        &profile,
        "--memory-cap",
        "700MiB",
        "--out",
        &plan,
        "--gap",
        "1e-4",
        "--json",
    ]);
    for field in [
        "iteration_time_us",
        "best_bound_us",
        "gap",
        "solve_seconds",
        "peak_memory_bytes",
        "variables",
        "constraints",
        "recomputed_units",
    ] {
        assert!(json[field].is_number(), "{field}: {}", json[field]);
    }
    assert!(
        ["optimal", "gap_limit"].contains(&json["status"].as_str().unwrap()),
        "{}",
        json["status"]
    );
    assert!(json["gap"].as_f64().unwrap() <= 1e-4);
    assert!(
        json["best_bound_us"].as_f64().unwrap()
            <= json["iteration_time_us"].as_f64().unwrap() * (1.0 + 1e-9)
    );
    assert!(json["peak_memory_bytes"].as_u64().unwrap() <= 700 << 20);
    let levels = &json["levels"];
    assert_eq!(
        ["none", "sdp", "fsdp"]
            .iter()
            .map(|l| levels[l].as_u64().unwrap())
            .sum::<u64>(),
        14
    );
    assert!(json["warm_start"]["name"].is_string() && json.get("window_depth").is_some());
    // The written plan simulates to the reported time.
    let sim = ok_json(&["simulate", "--profile", &profile, "--plan", &plan, "--json"]);
    assert_eq!(sim["iteration_time_us"], json["iteration_time_us"]);

    let never = path(dir.path(), "never.toml");
    let (code, msg) = fails(&[
        "solve",
        "--profile",
        &profile,
        "--memory-cap",
        "100MiB",
        "--out",
        &never,
    ]);
    assert_eq!(code, 3, "{msg}");
    assert!(
        msg.contains("no plan fits the memory cap of 100.00 MiB")
            && msg.contains("smallest feasible cap is")
            && msg.contains("peaking at slot"),
        "{msg}"
    );
    let (code, msg) = fails(&[
        "solve",
        "--profile",
        &profile,
        "--objective",
        "memory",
        "--max-iteration-time",
        "1us",
        "--out",
        &never,
    ]);
    assert_eq!(code, 3, "{msg}");
    assert!(msg.contains("iteration-time ceiling of 0.001 ms"), "{msg}");
    assert!(!Path::new(&never).exists());
    let (code, _) = fails(&["solve", "--profile", &profile, "--out", &never]);
    assert_eq!(code, 2, "the time objective needs a cap");
}

/// A plan written by hand needs no `profile_digest`, `[producer]` or `[predicted]`: `simulate`
/// computes its prediction (the same as the baseline it was copied from) and names it
/// hand-written; its units are still checked against the profile.
#[test]
fn hand_written_plans_need_no_producer_prediction_or_digest() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "8");
    let written = path(dir.path(), "fsdp2.toml");
    ok_json(&[
        "baseline",
        "--profile",
        &profile,
        "--kind",
        "fsdp2",
        "--out",
        &written,
        "--json",
    ]);
    let text = std::fs::read_to_string(&written).unwrap();
    // Keep `schema`, `world_size` and the [[units]] tables only.
    let units = &text[text.find("[[units]]").unwrap()..];
    let header: String = text
        .lines()
        .filter(|l| l.starts_with("schema") || l.starts_with("world_size"))
        .map(|l| format!("{l}\n"))
        .collect();
    let hand = path(dir.path(), "hand.toml");
    std::fs::write(&hand, format!("{header}\n{units}")).unwrap();
    assert!(
        !std::fs::read_to_string(&hand)
            .unwrap()
            .contains("predicted")
    );
    let copied = ok_json(&[
        "simulate",
        "--profile",
        &profile,
        "--plan",
        &written,
        "--json",
    ]);
    let by_hand = ok_json(&["simulate", "--profile", &profile, "--plan", &hand, "--json"]);
    assert_eq!(by_hand["iteration_time_us"], copied["iteration_time_us"]);
    assert_eq!(by_hand["peak_memory_bytes"], copied["peak_memory_bytes"]);
    assert_eq!(by_hand["producer"], "hand-written", "{by_hand}");
    // A unit the profile does not have is still refused, by name.
    let wrong = path(dir.path(), "wrong.toml");
    std::fs::write(
        &wrong,
        std::fs::read_to_string(&hand).unwrap().replacen(
            "name = \"block.1\"",
            "name = \"block.one\"",
            1,
        ),
    )
    .unwrap();
    let (code, msg) = fails(&["simulate", "--profile", &profile, "--plan", &wrong]);
    assert_eq!(code, 2, "{msg}");
    assert!(
        msg.contains("units[1].name") && msg.contains("block.one"),
        "{msg}"
    );
}

/// A time limit past any clock (`1e12` seconds, `unlimited`) means no limit: the solve runs to its
/// gap as with the default limit; a limit that is not a positive number is refused.
#[test]
fn huge_and_unlimited_time_limits_mean_no_limit() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "64");
    let plan = path(dir.path(), "ilp.toml");
    for limit in ["1e12", "unlimited", "UNLIMITED"] {
        let json = ok_json(&[
            "solve",
            "--profile",
            &profile,
            "--memory-cap",
            "700MiB",
            "--time-limit",
            limit,
            "--out",
            &plan,
            "--json",
        ]);
        assert!(
            ["optimal", "gap_limit"].contains(&json["status"].as_str().unwrap()),
            "{limit}: {json}"
        );
    }
    for bad in ["0", "-5", "inf", "never"] {
        let limit = format!("--time-limit={bad}");
        let (code, message) = fails(&[
            "solve",
            "--profile",
            &profile,
            "--memory-cap",
            "700MiB",
            &limit,
            "--out",
            &plan,
        ]);
        assert_eq!(code, 2, "{bad}: {message}");
        assert!(message.contains("`unlimited`"), "{bad}: {message}");
    }
}
