//! The CUDA backend's own kernels: a region converted between formats (an fp32 master rounded
//! into bf16 parameters, a bf16 region widened), compiled at their first use or with a workload
//! whose policy keeps a master.

use super::CudaBackend;
use super::module::{KernelModule, KernelSource};
use super::work::WorkloadDevice;
use crate::Result;
use shardplan_scheduler::precision::Precision;

/// The conversion kernels' source (the storage prelude defines `bf16`, `ld` and `st`).
pub const CONVERSIONS: KernelSource = KernelSource {
    model: "format conversion",
    file: "shardplan_formats.cu",
    text: r#"
typedef long long i64;
extern "C" __global__ void narrow_values(const float* src, bf16* dst, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) st(dst + i, src[i]);
}
extern "C" __global__ void widen_values(const bf16* src, float* dst, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = ld(src + i);
}
"#,
};

/// [`CONVERSIONS`] loaded on one backend.
pub(super) struct Conversions(pub(super) KernelModule);

impl WorkloadDevice for Conversions {
    fn load(backend: &CudaBackend) -> Result<Self> {
        KernelModule::load(backend.context(), &CONVERSIONS, Precision::FP32).map(Conversions)
    }
}

impl CudaBackend {
    /// Compiles and loads the conversion kernels now (a policy with an fp32 master converts at
    /// every optimizer step), so that no step compiles them.
    pub fn load_conversions(&self) -> Result<()> {
        self.workload_device::<Conversions>().map(drop)
    }
}
