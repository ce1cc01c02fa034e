//! What a workload's CUDA side calls (`mlp::cuda`, `gpt2::cuda`): pointers to arena regions and
//! loss slots, launches of its own kernels with arguments checked against their parameters,
//! row-major products on cuBLAS, buffers of its own, and its per-backend state ([`WorkloadDevice`],
//! loaded once). Every pointer a kernel or a product gets comes from here, checked against what
//! the backend allocated, so none of these calls can be misused into an unchecked access.

use super::CudaBackend;
use super::driver_error;
use super::module::{DevicePointer, Element, KernelArg, KernelModule, per_element};
use crate::backend::{FloatFormat, Operand, Region, Stream};
use crate::gemm::Strided;
use crate::lock::recover;
use crate::{Error, Result};
use cublas_sys::cudaDataType;
use cudarc::cublas::{result as cublas, sys as cublas_sys};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use std::any::Any;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// A workload's state on one backend: its loaded kernels and buffers.
pub trait WorkloadDevice: Send + Sync + Sized + 'static {
    fn load(backend: &CudaBackend) -> Result<Self>;
}

/// The [`WorkloadDevice`]s a backend has loaded, one per type.
#[derive(Default)]
pub(super) struct WorkloadDevices(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

/// A buffer a workload asked the backend for (partial sums of its loss).
pub enum Scratch {
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
}

impl CudaBackend {
    /// The workload state `S` of this backend, loaded at the first call.
    pub fn workload_device<S: WorkloadDevice>(&self) -> Result<Arc<S>> {
        let mut loaded = recover(self.workloads.0.lock());
        if let Some(state) = loaded.iter().find_map(|s| s.clone().downcast::<S>().ok()) {
            return Ok(state);
        }
        let state = Arc::new(S::load(self)?);
        loaded.push(state.clone());
        Ok(state)
    }

    /// `region`'s first element, of the region's format, checked against the arena.
    pub fn pointer(&self, region: Region) -> Result<DevicePointer> {
        Ok(DevicePointer::new(
            self.ptr(region)?,
            Element::of(region.format),
        ))
    }

    /// The address of `operand`'s first element, once the `extent` elements from it are found
    /// inside its region (which is checked against the arena).
    fn operand(&self, operand: Operand, extent: usize) -> Result<CUdeviceptr> {
        let Operand { region, at } = operand;
        if at + extent > region.len {
            return Err(Error::Backend(format!(
                "a product's operand of {extent} elements from element {at} of a {}-element region",
                region.len
            )));
        }
        Ok(self.ptr(region)? + region.format.bytes() * at as u64)
    }

    /// Step `step`'s loss slot (one f32).
    pub fn loss_pointer(&self, step: usize) -> Result<DevicePointer> {
        Ok(DevicePointer::new(self.loss_slot(step)?, Element::F32))
    }

    /// `len` zeroed elements of device memory of the workload's own.
    pub fn scratch(&self, len: usize, element: Element) -> Result<Scratch> {
        let failed = driver_error("allocating a workload's buffer");
        Ok(match element {
            Element::F32 => Scratch::F32(self.compute.alloc_zeros::<f32>(len).map_err(failed)?),
            Element::F64 => Scratch::F64(self.compute.alloc_zeros::<f64>(len).map_err(failed)?),
            Element::Bf16 => {
                return Err(Error::Backend(
                    "a workload's buffer of bf16: the backend makes f32 and f64 ones".into(),
                ));
            }
        })
    }

    /// A pointer to `scratch`, which this backend allocated.
    pub fn scratch_pointer(&self, scratch: &Scratch) -> DevicePointer {
        match scratch {
            Scratch::F32(s) => DevicePointer::new(s.device_ptr(&self.compute).0, Element::F32),
            Scratch::F64(s) => DevicePointer::new(s.device_ptr(&self.compute).0, Element::F64),
        }
    }

    /// Enqueues `kernel` of `module` on `stream`, one thread per element of `threads`
    /// ([`per_element`]), once `args` are checked against its parameters.
    pub fn launch(
        &self,
        module: &KernelModule,
        kernel: &str,
        args: &[KernelArg],
        threads: usize,
        stream: Stream,
    ) -> Result<()> {
        let function = module.checked(kernel, args)?;
        let stream = self.stream(stream);
        self.clock.around(
            stream,
            || kernel.to_string(),
            0.0,
            || {
                let mut builder = stream.launch_builder(function);
                for arg in args {
                    match arg {
                        KernelArg::Pointer(p) => builder.arg(&p.address),
                        KernelArg::Int(v) => builder.arg(v),
                        KernelArg::Int32(v) => builder.arg(v),
                        KernelArg::Float(v) => builder.arg(v),
                    };
                }
                // SAFETY: the arguments were checked against the kernel's parameters (read from its
                // source), and every pointer is one the backend made: into the arena (checked by
                // `ptr`), a loss slot, or a buffer it allocated; each outlives the launch's completion.
                unsafe { builder.launch(per_element(threads)) }
                    .map(drop)
                    .map_err(driver_error("launching a kernel"))
            },
        )
    }

    /// Row-major C = op(A)·op(B) + beta·C for every product of the batch (each operand checked
    /// with the extent the product reads or writes), on the compute stream through cuBLAS's
    /// column-major `cublasGemmStridedBatchedEx` ([`Strided::cublas`]): A and B of one format, C
    /// of that format or fp32, accumulated in fp32 — bf16 operands on the tensor cores, fp32 ones
    /// as the backend's [`super::ProductMath`] says.
    pub fn product(&self, product: &Strided, operands: [Operand; 3], beta: f32) -> Result<()> {
        let extents = product.extents();
        let [a, b, c] = [0, 1, 2].map(|i| self.operand(operands[i], extents[i]));
        let (a, b, c) = (a?, b?, c?);
        let [fa, fb, fc] = operands.map(|o| o.region.format);
        if fa != fb || (fc != fa && fc != FloatFormat::Fp32) {
            return Err(Error::Backend(format!(
                "a product of {} by {} into {}: cuBLAS takes A and B of one format, C of theirs                  or fp32",
                fa.name(),
                fb.name(),
                fc.name()
            )));
        }
        let compute = match (fa, self.math) {
            (FloatFormat::Fp32, super::ProductMath::Tf32) => {
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
            }
            _ => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let call = BlasCall::of(product)?;
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        let gemm = product.gemm();
        let name = || {
            let batch = match gemm.batch {
                1 => String::new(),
                b => format!(" × {b}"),
            };
            format!("product {}×{}×{}{batch}", gemm.m, gemm.n, gemm.k)
        };
        self.clock.around(&self.compute, name, gemm.flops(), || {
            let types = [fa, fb, fc].map(blas_type);
            // SAFETY: the operands lie in the arena with the extents the product names, in the
            // formats passed (checked above); cuBLAS runs on the compute stream.
            unsafe { call.enqueue(self.blas, [a, b, c], types, beta, compute) }.map_err(|e| {
                Error::Backend(format!("cuBLAS GemmStridedBatchedEx {product:?}: {e:?}"))
            })
        })
    }
}

/// cuBLAS's name of a format.
fn blas_type(format: FloatFormat) -> cudaDataType {
    match format {
        FloatFormat::Fp32 => cudaDataType::CUDA_R_32F,
        FloatFormat::Bf16 => cudaDataType::CUDA_R_16BF,
    }
}

/// A matrix dimension as cuBLAS's 32-bit integer.
fn blas_int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Backend(format!("GEMM dimension {v} exceeds i32")))
}

