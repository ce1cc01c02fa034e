//! The CUDA backend: one GPU per process, a compute stream and a communication stream, the arena
//! as one device allocation, cuBLAS on the compute stream, collectives on NCCL, CUDA events as
//! marks. The workloads' kernels are theirs (`mlp::cuda`, `gpt2::cuda`): they launch them through
//! [`super::work`]'s checked API.
//!
//! Operations only enqueue work; the executor orders the two streams with marks. Buffers are
//! addressed as `arena base + offset` (cudarc's per-buffer tracking is turned off: the plan's
//! lifetimes and the executor's marks already order every access).

use super::clock::LaunchClock;
use super::convert::Conversions;
use super::driver_error;
use super::graphs::Graphs;
use super::memory;
use super::module::KernelArg;
use super::nccl::{DeviceBuffer, Nccl, NcclSetup};
use super::pinned::PinnedArena;
use super::storage::{pack_bf16, unpack_bf16};
use super::work::WorkloadDevices;
use crate::backend::{
    Allocation, Backend, DeviceMemory, FloatFormat, Group, HostMemory, LaunchTime, Region, Stream,
};
use crate::lock::recover;
use crate::{Error, Result};
use cudarc::cublas::{result as cublas, sys as cublas_sys};
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, result as driver,
};
use shardplan_scheduler::size::format_bytes;
use std::sync::{Arc, Mutex};

/// Pinned buffers uploads go through, used round-robin (an upload waits only for the copy made
/// from the same buffer `STAGING_SLOTS` uploads earlier).
const STAGING_SLOTS: usize = 4;

struct StagingSlot {
    buffer: PinnedHostSlice<f32>,
    copied: Option<CudaEvent>,
}

/// How cuBLAS computes the fp32 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductMath {
    /// fp32 arithmetic throughout (the default; the kernels match the CPU backend).
    Fp32,
    /// TF32 tensor cores (`CUBLAS_TF32_TENSOR_OP_MATH`): fp32 operands rounded to 10 mantissa
    /// bits, fp32 accumulation, as PyTorch's `allow_tf32`. Opt-in (`--tf32`).
    Tf32,
}

/// How a CUDA backend runs its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    pub math: ProductMath,
    /// Operations replayed as CUDA graphs ([`super::graphs`]; `--cuda-graphs`).
    pub graphs: bool,
}

/// One GPU of one rank.
pub struct CudaBackend {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) compute: Arc<CudaStream>,
    communication: Arc<CudaStream>,
    /// The copies between the arena and the host arena (DESIGN §6.12).
    copies: Arc<CudaStream>,
    pub(super) blas: cublas_sys::cublasHandle_t,
    nccl: Nccl,
    arena: Option<CudaSlice<f32>>,
    base: CUdeviceptr,
    elements: usize,
    /// An offloading plan's host arena, after the arena's words (none without offload).
    host: Option<PinnedArena>,
    losses: Option<CudaSlice<f32>>,
    loss_slots: usize,
    /// Each workload's kernels and buffers, loaded at its first use.
    pub(super) workloads: WorkloadDevices,
    staging: Mutex<(usize, Vec<StagingSlot>)>,
    memory: DeviceMemory,
    pub(super) math: ProductMath,
    /// Times each launch while `profile measure --launch-times` asks for it.
    pub(super) clock: LaunchClock,
    pub(super) graphs: Graphs,
}

