//! The CPU backend: the arena in host memory lent by region to the workloads' host kernels
//! (`mlp::cpu`, `gpt2::cpu`), collectives from MPI (one process per rank) or, for one rank, a
//! loopback. Every operation completes before it returns, so a stream's mark is the instant it was
//! taken and waiting on one is a no-op.

use super::arenas::Arenas;
use super::host_arena::{HostMemory, Read, Write};
use super::{Allocation, Backend, DeviceMemory, FloatFormat, Group, Region, Stream};
use crate::lock::recover;
use crate::process::{check_host_memory, keep_freed_memory, thread_cpu_us};
use crate::{Error, Result};
use half::bf16;
use half::slice::HalfFloatSliceExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The three collectives on host slices, among the ranks of one communicator.
pub trait Collectives: Sync + Sized {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The communicator of the ranks that pass the same `color`, ordered by `key` (collective:
    /// every rank of this one calls it).
    fn split(&self, color: usize, key: usize) -> Result<Self>;
    /// Whether two threads may each run collectives on a communicator of their own at once.
    fn concurrent(&self) -> bool {
        false
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]);
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]);
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]);
    /// An AllGather of 2-byte elements (bf16 bit patterns: a copy).
    fn all_gather_bits(&self, send: &[u16], recv: &mut [u16]);
    /// A ReduceScatter of bf16 elements, each addition widened to f32 and rounded back to bf16
    /// (as NCCL's bf16 sum does at each step of its algorithm).
    fn reduce_scatter_bf16(&self, send: &[u16], recv: &mut [u16]);
    /// An AllReduce of bf16 elements, summed as in [`Collectives::reduce_scatter_bf16`].
    fn all_reduce_bf16(&self, send: &[u16], recv: &mut [u16]);
}

/// The bf16 sum of two bit patterns, in f32 and rounded to nearest, ties to even.
fn bf16_sum(a: u16, b: u16) -> u16 {
    bf16::from_f32(bf16::from_bits(a).to_f32() + bf16::from_bits(b).to_f32()).to_bits()
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
    fn split(&self, _color: usize, _key: usize) -> Result<Loopback> {
        Ok(Loopback)
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
    fn all_gather_bits(&self, send: &[u16], recv: &mut [u16]) {
        recv.copy_from_slice(send);
    }
    fn reduce_scatter_bf16(&self, send: &[u16], recv: &mut [u16]) {
        recv.copy_from_slice(send);
    }
    fn all_reduce_bf16(&self, send: &[u16], recv: &mut [u16]) {
        recv.copy_from_slice(send);
    }
}

/// An MPI communicator: the world's, or one split from it.
pub struct Mpi {
    comm: mpi::topology::SimpleCommunicator,
    /// The thread support MPI gave.
    threading: mpi::Threading,
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
        Ok((
            universe,
            Mpi {
                comm: world,
                threading,
            },
        ))
    }

    /// Rank 0's `bytes` on every rank (e.g. the NCCL unique id).
    pub fn broadcast_from_first(&self, bytes: &mut [u8]) {
        use mpi::collective::Root;
        use mpi::topology::Communicator;
        self.comm.process_at_rank(0).broadcast_into(bytes);
    }
}

// SAFETY: MPI was initialised with at least `Serialized` thread support (checked in `init`), and
// the runtime calls MPI from one thread at a time (the communication thread during the steps, the
// main thread before and after them) unless MPI gave `Multiple` (`concurrent`), where each link's
// communication thread calls it on communicators of its own.
unsafe impl Sync for Mpi {}

