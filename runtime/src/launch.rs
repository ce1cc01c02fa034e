//! Starting a rank: whether an MPI launcher started this process, which GPU is its own, and the
//! CUDA backend set up in the order it needs (libraries, then MPI, then NCCL).

use crate::Result;
use crate::backend::{Collectives, Mpi, MpiUniverse};
use crate::cuda::{CudaBackend, CudaOptions, NcclSetup, libraries, unique_id};

/// Whether this process was started by an MPI launcher.
pub fn under_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// This process's rank as the launcher set it in the environment (before MPI is initialised, or
/// where it never is), if a launcher started it.
pub fn launcher_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// This process's index among the launcher's processes on this machine (its GPU).
fn local_rank(rank: usize) -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(rank)
}

/// This rank's GPU: the libraries first (before MPI or any thread: finding them may re-execute
/// the process), then under mpirun MPI for the rank and rank 0's NCCL id, else one GPU alone.
/// The MPI universe, when there is one, must outlive the backend's use of MPI.
pub fn cuda_backend(options: CudaOptions) -> Result<(Option<MpiUniverse>, CudaBackend)> {
    libraries::prepare()?;
    if !under_mpi() {
        return Ok((None, CudaBackend::new(0, NcclSetup::Single, options)?));
    }
    let (universe, mpi) = Mpi::init()?;
    let (rank, size) = (mpi.rank(), mpi.size());
    let mut id = if rank == 0 { unique_id()? } else { [0; 128] };
    mpi.broadcast_from_first(&mut id);
    let setup = NcclSetup::Rank { rank, size, id };
    Ok((
        Some(universe),
        CudaBackend::new(local_rank(rank), setup, options)?,
    ))
}

/// Ends this process and, in a job of several MPI ranks, every rank (MPI_Abort with `code`:
/// mpirun ends the others); a process alone exits with `code`. It exits without the process's
/// exit handlers (`_exit`, after flushing stdout and stderr): the CUDA driver's and NCCL's handlers
/// wait for the device, which a stalled collective never frees. On an H100 a plain exit behind a
/// held stream waited for the stream, then crashed (signal 11) in those handlers
/// (docs/gpu-results.md, 2026-11-26, second session).
pub fn end_job(code: i32) -> ! {
    use std::io::Write;
    abort_peers(code);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process at once; no Rust state is observed after it.
    unsafe { libc::_exit(code) }
}

/// This process's rank of the job and the job's number of ranks.
pub fn job_rank(universe: &MpiUniverse) -> (usize, usize) {
    use mpi::topology::Communicator;
    let world = universe.world();
    (world.rank() as usize, world.size() as usize)
}

/// Ends every rank of a job of more than one MPI rank (MPI_Abort with `code`); returns when MPI
/// is not initialised or this rank is alone. For a rank that failed: its peers may wait in a
/// collective it will never join, and MPI_Finalize would then wait for them. The caller reports
/// the failure first.
pub fn abort_peers(code: i32) {
    use mpi::topology::{Communicator, SimpleCommunicator};
    if mpi::environment::is_initialized() {
        let world = SimpleCommunicator::world();
        if world.size() > 1 {
            world.abort(code);
        }
    }
}