/// [`Strided::cublas`]'s arguments in cuBLAS's own types (its "A" is the product's B).
pub(super) struct BlasCall {
    pub transa: cublas_sys::cublasOperation_t,
    pub transb: cublas_sys::cublasOperation_t,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub batch: i32,
}

impl BlasCall {
    /// Enqueues C = op(A)·op(B) + beta·C on `handle`'s stream through
    /// `cublasGemmStridedBatchedEx` (α = 1; α and β f32, as an fp32 compute type takes them;
    /// cuBLAS's A is the product's B).
    ///
    /// # Safety
    /// `a`, `b` and `c` must address device memory holding the product's extents in `types`
    /// ([A's, B's, C's]) that no other work touches while the stream runs the product.
    pub(super) unsafe fn enqueue(
        &self,
        handle: cublas_sys::cublasHandle_t,
        [a, b, c]: [CUdeviceptr; 3],
        [ta, tb, tc]: [cudaDataType; 3],
        beta: f32,
        compute: cublas_sys::cublasComputeType_t,
    ) -> std::result::Result<(), cublas::CublasError> {
        let alpha = 1.0f32;
        // SAFETY: the caller's contract; alpha and beta live across the call.
        unsafe {
            cublas::gemm_strided_batched_ex(
                handle,
                self.transa,
                self.transb,
                self.m,
                self.n,
                self.k,
                &alpha as *const f32 as *const c_void,
                b as *const c_void,
                tb,
                self.lda,
                self.stride_a,
                a as *const c_void,
                ta,
                self.ldb,
                self.stride_b,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                tc,
                self.ldc,
                self.stride_c,
                self.batch,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
    }

    pub(super) fn of(product: &Strided) -> Result<Self> {
        use cublas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let call = product.cublas();
        let stride = |s: usize| {
            i64::try_from(s).map_err(|_| Error::Backend(format!("GEMM stride {s} exceeds i64")))
        };
        Ok(BlasCall {
            transa: op(call.transa),
            transb: op(call.transb),
            m: blas_int(call.m)?,
            n: blas_int(call.n)?,
            k: blas_int(call.k)?,
            lda: blas_int(call.lda)?,
            ldb: blas_int(call.ldb)?,
            ldc: blas_int(call.ldc)?,
            stride_a: stride(call.stride_a)?,
            stride_b: stride(call.stride_b)?,
            stride_c: stride(call.stride_c)?,
            batch: blas_int(call.batch)?,
        })
    }
}