impl Collectives for Mpi {
    fn concurrent(&self) -> bool {
        self.threading == mpi::Threading::Multiple
    }
    fn rank(&self) -> usize {
        use mpi::topology::Communicator;
        self.comm.rank() as usize
    }
    fn size(&self) -> usize {
        use mpi::topology::Communicator;
        self.comm.size() as usize
    }
    fn split(&self, color: usize, key: usize) -> Result<Mpi> {
        use mpi::topology::{Color, Communicator};
        let as_int = |what: &str, value: usize| {
            i32::try_from(value)
                .map_err(|_| Error::Backend(format!("an MPI communicator {what} of {value}")))
        };
        let color = Color::with_value(as_int("colour", color)?);
        self.comm
            .split_by_color_with_key(color, as_int("key", key)?)
            .map(|comm| Mpi {
                comm,
                threading: self.threading,
            })
            .ok_or_else(|| Error::Backend("MPI_Comm_split gave this rank no communicator".into()))
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::CommunicatorCollectives;
        mpi::request::scope(|scope| {
            wait_without_spinning(self.comm.immediate_all_gather_into(scope, send, recv))
        });
    }
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        mpi::request::scope(|scope| {
            let sum = SystemOperation::sum();
            let request = self
                .comm
                .immediate_reduce_scatter_block_into(scope, send, recv, sum);
            wait_without_spinning(request)
        });
    }
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        mpi::request::scope(|scope| {
            let sum = SystemOperation::sum();
            let request = self.comm.immediate_all_reduce_into(scope, send, recv, sum);
            wait_without_spinning(request)
        });
    }
    fn all_gather_bits(&self, send: &[u16], recv: &mut [u16]) {
        use mpi::collective::CommunicatorCollectives;
        mpi::request::scope(|scope| {
            wait_without_spinning(self.comm.immediate_all_gather_into(scope, send, recv))
        });
    }
    fn reduce_scatter_bf16(&self, send: &[u16], recv: &mut [u16]) {
        use mpi::collective::CommunicatorCollectives;
        let sum = bf16_sum_operation();
        mpi::request::scope(|scope| {
            let request = self
                .comm
                .immediate_reduce_scatter_block_into(scope, send, recv, &sum);
            wait_without_spinning(request)
        });
    }
    fn all_reduce_bf16(&self, send: &[u16], recv: &mut [u16]) {
        use mpi::collective::CommunicatorCollectives;
        let sum = bf16_sum_operation();
        mpi::request::scope(|scope| {
            let request = self.comm.immediate_all_reduce_into(scope, send, recv, &sum);
            wait_without_spinning(request)
        });
    }
}

/// MPI's user-defined bf16 sum over 2-byte elements ([`bf16_sum`] per pair).
fn bf16_sum_operation() -> mpi::collective::UserOperation<'static> {
    mpi::collective::UserOperation::commutative(|read, write| {
        // The runtime passes this operation u16 buffers only; another type is left unreduced.
        if let (Some(read), Some(write)) = (read.downcast::<u16>(), write.downcast::<u16>()) {
            for (w, &r) in write.iter_mut().zip(read) {
                *w = bf16_sum(r, *w);
            }
        }
    })
}

/// How long a collective's wait tests without pausing, and the longest pause between tests.
const SPIN: Duration = Duration::from_micros(20);
const LONGEST_PAUSE: Duration = Duration::from_micros(200);

