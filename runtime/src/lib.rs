//! shardplan's runtime: executes a saved plan, one process per rank, compute and communication on
//! separate streams synchronised at the planned points (DESIGN §6).
//!
//! Its modules: `event` (monotonic counters), `arena` (static buffer offsets from plan lifetimes),
//! `workload` (a model's units and buffers), `train` (a workload's compute on a backend),
//! `gradients` (how a gradient buffer starts each micro-batch), `mlp` (the MLP and its
//! single-process reference), `gpt2` (GPT-2 on every backend), `model_file` (what `--model`
//! names), `dispatch` (the one meeting of backend and model), `layout` (which buffers a plan needs
//! and when), `backend` (the collectives; MPI and a single-rank loopback), `executor` (the slot
//! walker), `checkpoint` (a run's checkpoints and their resumption), `measure` (the measuring
//! profiler), `gemm` (products and their cuBLAS calls), `transformer` (a zoo unit's products),
//! `cuda` (the GPU backend), `launch` (a rank's start under mpirun), `session` (one run of a saved
//! plan, end to end), `fit` (a solve whose packed arena keeps its cap), `process` (the process's
//! peak resident memory), `lock` (the one policy for a poisoned lock), `error` (the runtime's
//! `Error`). tests/architecture.rs checks this list against the modules declared below.

pub mod arena;
pub mod backend;
pub mod checkpoint;
pub mod cuda;
pub mod dispatch;
pub mod error;
pub mod event;
pub mod executor;
#[cfg(feature = "solver")]
pub mod fit;
pub mod gemm;
pub mod gpt2;
pub mod gradients;
pub mod launch;
pub mod layout;
mod lock;
pub mod measure;
pub mod mlp;
pub mod model_file;
pub mod process;
pub mod session;
pub mod train;
pub mod transformer;
pub mod workload;

pub use error::{Error, Result};
