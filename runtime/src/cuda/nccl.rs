//! NCCL on the communication stream: one communicator per process, created from a unique id that
//! rank 0 makes and the launcher's other ranks receive (over MPI, as nccl-tests does), or alone
//! for a single GPU.

use crate::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use std::ffi::c_void;

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
        Ok(Nccl { comm, rank, size })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// `count` floats from every rank into `recv` (count·size floats), in rank order.
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        // SAFETY: the caller passes arena addresses of `count` and `count·size` floats.
        unsafe {
            result::all_gather(
                send as *const c_void,
                recv as *mut c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(drop)
        .map_err(nccl_error("AllGather"))
    }

    /// The sum over ranks of `send` (count·size floats), this rank's `count` into `recv`.
    pub fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        // SAFETY: as for `all_gather`.
        unsafe {
            result::reduce_scatter(
                send as *const c_void,
                recv as *mut c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(drop)
        .map_err(nccl_error("ReduceScatter"))
    }

    /// The sum over ranks of `count` floats (in place when `send` = `recv`).
    pub fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        // SAFETY: as for `all_gather`.
        unsafe {
            result::all_reduce(
                send as *const c_void,
                recv as *mut c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(drop)
        .map_err(nccl_error("AllReduce"))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, after the owner synchronised its streams.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