/// Waits for a non-blocking collective by testing it, pausing between tests once it has taken
/// longer than [`SPIN`] (pauses double up to [`LONGEST_PAUSE`]). MPI's blocking wait spins for
/// as long as the peer takes to arrive, and with a compute and a communication thread per rank
/// on shared cores that time is taken from compute (DESIGN §6.1). MPI progresses the collective
/// inside each test.
fn wait_without_spinning<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
    mut request: mpi::request::Request<'a, D, S>,
) {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        match request.test() {
            Ok(_) => return,
            Err(pending) => request = pending,
        }
        if start.elapsed() > SPIN {
            std::thread::sleep(pause);
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// How much nicer than its caller a compute stream's thread runs (DESIGN §6.1): enough that a
/// communication thread which wakes runs at once rather than after compute's slice.
const COMPUTE_NICE_INCREMENT: i32 = 10;

/// The calling thread's nice value.
fn this_threads_nice() -> i32 {
    // SAFETY: gettid has no preconditions; getpriority with PRIO_PROCESS and a thread id reads
    // that one thread's nice value on Linux, and cannot fail for the calling thread.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

/// Raises the calling thread's nice value by `increment` (a lower priority, which the kernel
/// grants to any thread; values past 19 become 19).
fn lower_this_threads_priority(increment: i32) -> Result<()> {
    let nice = this_threads_nice() + increment;
    // SAFETY: as in `this_threads_nice`; setpriority sets only the calling thread's nice value.
    let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if set != 0 {
        return Err(Error::Backend(format!(
            "lowering the compute thread's priority to nice {nice} failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Host memory and host kernels, collectives from `C`.
pub struct CpuBackend<C: Collectives> {
    collectives: C,
    /// The communicators of the groups besides the world ([`Backend::open_groups`]).
    groups: Vec<(Group, C)>,
    /// The device arena and, after its words, the host arena (DESIGN §6.12).
    arena: Arenas,
    losses: Mutex<Vec<f32>>,
    /// A block-sized buffer for AllReduce (MPI has no in-place form here).
    scratch: Mutex<Vec<f32>>,
}

impl<C: Collectives> CpuBackend<C> {
    pub fn new(collectives: C) -> Self {
        keep_freed_memory();
        CpuBackend {
            collectives,
            groups: Vec::new(),
            arena: Arenas::default(),
            losses: Mutex::new(Vec::new()),
            scratch: Mutex::new(Vec::new()),
        }
    }

    /// `region`'s elements to read, refused while an overlapping operation writes them.
    pub(crate) fn read(&self, region: Region) -> Result<Read<'_>> {
        self.arena.read(region)
    }

    /// `region`'s elements to write, refused while an overlapping operation uses them.
    pub(crate) fn write(&self, region: Region) -> Result<Write<'_>> {
        self.arena.write(region)
    }

    /// The communicator of `group`.
    fn among(&self, group: Group) -> Result<&C> {
        match group.normalized(self.collectives.size()) {
            Group::World => Ok(&self.collectives),
            group => (self.groups.iter().find(|(g, _)| *g == group))
                .map(|(_, c)| c)
                .ok_or_else(|| {
                    Error::Backend(format!(
                        "a collective among {}, whose communicator was not opened",
                        group.describe(self.collectives.size())
                    ))
                }),
        }
    }

    /// Stores this rank's partial loss of `step`.
    pub(crate) fn record_loss(&self, step: usize, loss: f32) -> Result<()> {
        let mut losses = recover(self.losses.lock());
        let slot = losses
            .get_mut(step)
            .ok_or_else(|| Error::Backend(format!("loss slot {step} was not allocated")))?;
        *slot = loss;
        Ok(())
    }
}

impl<C: Collectives> HostMemory for CpuBackend<C> {
    fn read(&self, region: Region) -> Result<Read<'_>> {
        self.arena.read(region)
    }
    fn write(&self, region: Region) -> Result<Write<'_>> {
        self.arena.write(region)
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
        let elements = sizes.arena_elements
            + sizes.host_arena_elements
            + sizes.largest_block
            + sizes.loss_slots;
        check_host_memory(
            4 * elements as u64,
            "the buffers it allocates (arenas, block buffer, loss slots)",
        )?;
        *recover(self.losses.get_mut()) = vec![0.0; sizes.loss_slots];
        *recover(self.scratch.get_mut()) = vec![0.0; sizes.largest_block];
        self.arena = Arenas::zeroed(sizes.arena_elements, sizes.host_arena_elements)?;
        Ok(())
    }
    fn device_memory(&self) -> Result<Option<DeviceMemory>> {
        Ok(None)
    }
    fn offloads(&self) -> bool {
        true
    }
    fn upload(&self, region: Region, data: &[f32]) -> Result<()> {
        self.arena.store(region, data)
    }
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self.read(region)?);
        Ok(())
    }
    fn losses(&self, steps: usize) -> Result<Vec<f32>> {
        let losses = recover(self.losses.lock());
        losses.get(..steps).map(<[f32]>::to_vec).ok_or_else(|| {
            Error::Backend(format!(
                "{steps} losses asked, {} slots allocated",
                losses.len()
            ))
        })
    }
    fn zero(&self, region: Region) -> Result<()> {
        match region.format {
            FloatFormat::Fp32 => self.arena.lend_mut::<f32>(region)?.fill(0.0),
            FloatFormat::Bf16 => self.arena.lend_mut::<bf16>(region)?.fill(bf16::ZERO),
        }
        Ok(())
    }
    fn copy(&self, from: Region, to: Region) -> Result<()> {
        if from.len != to.len {
            return Err(Error::Backend(format!(
                "a copy of {} elements into {}",
                from.len, to.len
            )));
        }
        // Rounded (or widened) on the way where the formats differ: the master into bf16
        // parameters.
        self.arena.store(to, &self.read(from)?)
    }
    fn open_groups(&mut self, groups: &[Group]) -> Result<()> {
        let world = self.collectives.size();
        for &group in groups {
            let group = group.normalized(world);
            if group == Group::World || self.groups.iter().any(|(g, _)| *g == group) {
                continue;
            }
            if !group.fits(world) {
                return Err(Error::Backend(format!(
                    "{} do not divide the world of {world} ranks",
                    group.describe(world)
                )));
            }
            let (color, key) = group.place(self.collectives.rank());
            let split = self.collectives.split(color, key)?;
            self.groups.push((group, split));
        }
        Ok(())
    }
    fn all_gather(&self, group: Group, shard: Region, full: Region) -> Result<()> {
        let among = self.among(group)?;
        match full.format {
            FloatFormat::Fp32 => among.all_gather(
                &self.arena.lend::<f32>(shard)?,
                &mut self.arena.lend_mut::<f32>(full)?,
            ),
            FloatFormat::Bf16 => among.all_gather_bits(
                self.arena.lend::<bf16>(shard)?.reinterpret_cast(),
                self.arena.lend_mut::<bf16>(full)?.reinterpret_cast_mut(),
            ),
        }
        Ok(())
    }
    fn reduce_scatter(&self, group: Group, full: Region, shard: Region) -> Result<()> {
        let among = self.among(group)?;
        match full.format {
            FloatFormat::Fp32 => among.reduce_scatter(
                &self.arena.lend::<f32>(full)?,
                &mut self.arena.lend_mut::<f32>(shard)?,
            ),
            FloatFormat::Bf16 => among.reduce_scatter_bf16(
                self.arena.lend::<bf16>(full)?.reinterpret_cast(),
                self.arena.lend_mut::<bf16>(shard)?.reinterpret_cast_mut(),
            ),
        }
        Ok(())
    }
    fn all_reduce(&self, group: Group, data: Region) -> Result<()> {
        let among = self.among(group)?;
        if data.format == FloatFormat::Bf16 {
            let mut data = self.arena.lend_mut::<bf16>(data)?;
            let send = data.reinterpret_cast().to_vec();
            among.all_reduce_bf16(&send, data.reinterpret_cast_mut());
            return Ok(());
        }
        let mut scratch = recover(self.scratch.lock());
        let capacity = scratch.len();
        let send = scratch.get_mut(..data.len).ok_or_else(|| {
            Error::Backend(format!(
                "an AllReduce of {} elements exceeds the {capacity}-element block buffer",
                data.len
            ))
        })?;
        let mut data = self.write(data)?;
        send.copy_from_slice(&data);
        among.all_reduce(send, &mut data);
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
    fn host_computes(&self) -> bool {
        true
    }
    fn thread_cpu_us(&self) -> Option<f64> {
        thread_cpu_us()
    }
    fn communicator_bytes(&self) -> Option<u64> {
        Some(0)
    }
    fn concurrent_communicators(&self) -> bool {
        self.collectives.concurrent()
    }
    fn enter_stream_thread(&self, stream: Stream) -> Result<()> {
        match stream {
            Stream::Compute => lower_this_threads_priority(COMPUTE_NICE_INCREMENT),
            Stream::Communication => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each addition rounds to bf16 (to nearest, ties to even): 1 + 2^-8 is a tie between 1 and
    /// 1 + 2^-7, so the sum stays 1 however often it is added; in f32 it would grow.
    #[test]
    fn a_bf16_sum_rounds_every_addition() {
        let bits = |x: f32| bf16::from_f32(x).to_bits();
        let half_ulp = bits(2f32.powi(-8));
        let mut sum = bits(1.0);
        for _ in 0..4 {
            sum = bf16_sum(sum, half_ulp);
        }
        assert_eq!(sum, bits(1.0));
        assert_eq!(bf16_sum(bits(1.5), bits(0.25)), bits(1.75));
        let big = bits(3.0e38);
        assert!(bf16::from_bits(bf16_sum(big, big)).to_f32().is_infinite());
    }

    /// The compute stream's thread runs at nice +10, its caller and the communication thread as
    /// they were.
    #[test]
    fn only_the_compute_thread_is_lowered() {
        let backend = CpuBackend::new(Loopback);
        let before = this_threads_nice();
        let on = |stream: Stream| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    backend.enter_stream_thread(stream).unwrap();
                    this_threads_nice()
                })
                .join()
                .unwrap()
            })
        };
        assert_eq!(
            on(Stream::Compute),
            (before + COMPUTE_NICE_INCREMENT).min(19)
        );
        assert_eq!(on(Stream::Communication), before);
        assert_eq!(this_threads_nice(), before);
    }
}
