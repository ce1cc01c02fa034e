//! Backends: buffers (regions of one arena), the compute kernels, the three collectives and the
//! two streams. The executor addresses memory only through [`Region`]s and calls only this
//! trait, so it never knows which backend runs.
//!
//! Every operation runs on a [`Stream`]: uploads, the layers and the loss on the compute stream;
//! the collectives and the optimizer on the communication stream. An operation may return before
//! it completes (CUDA) or after (CPU); ordering across streams is expressed only with marks: a
//! [`Backend::mark`] taken on one stream, a [`Backend::wait_mark`] on the other. Marks also time
//! the run ([`Backend::elapsed_us`]), so GPU timings are device times, not host times.

mod arenas;
mod cpu;
mod group;
mod host_arena;

pub(crate) use arenas::host_part;
pub use cpu::{Collectives, CpuBackend, Loopback, Mpi};
pub use group::Group;
pub(crate) use host_arena::{HostArena, HostMemory, Read, Words, Write, each};
/// MPI stays initialised while this lives.
pub use mpi::environment::Universe as MpiUniverse;

use crate::{Error, Result};
pub use shardplan_scheduler::precision::FloatFormat;
use std::time::Duration;

/// How long a host thread that only enqueues polls for the other stream's signal before it
/// sleeps: longer than the waits of a run whose pace the host sets (tens of microseconds a slot),
/// short enough that a host far ahead of its device soon sleeps.
pub const ENQUEUE_SPIN: Duration = Duration::from_millis(1);

/// A range of elements of one format in the arena: `offset` counts 4-byte words from the
/// arena's start (an fp32 element each, two bf16 ones), `len` the region's elements. A bf16
/// region starts on a word; its parts and carvings keep that where their element offsets are
/// even, which the layout's blocks (multiples of 16 per rank) and the models' tensor sizes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub offset: usize,
    pub len: usize,
    pub format: FloatFormat,
}

impl Region {
    /// `len` fp32 elements at word `offset`.
    pub fn f32(offset: usize, len: usize) -> Region {
        Region {
            offset,
            len,
            format: FloatFormat::Fp32,
        }
    }

    /// The 4-byte words its elements take.
    pub fn words(self) -> usize {
        words(self.format, self.len)
    }

    /// Whether the two ranges share a word.
    pub fn overlaps(self, other: Region) -> bool {
        self.offset < other.offset + other.words() && other.offset < self.offset + self.words()
    }

    /// The `len` elements from element `start` on (an even `start` for bf16).
    pub fn sub(self, start: usize, len: usize) -> Region {
        debug_assert!(
            self.format == FloatFormat::Fp32 || start.is_multiple_of(2),
            "a bf16 region split at odd element {start}"
        );
        Region {
            offset: self.offset + words(self.format, start),
            len,
            format: self.format,
        }
    }

    /// The `index`-th of `parts` equal sub-ranges.
    pub fn part(self, index: usize, parts: usize) -> Region {
        let len = self.len / parts;
        self.sub(index * len, len)
    }
}

/// A product's operand: the elements of `region` from element `at` on (attention's products
/// read Q, K and V inside the fused QKV rows, at offsets a bf16 region cannot start at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub region: Region,
    pub at: usize,
}

impl Operand {
    /// The whole region, from its first element.
    pub fn whole(region: Region) -> Operand {
        Operand { region, at: 0 }
    }
}

/// The 4-byte words `len` elements of `format` take.
pub fn words(format: FloatFormat, len: usize) -> usize {
    match format {
        FloatFormat::Fp32 => len,
        FloatFormat::Bf16 => len.div_ceil(2),
    }
}

/// The two streams of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Compute,
    Communication,
}

impl Stream {
    pub const BOTH: [Stream; 2] = [Stream::Compute, Stream::Communication];

    pub fn name(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::Communication => "communication",
        }
    }

    /// Its track in a trace.
    pub fn track(self) -> u32 {
        match self {
            Stream::Compute => 0,
            Stream::Communication => 1,
        }
    }
}

/// What a run allocates before its first step.
#[derive(Debug, Clone, Copy)]
pub struct Allocation {
    /// f32 elements of the arena.
    pub arena_elements: usize,
    /// f32 elements of the host arena, addressed after the arena's (DESIGN §6.12); 0 without
    /// offload.
    pub host_arena_elements: usize,
    /// The largest block (a backend without in-place AllReduce keeps a buffer of it).
    pub largest_block: usize,
    /// Per-step loss slots.
    pub loss_slots: usize,
}

