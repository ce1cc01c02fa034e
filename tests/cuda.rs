//! The CUDA backend where there is no GPU (CI): `run --backend cuda` (an offloading plan's too)
//! and `profile measure --backend cuda` exit 1 with one line naming the missing driver library
//! and where it was searched — never a panic — and write nothing; `doctor` finds the CUDA wheels
//! of a Python environment and NVRTC compiles the MLP and GPT-2 kernels, which needs no GPU.

mod common;

use shardplan_runtime::cuda::libraries::{Needed, SearchPaths, find};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::precision::Precision;
use shardplan_scheduler::schedule::Recompute;
use std::path::{Path, PathBuf};
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

/// gpt2-tiny's fsdp2-offload plan (DESIGN §6.12) on one rank with a host link, and its profile,
/// written in `dir`: (profile, plan).
fn offloading_plan(dir: &Path) -> (PathBuf, PathBuf) {
    let mut profile = common::gpt2_tiny_profile(1);
    profile.host = Some(common::test_host(1, 1));
    let plan = baseline(&profile, BaselineKind::Fsdp2Offload, Recompute::Off, None).unwrap();
    assert!(plan.schedule.offloads(), "fsdp2-offload offloads");
    let profile_path = dir.join("gpt2-tiny-host.toml");
    profile.save(&profile_path).unwrap();
    let plan = common::write_plan(dir, "fsdp2-offload", &profile, &plan.schedule);
    (profile_path, plan)
}

#[test]
#[ignore = "needs a machine without a CUDA driver; scripts/test runs it where that holds"]
fn without_a_driver_the_cuda_backend_fails_with_one_clear_line() {
    assert!(
        !driver_present(),
        "this machine has a CUDA driver (scripts/gpu-check runs the GPU path): scripts/test skips this test here"
    );
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
    // An offloading plan (pinned host arena, copy stream, host AdamW) stops at the same line.
    let (offload_profile, offload_plan) = offloading_plan(dir.path());
    assert_clear_driver_error(&[
        "run",
        "--backend",
        "cuda",
        "--profile",
        offload_profile.to_str().unwrap(),
        "--plan",
        offload_plan.to_str().unwrap(),
        "--model",
        "models/gpt2-tiny.toml",
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

/// Runs `shardplan doctor` with `VIRTUAL_ENV` naming a Python environment whose torch brought
/// the nvidia-* wheels (scripts/test sets `SHARDPLAN_CUDA_WHEELS`).
fn doctor(venv: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardplan"))
        .arg("doctor")
        .args(args)
        .env("VIRTUAL_ENV", venv)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SHARDPLAN_NCCL_LIB")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// The real wheels, found where pip puts them (cuBLAS and NVRTC in `nvidia/cu13/lib`, NCCL only
/// as `nvidia/nccl/lib/libnccl.so.2`), made loadable (links + one re-execution, from a relative
/// `VIRTUAL_ENV`), and NVRTC compiling the MLP and GPT-2 kernels for Hopper under each precision
/// policy (the bf16 prelude included): every entry point, no fused multiply-add, machine code. A
/// virtual architecture is refused with a clear line.
#[test]
#[ignore = "needs SHARDPLAN_CUDA_WHEELS, a Python environment with torch's nvidia wheels; scripts/test sets it"]
fn doctor_finds_the_wheels_and_nvrtc_compiles_the_kernels() {
    let venv = &std::env::var("SHARDPLAN_CUDA_WHEELS").expect(
        "SHARDPLAN_CUDA_WHEELS names a Python environment with torch (scripts/test sets it)",
    );
    let (code, stdout, stderr) = doctor(venv, &[]);
    let line = |label: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(label))
            .unwrap_or_else(|| panic!("no `{label}` line in:\n{stdout}"))
            .to_string()
    };
    for library in ["libcublas", "libnvrtc", "libnccl"] {
        let found = line(library);
        assert!(!found.contains("missing"), "{found}");
        assert!(found.contains("site-packages/nvidia/"), "{found}");
    }
    assert!(
        line("libnccl").ends_with("nccl/lib/libnccl.so.2"),
        "{stdout}"
    );
    assert!(line("nccl").contains("version 2."), "{stdout}");
    let kernels: Vec<&str> = stdout
        .lines()
        .filter(|l| l.split_whitespace().next() == Some("kernels"))
        .collect();
    for source in shardplan_runtime::dispatch::KERNEL_SOURCES {
        let (model, count) = (source.model, source.signatures().len());
        for precision in Precision::ALL {
            let policy = precision.describe();
            let compiled = format!("compiled the {count} {model} kernels for sm_90 under {policy}");
            let found = kernels
                .iter()
                .find(|l| l.contains(&compiled))
                .unwrap_or_else(|| panic!("`{compiled}` missing from:\n{stdout}"));
            for part in ["(no fused multiply-add", "bytes of machine code"] {
                assert!(found.contains(part), "`{part}` missing from: {found}");
            }
        }
    }
    if !driver_present() {
        assert_eq!(code, Some(1), "{stderr}");
        assert_eq!(
            stderr,
            "error: the CUDA backend cannot start here: no libcuda (details above)"
        );
    }

    let (code, stdout, stderr) = doctor(venv, &["--arch", "compute_90"]);
    assert_eq!(code, Some(1), "{stderr}");
    for model in ["MLP", "GPT-2"] {
        let refused = format!("the {model} kernels do not compile");
        assert!(stderr.contains(&refused), "{stderr}");
    }
    assert!(
        stdout.contains("name a real architecture (sm_90)"),
        "{stdout}"
    );
}
