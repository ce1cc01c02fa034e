//! What a machine offers the CUDA backend: the driver's and NCCL's versions, each GPU's name,
//! architecture and memory, and whether the workloads' kernels load on a GPU. Every call needs its
//! library loadable ([`super::libraries::prepare_for`]).

use super::driver_error;
use super::module::{KernelModule, KernelSource, architecture};
use crate::{Error, Result};
use cudarc::driver::CudaContext;
use shardplan_scheduler::precision::Precision;

/// One visible GPU.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub ordinal: usize,
    pub name: String,
    /// `compute_<major><minor>`.
    pub architecture: String,
    pub total_bytes: u64,
}

/// The CUDA version the driver supports, as "major.minor".
pub fn driver_version() -> Result<String> {
    let mut version = 0;
    // SAFETY: the pointer is valid for the call; cuDriverGetVersion needs no cuInit.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(driver_error("reading the driver's version"))?;
    Ok(format!("{}.{}", version / 1000, (version % 1000) / 10))
}

/// NCCL's version, as "major.minor.patch" (NCCL ≥ 2.9 encodes it as major·10⁴ + minor·10² +
/// patch).
pub fn nccl_version() -> Result<String> {
    let code = cudarc::nccl::result::get_nccl_version()
        .map_err(|e| Error::Backend(format!("NCCL: reading its version: {e:?}")))?;
    Ok(format!(
        "{}.{}.{}",
        code / 10000,
        (code % 10000) / 100,
        code % 100
    ))
}

/// Every GPU the driver shows (after `CUDA_VISIBLE_DEVICES`).
pub fn gpus() -> Result<Vec<Gpu>> {
    let count = CudaContext::device_count().map_err(driver_error("counting GPUs"))?;
    (0..count.max(0) as usize)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(driver_error("opening a GPU"))?;
            Ok(Gpu {
                ordinal,
                name: ctx.name().map_err(driver_error("reading a GPU's name"))?,
                architecture: architecture(&ctx)?,
                total_bytes: ctx
                    .total_mem()
                    .map_err(driver_error("reading a GPU's memory"))?
                    as u64,
            })
        })
        .collect()
}

/// Compiles each of `sources` for GPU `ordinal` and every precision policy and loads its machine
/// code there, as the backend does when it first runs the source's workload.
pub fn load_kernels(ordinal: usize, sources: &[KernelSource]) -> Result<()> {
    let ctx = CudaContext::new(ordinal).map_err(driver_error("opening a GPU"))?;
    sources.iter().try_for_each(|source| {
        Precision::ALL
            .into_iter()
            .try_for_each(|precision| KernelModule::load(&ctx, source, precision).map(drop))
    })
}
