//! The CUDA backend: one GPU per process, a compute stream and a communication stream, the arena
//! as one device allocation, layers on cuBLAS, element-wise kernels from NVRTC, collectives on
//! NCCL, CUDA events as marks.
//!
//! Operations only enqueue work; the executor orders the two streams with marks. Buffers are
//! addressed as `arena base + offset` (cudarc's per-buffer tracking is turned off: the plan's
//! lifetimes and the executor's marks already order every access).

use super::driver_error;
use super::gpt2::Gpt2Device;
use super::kernels::{Kernels, per_element};
use super::memory;
use super::nccl::{DeviceFloats, Nccl, NcclSetup};
use crate::backend::{Allocation, Backend, DeviceMemory, Region, Stream};
use crate::gemm::{Gemm, Strided};
use crate::mlp::{self, BETA1, BETA2, EPSILON};
use crate::{Error, Result};
use cudarc::cublas::{result as cublas, sys as cublas_sys};
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchArgs,
    LaunchConfig, PinnedHostSlice, PushKernelArg, result as driver,
};
use std::sync::{Arc, Mutex};

/// Pinned buffers uploads go through, used round-robin (an upload waits only for the copy made
/// from the same buffer `STAGING_SLOTS` uploads earlier).
const STAGING_SLOTS: usize = 4;

struct StagingSlot {
    buffer: PinnedHostSlice<f32>,
    copied: Option<CudaEvent>,
}

/// One GPU of one rank.
pub struct CudaBackend {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) compute: Arc<CudaStream>,
    communication: Arc<CudaStream>,
    pub(super) blas: cublas_sys::cublasHandle_t,
    kernels: Kernels,
    pub(super) gpt2: Gpt2Device,
    nccl: Nccl,
    arena: Option<CudaSlice<f32>>,
    base: CUdeviceptr,
    elements: usize,
    losses: Option<CudaSlice<f32>>,
    /// The loss's partial sums ([`mlp::LOSS_PARTIALS`] of them).
    loss_partials: Option<CudaSlice<f32>>,
    loss_slots: usize,
    staging: Mutex<(usize, Vec<StagingSlot>)>,
    memory: DeviceMemory,
}

