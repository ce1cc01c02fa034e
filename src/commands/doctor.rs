//! `shardplan doctor`: what the CUDA backend finds on this machine and whether
//! `run --backend cuda` can start. It prints, per library, where it is or the one-line reason it
//! is missing; the driver's and NCCL's versions; each GPU; and the MLP and GPT-2 kernels compiled by NVRTC
//! (no GPU needed, so any machine with NVRTC checks the kernel source) and loaded on GPU 0. It
//! exits 1, with one line naming what is missing, when the backend cannot start.

use crate::cli::DoctorArgs;
use crate::output::outln;
use shardplan_runtime::cuda::libraries::{self, Needed, SearchPaths, find};
use shardplan_runtime::cuda::{inventory, nvrtc};
use shardplan_runtime::dispatch::KERNEL_SOURCES;
use shardplan_scheduler::precision::Precision;

/// The architecture the kernels are compiled for when neither `--arch` nor a GPU says: Hopper.
const DEFAULT_ARCHITECTURE: &str = "sm_90";

/// One line of the report: a label column, then the finding.
fn report(label: &str, finding: impl std::fmt::Display) {
    outln!("{label:<10} {finding}");
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let search = SearchPaths::from_environment();
    let found: Vec<_> = Needed::ALL.iter().map(|&n| (n, find(n, &search))).collect();
    let present: Vec<Needed> = found
        .iter()
        .filter(|(_, f)| f.is_ok())
        .map(|(n, _)| *n)
        .collect();
    // Makes what was found loadable; may re-execute this process once, before anything prints.
    libraries::prepare_for(&present)?;
    let mut problems: Vec<String> = Vec::new();
    for (needed, found) in &found {
        match found {
            Ok(found) => report(&needed.library(), found.location()),
            Err(e) => {
                report(&needed.library(), format!("missing: {e}"));
                problems.push(format!("no {}", needed.library()));
            }
        }
    }
    let has = |n: Needed| present.contains(&n);
    let mut gpus = Vec::new();
    if has(Needed::Driver) {
        match inventory::driver_version() {
            Ok(v) => report("driver", format!("supports CUDA {v}")),
            Err(e) => report("driver", e),
        }
        match inventory::gpus() {
            Ok(list) => gpus = list,
            Err(e) => report("gpus", e),
        }
        for gpu in &gpus {
            report(
                &format!("gpu {}", gpu.ordinal),
                format!(
                    "{}, {}, {:.1} GiB",
                    gpu.name,
                    gpu.architecture,
                    gpu.total_bytes as f64 / (1u64 << 30) as f64
                ),
            );
        }
        if gpus.is_empty() {
            problems.push("no GPU".into());
        }
    }
    if has(Needed::Nccl) {
        match inventory::nccl_version() {
            Ok(v) => report("nccl", format!("version {v}")),
            Err(e) => report("nccl", e),
        }
    }
    if has(Needed::Nvrtc) {
        let arch = args
            .arch
            .clone()
            .or_else(|| gpus.first().map(|g| g.architecture.clone()))
            .unwrap_or_else(|| DEFAULT_ARCHITECTURE.into());
        let version = nvrtc::version()
            .map(|(major, minor)| format!("NVRTC {major}.{minor}"))
            .unwrap_or_else(|e| e.to_string());
        for source in KERNEL_SOURCES {
            let (model, count) = (source.model, source.signatures().len());
            let except = if source.library_math().is_empty() {
                ""
            } else {
                " outside calls of the math library"
            };
            for precision in Precision::ALL {
                let policy = precision.describe();
                match source.compile(&arch, precision) {
                    Ok(compiled) => report(
                        "kernels",
                        format!(
                            "{version} compiled the {count} {model} kernels for {arch} under {policy}: {} bytes of PTX (no fused multiply-add{except}), {} bytes of machine code",
                            compiled.ptx.len(),
                            compiled.cubin.len()
                        ),
                    ),
                    Err(e) => {
                        report("kernels", e);
                        problems.push(format!("the {model} kernels do not compile under {policy}"));
                    }
                }
            }
        }
        if let Some(gpu) = gpus.first() {
            match inventory::load_kernels(gpu.ordinal, &KERNEL_SOURCES) {
                Ok(()) => report("kernels", format!("loaded on GPU {}", gpu.ordinal)),
                Err(e) => {
                    report("kernels", e);
                    problems.push(format!("the kernels do not load on GPU {}", gpu.ordinal));
                }
            }
        }
    }
    anyhow::ensure!(
        problems.is_empty(),
        "the CUDA backend cannot start here: {} (details above)",
        problems.join(", ")
    );
    report("ready", "`shardplan run --backend cuda` can start");
    Ok(())
}
