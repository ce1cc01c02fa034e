//! The MLP's element-wise kernels, compiled at start-up by NVRTC (no CUDA toolkit is needed to
//! build shardplan). Each does what its namesake in [`crate::mlp`] does, in the same order of
//! floating-point operations (column sums run one thread per column over the rows in order; the
//! loss is reduced through [`crate::mlp::LOSS_PARTIALS`] strided partial sums, one thread each,
//! then one thread adds the partials in order; Adam computes the same expression), compiled without fused multiply-adds, so the kernels round as the CPU does. Every
//! kernel is free of barriers and shared memory, so a test can run this very source on the CPU,
//! one thread after another (tests/cuda_kernels.rs).

use super::driver_error;
use super::nvrtc::{self, Compiled};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// The CUDA C source: one `extern "C"` kernel per operation.
pub const SOURCE: &str = r#"
extern "C" __global__ void fill_rows(float* out, const float* row, int rows, int cols) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < (long long)rows * cols) out[k] = row[k % cols];
}

extern "C" __global__ void relu(float* x, long long n) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) x[k] = fmaxf(x[k], 0.0f);
}

extern "C" __global__ void relu_mask(float* grad, const float* output, long long n) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n && output[k] <= 0.0f) grad[k] = 0.0f;
}

extern "C" __global__ void column_sums(float* out, const float* x, int rows, int cols) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += x[(long long)r * cols + j];
    out[j] = sum;
}

extern "C" __global__ void mse_grad(const float* z, const float* y, float* grad, float scale,
                                    long long n) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) grad[k] = 2.0f * (z[k] - y[k]) * scale;
}

extern "C" __global__ void mse_loss_partials(const float* z, const float* y, float scale,
                                             long long n, long long parts, float* partials) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= parts) return;
    float sum = 0.0f;
    for (long long k = j; k < n; k += parts) {
        float d = z[k] - y[k];
        sum += d * d * scale;
    }
    partials[j] = sum;
}

extern "C" __global__ void sum_in_order(const float* values, long long n, float* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float sum = 0.0f;
    for (long long k = 0; k < n; ++k) sum += values[k];
    *out = sum;
}

extern "C" __global__ void adam(float* params, const float* grads, float* m, float* v,
                                long long n, float lr, float c1, float c2, float beta1,
                                float beta2, float epsilon) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    float g = grads[k];
    m[k] = beta1 * m[k] + (1.0f - beta1) * g;
    v[k] = beta2 * v[k] + (1.0f - beta2) * g * g;
    params[k] -= lr * (m[k] / c1) / (sqrtf(v[k] / c2) + epsilon);
}
"#;

/// The kernels of [`SOURCE`], in [`Kernels`]' field order.
pub const ENTRY_POINTS: [&str; 8] = [
    "fill_rows",
    "relu",
    "relu_mask",
    "column_sums",
    "mse_grad",
    "mse_loss_partials",
    "sum_in_order",
    "adam",
];

/// The loaded kernels.
pub struct Kernels {
    pub fill_rows: CudaFunction,
    pub relu: CudaFunction,
    pub relu_mask: CudaFunction,
    pub column_sums: CudaFunction,
    pub mse_grad: CudaFunction,
    pub mse_loss_partials: CudaFunction,
    pub sum_in_order: CudaFunction,
    pub adam: CudaFunction,
}

/// [`SOURCE`] compiled for the real architecture `arch` (`sm_90` for Hopper) by NVRTC alone: no
/// driver or GPU is needed ([`compile_source`]).
pub fn compile(arch: &str) -> Result<Compiled> {
    compile_source(SOURCE, "shardplan_mlp.cu", arch, ENTRY_POINTS, &[])
}

/// `source` (called `name` in messages) compiled for the real architecture `arch` without fused
/// multiply-adds, with IEEE division and square root and denormals kept, as the CPU backend
/// rounds. Checks that every entry point is in the PTX under its unmangled name and that no
/// fused multiply-add is, except in the kernels of `library_math`: they call CUDA's `expf`,
/// `logf` or `tanhf`, whose implementations fuse by design (`--fmad` governs only the source's
/// own expressions).
pub fn compile_source<'a>(
    source: &str,
    name: &str,
    arch: &str,
    entry_points: impl IntoIterator<Item = &'a str>,
    library_math: &[&str],
) -> Result<Compiled> {
    let options = [
        "--fmad=false",
        "--prec-div=true",
        "--prec-sqrt=true",
        "--ftz=false",
        &format!("--gpu-architecture={arch}"),
    ]
    .map(String::from);
    let compiled = nvrtc::compile(source, name, &options)?;
    if let Some(entry) = entry_points
        .into_iter()
        .find(|entry| !compiled.ptx.contains(&format!(".entry {entry}(")))
    {
        return Err(Error::Backend(format!(
            "NVRTC's PTX of {name} for {arch} has no entry point {entry}"
        )));
    }
    if let Some(fused) = ptx_entries(&compiled.ptx)
        .into_iter()
        .find(|(entry, body)| body.contains("fma.") && !library_math.contains(entry))
    {
        return Err(Error::Backend(format!(
            "NVRTC fused multiply-adds in {} of {name}'s PTX for {arch} despite --fmad=false",
            if fused.0.is_empty() {
                "the module"
            } else {
                fused.0
            }
        )));
    }
    Ok(compiled)
}

/// The PTX cut at each `.entry`: (its name, its text); what precedes the first has the name "".
fn ptx_entries(ptx: &str) -> Vec<(&str, &str)> {
    let mut parts = ptx.split(".entry ");
    let mut entries = vec![("", parts.next().unwrap_or(""))];
    entries.extend(parts.map(|part| (part.split('(').next().unwrap_or("").trim(), part)));
    entries
}

/// The real architecture of the context's GPU (`sm_<major><minor>`).
pub fn architecture(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver_error("reading the compute capability"))?;
    Ok(format!("sm_{major}{minor}"))
}

impl Kernels {
    /// Compiles [`SOURCE`] for the context's GPU and loads its machine code into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let compiled = compile(&architecture(ctx)?)?;
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(|e| Error::Backend(format!("cannot load the MLP kernels: {e}")))?;
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| Error::Backend(format!("kernel {name} is missing: {e}")))
        };
        let [
            fill_rows,
            relu,
            relu_mask,
            column_sums,
            mse_grad,
            mse_loss_partials,
            sum_in_order,
            adam,
        ] = ENTRY_POINTS;
        Ok(Kernels {
            fill_rows: function(fill_rows)?,
            relu: function(relu)?,
            relu_mask: function(relu_mask)?,
            column_sums: function(column_sums)?,
            mse_grad: function(mse_grad)?,
            mse_loss_partials: function(mse_loss_partials)?,
            sum_in_order: function(sum_in_order)?,
            adam: function(adam)?,
        })
    }
}

/// One thread per element, 256 per block.
pub fn per_element(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