/// Device memory as the driver reports it (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total: u64,
    /// In use once the backend was set up (context, libraries' workspaces, communicator).
    pub before_arena: u64,
    /// The stream-ordered allocator's pool when `before_arena` was read.
    pub pool_before_arena: PoolMemory,
    /// In use right after the arena was allocated.
    pub after_arena: u64,
    /// In use now; nothing is freed during a run, so after a run this is its peak.
    pub now: u64,
    /// The pool when `now` was read.
    pub pool_now: PoolMemory,
}

/// The bytes a device's stream-ordered memory pool has mapped (counted in use by the driver) and
/// of those the bytes its allocations hold; both 0 where the device has no pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolMemory {
    pub reserved: u64,
    pub used: u64,
}

impl DeviceMemory {
    /// What the run took beyond the set-up: its pool allocations (arena, loss slots), plus what
    /// the driver's count grew by outside the pool (libraries' workspaces). The pool's mapped but
    /// unused room is left out: set-up left 32 MiB of it on the H100, where gpt2-tiny's 21.7 MiB
    /// arena fitted without the driver's count moving.
    pub fn used_by_run(&self) -> u64 {
        let (before, now) = (self.pool_before_arena, self.pool_now);
        let outside_pool = (self.now.saturating_sub(self.before_arena))
            .saturating_sub(now.reserved.saturating_sub(before.reserved));
        outside_pool + now.used.saturating_sub(before.used)
    }
}

/// One kernel or product a backend launched while its launch clock ran, and its device time.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LaunchTime {
    /// The kernel's name, or `product m×n×k` (`× batch` for a batch of products).
    pub name: String,
    /// Floating-point operations: 2·m·n·k per product of a batch; 0 for a kernel.
    pub flops: f64,
    pub us: f64,
}

/// What the executor needs from a device.
pub trait Backend: Sync {
    /// A point in a stream's work: what a wait refers to and what timings are taken between.
    type Mark: Clone + Send + Sync;

