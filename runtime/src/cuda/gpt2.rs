//! [`Gpt2Kernels`] on the CUDA backend: each operation's [`Launch`]es (`gpt2::launches`) run
//! in order, kernels through NVRTC's [`Gpt2Functions`], products through cuBLAS; every region is
//! checked against the arena and every kernel's arguments against its signature before launch.

use super::CudaBackend;
use super::driver_error;
use super::gpt2_kernels::Gpt2Functions;
use super::kernels::per_element;
use crate::backend::{Region, Stream};
use crate::gpt2::kernels::AdamW;
use crate::gpt2::launches::{self as l, Arg, Kernel, Launch};
use crate::gpt2::{AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape};
use crate::{Error, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use std::ops::Range;
use std::sync::Arc;

/// A kernel argument as the launch passes it.
enum Value {
    Pointer(CUdeviceptr),
    Int(i64),
    Float(f32),
}

/// What GPT-2 adds to the backend: its kernels and the loss's f64 partial sums.
pub(super) struct Gpt2Device {
    functions: Gpt2Functions,
    partials: CudaSlice<f64>,
}

impl Gpt2Device {
    pub(super) fn new(ctx: &Arc<CudaContext>, compute: &Arc<CudaStream>) -> Result<Self> {
        Ok(Gpt2Device {
            functions: Gpt2Functions::load(ctx)?,
            partials: compute
                .alloc_zeros::<f64>(l::NLL_PARTIALS)
                .map_err(driver_error("allocating the loss's partial sums"))?,
        })
    }
}

impl CudaBackend {
    /// Enqueues `launches` in order on `stream` (products only on the compute stream, where
    /// cuBLAS runs); every region of every launch is checked against the arena before the
    /// first is enqueued.
    fn run_launches(&self, launches: &[Launch], stream: Stream) -> Result<()> {
        let device = &self.gpt2;
        for region in launches.iter().flat_map(Launch::regions) {
            self.ptr(region)?;
        }
        for launch in launches {
            match launch {
                Launch::Kernel(kernel) => self.launch_gpt2_kernel(device, kernel, stream)?,
                Launch::Product {
                    product,
                    operands,
                    beta,
                } => {
                    if stream != Stream::Compute {
                        return Err(Error::Backend(format!(
                            "a product on the {} stream: cuBLAS runs on the compute stream",
                            stream.name()
                        )));
                    }
                    let extents = product.extents();
                    let [a, b, c] = [0, 1, 2].map(|i| {
                        self.ptr(Region {
                            offset: operands[i],
                            len: extents[i],
                        })
                    });
                    self.strided_gemm(product, (a?, b?, c?), *beta)?;
                }
            }
        }
        Ok(())
    }

    fn launch_gpt2_kernel(
        &self,
        device: &Gpt2Device,
        kernel: &Kernel,
        stream: Stream,
    ) -> Result<()> {
        let function = device.functions.checked(kernel)?;
        let values = kernel
            .args
            .iter()
            .map(|arg| {
                Ok(match *arg {
                    Arg::Floats(region) => Value::Pointer(self.ptr(region)?),
                    Arg::LossPartials => {
                        Value::Pointer(device.partials.device_ptr(&self.compute).0)
                    }
                    Arg::LossSlot(step) => Value::Pointer(self.loss_slot(step)?),
                    Arg::Int(v) => Value::Int(v),
                    Arg::Float(v) => Value::Float(v),
                })
            })
            .collect::<Result<Vec<Value>>>()?;
        let mut builder = self.kernel(function, stream);
        for value in &values {
            match value {
                Value::Pointer(p) => builder.arg(p),
                Value::Int(v) => builder.arg(v),
                Value::Float(v) => builder.arg(v),
            };
        }
        self.launch(builder, per_element(kernel.threads))
    }
}

impl Gpt2Kernels for CudaBackend {
    fn embedding_forward(
        &self,
        shape: &Shape,
        params: Region,
        tokens: Region,
        out: Region,
    ) -> Result<()> {
        self.run_launches(
            &l::embedding_forward(shape, params, tokens, out),
            Stream::Compute,
        )
    }

    fn embedding_backward(
        &self,
        shape: &Shape,
        tokens: Region,
        grad_out: Region,
        grads: Region,
    ) -> Result<()> {
        self.run_launches(
            &l::embedding_backward(shape, tokens, grad_out, grads),
            Stream::Compute,
        )
    }

    fn block_forward(
        &self,
        shape: &Shape,
        params: Region,
        x: Region,
        out: Region,
        internals: Region,
    ) -> Result<()> {
        self.run_launches(
            &l::block_forward(shape, params, x, out, internals),
            Stream::Compute,
        )
    }

    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()> {
        self.run_launches(&l::block_backward(shape, regions), Stream::Compute)
    }

    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()> {
        let launches = l::head_forward(shape, head, scale, step);
        self.run_launches(&launches, Stream::Compute)
    }

    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()> {
        let launches = l::head_backward(shape, head, out, scale);
        self.run_launches(&launches, Stream::Compute)
    }

    fn adamw(
        &self,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        self.run_launches(&l::adamw(adam, step, hp, decayed), Stream::Communication)
    }
}