// SAFETY: the cuBLAS handle is used only on the compute stream's host thread during the steps
// and from the main thread outside them; the arena's concurrent accesses never overlap (the
// executor's ordering, as for the CPU backend); the staging ring is behind a mutex.
unsafe impl Sync for CudaBackend {}
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    /// Opens GPU `ordinal`, creates both streams, cuBLAS on the compute stream (its fp32
    /// products in `options.math`), and NCCL on the communication stream. Call
    /// [`super::libraries::prepare`] first.
    pub fn new(ordinal: usize, setup: NcclSetup, options: CudaOptions) -> Result<Self> {
        let math = options.math;
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
        let copies = ctx
            .new_stream()
            .map_err(driver_error("creating a stream"))?;
        let blas = cublas::create_handle()
            .map_err(|e| Error::Backend(format!("cuBLAS: creating a handle: {e:?}")))?;
        // SAFETY: the handle was just created; the stream outlives it (both live in `self`).
        unsafe {
            cublas::set_stream(blas, compute.cu_stream() as _)
                .map_err(|e| Error::Backend(format!("cuBLAS: setting its stream: {e:?}")))?;
        }
        if math == ProductMath::Tf32 {
            let tf32 = cublas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH;
            // SAFETY: the handle was just created and is used by no other thread yet.
            unsafe { cublas_sys::cublasSetMathMode(blas, tf32) }
                .result()
                .map_err(|e| Error::Backend(format!("cuBLAS: TF32 math: {e:?}")))?;
        }
        ctx.bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        let nccl = Nccl::new(setup)?;
        ctx.synchronize()
            .map_err(driver_error("finishing the set-up"))?;
        let (_, total) = memory::used_and_total_bytes(&ctx)?;
        let memory = DeviceMemory {
            total,
            ..Default::default()
        };
        Ok(CudaBackend {
            ctx,
            compute,
            communication,
            copies,
            blas,
            nccl,
            arena: None,
            base: 0,
            elements: 0,
            host: None,
            losses: None,
            loss_slots: 0,
            workloads: WorkloadDevices::default(),
            staging: Mutex::new((0, Vec::new())),
            memory,
            math,
            clock: LaunchClock::default(),
            graphs: Graphs::new(options.graphs),
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn device_name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    pub(super) fn stream(&self, stream: Stream) -> &Arc<CudaStream> {
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

    /// The device address of a region (its words checked against the arena).
    pub(super) fn ptr(&self, r: Region) -> Result<CUdeviceptr> {
        if r.offset + r.words() > self.elements {
            return Err(Error::Backend(format!(
                "region of words {}..{} lies outside the {}-word arena",
                r.offset,
                r.offset + r.words(),
                self.elements
            )));
        }
        Ok(self.base + 4 * r.offset as u64)
    }

    /// The host arena, where `region` lies in it (DESIGN §6.12: an offloaded unit's host state).
    pub(crate) fn on_host(&self, region: Region) -> Option<&PinnedArena> {
        (self.host.as_ref()).filter(|host| host.host_part(region).is_some())
    }

    /// The host arena, or why there is none.
    fn host_arena(&self) -> Result<&PinnedArena> {
        self.host.as_ref().ok_or_else(|| {
            Error::Backend(
                "a copy between the arenas, and no host arena was allocated (a plan without \
                 offload)"
                    .into(),
            )
        })
    }

    /// A region as the collectives take it (checked against the arena).
    fn buffer(&self, r: Region) -> Result<DeviceBuffer> {
        let ptr = self.ptr(r)?;
        // SAFETY: `ptr` checked the region against the arena, which lives as long as the backend
        // and is freed only after its streams are synchronised; the executor orders every access.
        Ok(unsafe { DeviceBuffer::new(ptr, r.len, r.format) })
    }

    /// `from` converted into `to` (another format) on the compute stream.
    fn convert(&self, from: Region, to: Region) -> Result<()> {
        let conversions = self.workload_device::<Conversions>()?;
        let kernel = match to.format {
            FloatFormat::Bf16 => "narrow_values",
            FloatFormat::Fp32 => "widen_values",
        };
        let args = [
            KernelArg::Pointer(self.pointer(from)?),
            KernelArg::Pointer(self.pointer(to)?),
            KernelArg::Int(from.len as i64),
        ];
        self.launch(&conversions.0, kernel, &args, from.len, Stream::Compute)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.synchronize();
        // SAFETY: created in `new`, destroyed once; no work is in flight after synchronize.
        let _ = unsafe { cublas::destroy_handle(self.blas) };
    }
}

impl CudaBackend {
    /// Refuses a collective among a group smaller than the world (no communicator for it).
    fn world_only(&self, group: Group) -> Result<()> {
        let world = self.world_size();
        match group.normalized(world) {
            Group::World => Ok(()),
            group => Err(Error::Backend(format!(
                "a collective among {}: the CUDA backend has only the world's communicator",
                group.describe(world)
            ))),
        }
    }
}

impl Backend for CudaBackend {
    type Mark = Arc<CudaEvent>;

    fn name(&self) -> &'static str {
        match (self.math, self.graphs.enabled()) {
            (ProductMath::Fp32, false) => "cuda",
            (ProductMath::Tf32, false) => "cuda (tf32 products)",
            (ProductMath::Fp32, true) => "cuda (graphs)",
            (ProductMath::Tf32, true) => "cuda (tf32 products, graphs)",
        }
    }
    fn rank(&self) -> usize {
        self.nccl.rank()
    }
    fn world_size(&self) -> usize {
        self.nccl.size()
    }
    fn allocate(&mut self, sizes: Allocation) -> Result<()> {
        let (elements, loss_slots) = (sizes.arena_elements, sizes.loss_slots);
        // The set-up ends here: context, libraries, communicator and the workload's kernels.
        self.synchronize()?;
        self.memory.before_arena = memory::used_bytes(&self.ctx)?;
        let needed = 4 * (elements + loss_slots) as u64;
        let free = self.memory.total.saturating_sub(self.memory.before_arena);
        if needed > free {
            return Err(Error::NotEnoughMemory(format!(
                "the arena (with its loss slots) needs {} on GPU {}, which has {} free of {}: make the batch smaller, or shard more (a plan under a lower --memory-cap)",
                format_bytes(needed as f64),
                self.device_name(),
                format_bytes(free as f64),
                format_bytes(self.memory.total as f64)
            )));
        }
        self.memory.pool_before_arena = memory::pool(&self.ctx)?;
        let mb = (elements * 4) >> 20;
        let arena = self
            .compute
            .alloc_zeros::<f32>(elements.max(1))
            .map_err(driver_error(&format!("allocating the {mb} MiB arena")))?;
        let losses = self
            .compute
            .alloc_zeros::<f32>(loss_slots.max(1))
            .map_err(driver_error("allocating the loss slots"))?;
        let (base, _) = arena.device_ptr(&self.compute);
        self.base = base;
        self.elements = elements;
        self.arena = Some(arena);
        self.losses = Some(losses);
        self.loss_slots = loss_slots;
        self.compute
            .synchronize()
            .map_err(driver_error("allocating"))?;
        self.memory.after_arena = memory::used_bytes(&self.ctx)?;
        self.host = match sizes.host_arena_elements {
            0 => None,
            words => Some(PinnedArena::zeroed(&self.ctx, elements, words)?),
        };
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
        if let Some(host) = self.on_host(region) {
            return host.store(region, data);
        }
        let dst = self.ptr(region)?;
        let packed;
        let data = match region.format {
            FloatFormat::Fp32 => data,
            FloatFormat::Bf16 => {
                packed = pack_bf16(data);
                &packed[..]
            }
        };
        let mut staging = recover(self.staging.lock());
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
        if let Some(host) = self.on_host(region) {
            self.synchronize()?;
            out[..region.len].copy_from_slice(&host.read(region)?);
            return Ok(());
        }
        let src = self.ptr(region)?;
        self.synchronize()?;
        let mut words = match region.format {
            FloatFormat::Fp32 => Vec::new(),
            FloatFormat::Bf16 => vec![0.0f32; region.words()],
        };
        let into = match region.format {
            FloatFormat::Fp32 => &mut out[..region.len],
            FloatFormat::Bf16 => &mut words[..],
        };
        // SAFETY: `src` spans the region's words, which `into` holds; the stream is
        // synchronised before `into` is read.
        unsafe {
            driver::memcpy_dtoh_async(into, src, self.compute.cu_stream())
                .map_err(driver_error("copying from the GPU"))?;
        }
        self.compute
            .synchronize()
            .map_err(driver_error("copying from the GPU"))?;
        if region.format == FloatFormat::Bf16 {
            unpack_bf16(&words, &mut out[..region.len]);
        }
        Ok(())
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
    fn zero(&self, region: Region) -> Result<()> {
        if let Some(host) = self.on_host(region) {
            return host.store(region, &vec![0.0; region.len]);
        }
        let dst = self.ptr(region)?;
        // SAFETY: `ptr` checked the region against the arena; the executor orders every access.
        unsafe {
            driver::memset_d8_async(dst, 0, 4 * region.words(), self.compute.cu_stream())
                .map_err(driver_error("zeroing device memory"))
        }
    }
    fn copy(&self, from: Region, to: Region) -> Result<()> {
        if from.len != to.len || from.overlaps(to) {
            return Err(Error::Backend(format!(
                "a copy of {} elements into {} overlapping or of another length",
                from.len, to.len
            )));
        }
        match (self.on_host(from), self.on_host(to)) {
            (Some(host), Some(_)) => return host.copy(from, to),
            (Some(host), None) | (None, Some(host)) => {
                return host.enqueue_copy(from, to, |r| self.ptr(r), &self.compute);
            }
            (None, None) => {}
        }
        if from.format != to.format {
            return self.convert(from, to);
        }
        let (src, dst) = (self.ptr(from)?, self.ptr(to)?);
        // SAFETY: both regions were checked against the arena and are disjoint; the executor
        // orders every access.
        unsafe {
            driver::memcpy_dtod_async(dst, src, 4 * from.words(), self.compute.cu_stream())
                .map_err(driver_error("copying device memory"))
        }
    }
    fn open_groups(&mut self, groups: &[Group]) -> Result<()> {
        let world = self.world_size();
        match groups.iter().find(|g| g.normalized(world) != Group::World) {
            Some(group) => Err(Error::Backend(format!(
                "a plan with collectives among {} needs an NCCL communicator per group \
                 (ncclCommSplit), which the CUDA backend does not create yet (DESIGN §6.11): run \
                 it on the CPU backend, or plan without a topology",
                group.describe(world)
            ))),
            None => Ok(()),
        }
    }
    fn all_gather(&self, group: Group, shard: Region, full: Region) -> Result<()> {
        self.world_only(group)?;
        let (send, recv) = (self.buffer(shard)?, self.buffer(full)?);
        self.nccl.all_gather(send, recv, &self.communication)
    }
    fn reduce_scatter(&self, group: Group, full: Region, shard: Region) -> Result<()> {
        self.world_only(group)?;
        let (send, recv) = (self.buffer(full)?, self.buffer(shard)?);
        self.nccl.reduce_scatter(send, recv, &self.communication)
    }
    fn all_reduce(&self, group: Group, data: Region) -> Result<()> {
        self.world_only(group)?;
        let data = self.buffer(data)?;
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
        let floats = unsafe { DeviceBuffer::new(p, data.len(), FloatFormat::Fp32) };
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
    fn offloads(&self) -> bool {
        true
    }
    fn copy_across(
        &self,
        from: Region,
        to: Region,
        after: Option<&Arc<CudaEvent>>,
    ) -> Result<Arc<CudaEvent>> {
        let host = self.host_arena()?;
        if let Some(after) = after {
            (self.copies.wait(after)).map_err(driver_error("waiting on an event"))?;
        }
        host.enqueue_copy(from, to, |r| self.ptr(r), &self.copies)?;
        (self.copies)
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map(Arc::new)
            .map_err(driver_error("recording an event"))
    }
    fn wait_on_host(&self, mark: &Arc<CudaEvent>) -> Result<()> {
        mark.synchronize()
            .map_err(driver_error("waiting for a copy to the host"))
    }
    fn abort_communication(&self) {
        self.nccl.abort();
    }
    fn communication_failure(&self) -> Option<String> {
        self.nccl.asynchronous_error()
    }
    fn reached(&self, mark: &Arc<CudaEvent>) -> Result<bool> {
        mark.try_is_complete()
            .map_err(driver_error("querying an event"))
    }
    fn start_launch_clock(&self) -> Result<()> {
        self.clock.start();
        Ok(())
    }
    fn launch_times(&self) -> Result<Vec<LaunchTime>> {
        self.synchronize()?;
        self.clock.stop()
    }
}
