//! `solve --target fsdp2` from the command line (DESIGN §4.9): the plan records its target and
//! exports to FSDP2 with zero approximations, FSDP2's time equal to the plan's and its peak within
//! the cap (GPT-2 small, its embedding tied to the head; one micro-batch per step and two), and
//! under `--objective memory` the smallest FSDP2 peak within a time ceiling; an unknown target, a
//! plan file whose target is unknown, and a plan or a baseline marked fsdp2 that FSDP2 cannot run
//! as written each get a one-line error naming the field.

use serde_json::Value;
use std::process::{Command, Output};

fn shardplan(line: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(line.split_whitespace())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| serde_json::from_slice(&output.stderr).unwrap())
}

fn analytic(dir: &std::path::Path, micro_batches: u32) -> String {
    let profile = dir
        .join(format!("p{micro_batches}.toml"))
        .display()
        .to_string();
    let made = shardplan(&format!(
        "profile analytic --model models/gpt2-small.toml --device h100-sxm --world-size 8 \
         --micro-batches {micro_batches} --out {profile}"
    ));
    assert!(made.status.success(), "{made:?}");
    profile
}

#[test]
fn an_fsdp2_target_plan_exports_exactly_at_its_own_time() {
    for micro_batches in [1, 2] {
        fsdp2_target_plan_exports_exactly(micro_batches);
    }
}

fn fsdp2_target_plan_exports_exactly(micro_batches: u32) {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = analytic(dir.path(), micro_batches);
    let (plan, out) = (at("plan.toml"), at("plan.json"));
    // 3 GiB: below zero2's peak on this profile, so the plan must shard and free some units.
    let cap: u64 = 3 << 30;
    let solved = shardplan(&format!(
        "solve --profile {profile} --memory-cap {cap} --target fsdp2 --effort 5 --out {plan} --json"
    ));
    assert!(solved.status.success(), "{solved:?}");
    let report = json(&solved);
    assert_eq!(report["target"], "fsdp2");
    assert_eq!(report["fsdp2_exact"], true);
    assert!(
        std::fs::read_to_string(&plan)
            .unwrap()
            .lines()
            .any(|l| l == "target = \"fsdp2\"")
    );
    let exported = shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {plan} --out {out} --json"
    ));
    assert!(exported.status.success(), "{exported:?}");
    let e = json(&exported);
    assert_eq!(e["exact"], true);
    assert_eq!(e["approximations"].as_array().unwrap().len(), 0);
    assert_eq!(e["fsdp2_iteration_time_us"], e["plan_iteration_time_us"]);
    assert_eq!(e["fsdp2_iteration_time_us"], report["iteration_time_us"]);
    assert_eq!(
        e["fsdp2_peak_memory_bytes"],
        report["fsdp2_peak_memory_bytes"]
    );
    assert!(e["fsdp2_peak_memory_bytes"].as_u64().unwrap() <= cap);
}

/// `--objective memory --target fsdp2`: the smallest FSDP2 peak within the iteration-time
/// ceiling, proven (the bound is FSDP2's peak), below the time objective's plan's FSDP2 peak, and
/// exported exactly at a time within the ceiling.
#[test]
fn the_smallest_fsdp2_peak_within_a_ceiling_exports_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = analytic(dir.path(), 1);
    let fastest = json(&shardplan(&format!(
        "solve --profile {profile} --memory-cap unlimited --target fsdp2 --out {} --json",
        at("t.toml")
    )));
    let ceiling_us = 1.3 * fastest["iteration_time_us"].as_f64().unwrap();
    let plan = at("m.toml");
    let solved = shardplan(&format!(
        "solve --profile {profile} --objective memory --max-iteration-time {ceiling_us}us \
         --target fsdp2 --out {plan} --json"
    ));
    assert!(solved.status.success(), "{solved:?}");
    let report = json(&solved);
    assert_eq!(report["objective"], "memory");
    assert_eq!(report["fsdp2_exact"], true);
    let peak = report["fsdp2_peak_memory_bytes"].as_u64().unwrap();
    assert!(peak < fastest["fsdp2_peak_memory_bytes"].as_u64().unwrap());
    let bound = report["best_bound_bytes"].as_f64().unwrap();
    assert!(bound <= peak as f64 && bound >= peak as f64 * (1.0 - 1e-3));
    let exported = json(&shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {plan} --out {} --json",
        at("m.json")
    )));
    assert_eq!(exported["exact"], true);
    assert_eq!(exported["fsdp2_peak_memory_bytes"].as_u64(), Some(peak));
    assert!(exported["fsdp2_iteration_time_us"].as_f64().unwrap() <= ceiling_us);
    let refused = shardplan(&format!(
        "solve --profile {profile} --objective memory --max-iteration-time 1us --target fsdp2 \
         --out {} --json",
        at("x.toml")
    ));
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert!(
        json(&refused)["error"]
            .as_str()
            .unwrap()
            .contains("ceiling")
    );
}

/// A baseline FSDP2 runs as built, recorded as made for it, exports exactly.
#[test]
fn a_baseline_for_the_fsdp2_target_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = analytic(dir.path(), 1);
    let plan = at("fsdp2.toml");
    let made = shardplan(&format!(
        "baseline --profile {profile} --kind fsdp2 --target fsdp2 --out {plan}"
    ));
    assert!(made.status.success(), "{made:?}");
    let text = std::fs::read_to_string(&plan).unwrap();
    assert!(text.lines().any(|l| l == "target = \"fsdp2\""), "{text}");
    let exported = shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {plan} --out {} --json",
        at("o.json")
    ));
    assert_eq!(json(&exported)["exact"], true);
}

#[test]
fn targets_fsdp2_cannot_take_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = analytic(dir.path(), 1);
    let one_line = |output: &Output, field: &str| {
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert_eq!(message.trim().lines().count(), 1, "{message}");
        assert!(message.contains(field), "{message}");
    };
    let unknown = shardplan(&format!(
        "solve --profile {profile} --memory-cap 3GiB --target fsdp3 --out {} --json",
        at("x.toml")
    ));
    assert_eq!(json(&unknown)["field"], "--target");
    // GPT-2 small's fsdp1 frees its tied embedding, which FSDP2 cannot (DESIGN §3.12): marked
    // fsdp2 it is refused, marked with an unknown target too.
    let baseline = at("fsdp1.toml");
    assert!(
        shardplan(&format!(
            "baseline --profile {profile} --kind fsdp1 --out {baseline}"
        ))
        .status
        .success()
    );
    let text = std::fs::read_to_string(&baseline).unwrap();
    for (target, field) in [("fsdp2", "target"), ("fsdp3", "field `target`")] {
        let marked = at(&format!("{target}.toml"));
        std::fs::write(&marked, format!("target = \"{target}\"\n{text}")).unwrap();
        let refused = shardplan(&format!(
            "export fsdp2 --profile {profile} --plan {marked} --out {}",
            at("o.json")
        ));
        one_line(&refused, field);
    }
    let refused = shardplan(&format!(
        "baseline --profile {profile} --kind fsdp1 --target fsdp2 --out {}",
        at("b.toml")
    ));
    one_line(&refused, "--target");
}
