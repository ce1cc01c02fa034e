//! `export fsdp2` tells the truth about what FSDP2 will run (DESIGN §3.12): it reports the
//! exported settings' time, peak and timeline beside the plan's, and refuses (exit 3, naming the
//! slot and the amount) settings that peak above the plan's cap unless `--force` is given.

use serde_json::Value;
use std::process::{Command, Output};

fn shardplan(line: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(line.split_whitespace())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// A plan whose cap equals its own peak fits to the byte; FSDP2's all-gather outputs and
/// reduce-scatter inputs beside the model's buffers take it over: refused, then forced.
#[test]
fn an_fsdp2_peak_above_the_plan_cap_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let (profile, plan, capped, out) = (
        at("p.toml"),
        at("plan.toml"),
        at("capped.toml"),
        at("o.json"),
    );
    assert!(shardplan(&format!(
        "profile analytic --model models/gpt2-small.toml --device h100-sxm --world-size 8 --out {profile}"
    ))
    .status
    .success());
    assert!(
        shardplan(&format!(
            "baseline --profile {profile} --kind fsdp2 --out {plan}"
        ))
        .status
        .success()
    );
    let text = std::fs::read_to_string(&plan).unwrap();
    let peak: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("peak_memory_bytes = "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::write(&capped, format!("memory_cap_bytes = {peak}\n{text}")).unwrap();

    let refused = shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {capped} --out {out}"
    ));
    assert_eq!(refused.status.code(), Some(3));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(message.trim().lines().count(), 1, "{message}");
    assert!(!std::path::Path::new(&out).exists());

    let forced = shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {capped} --out {out} --force --json"
    ));
    assert!(forced.status.success());
    let report: Value = serde_json::from_slice(&forced.stdout).unwrap();
    let fsdp2_peak = report["fsdp2_peak_memory_bytes"].as_u64().unwrap();
    assert_eq!(report["plan_peak_memory_bytes"].as_u64(), Some(peak));
    assert!(fsdp2_peak > peak);
    let slot = report["fsdp2_peak_slot"].as_str().unwrap();
    for fragment in [
        "its FSDP2 export".to_string(),
        format!("at {slot},"),
        format!(
            "({} bytes) above its own memory_cap_bytes",
            fsdp2_peak - peak
        ),
    ] {
        assert!(message.contains(&fragment), "`{fragment}` not in {message}");
    }
    // The exported file carries the same figures, and the timeline every module boundary.
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        file["fsdp2_peak_memory_bytes"],
        report["fsdp2_peak_memory_bytes"]
    );
    let units = file["units"].as_array().unwrap().len();
    let timeline = file["fsdp2_timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 2 * units);
    assert_eq!(timeline[0]["at"], "F:embedding");
    // GPT-2's head reads the embedding's wte (tied): one FSDP2 group, whose pre-backward runs
    // first, before the head's (DESIGN §3.12).
    assert_eq!(timeline[units]["at"], "B:embedding");
    assert_eq!(timeline[units + 1]["at"], "B:head");
    // F:embedding holds the embedding and block.1 (its forward list), in bf16 (2 bytes):
    // wte 50257·768 + wpe 1024·768 = 39383808 and a block 7087872 parameters.
    assert_eq!(
        timeline[0]["unsharded"],
        serde_json::json!(["embedding", "block.1"])
    );
    assert_eq!(
        timeline[0]["unsharded_bytes"].as_u64(),
        Some(2 * (39_383_808 + 7_087_872))
    );
    // Each unit is reduced once, the embedding last (its post-backward is the final callback's),
    // and freed once after its backward.
    let listed = |field: &str| -> Vec<String> {
        timeline[units..]
            .iter()
            .flat_map(|e| e[field].as_array().unwrap().clone())
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let mut names: Vec<String> = file["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_string())
        .collect();
    names.reverse();
    assert_eq!(listed("reduced"), names);
    assert_eq!(listed("resharded"), names);

    let json = shardplan(&format!(
        "export fsdp2 --profile {profile} --plan {capped} --out {out}2 --json"
    ));
    assert_eq!(json.status.code(), Some(3));
    let error: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(error["exit_code"], 3);
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains(&format!("at {slot},"))
    );
}
