//! NCCL on the communication stream: one communicator per process, created from a unique id that
//! rank 0 makes and the launcher's other ranks receive (over MPI, as nccl-tests does), or alone
//! for a single GPU.

use crate::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use shardplan_scheduler::timeline::Collective;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

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
    move |e| Error::Backend(format!("NCCL: {what}: {e:?}"))
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
        // SAFETY: `comm` is written by NCCL on success and read only then.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), size as i32, id, rank as i32)
                .map_err(nccl_error("joining the communicator"))?;
            comm.assume_init()
        };
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

    /// `send` from every rank into `recv` (size × as many floats), in rank order.
    pub fn all_gather(
        &self,
        send: DeviceFloats,
        recv: DeviceFloats,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::AllGather, send, recv, stream)
    }

    /// The sum over ranks of `send`, this rank's share (1/size of it) into `recv`.
    pub fn reduce_scatter(
        &self,
        send: DeviceFloats,
        recv: DeviceFloats,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter, send, recv, stream)
    }

    /// The sum over ranks of `send` into `recv` (the same length; in place when they are one).
    pub fn all_reduce(
        &self,
        send: DeviceFloats,
        recv: DeviceFloats,
        stream: &CudaStream,
    ) -> Result<()> {
        self.collective(Collective::AllReduce, send, recv, stream)
    }

    /// One collective on `stream`, after checking that the buffers' lengths fit it.
    fn collective(
        &self,
        op: Collective,
        send: DeviceFloats,
        recv: DeviceFloats,
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
        if !whole || recv.len != expected_recv {
            return Err(Error::Backend(format!(
                "NCCL {}: {} floats sent and {} received do not fit {} ranks",
                op.name(),
                send.len,
                recv.len,
                self.size
            )));
        }
        let (send_ptr, recv_ptr) = (send.ptr as *const c_void, recv.ptr as *mut c_void);
        let (float, sum) = (sys::ncclDataType_t::ncclFloat32, sys::ncclRedOp_t::ncclSum);
        let cu_stream = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: NCCL reads `count` (AllGather, AllReduce) or count·size (ReduceScatter) floats
        // of `send` and writes `expected_recv` floats of `recv`; the lengths were checked above,
        // and `DeviceFloats`' contract keeps both allocated until the stream has run it.
        unsafe {
            match op {
                Collective::AllGather => {
                    result::all_gather(send_ptr, recv_ptr, count, float, self.comm, cu_stream)
                }
                Collective::ReduceScatter => result::reduce_scatter(
                    send_ptr, recv_ptr, count, float, sum, self.comm, cu_stream,
                ),
                Collective::AllReduce => {
                    result::all_reduce(send_ptr, recv_ptr, count, float, sum, self.comm, cu_stream)
                }
            }
        }
        .map(drop)
        .map_err(nccl_error(op.name()))
    }
}

/// `len` f32 values of device memory, as a collective reads or writes them.
#[derive(Debug, Clone, Copy)]
pub struct DeviceFloats {
    ptr: u64,
    len: usize,
}

impl DeviceFloats {
    /// # Safety
    /// `ptr` must address `len` f32 values of device memory on the communicator's GPU that stay
    /// allocated until every operation enqueued on them has completed, and that no other
    /// operation writes while a collective reading them, or reads or writes while a collective
    /// writing them, runs (the executor's ordering).
    pub unsafe fn new(ptr: u64, len: usize) -> Self {
        DeviceFloats { ptr, len }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.aborted.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: created in `new`, destroyed once, after the owner synchronised its streams.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
