//! The CUDA backend where there is no GPU (CI): `run --backend cuda` and `profile measure
//! --backend cuda` exit 1 with one line naming the missing driver library and where it was
//! searched — never a panic — and write nothing.

use shardplan_runtime::cuda::libraries::{Needed, SearchPaths, find};
use std::process::Command;

fn driver_present() -> bool {
    find(Needed::Driver, &SearchPaths::from_environment()).is_ok()
}

fn assert_clear_driver_error(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    for part in [
        "error:",
        "CUDA driver",
        "libcuda.so.1",
        "/usr/local/nvidia/lib64",
    ] {
        assert!(stderr.contains(part), "`{part}` missing from: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn without_a_driver_the_cuda_backend_fails_with_one_clear_line() {
    if driver_present() {
        eprintln!(
            "skipped: this machine has a CUDA driver (docs/gpu-results.md runs the GPU path)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profile.toml");
    let out = out.to_str().unwrap();
    assert_clear_driver_error(&[
        "run",
        "--backend",
        "cuda",
        "--profile",
        "profiles/llama2-7b-h100-n64.toml",
        "--plan",
        "plan.toml",
        "--model",
        "models/mlp-small.toml",
        "--steps",
        "2",
    ]);
    assert_clear_driver_error(&[
        "profile",
        "measure",
        "--backend",
        "cuda",
        "--model",
        "models/mlp-small.toml",
        "--world-size",
        "1",
        "--out",
        out,
    ]);
    assert_clear_driver_error(&[
        "profile",
        "measure",
        "--backend",
        "cuda",
        "--model",
        "models/llama2-7b.toml",
        "--world-size",
        "8",
        "--device",
        "h100-sxm",
        "--out",
        out,
    ]);
    assert!(!std::path::Path::new(out).exists(), "nothing is written");
}
