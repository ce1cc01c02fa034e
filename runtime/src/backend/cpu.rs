//! The CPU backend: the arena in host memory, the kernels of [`crate::mlp`], collectives from MPI
//! (one process per rank) or, for one rank, a loopback. Every operation completes before it
//! returns, so a stream's mark is the instant it was taken and waiting on one is a no-op.

use super::{Allocation, Backend, DeviceMemory, Region, Stream};
use crate::mlp;
use crate::{Error, Result};
use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::time::Instant;

/// The three collectives on host slices.
pub trait Collectives: Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn all_gather(&self, send: &[f32], recv: &mut [f32]);
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]);
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]);
}

/// One rank, no communication.
pub struct Loopback;

impl Collectives for Loopback {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
}

/// MPI's world communicator.
pub struct Mpi {
    world: mpi::topology::SimpleCommunicator,
}

impl Mpi {
    /// Initialises MPI with thread support for a communication thread. Fails (never panics)
    /// when MPI is already initialised or gives too little thread support.
    pub fn init() -> Result<(mpi::environment::Universe, Mpi)> {
        use mpi::topology::Communicator;
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| Error::Backend("MPI was already initialised".into()))?;
        if threading < mpi::Threading::Serialized {
            return Err(Error::Backend(format!(
                "MPI provides {threading:?} threading; the runtime needs at least Serialized"
            )));
        }
        let world = universe.world();
        let _ = world.size();
        Ok((universe, Mpi { world }))
    }

    /// Rank 0's `bytes` on every rank (e.g. the NCCL unique id).
    pub fn broadcast_from_first(&self, bytes: &mut [u8]) {
        use mpi::collective::Root;
        use mpi::topology::Communicator;
        self.world.process_at_rank(0).broadcast_into(bytes);
    }
}

// SAFETY: MPI was initialised with at least `Serialized` thread support (checked in `init`), and
// the runtime calls MPI from one thread at a time: the communication thread during the steps, the
// main thread before and after them.
unsafe impl Sync for Mpi {}

impl Collectives for Mpi {
    fn rank(&self) -> usize {
        use mpi::topology::Communicator;
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        use mpi::topology::Communicator;
        self.world.size() as usize
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::CommunicatorCollectives;
        self.world.all_gather_into(send, recv);
    }
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        self.world
            .reduce_scatter_block_into(send, recv, SystemOperation::sum());
    }
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        self.world
            .all_reduce_into(send, recv, SystemOperation::sum());
    }
}

/// Host memory and host kernels, collectives from `C`.
pub struct CpuBackend<C: Collectives> {
    collectives: C,
    arena: UnsafeCell<Vec<f32>>,
    losses: Mutex<Vec<f32>>,
    /// A block-sized buffer for AllReduce (MPI has no in-place form here); comm thread only.
    scratch: UnsafeCell<Vec<f32>>,
}

// SAFETY: the executor's schedule guarantees that no two concurrent operations touch overlapping
// regions (lifetimes from the plan, ordering by events), and `scratch` is used by the
// communication thread alone.
unsafe impl<C: Collectives> Sync for CpuBackend<C> {}

impl<C: Collectives> CpuBackend<C> {
    pub fn new(collectives: C) -> Self {
        CpuBackend {
            collectives,
            arena: UnsafeCell::new(Vec::new()),
            losses: Mutex::new(Vec::new()),
            scratch: UnsafeCell::new(Vec::new()),
        }
    }

    #[allow(clippy::mut_from_ref)]
    pub(crate) fn slice(&self, r: Region) -> &mut [f32] {
        // SAFETY: see the Sync impl: regions used concurrently never overlap.
        unsafe { &mut (&mut *self.arena.get())[r.offset..r.offset + r.len] }
    }

    /// Stores this rank's partial loss of `step`.
    pub(crate) fn record_loss(&self, step: usize, loss: f32) -> Result<()> {
        let mut losses = self.losses.lock().expect("loss lock is never poisoned");
        let slot = losses
            .get_mut(step)
            .ok_or_else(|| Error::Backend(format!("loss slot {step} was not allocated")))?;
        *slot = loss;
        Ok(())
    }

