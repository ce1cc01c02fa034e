//! [`Gpt2Kernels`] on the CUDA backend: each operation's [`Launch`]es ([`super::launches`]) run
//! in order, kernels of [`super::cuda_source`] through the backend's checked launch, products
//! through cuBLAS; every region of an operation is checked against the arena before its first
//! launch is enqueued.

use super::cuda_source::KERNELS;
use super::kernels::AdamW;
use super::launches::{self as l, Arg, Kernel, Launch};
use super::{AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape};
use crate::backend::{Region, Stream};
use crate::cuda::CudaBackend;
use crate::cuda::module::{Element, KernelArg, KernelModule};
use crate::cuda::work::{Scratch, WorkloadDevice};
use crate::{Error, Result};
use std::ops::Range;

/// GPT-2 on one CUDA backend: its kernels and the loss's f64 partial sums.
struct Gpt2Device {
    kernels: KernelModule,
    partials: Scratch,
}

impl WorkloadDevice for Gpt2Device {
    fn load(backend: &CudaBackend) -> Result<Self> {
        Ok(Gpt2Device {
            kernels: KernelModule::load(backend.context(), &KERNELS)?,
            partials: backend.scratch(l::NLL_PARTIALS, Element::F64)?,
        })
    }
}

/// Enqueues `launches` in order on `stream` (products only on the compute stream, where cuBLAS
/// runs); every region of every launch is checked against the arena before the first is
/// enqueued.
fn run_launches(backend: &CudaBackend, launches: &[Launch], stream: Stream) -> Result<()> {
    let device = backend.workload_device::<Gpt2Device>()?;
    for region in launches.iter().flat_map(Launch::regions) {
        backend.pointer(region)?;
    }
    for launch in launches {
        match launch {
            Launch::Kernel(kernel) => launch_kernel(backend, &device, kernel, stream)?,
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
                backend.product(product, *operands, *beta)?;
            }
        }
    }
    Ok(())
}

/// One kernel of `launches`, its arguments made device arguments.
fn launch_kernel(
    backend: &CudaBackend,
    device: &Gpt2Device,
    kernel: &Kernel,
    stream: Stream,
) -> Result<()> {
    let args = kernel
        .args
        .iter()
        .map(|arg| {
            Ok(match *arg {
                Arg::Floats(region) => KernelArg::Pointer(backend.pointer(region)?),
                Arg::LossPartials => KernelArg::Pointer(backend.scratch_pointer(&device.partials)),
                Arg::LossSlot(step) => KernelArg::Pointer(backend.loss_pointer(step)?),
                Arg::Int(v) => KernelArg::Int(v),
                Arg::Float(v) => KernelArg::Float(v),
            })
        })
        .collect::<Result<Vec<KernelArg>>>()?;
    backend.launch(&device.kernels, kernel.name, &args, kernel.threads, stream)
}

impl Gpt2Kernels for CudaBackend {
    fn load_kernels(&self) -> Result<()> {
        self.workload_device::<Gpt2Device>().map(drop)
    }

    fn embedding_forward(
        &self,
        shape: &Shape,
        params: Region,
        tokens: Region,
        out: Region,
    ) -> Result<()> {
        run_launches(
            self,
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
        run_launches(
            self,
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
        run_launches(
            self,
            &l::block_forward(shape, params, x, out, internals),
            Stream::Compute,
        )
    }

    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()> {
        run_launches(self, &l::block_backward(shape, regions), Stream::Compute)
    }

    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()> {
        let launches = l::head_forward(shape, head, scale, step);
        run_launches(self, &launches, Stream::Compute)
    }

    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()> {
        let launches = l::head_backward(shape, head, out, scale);
        run_launches(self, &launches, Stream::Compute)
    }

    fn adamw(
        &self,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        run_launches(
            self,
            &l::adamw(adam, step, hp, decayed),
            Stream::Communication,
        )
    }
}
