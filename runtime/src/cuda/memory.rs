//! The device memory a GPU's driver reports, and the part of it the stream-ordered allocator
//! holds in reserve.
//!
//! cudarc allocates through the device's memory pool (`cuMemAllocAsync`) where the device has
//! one. The pool maps memory in chunks and keeps what is freed, so the driver's count of memory in
//! use (`cuMemGetInfo`) can already include the room a later allocation takes: on the H100,
//! gpt2-tiny's 21.7 MiB arena fitted in what set-up had left reserved, and the driver's count did
//! not move, while a larger arena grew it by a whole chunk. So a run's memory is counted as its
//! pool allocations plus the driver's count's growth outside the pool
//! ([`crate::backend::DeviceMemory::used_by_run`]).

use super::driver_error;
use crate::Result;
use crate::backend::PoolMemory;
use cudarc::driver::sys::CUmemPool_attribute;
use cudarc::driver::{CudaContext, result as driver};

/// Device memory in use now (every process's and library's, as the driver counts it) and the
/// device's total.
pub fn used_and_total_bytes(ctx: &CudaContext) -> Result<(u64, u64)> {
    let (free, total) = ctx.mem_get_info().map_err(driver_error("reading memory"))?;
    Ok(((total - free) as u64, total as u64))
}

/// Device memory in use now, as [`used_and_total_bytes`] counts it.
pub fn used_bytes(ctx: &CudaContext) -> Result<u64> {
    Ok(used_and_total_bytes(ctx)?.0)
}

/// What the device's memory pool has mapped and what its allocations hold; nothing where the
/// device has no pool (cudarc then allocates directly, and the driver's count is the whole story).
pub fn pool(ctx: &CudaContext) -> Result<PoolMemory> {
    if !ctx.has_async_alloc() {
        return Ok(PoolMemory::default());
    }
    ctx.bind_to_thread()
        .map_err(driver_error("binding the context"))?;
    // SAFETY: the device comes from a live context, and each attribute is a u64, as the driver
    // API documents for the pool's RESERVED_MEM_CURRENT and USED_MEM_CURRENT.
    unsafe {
        let pool = driver::device::get_mem_pool(ctx.cu_device())
            .map_err(driver_error("finding the memory pool"))?;
        let attribute = |attr: CUmemPool_attribute| -> Result<u64> {
            let mut value = 0u64;
            driver::mem_pool::get_attribute(pool, attr, (&raw mut value).cast())
                .map_err(driver_error("reading the memory pool"))?;
            Ok(value)
        };
        Ok(PoolMemory {
            reserved: attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used: attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        })
    }
}
