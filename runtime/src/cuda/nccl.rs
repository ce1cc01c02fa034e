//! NCCL on the communication stream: one communicator per process, created from a unique id that
//! rank 0 makes and the launcher's other ranks receive (over MPI, as nccl-tests does), or alone
//! for a single GPU.
//!
//! The communicator is non-blocking (`ncclConfig_t.blocking = 0`, DESIGN §6.8): a call that NCCL
//! has not finished returns `ncclInProgress` and is waited for by polling
//! `ncclCommGetAsyncError`, so no host thread is ever stuck inside NCCL where `ncclCommAbort`
//! cannot reach it, and the watchdog reads the communicator's own errors (a peer's connection
//! lost) as they happen.

use crate::backend::FloatFormat;
use crate::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use shardplan_scheduler::timeline::Collective;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The bytes of an NCCL unique id.
pub type UniqueId = [u8; 128];

/// How this process joins its communicator.
#[derive(Debug, Clone, Copy)]
pub enum NcclSetup {
    /// One rank, one GPU.
    Single,
    /// Rank `rank` of `size`, with the id rank 0 made ([`unique_id`]).
    Rank {
        rank: usize,
        size: usize,
        id: UniqueId,
    },
}

/// A new unique id (rank 0 only).
pub fn unique_id() -> Result<UniqueId> {
    let id = result::get_uniqueid().map_err(nccl_error("making a unique id"))?;
    Ok(id.internal.map(|c| c as u8))
}

fn nccl_error(what: &str) -> impl Fn(result::NcclError) -> Error + '_ {
    move |e| Error::Backend(format!("NCCL: {what}: {:?}", e.0))
}

/// `NCCL_CONFIG_INITIALIZER`'s magic, and its value for a field left to NCCL's default.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
const CONFIG_UNDEF_INT: i32 = i32::MIN;
/// `NCCL_VERSION(2, 30, 0)`: the header cudarc's `ncclConfig_t` was generated from. An older
/// library reads the fields it knows (the struct's `size` tells it how many bytes there are).
const CONFIG_VERSION: u32 = 2 * 10_000 + 30 * 100;

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: every other field NCCL's default.
fn non_blocking_config() -> sys::ncclConfig_t {
    let undef = CONFIG_UNDEF_INT;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: CONFIG_VERSION,
        blocking: 0,
        cgaClusterSize: undef,
        minCTAs: undef,
        maxCTAs: undef,
        netName: std::ptr::null(),
        splitShare: undef,
        trafficClass: undef,
        commName: std::ptr::null(),
        collnetEnable: undef,
        CTAPolicy: undef,
        shrinkShare: undef,
        nvlsCTAs: undef,
        nChannelsPerNetPeer: undef,
        nvlinkCentricSched: undef,
        graphUsageMode: undef,
        numRmaCtx: undef,
        maxP2pPeers: undef,
    }
}

/// How long dropping a communicator waits for `ncclCommFinalize` before it aborts instead.
const FINALIZE_WAIT: Duration = Duration::from_secs(30);

/// The communicator's state (`ncclCommGetAsyncError`): `ncclInProgress` while a call NCCL
/// returned from early still runs, `ncclSuccess` once none does, or the error it ended in.
fn state(comm: sys::ncclComm_t) -> Result<sys::ncclResult_t> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: `comm` is a communicator handle NCCL returned (valid from the moment
    // ncclCommInitRankConfig returns, also while it is in progress) and not yet destroyed;
    // `state` is a valid place for the result.
    unsafe { sys::ncclCommGetAsyncError(comm, &mut state) }
        .result()
        .map_err(nccl_error("reading the communicator's state"))?;
    Ok(state)
}

