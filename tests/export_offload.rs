//! `export fsdp2` of an offloading plan (DESIGN §3.13): every offloaded unit gets FSDP2's
//! `CPUOffloadPolicy(pin_memory=True)`, what FSDP2 cannot express is listed (an `optimizer` unit
//! exported as full offload, overlapped steps after the backward), and the FSDP2 time, peak and
//! host memory are those of the settings with FSDP2's offload. (python/tests/test_offload_export.py
//! applies such exports to transformers' GPT-2 under gloo.)

use serde_json::Value;
use shardplan_scheduler::profile::Profile;
use std::path::Path;
use std::process::{Command, Output};

fn shardplan(line: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(line.split_whitespace())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn ok(line: &str) {
    let out = shardplan(line);
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The exported file of `plan`.
fn export(profile: &str, plan: &str, out: &str) -> Value {
    ok(&format!(
        "export fsdp2 --profile {profile} --plan {plan} --out {out} --force"
    ));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

#[test]
fn offloading_plans_export_fsdp2s_cpu_offload_policy() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let profile = at("p.toml");
    ok(&format!(
        "profile analytic --model models/gpt2-small.toml --device h100-sxm --world-size 8 --out {profile}"
    ));
    for kind in ["fsdp2", "fsdp2-offload", "zero3-offload"] {
        ok(&format!(
            "baseline --profile {profile} --kind {kind} --out {}",
            at(&format!("{kind}.toml"))
        ));
    }
    let plain = export(&profile, &at("fsdp2.toml"), &at("fsdp2.json"));
    let full = export(&profile, &at("fsdp2-offload.toml"), &at("full.json"));
    let zero3 = export(&profile, &at("zero3-offload.toml"), &at("zero3.json"));
    let text = std::fs::read_to_string(at("zero3-offload.toml")).unwrap();
    let as_full = text.replace("offload = \"optimizer\"", "offload = \"full\"");
    assert_ne!(as_full, text);
    std::fs::write(at("zero3-full.toml"), as_full).unwrap();
    let zero3_full = export(&profile, &at("zero3-full.toml"), &at("zero3-full.json"));

    // Without offload the file is what it was: no policy, no host.
    assert!(plain.get("fsdp2_host_memory_bytes").is_none());
    let units = plain["units"].as_array().unwrap();
    assert!(units.iter().all(|u| u.get("offload_policy").is_none()));

    // Every unit of the offload baselines is sharded and offloaded.
    for file in [&full, &zero3] {
        for u in file["units"].as_array().unwrap() {
            assert_eq!(u["offload_policy"], serde_json::json!({"pin_memory": true}));
        }
    }
    // FSDP2's host: 8 ranks per node, each Ψ'_i(p + g + o)/8 of every unit at bf16's (2, 2, 12).
    let p = Profile::load(Path::new(&profile)).unwrap();
    let host: u64 = (0..p.unit_count()).map(|u| p.laid_out_params(u) * 16).sum();
    assert_eq!(full["fsdp2_host_memory_bytes"].as_u64(), Some(host));
    // The optimizer-only plan is exported as full offload: the same FSDP2 figures as the plan
    // with every unit `full`, each unit listed; both baselines step after the backward, as
    // FSDP2 does.
    for field in [
        "fsdp2_iteration_time_us",
        "fsdp2_relaxed_iteration_time_us",
        "fsdp2_peak_memory_bytes",
        "fsdp2_peak_slot",
        "fsdp2_host_memory_bytes",
    ] {
        assert_eq!(zero3[field], zero3_full[field], "{field}");
    }
    let notes = |file: &Value| -> Vec<String> {
        (file["approximations"].as_array().unwrap().iter())
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let optimizer_notes = notes(&zero3)
        .iter()
        .filter(|n| n.contains("offload = optimizer"))
        .count();
    assert_eq!(optimizer_notes, p.unit_count());
    assert!(
        !notes(&full)
            .iter()
            .any(|n| n.contains("offload = optimizer") || n.contains("host_step"))
    );
    assert!(notes(&full).iter().any(|n| n.contains("casts it there")));
    // The parameters, gradients and optimizer state leave the device: FSDP2's peak falls by
    // more than half of their Ψ'(p + g + o)/N, and the host's copies and steps take time.
    let peak = |file: &Value| file["fsdp2_peak_memory_bytes"].as_u64().unwrap();
    assert!(
        peak(&full) + host / 8 / 2 < peak(&plain),
        "{} vs {}",
        peak(&full),
        peak(&plain)
    );
    let time = |file: &Value| file["fsdp2_iteration_time_us"].as_f64().unwrap();
    assert!(time(&full) > time(&plain));
    // The fsdp2-offload baseline models CPUOffloadPolicy (DESIGN §3.13), built apart from the
    // export's translation: its FSDP2 time is the plan's, and its peak the plan's plus what
    // FSDP2's copies add to plain fsdp2's.
    let plan = |file: &Value, field: &str| file[field].as_f64().unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    assert!(close(time(&full), plan(&full, "plan_iteration_time_us")));
    let copies = |file: &Value| peak(file) - file["plan_peak_memory_bytes"].as_u64().unwrap();
    assert_eq!(copies(&full), copies(&plain));
}