    #[allow(clippy::mut_from_ref)]
    fn scratch(&self, len: usize) -> &mut [f32] {
        // SAFETY: only the communication thread calls collectives.
        unsafe { &mut (&mut *self.scratch.get())[..len] }
    }
}

impl<C: Collectives> Backend for CpuBackend<C> {
    type Mark = Instant;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn rank(&self) -> usize {
        self.collectives.rank()
    }
    fn world_size(&self) -> usize {
        self.collectives.size()
    }
    fn allocate(&mut self, sizes: Allocation) -> Result<()> {
        *self.losses.get_mut().expect("loss lock is never poisoned") = vec![0.0; sizes.loss_slots];
        self.scratch.get_mut().resize(sizes.largest_block, 0.0);
        let elements = sizes.arena_elements;
        let arena = self.arena.get_mut();
        arena.try_reserve_exact(elements).map_err(|e| {
            Error::Backend(format!(
                "cannot allocate the {} MiB arena: {e}",
                (elements * 4) >> 20
            ))
        })?;
        arena.resize(elements, 0.0);
        Ok(())
    }
    fn device_memory(&self) -> Result<Option<DeviceMemory>> {
        Ok(None)
    }
    fn upload(&self, region: Region, data: &[f32]) -> Result<()> {
        self.slice(region).copy_from_slice(data);
        Ok(())
    }
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(self.slice(region));
        Ok(())
    }
    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        dims: (usize, usize),
        relu: bool,
    ) -> Result<()> {
        mlp::linear_forward(
            self.slice(x),
            self.slice(params),
            self.slice(out),
            rows,
            dims,
            relu,
        );
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
        dims: (usize, usize),
        relu: bool,
    ) -> Result<()> {
        let grad_in = grad_in.map(|r| self.slice(r));
        mlp::linear_backward(
            self.slice(x),
            self.slice(params),
            self.slice(output),
            self.slice(grad_out),
            self.slice(grads),
            grad_in,
            rows,
            dims,
            relu,
        );
        Ok(())
    }
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        let loss = mlp::mse_grad(self.slice(z), self.slice(y), self.slice(grad), scale);
        self.record_loss(step, loss)
    }
    fn losses(&self, steps: usize) -> Result<Vec<f32>> {
        let losses = self.losses.lock().expect("loss lock is never poisoned");
        losses.get(..steps).map(<[f32]>::to_vec).ok_or_else(|| {
            Error::Backend(format!(
                "{steps} losses asked, {} slots allocated",
                losses.len()
            ))
        })
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
        mlp::adam(
            self.slice(params),
            self.slice(grads),
            self.slice(m),
            self.slice(v),
            step,
            lr,
        );
        Ok(())
    }
    fn all_gather(&self, shard: Region, full: Region) -> Result<()> {
        self.collectives
            .all_gather(self.slice(shard), self.slice(full));
        Ok(())
    }
    fn reduce_scatter(&self, full: Region, shard: Region) -> Result<()> {
        self.collectives
            .reduce_scatter(self.slice(full), self.slice(shard));
        Ok(())
    }
    fn all_reduce(&self, data: Region) -> Result<()> {
        let send = self.scratch(data.len);
        send.copy_from_slice(self.slice(data));
        self.collectives.all_reduce(send, self.slice(data));
        Ok(())
    }
    fn all_reduce_host(&self, data: &mut [f32]) -> Result<()> {
        let send = data.to_vec();
        self.collectives.all_reduce(&send, data);
        Ok(())
    }
    fn mark(&self, _stream: Stream) -> Result<Instant> {
        Ok(Instant::now())
    }
    fn wait_mark(&self, _stream: Stream, _mark: &Instant) -> Result<()> {
        Ok(())
    }
    fn elapsed_us(&self, from: &Instant, to: &Instant) -> Result<f64> {
        Ok(to.saturating_duration_since(*from).as_secs_f64() * 1e6)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