/// Waits until the communicator's call that returned `ncclInProgress` has finished, by
/// polling its state; the error it ended in, or a timeout past `deadline`.
fn settle(comm: sys::ncclComm_t, what: &str, deadline: Option<Instant>) -> Result<()> {
    let mut pause = Duration::from_micros(1);
    loop {
        match state(comm)? {
            sys::ncclResult_t::ncclSuccess => return Ok(()),
            sys::ncclResult_t::ncclInProgress => {
                if deadline.is_some_and(|d| Instant::now() > d) {
                    return Err(Error::Timeout(format!(
                        "NCCL: {what} did not finish in time"
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
            failed => return Err(Error::Backend(format!("NCCL: {what}: {failed:?}"))),
        }
    }
}

/// A call's result on a non-blocking communicator: finished, or waited for until it is (until
/// `deadline`, if given).
fn finished(
    comm: sys::ncclComm_t,
    what: &str,
    called: std::result::Result<result::NcclStatus, result::NcclError>,
    deadline: Option<Instant>,
) -> Result<()> {
    match called.map_err(nccl_error(what))? {
        result::NcclStatus::InProgress => settle(comm, what, deadline),
        _ => Ok(()),
    }
}

/// A communicator.
pub struct Nccl {
    comm: sys::ncclComm_t,
    rank: usize,
    size: usize,
    /// Set by [`Nccl::abort`]: the communicator is neither used nor destroyed after it.
    aborted: AtomicBool,
}

impl Nccl {
    /// Joins the communicator; the GPU's context must be current on this thread.
    pub fn new(setup: NcclSetup) -> Result<Self> {
        let (rank, size, id) = match setup {
            NcclSetup::Single => (0, 1, unique_id()?),
            NcclSetup::Rank { rank, size, id } => (rank, size, id),
        };
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm = std::mem::MaybeUninit::uninit();
        let mut config = non_blocking_config();
        let joining = "joining the communicator";
        // SAFETY: `config` is a complete `ncclConfig_t` that outlives the call; `comm` is a
        // valid place for the handle.
        let called = unsafe {
            sys::ncclCommInitRankConfig(
                comm.as_mut_ptr(),
                size as i32,
                id,
                rank as i32,
                &mut config,
            )
        };
        let status = called.result().map_err(nccl_error(joining))?;
        // SAFETY: NCCL wrote the handle: the call returned ncclSuccess or ncclInProgress.
        let comm = unsafe { comm.assume_init() };
        if let Err(e) = finished(comm, joining, Ok(status), None) {
            // SAFETY: the handle is valid and never used again.
            let _ = unsafe { result::comm_abort(comm) };
            return Err(e);
        }
        Ok(Nccl {
            comm,
            rank,
            size,
            aborted: AtomicBool::new(false),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Aborts the communicator (`ncclCommAbort`, callable from any thread): its operations in
    /// flight end, later ones are refused, and it is not destroyed again. The job is ending.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: the communicator is valid (created in `new`, destroyed only in `drop`,
            // which skips an aborted one); NCCL allows the abort beside a blocked operation.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// An error the communicator has ended in on its own (`ncclCommGetAsyncError`: a peer's
    /// connection lost, a remote error), which no call has returned yet; `None` while it is
    /// healthy or once it was aborted.
    pub fn asynchronous_error(&self) -> Option<String> {
        if self.aborted.load(Ordering::SeqCst) {
            return None;
        }
        match state(self.comm) {
            Ok(sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) => None,
            Ok(failed) => Some(format!("NCCL's communicator failed: {failed:?}")),
            Err(e) => Some(e.to_string()),
        }
    }

    /// `send` from every rank into `recv` (size × as many floats), in rank order.
    pub fn all_gather(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::AllGather, send, recv, stream)
    }

    /// The sum over ranks of `send`, this rank's share (1/size of it) into `recv`.
    pub fn reduce_scatter(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter, send, recv, stream)
    }

    /// The sum over ranks of `send` into `recv` (the same length; in place when they are one).
    pub fn all_reduce(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::AllReduce, send, recv, stream)
    }

    /// One collective on `stream`, after checking that the buffers' lengths fit it.
    fn collective(
        &self,
        op: Collective,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        stream: &CudaStream,
    ) -> Result<()> {
        let (count, expected_recv) = match op {
            Collective::AllGather => (send.len, send.len * self.size),
            Collective::ReduceScatter => (send.len / self.size, send.len / self.size),
            Collective::AllReduce => (send.len, send.len),
        };
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Backend(format!(
                "NCCL {}: the communicator was aborted",
                op.name()
            )));
        }
        let whole = op != Collective::ReduceScatter || send.len.is_multiple_of(self.size);
        if !whole || recv.len != expected_recv || send.format != recv.format {
            return Err(Error::Backend(format!(
                "NCCL {}: {} {} elements sent and {} {} received do not fit {} ranks",
                op.name(),
                send.len,
                send.format.name(),
                recv.len,
                recv.format.name(),
                self.size
            )));
        }
        let (send_ptr, recv_ptr) = (send.ptr as *const c_void, recv.ptr as *mut c_void);
        let dtype = match send.format {
            FloatFormat::Fp32 => sys::ncclDataType_t::ncclFloat32,
            FloatFormat::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        };
        let sum = sys::ncclRedOp_t::ncclSum;
        let cu_stream = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: NCCL reads `count` (AllGather, AllReduce) or count·size (ReduceScatter) elements
        // of `send` and writes `expected_recv` elements of `recv`, of the one format both have;
        // the lengths were checked above, and `DeviceBuffer`'s contract keeps both allocated until
        // the stream has run it.
        let called = unsafe {
            match op {
                Collective::AllGather => {
                    result::all_gather(send_ptr, recv_ptr, count, dtype, self.comm, cu_stream)
                }
                Collective::ReduceScatter => result::reduce_scatter(
                    send_ptr, recv_ptr, count, dtype, sum, self.comm, cu_stream,
                ),
                Collective::AllReduce => {
                    result::all_reduce(send_ptr, recv_ptr, count, dtype, sum, self.comm, cu_stream)
                }
            }
        };
        finished(self.comm, op.name(), called, None)
    }
}

/// `len` values of `format` in device memory, as a collective reads or writes them (bf16 sums
/// are NCCL's `ncclBfloat16`: each addition rounded, as the CPU backend's).
#[derive(Debug, Clone, Copy)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    format: FloatFormat,
}

impl DeviceBuffer {
    /// # Safety
    /// `ptr` must address `len` values of `format` in device memory on the communicator's GPU
    /// that stay allocated until every operation enqueued on them has completed, and that no
    /// other operation writes while a collective reading them, or reads or writes while a
    /// collective writing them, runs (the executor's ordering).
    pub unsafe fn new(ptr: u64, len: usize, format: FloatFormat) -> Self {
        DeviceBuffer { ptr, len, format }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.aborted.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: created in `new`, finalized and destroyed once, after the owner synchronised
        // its streams; a finalize that does not finish (a peer gone) is aborted instead.
        unsafe {
            let finalizing = "finalizing the communicator";
            let called = result::comm_finalize(self.comm);
            let deadline = Some(Instant::now() + FINALIZE_WAIT);
            let finalized = finished(self.comm, finalizing, called, deadline);
            let _ = match finalized {
                Ok(()) => result::comm_destroy(self.comm),
                Err(_) => result::comm_abort(self.comm),
            };
        }
    }
}