    fn name(&self) -> &'static str;
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Allocates the arena and the loss slots (once, before the first step).
    fn allocate(&mut self, sizes: Allocation) -> Result<()>;
    /// The device's memory use, where the backend has a device.
    fn device_memory(&self) -> Result<Option<DeviceMemory>>;
    /// Copies host data into the arena (compute stream; `data` may be reused on return).
    fn upload(&self, region: Region, data: &[f32]) -> Result<()>;
    /// Copies arena data to the host after every stream's work has completed.
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()>;
    /// The first `steps` loss slots (after every stream's work has completed).
    fn losses(&self, steps: usize) -> Result<Vec<f32>>;
    /// Zeros `region` (compute stream).
    fn zero(&self, region: Region) -> Result<()>;
    /// Copies `from` into `to`, regions of one length that do not overlap (compute stream).
    fn copy(&self, from: Region, to: Region) -> Result<()>;
    /// Sets up the communicators of `groups` besides the world's (collective: every rank calls
    /// it with the same groups, before the collectives that use them). A backend that has only
    /// the world's refuses any other group, naming it.
    fn open_groups(&mut self, groups: &[Group]) -> Result<()>;
    /// Every rank of `group`'s `shard` concatenated in group order into `full`.
    fn all_gather(&self, group: Group, shard: Region, full: Region) -> Result<()>;
    /// The sum over `group`'s ranks of `full`, this rank's part into `shard`.
    fn reduce_scatter(&self, group: Group, full: Region, shard: Region) -> Result<()>;
    /// The sum over `group`'s ranks, in place.
    fn all_reduce(&self, group: Group, data: Region) -> Result<()>;
    /// The sum over ranks of a host vector, in place (outside the timed steps).
    fn all_reduce_host(&self, data: &mut [f32]) -> Result<()>;
    /// The point `stream` has reached (the work enqueued on it so far).
    fn mark(&self, stream: Stream) -> Result<Self::Mark>;
    /// Makes later work on `stream` wait until `mark` is reached.
    fn wait_mark(&self, stream: Stream, mark: &Self::Mark) -> Result<()>;
    /// Microseconds from `from` to `to`; blocks until both are reached.
    fn elapsed_us(&self, from: &Self::Mark, to: &Self::Mark) -> Result<f64>;
    /// Whether the work before `mark` has completed, without waiting (the watchdog's view of a
    /// device that runs behind its host); a backend whose operations complete before they
    /// return has always reached its marks.
    fn reached(&self, _mark: &Self::Mark) -> Result<bool> {
        Ok(true)
    }
    /// Blocks until all work on both streams has completed.
    fn synchronize(&self) -> Result<()>;
    /// Whether the compute stream's work runs on the host thread that issues it (the CPU
    /// backend), so that other host work of the rank takes compute's own core.
    fn host_computes(&self) -> bool;
    /// How long a stream's host thread polls for the other's signal before it sleeps
    /// ([`Event::spinning`](crate::event::Event::spinning)): nothing where the host computes (a
    /// polling thread would take a core from the work), [`ENQUEUE_SPIN`] where the host threads
    /// only enqueue.
    fn host_wait_spin(&self) -> Duration {
        if self.host_computes() {
            Duration::ZERO
        } else {
            ENQUEUE_SPIN
        }
    }
    /// The calling thread's CPU time (µs) where the host computes, else None. The profiler times
    /// the units' compute rounds, which run alone on one host thread, by it rather than by the
    /// marks: the time the operating system gives other processes between a span's marks is not
    /// the span's work (DESIGN §6.6).
    fn thread_cpu_us(&self) -> Option<f64> {
        None
    }
    /// Whether collectives of two communicators may run at once, each from a host thread of its
    /// own (a plan's two links, DESIGN §6.11): MPI with `MPI_THREAD_MULTIPLE`.
    fn concurrent_communicators(&self) -> bool {
        false
    }
    /// The device bytes one communicator of this backend holds, where the backend knows them
    /// (DESIGN §3.11: counted in every plan's peak): 0 on the CPU, whose MPI communicators keep
    /// their buffers in host memory outside the arena; `None` where they come from the catalog's
    /// estimate (NCCL's, until measured).
    fn communicator_bytes(&self) -> Option<u64> {
        None
    }
    /// Abandons the communicator before the job ends on a stalled collective (NCCL:
    /// `ncclCommAbort`, so no kernel waits for a peer that will not come); MPI has nothing to do.
    fn abort_communication(&self) {}
    /// A failure the communicator has reported on its own, before any call returns it (NCCL's
    /// asynchronous error: a peer's connection lost); the watchdog ends the job on it at once.
    /// MPI reports its failures through its calls.
    fn communication_failure(&self) -> Option<String> {
        None
    }
    /// Starts timing each kernel and product this backend launches, one by one, until
    /// [`Backend::launch_times`] (`profile measure --launch-times`). A backend whose kernels are
    /// not launches of their own (the CPU's run on the calling thread) refuses.
    fn start_launch_clock(&self) -> Result<()> {
        Err(Error::Setting {
            setting: "--launch-times",
            expected: "--backend cuda (the CPU backend's kernels are calls on the host, not \
                       launches)"
                .into(),
        })
    }
    /// Every launch since [`Backend::start_launch_clock`] in launch order with its time, once
    /// both streams have completed; stops the clock.
    fn launch_times(&self) -> Result<Vec<LaunchTime>> {
        Ok(Vec::new())
    }
    /// Whether the backend runs an offloading plan (DESIGN §6.12): a host arena beside the
    /// arena, copies between them on a copy thread, the host's optimizer step on a host thread.
    fn offloads(&self) -> bool {
        false
    }
    /// One copy between the device and the host arena (DESIGN §6.12: a gradient shard to the
    /// host, parameters to the device), after `after` (a mark of the stream that issued it, where
    /// the copy reads what that stream wrote); returns the mark of its completion. The CPU
    /// backend copies at once and marks; the CUDA backend enqueues it on its copy stream.
    fn copy_across(
        &self,
        from: Region,
        to: Region,
        _after: Option<&Self::Mark>,
    ) -> Result<Self::Mark> {
        self.copy(from, to)?;
        self.mark(Stream::Communication)
    }
    /// Blocks the calling host thread until `mark` is reached (the host's step reads a gradient
    /// copy's words only then); a backend whose operations complete before they return has
    /// nothing to wait for.
    fn wait_on_host(&self, _mark: &Self::Mark) -> Result<()> {
        Ok(())
    }
    /// Called first on the host thread that drives `stream`, before its first operation. The CPU
    /// backend lowers its compute threads' priority there (DESIGN §6.1); a backend whose threads
    /// only enqueue work has nothing to do.
    fn enter_stream_thread(&self, _stream: Stream) -> Result<()> {
        Ok(())
    }
}

