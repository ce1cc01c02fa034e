//! [`Gpt2Kernels`] on the CUDA backend: each operation's [`Launch`]es ([`super::launches`]) run
//! in order, kernels of [`super::cuda_source`] (compiled for the shape's precision policy at its
//! first use) through the backend's checked launch, products through cuBLAS; every region of an
//! operation is checked against the arena before its first launch is enqueued.

use super::cpu::adamw_on;
use super::cuda_source::KERNELS;
use super::kernels::AdamW;
use super::launches::{self as l, Arg, Kernel, Launch};
use super::{AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape};
use crate::backend::{Region, Stream};
use crate::cuda::CudaBackend;
use crate::cuda::module::{DevicePointer, Element, KernelArg, KernelModule};
use crate::cuda::work::{Scratch, WorkloadDevice};
use crate::lock::recover;
use crate::{Error, Result};
use shardplan_scheduler::precision::Precision;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// GPT-2 on one CUDA backend: its kernels per precision policy, the loss's f64 partial sums and
/// the token links of the embedding's backward (grown to the largest batch seen).
struct Gpt2Device {
    kernels: Mutex<HashMap<Precision, Arc<KernelModule>>>,
    partials: Scratch,
    links: Mutex<Option<(usize, Scratch)>>,
}

impl WorkloadDevice for Gpt2Device {
    fn load(backend: &CudaBackend) -> Result<Self> {
        Ok(Gpt2Device {
            kernels: Mutex::default(),
            partials: backend.scratch(l::NLL_PARTIALS, Element::F64)?,
            links: Mutex::default(),
        })
    }
}

impl Gpt2Device {
    /// The kernels compiled for `precision`, at their first use.
    fn kernels(&self, backend: &CudaBackend, precision: Precision) -> Result<Arc<KernelModule>> {
        let mut loaded = recover(self.kernels.lock());
        if let Some(module) = loaded.get(&precision) {
            return Ok(module.clone());
        }
        let module = Arc::new(KernelModule::load(backend.context(), &KERNELS, precision)?);
        loaded.insert(precision, module.clone());
        Ok(module)
    }

    /// The token links' buffer, at least `len` floats.
    fn links(&self, backend: &CudaBackend, len: usize) -> Result<DevicePointer> {
        let mut links = recover(self.links.lock());
        if links.as_ref().is_none_or(|(have, _)| *have < len) {
            *links = Some((len, backend.scratch(len, Element::F32)?));
        }
        let (_, scratch) = links.as_ref().expect("allocated above");
        Ok(backend.scratch_pointer(scratch))
    }
}

/// Enqueues `launches` in order on `stream` (products only on the compute stream, where cuBLAS
/// runs), as one CUDA graph when the backend replays graphs; every region of every launch is
/// checked against the arena before the first is enqueued.
fn run_launches(
    backend: &CudaBackend,
    shape: &Shape,
    launches: &[Launch],
    stream: Stream,
) -> Result<()> {
    let device = backend.workload_device::<Gpt2Device>()?;
    let kernels = device.kernels(backend, shape.precision)?;
    for region in launches.iter().flat_map(Launch::regions) {
        backend.pointer(region)?;
    }
    let links = match launches.iter().any(uses_token_links) {
        true => Some(device.links(backend, l::token_links_len(shape.rows()))?),
        false => None,
    };
    let devices = Devices {
        device: &device,
        kernels: &kernels,
        links,
    };
    // The operation's launches (and the links' buffer they may read) are its key: the same
    // list replays the same graph.
    let key = || format!("{links:?} {launches:?}");
    backend.graphed(stream, key, || {
        for launch in launches {
            match launch {
                Launch::Kernel(kernel) => launch_kernel(backend, &devices, kernel, stream)?,
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
    })
}

fn uses_token_links(launch: &Launch) -> bool {
    matches!(launch, Launch::Kernel(k) if k.args.contains(&Arg::TokenLinks))
}

/// What an operation's kernels run with: the module of its policy and the backend's buffers.
struct Devices<'a> {
    device: &'a Gpt2Device,
    kernels: &'a KernelModule,
    links: Option<DevicePointer>,
}

/// One kernel of `launches`, its arguments made device arguments.
fn launch_kernel(
    backend: &CudaBackend,
    devices: &Devices,
    kernel: &Kernel,
    stream: Stream,
) -> Result<()> {
    let args = kernel
        .args
        .iter()
        .map(|arg| {
            Ok(match *arg {
                Arg::Floats(region) => KernelArg::Pointer(backend.pointer(region)?),
                Arg::TokenLinks => KernelArg::Pointer(
                    devices
                        .links
                        .expect("allocated for the operation's launches"),
                ),
                Arg::LossPartials => {
                    KernelArg::Pointer(backend.scratch_pointer(&devices.device.partials))
                }
                Arg::LossSlot(step) => KernelArg::Pointer(backend.loss_pointer(step)?),
                Arg::Int(v) => KernelArg::Int(v),
                Arg::Float(v) => KernelArg::Float(v),
            })
        })
        .collect::<Result<Vec<KernelArg>>>()?;
    backend.launch(devices.kernels, kernel.name, &args, kernel.threads, stream)
}

impl Gpt2Kernels for CudaBackend {
    fn load_kernels(&self, shape: &Shape) -> Result<()> {
        let device = self.workload_device::<Gpt2Device>()?;
        device.kernels(self, shape.precision)?;
        if shape.precision.has_master() {
            self.load_conversions()?;
        }
        Ok(())
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
            shape,
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
            shape,
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
            shape,
            &l::block_forward(shape, params, x, out, internals),
            Stream::Compute,
        )
    }

    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()> {
        run_launches(
            self,
            shape,
            &l::block_backward(shape, regions),
            Stream::Compute,
        )
    }

    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()> {
        let launches = l::head_forward(shape, head, scale, step);
        run_launches(self, shape, &launches, Stream::Compute)
    }

    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()> {
        let launches = l::head_backward(shape, head, out, scale);
        run_launches(self, shape, &launches, Stream::Compute)
    }

    fn adamw(
        &self,
        shape: &Shape,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        // An offloaded unit's step runs on the host, on the host arena (DESIGN §6.12).
        if let Some(host) = self.on_host(adam.params) {
            return adamw_on(host, adam, step, hp, decayed);
        }
        run_launches(
            self,
            shape,
            &l::adamw(adam, step, hp, decayed),
            Stream::Communication,
        )
    }
}
