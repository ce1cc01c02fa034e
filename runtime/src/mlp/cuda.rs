//! [`MlpKernels`] on the CUDA backend: the MLP's element-wise kernels ([`SOURCE`], compiled by
//! NVRTC when a backend first runs the MLP) and its layers' products on cuBLAS. Each kernel does
//! what its namesake in [`super`] does, in the same order of floating-point operations (column
//! sums run one thread per column over the rows in order; the loss is reduced through
//! [`super::LOSS_PARTIALS`] strided partial sums, one thread each, then one thread adds the
//! partials in order; Adam computes the same expression), compiled without fused multiply-adds,
//! so the kernels round as the CPU does. Every kernel is free of barriers and shared memory, so a
//! test runs this very source on the CPU, one thread after another
//! (runtime/tests/cuda_kernels.rs).

use super::cpu::adam_on;
use super::{Activation, BETA1, BETA2, EPSILON, LOSS_PARTIALS, MlpKernels};
use crate::Result;
use crate::backend::{Operand, Region, Stream};
use crate::cuda::CudaBackend;
use crate::cuda::module::{Element, KernelArg, KernelModule, KernelSource};
use crate::cuda::work::{Scratch, WorkloadDevice};
use crate::gemm::Gemm;
use shardplan_scheduler::precision::Precision;

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

extern "C" __global__ void column_sums_add(float* out, const float* x, int rows, int cols) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += x[(long long)r * cols + j];
    out[j] += sum;
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

/// The MLP's kernels as the backend compiles and loads them.
pub const KERNELS: KernelSource = KernelSource {
    model: "MLP",
    file: "shardplan_mlp.cu",
    text: SOURCE,
};

/// The MLP on one CUDA backend: its kernels and the loss's partial sums.
struct MlpDevice {
    kernels: KernelModule,
    loss_partials: Scratch,
}

impl WorkloadDevice for MlpDevice {
    fn load(backend: &CudaBackend) -> Result<Self> {
        Ok(MlpDevice {
            kernels: KernelModule::load(backend.context(), &KERNELS, Precision::FP32)?,
            loss_partials: backend.scratch(LOSS_PARTIALS, Element::F32)?,
        })
    }
}

impl MlpKernels for CudaBackend {
    fn load_kernels(&self) -> Result<()> {
        self.workload_device::<MlpDevice>().map(drop)
    }

    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        (din, dout): (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        use KernelArg::{Int, Int32, Pointer};
        let device = self.workload_device::<MlpDevice>()?;
        let key = || {
            format!("linear_forward {x:?} {params:?} {out:?} {rows} {din} {dout} {activation:?}")
        };
        self.graphed(Stream::Compute, key, || {
            let bias = params.sub(dout * din, dout);
            let (o, n) = (self.pointer(out)?, (rows * dout) as i64);
            let fill = [
                Pointer(o),
                Pointer(self.pointer(bias)?),
                Int32(rows as i32),
                Int32(dout as i32),
            ];
            self.launch(
                &device.kernels,
                "fill_rows",
                &fill,
                rows * dout,
                Stream::Compute,
            )?;
            let product = Gemm::linear(rows, din, dout).dense();
            self.product(&product, [x, params, out].map(Operand::whole), 1.0)?;
            if activation == Activation::Relu {
                self.launch(
                    &device.kernels,
                    "relu",
                    &[Pointer(o), Int(n)],
                    rows * dout,
                    Stream::Compute,
                )?;
            }
            Ok(())
        })
    }

    fn linear_backward(
        &self,
        x: Region,
        params: Region,
        output: Region,
        grad_out: Region,
        grads: Region,
        grad_in: Option<Region>,
        rows: usize,
        (din, dout): (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        use KernelArg::{Int, Int32, Pointer};
        let device = self.workload_device::<MlpDevice>()?;
        let key = || {
            format!(
                "linear_backward {x:?} {params:?} {output:?} {grad_out:?} {grads:?} {grad_in:?} {rows} {din} {dout} {activation:?}"
            )
        };
        self.graphed(Stream::Compute, key, || {
            let n = (rows * dout) as i64;
            if activation == Activation::Relu {
                let mask = [
                    Pointer(self.pointer(grad_out)?),
                    Pointer(self.pointer(output)?),
                    Int(n),
                ];
                self.launch(
                    &device.kernels,
                    "relu_mask",
                    &mask,
                    rows * dout,
                    Stream::Compute,
                )?;
            }
            // dX = dZ · W and dW = dZᵀ · x: the products `Gemm::backward` names.
            let [input_grad, weight_grad] = Gemm::linear(rows, din, dout).backward();
            self.product(
                &weight_grad.dense(),
                [grad_out, x, grads].map(Operand::whole),
                1.0,
            )?;
            let bias_grad = grads.sub(dout * din, dout);
            let sums = [
                Pointer(self.pointer(bias_grad)?),
                Pointer(self.pointer(grad_out)?),
                Int32(rows as i32),
                Int32(dout as i32),
            ];
            self.launch(
                &device.kernels,
                "column_sums_add",
                &sums,
                dout,
                Stream::Compute,
            )?;
            if let Some(grad_in) = grad_in {
                let operands = [grad_out, params, grad_in].map(Operand::whole);
                self.product(&input_grad.dense(), operands, 0.0)?;
            }
            Ok(())
        })
    }

    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        use KernelArg::{Float, Int, Pointer};
        let device = self.workload_device::<MlpDevice>()?;
        let (zp, yp) = (self.pointer(z)?, self.pointer(y)?);
        let n = z.len as i64;
        let grads = [
            Pointer(zp),
            Pointer(yp),
            Pointer(self.pointer(grad)?),
            Float(scale),
            Int(n),
        ];
        self.launch(&device.kernels, "mse_grad", &grads, z.len, Stream::Compute)?;
        let partials = self.scratch_pointer(&device.loss_partials);
        let parts = LOSS_PARTIALS.min(z.len);
        let sums = [
            Pointer(zp),
            Pointer(yp),
            Float(scale),
            Int(n),
            Int(parts as i64),
            Pointer(partials),
        ];
        self.launch(
            &device.kernels,
            "mse_loss_partials",
            &sums,
            parts,
            Stream::Compute,
        )?;
        let total = [
            Pointer(partials),
            Int(parts as i64),
            Pointer(self.loss_pointer(step)?),
        ];
        self.launch(&device.kernels, "sum_in_order", &total, 1, Stream::Compute)
    }

    fn adam(
        &self,
        params: Region,
        grads: Region,
        m: Region,
        v: Region,
        step: u32,
        lr: f32,
    ) -> Result<()> {
        use KernelArg::{Float, Int, Pointer};
        // An offloaded unit's step runs on the host, on the host arena (DESIGN §6.12).
        if let Some(host) = self.on_host(params) {
            return adam_on(host, [params, grads, m, v], step, lr);
        }
        let device = self.workload_device::<MlpDevice>()?;
        let (c1, c2) = (1.0 - BETA1.powi(step as i32), 1.0 - BETA2.powi(step as i32));
        let args = [
            Pointer(self.pointer(params)?),
            Pointer(self.pointer(grads)?),
            Pointer(self.pointer(m)?),
            Pointer(self.pointer(v)?),
            Int(params.len as i64),
            Float(lr),
            Float(c1),
            Float(c2),
            Float(BETA1),
            Float(BETA2),
            Float(EPSILON),
        ];
        self.launch(
            &device.kernels,
            "adam",
            &args,
            params.len,
            Stream::Communication,
        )
    }
}