/// The names of the host threads [`on_both_streams`] runs (as `ps -L`, a debugger and
/// `/proc/<pid>/task/*/comm` show them).
pub const COMPUTE_THREAD: &str = "compute";
pub const COMMUNICATION_THREAD: &str = "communication";

/// One stream's host work for [`on_both_streams`]: what it runs, and what to do when it fails
/// (abandon the events the other stream waits on, so that stream stops at its next wait).
pub struct StreamWork<F, A> {
    pub work: F,
    pub on_failure: A,
}

/// Runs the compute stream's and the communication stream's host work on a thread each, every
/// thread entered as its stream ([`Backend::enter_stream_thread`]) before its work, and returns
/// each side's result (a panicking thread as an error).
pub fn on_both_streams<B, C, Q, FC, AC, FQ, AQ>(
    backend: &B,
    compute: StreamWork<FC, AC>,
    communication: StreamWork<FQ, AQ>,
) -> (Result<C>, Result<Q>)
where
    B: Backend,
    C: Send,
    Q: Send,
    FC: FnOnce() -> Result<C> + Send,
    AC: FnOnce() + Send,
    FQ: FnOnce() -> Result<Q> + Send,
    AQ: FnOnce() + Send,
{
    fn entered<B: Backend, T, F: FnOnce() -> Result<T>, A: FnOnce()>(
        backend: &B,
        stream: Stream,
        side: StreamWork<F, A>,
    ) -> Result<T> {
        let result = backend
            .enter_stream_thread(stream)
            .and_then(|()| (side.work)());
        if result.is_err() {
            (side.on_failure)();
        }
        result
    }
    /// A stream thread's result: its work's, or why the thread did not start or finish.
    fn joined<T>(
        thread: &str,
        spawned: std::io::Result<std::thread::ScopedJoinHandle<'_, Result<T>>>,
    ) -> Result<T> {
        let failed = |why: String| Error::Backend(format!("the {thread} thread {why}"));
        spawned
            .map_err(|e| failed(format!("could not start: {e}")))?
            .join()
            .map_err(|_| failed("panicked".into()))?
    }
    std::thread::scope(|scope| {
        let named = |name: &str| std::thread::Builder::new().name(name.to_string());
        let comm = named(COMMUNICATION_THREAD).spawn_scoped(scope, || {
            entered(backend, Stream::Communication, communication)
        });
        let computed = named(COMPUTE_THREAD)
            .spawn_scoped(scope, || entered(backend, Stream::Compute, compute));
        (
            joined(COMPUTE_THREAD, computed),
            joined(COMMUNICATION_THREAD, comm),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{DeviceMemory, PoolMemory};

    const MIB: u64 = 1 << 20;

    /// The H100's set-up as read there: 1,269,628,928 bytes in use, the pool holding a 32 MiB
    /// chunk of which its own small buffers use 64 KiB.
    fn after_setup() -> DeviceMemory {
        DeviceMemory {
            total: 80 << 30,
            before_arena: 1_269_628_928,
            pool_before_arena: PoolMemory {
                reserved: 32 * MIB,
                used: 64 << 10,
            },
            ..Default::default()
        }
    }

    #[test]
    fn an_arena_in_the_pools_spare_room_counts_though_the_driver_saw_nothing() {
        // gpt2-tiny's 21.7 MiB arena in the chunk, cuBLAS' 2 MiB workspace outside the pool.
        let arena = 22_797_568;
        let mut m = after_setup();
        m.now = m.before_arena + 2 * MIB;
        m.pool_now = PoolMemory {
            reserved: 32 * MIB,
            used: (64 << 10) + arena,
        };
        assert_eq!(m.used_by_run(), arena + 2 * MIB);
    }

    #[test]
    fn an_arena_that_grows_the_pool_counts_once() {
        // A 38.45 MiB arena: 6.45 MiB from the chunk, a new 32 MiB chunk; 2 MiB outside the pool.
        let arena = 40_318_976;
        let mut m = after_setup();
        m.now = m.before_arena + 32 * MIB + 2 * MIB;
        m.pool_now = PoolMemory {
            reserved: 64 * MIB,
            used: (64 << 10) + arena,
        };
        assert_eq!(m.used_by_run(), arena + 2 * MIB);
    }

    #[test]
    fn without_a_pool_it_is_the_drivers_growth() {
        let m = DeviceMemory {
            before_arena: 100,
            now: 1100,
            ..Default::default()
        };
        assert_eq!(m.used_by_run(), 1000);
    }
}
