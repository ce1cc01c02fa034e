//! The CUDA backend (cudarc with dynamic loading: it builds without CUDA and loads the driver,
//! cuBLAS, NVRTC and NCCL at run time). `libraries` finds them before any CUDA call, `kernels`
//! holds the MLP's NVRTC source and `gpt2_kernels` GPT-2's, `gpt2` runs GPT-2's launches, `nccl` the communicator, `backend` the [`crate::backend::Backend`],
//! `replay` a transformer unit's products, `inventory` the versions and GPUs `doctor` reports,
//! `nvrtc` run-time compilation to PTX and machine code, `memory` the device memory the driver and
//! the pool report.

pub mod backend;
mod gpt2;
pub mod gpt2_kernels;
pub mod inventory;
pub mod kernels;
pub mod libraries;
mod memory;
pub mod nccl;
pub mod nvrtc;
pub mod replay;

pub use backend::CudaBackend;
pub use nccl::{NcclSetup, unique_id};

/// A driver error as the backend's, naming what was being done.
pub(crate) fn driver_error(
    what: &str,
) -> impl Fn(cudarc::driver::DriverError) -> crate::Error + '_ {
    move |e| crate::Error::Backend(format!("CUDA: {what}: {e}"))
}
