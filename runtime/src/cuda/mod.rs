//! The CUDA backend (cudarc with dynamic loading: it builds without CUDA and loads the driver,
//! cuBLAS, NVRTC and NCCL at run time): plumbing that knows no model. `libraries` finds the
//! libraries before any CUDA call, `backend` is the [`crate::backend::Backend`], `work` what a
//! workload's CUDA side calls (checked launches and products, its own buffers and state),
//! `module` a workload's kernel source compiled, loaded and its launches checked, `storage` how
//! kernels store floats under a precision policy (the prelude, bf16 packing), `convert` the
//! backend's conversion kernels between formats, `nccl` the
//! communicator, `replay` a transformer unit's products, `inventory` the versions and GPUs
//! `doctor` reports, `nvrtc` run-time compilation to PTX and machine code, `memory` the device
//! memory the driver and the pool report, `pinned` an offloading plan's host arena in page-locked
//! memory and the copies between it and the device arena, `clock` the per-launch timing of `profile measure
//! --launch-times`, `graphs` operations captured and replayed as CUDA graphs (`--cuda-graphs`). The models' kernels live with the models (`mlp::cuda`, `gpt2::cuda`).

pub mod backend;
mod clock;
pub mod convert;
mod graphs;
pub mod inventory;
pub mod libraries;
mod memory;
pub mod module;
pub mod nccl;
pub mod nvrtc;
mod pinned;
pub mod replay;
pub mod storage;
pub mod work;

pub use backend::{CudaBackend, CudaOptions, ProductMath};
pub use nccl::{NcclSetup, unique_id};

/// A driver error as the backend's, naming what was being done.
pub(crate) fn driver_error(
    what: &str,
) -> impl Fn(cudarc::driver::DriverError) -> crate::Error + '_ {
    move |e| crate::Error::Backend(format!("CUDA: {what}: {e}"))
}