// SAFETY: the cuBLAS handle is used only on the compute stream's host thread during the steps
// and from the main thread outside them; the arena's concurrent accesses never overlap (the
// executor's ordering, as for the CPU backend); the staging ring is behind a mutex.
unsafe impl Sync for CudaBackend {}
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    /// Opens GPU `ordinal`, creates both streams, cuBLAS on the compute stream, the kernels, and
    /// NCCL on the communication stream. Call [`super::libraries::prepare`] first.
    pub fn new(ordinal: usize, setup: NcclSetup) -> Result<Self> {
        let count = CudaContext::device_count().map_err(driver_error("counting GPUs"))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::Backend(format!(
                "CUDA: GPU {ordinal} asked for, {count} visible (CUDA_VISIBLE_DEVICES, one process per GPU)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error("opening the GPU"))?;
        // SAFETY: every cross-stream access is ordered by the executor's marks.
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx
            .new_stream()
            .map_err(driver_error("creating a stream"))?;
        let communication = ctx
            .new_stream()
            .map_err(driver_error("creating a stream"))?;
        let blas = cublas::create_handle()
            .map_err(|e| Error::Backend(format!("cuBLAS: creating a handle: {e:?}")))?;
        // SAFETY: the handle was just created; the stream outlives it (both live in `self`).
        unsafe {
            cublas::set_stream(blas, compute.cu_stream() as _)
                .map_err(|e| Error::Backend(format!("cuBLAS: setting its stream: {e:?}")))?;
        }
        let kernels = Kernels::load(&ctx)?;
        let gpt2 = Gpt2Device::new(&ctx, &compute)?;
        ctx.bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        let nccl = Nccl::new(setup)?;
        ctx.synchronize()
            .map_err(driver_error("finishing the set-up"))?;
        let (before_arena, total) = memory::used_and_total_bytes(&ctx)?;
        let memory = DeviceMemory {
            total,
            before_arena,
            pool_before_arena: memory::pool(&ctx)?,
            after_arena: 0,
            now: 0,
            pool_now: Default::default(),
        };
        Ok(CudaBackend {
            ctx,
            compute,
            communication,
            blas,
            kernels,
            gpt2,
            nccl,
            arena: None,
            base: 0,
            elements: 0,
            losses: None,
            loss_partials: None,
            loss_slots: 0,
            staging: Mutex::new((0, Vec::new())),
            memory,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn device_name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    fn stream(&self, stream: Stream) -> &Arc<CudaStream> {
        match stream {
            Stream::Compute => &self.compute,
            Stream::Communication => &self.communication,
        }
    }

    /// The device address of step `step`'s loss slot.
    pub(super) fn loss_slot(&self, step: usize) -> Result<CUdeviceptr> {
        if step >= self.loss_slots {
            return Err(Error::Backend(format!(
                "loss slot {step} was not allocated"
            )));
        }
        let losses = self.losses.as_ref().expect("allocated with the slots");
        let (base, _) = losses.device_ptr(&self.compute);
        Ok(base + 4 * step as u64)
    }

    /// The device address of a region (checked against the arena).
    pub(super) fn ptr(&self, r: Region) -> Result<CUdeviceptr> {
        if r.offset + r.len > self.elements {
            return Err(Error::Backend(format!(
                "region {}..{} lies outside the {}-element arena",
                r.offset,
                r.offset + r.len,
                self.elements
            )));
        }
        Ok(self.base + 4 * r.offset as u64)
    }

    /// A region as the collectives take it (checked against the arena).
    fn floats(&self, r: Region) -> Result<DeviceFloats> {
        let ptr = self.ptr(r)?;
        // SAFETY: `ptr` checked the region against the arena, which lives as long as the backend
        // and is freed only after its streams are synchronised; the executor orders every access.
        Ok(unsafe { DeviceFloats::new(ptr, r.len) })
    }

    pub(super) fn kernel<'a>(
        &'a self,
        function: &'a CudaFunction,
        stream: Stream,
    ) -> LaunchArgs<'a> {
        self.stream(stream).launch_builder(function)
    }

    pub(super) fn launch(&self, mut builder: LaunchArgs<'_>, config: LaunchConfig) -> Result<()> {
        // SAFETY: the arguments match the kernel's signature (in `kernels::SOURCE`, or checked
        // against `gpt2_kernels::SOURCE`'s by `Gpt2Functions::checked`) and every pointer lies
        // inside the arena (checked by `ptr`) or in a buffer the backend allocated.
        unsafe { builder.launch(config) }
            .map(drop)
            .map_err(driver_error("launching a kernel"))
    }

    /// Row-major C = op(A)·op(B) + beta·C on dense operands on the compute stream.
    fn gemm(
        &self,
        product: &Gemm,
        (a, b, c): (CUdeviceptr, CUdeviceptr, CUdeviceptr),
        beta: f32,
    ) -> Result<()> {
        self.strided_gemm(&product.dense(), (a, b, c), beta)
    }

    /// Row-major C = op(A)·op(B) + beta·C for every product of the batch on the compute stream,
    /// through cuBLAS's column-major call ([`Strided::cublas`]).
    pub(super) fn strided_gemm(
        &self,
        product: &Strided,
        (a, b, c): (CUdeviceptr, CUdeviceptr, CUdeviceptr),
        beta: f32,
    ) -> Result<()> {
        let call = BlasCall::of(product)?;
        let alpha = 1.0f32;
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        // SAFETY: the pointers lie in the arena with the extents the product names (the layout
        // sized every region from the same dimensions, and callers check the extents); alpha
        // and beta live across the call.
        unsafe {
            cublas::sgemm_strided_batched(
                self.blas,
                call.transa,
                call.transb,
                call.m,
                call.n,
                call.k,
                &alpha,
                b as *const f32,
                call.lda,
                call.stride_a,
                a as *const f32,
                call.ldb,
                call.stride_b,
                &beta,
                c as *mut f32,
                call.ldc,
                call.stride_c,
                call.batch,
            )
        }
        .map_err(|e| Error::Backend(format!("cuBLAS sgemm {product:?}: {e:?}")))
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

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.synchronize();
        // SAFETY: created in `new`, destroyed once; no work is in flight after synchronize.
        let _ = unsafe { cublas::destroy_handle(self.blas) };
    }
}

impl Backend for CudaBackend {
    type Mark = Arc<CudaEvent>;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn rank(&self) -> usize {
        self.nccl.rank()
    }
    fn world_size(&self) -> usize {
        self.nccl.size()
    }
    fn allocate(&mut self, sizes: Allocation) -> Result<()> {
        let (elements, loss_slots) = (sizes.arena_elements, sizes.loss_slots);
        let mb = (elements * 4) >> 20;
        let arena = self
            .compute
            .alloc_zeros::<f32>(elements.max(1))
            .map_err(driver_error(&format!("allocating the {mb} MiB arena")))?;
        let losses = self
            .compute
            .alloc_zeros::<f32>(loss_slots.max(1))
            .map_err(driver_error("allocating the loss slots"))?;
        let loss_partials = self
            .compute
            .alloc_zeros::<f32>(mlp::LOSS_PARTIALS)
            .map_err(driver_error("allocating the loss's partial sums"))?;
        let (base, _) = arena.device_ptr(&self.compute);
        self.base = base;
        self.elements = elements;
        self.arena = Some(arena);
        self.losses = Some(losses);
        self.loss_partials = Some(loss_partials);
        self.loss_slots = loss_slots;
        self.compute
            .synchronize()
            .map_err(driver_error("allocating"))?;
        self.memory.after_arena = memory::used_bytes(&self.ctx)?;
        Ok(())
    }
    fn device_memory(&self) -> Result<Option<DeviceMemory>> {
        self.synchronize()?;
        Ok(Some(DeviceMemory {
            now: memory::used_bytes(&self.ctx)?,
            pool_now: memory::pool(&self.ctx)?,
            ..self.memory
        }))
    }
    fn upload(&self, region: Region, data: &[f32]) -> Result<()> {
        if data.len() != region.len {
            return Err(Error::Backend(format!(
                "upload of {} elements into a region of {}",
                data.len(),
                region.len
            )));
        }
        let dst = self.ptr(region)?;
        let mut staging = self.staging.lock().expect("staging lock is never poisoned");
        let (next, slots) = &mut *staging;
        if slots.len() < STAGING_SLOTS {
            // SAFETY: the buffer is written in full below before any copy reads it.
            let buffer = unsafe { self.ctx.alloc_pinned::<f32>(data.len()) }
                .map_err(driver_error("allocating pinned memory"))?;
            slots.push(StagingSlot {
                buffer,
                copied: None,
            });
        }
        let k = *next % slots.len();
        *next += 1;
        let slot = &mut slots[k];
        if let Some(event) = slot.copied.take() {
            event
                .synchronize()
                .map_err(driver_error("waiting for an upload"))?;
        }
        if slot.buffer.len() < data.len() {
            // SAFETY: as above.
            slot.buffer = unsafe { self.ctx.alloc_pinned::<f32>(data.len()) }
                .map_err(driver_error("allocating pinned memory"))?;
        }
        let host = slot
            .buffer
            .as_mut_slice()
            .map_err(driver_error("pinned memory"))?;
        host[..data.len()].copy_from_slice(data);
        // SAFETY: `dst` spans `data.len()` elements of the arena; the pinned source stays
        // untouched until the event recorded after the copy completes.
        unsafe {
            driver::memcpy_htod_async(dst, &host[..data.len()], self.compute.cu_stream())
                .map_err(driver_error("copying to the GPU"))?;
        }
        slot.copied = Some(
            self.compute
                .record_event(None)
                .map_err(driver_error("recording an event"))?,
        );
        Ok(())
    }
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()> {
        let src = self.ptr(region)?;
        self.synchronize()?;
        // SAFETY: `src` spans `out.len()` = region.len elements; the stream is synchronised
        // before `out` is read.
        unsafe {
            driver::memcpy_dtoh_async(&mut out[..region.len], src, self.compute.cu_stream())
                .map_err(driver_error("copying from the GPU"))?;
        }
        self.compute
            .synchronize()
            .map_err(driver_error("copying from the GPU"))
    }
    fn losses(&self, steps: usize) -> Result<Vec<f32>> {
        if steps > self.loss_slots {
            return Err(Error::Backend(format!(
                "{steps} losses asked, {} slots allocated",
                self.loss_slots
            )));
        }
        self.synchronize()?;
        let losses = self.losses.as_ref().expect("allocated with the slots");
        let all = self
            .compute
            .clone_dtoh(losses)
            .map_err(driver_error("copying the losses"))?;
        Ok(all[..steps].to_vec())
    }
    fn all_gather(&self, shard: Region, full: Region) -> Result<()> {
        let (send, recv) = (self.floats(shard)?, self.floats(full)?);
        self.nccl.all_gather(send, recv, &self.communication)
    }
    fn reduce_scatter(&self, full: Region, shard: Region) -> Result<()> {
        let (send, recv) = (self.floats(full)?, self.floats(shard)?);
        self.nccl.reduce_scatter(send, recv, &self.communication)
    }
    fn all_reduce(&self, data: Region) -> Result<()> {
        let data = self.floats(data)?;
        self.nccl.all_reduce(data, data, &self.communication)
    }
    fn all_reduce_host(&self, data: &mut [f32]) -> Result<()> {
        let device = self
            .communication
            .clone_htod(data)
            .map_err(driver_error("copying to the GPU"))?;
        let (p, _) = device.device_ptr(&self.communication);
        // SAFETY: `device` holds `data.len()` floats and lives until the stream is synchronised
        // below; nothing else uses it.
        let floats = unsafe { DeviceFloats::new(p, data.len()) };
        self.nccl.all_reduce(floats, floats, &self.communication)?;
        self.communication
            .memcpy_dtoh(&device, data)
            .map_err(driver_error("copying from the GPU"))?;
        self.communication
            .synchronize()
            .map_err(driver_error("reducing host values"))?;
        Ok(())
    }
    fn mark(&self, stream: Stream) -> Result<Arc<CudaEvent>> {
        self.stream(stream)
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map(Arc::new)
            .map_err(driver_error("recording an event"))
    }
    fn wait_mark(&self, stream: Stream, mark: &Arc<CudaEvent>) -> Result<()> {
        self.stream(stream)
            .wait(mark)
            .map_err(driver_error("waiting on an event"))
    }
    fn elapsed_us(&self, from: &Arc<CudaEvent>, to: &Arc<CudaEvent>) -> Result<f64> {
        from.elapsed_ms(to)
            .map(|ms| ms as f64 * 1e3)
            .map_err(driver_error("timing events"))
    }
    fn synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(driver_error("synchronising"))
    }
    fn host_computes(&self) -> bool {
        false
    }
}

impl crate::mlp::MlpKernels for CudaBackend {
    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        (din, dout): (usize, usize),
        relu: bool,
    ) -> Result<()> {
        let (x, w, o) = (self.ptr(x)?, self.ptr(params)?, self.ptr(out)?);
        let bias = w + 4 * (dout * din) as u64;
        let (r, c) = (rows as i32, dout as i32);
        let mut k = self.kernel(&self.kernels.fill_rows, Stream::Compute);
        k.arg(&o).arg(&bias).arg(&r).arg(&c);
        self.launch(k, per_element(rows * dout))?;
        self.gemm(&Gemm::linear(rows, din, dout), (x, w, o), 1.0)?;
        if relu {
            let n = (rows * dout) as i64;
            let mut k = self.kernel(&self.kernels.relu, Stream::Compute);
            k.arg(&o).arg(&n);
            self.launch(k, per_element(rows * dout))?;
        }
        Ok(())
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
        relu: bool,
    ) -> Result<()> {
        let (x, w, a, dz, g) = (
            self.ptr(x)?,
            self.ptr(params)?,
            self.ptr(output)?,
            self.ptr(grad_out)?,
            self.ptr(grads)?,
        );
        let n = (rows * dout) as i64;
        if relu {
            let mut k = self.kernel(&self.kernels.relu_mask, Stream::Compute);
            k.arg(&dz).arg(&a).arg(&n);
            self.launch(k, per_element(rows * dout))?;
        }
        // dX = dZ · W and dW = dZᵀ · x: the products `Gemm::backward` names.
        let [input_grad, weight_grad] = Gemm::linear(rows, din, dout).backward();
        self.gemm(&weight_grad, (dz, x, g), 0.0)?;
        let gb = g + 4 * (dout * din) as u64;
        let (r, c) = (rows as i32, dout as i32);
        let mut k = self.kernel(&self.kernels.column_sums, Stream::Compute);
        k.arg(&gb).arg(&dz).arg(&r).arg(&c);
        self.launch(k, per_element(dout))?;
        if let Some(grad_in) = grad_in {
            self.gemm(&input_grad, (dz, w, self.ptr(grad_in)?), 0.0)?;
        }
        Ok(())
    }
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        let (zp, yp, gp) = (self.ptr(z)?, self.ptr(y)?, self.ptr(grad)?);
        let loss = self.loss_slot(step)?;
        let n = z.len as i64;
        let mut k = self.kernel(&self.kernels.mse_grad, Stream::Compute);
        k.arg(&zp).arg(&yp).arg(&gp).arg(&scale).arg(&n);
        self.launch(k, per_element(z.len))?;
        let partials = self
            .loss_partials
            .as_ref()
            .expect("allocated with the slots");
        let (partials, _) = partials.device_ptr(&self.compute);
        let parts = mlp::LOSS_PARTIALS.min(z.len);
        let parts_arg = parts as i64;
        let mut k = self.kernel(&self.kernels.mse_loss_partials, Stream::Compute);
        k.arg(&zp)
            .arg(&yp)
            .arg(&scale)
            .arg(&n)
            .arg(&parts_arg)
            .arg(&partials);
        self.launch(k, per_element(parts))?;
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut k = self.kernel(&self.kernels.sum_in_order, Stream::Compute);
        k.arg(&partials).arg(&parts_arg).arg(&loss);
        self.launch(k, one)
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
        let (p, g, mp, vp) = (
            self.ptr(params)?,
            self.ptr(grads)?,
            self.ptr(m)?,
            self.ptr(v)?,
        );
        let n = params.len as i64;
        let (c1, c2) = (1.0 - BETA1.powi(step as i32), 1.0 - BETA2.powi(step as i32));
        let config = per_element(params.len);
        let mut k = self.kernel(&self.kernels.adam, Stream::Communication);
        k.arg(&p)
            .arg(&g)
            .arg(&mp)
            .arg(&vp)
            .arg(&n)
            .arg(&lr)
            .arg(&c1)
            .arg(&c2);
        k.arg(&BETA1).arg(&BETA2).arg(&EPSILON);
        self.launch(k, config)
    }
}
