//! The runtime's command-line arguments: the backend choice, `profile measure`, `doctor` and
//! `run`.

use super::SemanticsArg;
use super::values::{bytes_arg, seconds_arg};
use clap::{Args, ValueEnum};
use shardplan_runtime::cuda::{CudaOptions, ProductMath};
use shardplan_runtime::dispatch::BackendKind;
use std::path::PathBuf;

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum BackendArg {
    /// Host threads as streams, MPI collectives.
    Cpu,
    /// One GPU per process: CUDA streams and events, cuBLAS, NVRTC kernels, NCCL (cudarc; the
    /// libraries load at run time, see README "GPU").
    Cuda,
}

/// The backend a command runs on, and how its products compute.
#[derive(Args, Debug, Clone, Copy)]
pub struct BackendChoice {
    #[arg(long, value_enum)]
    pub backend: BackendArg,
    /// CUDA: fp32 products on TF32 tensor cores (operands rounded to 10 mantissa bits, fp32
    /// accumulation, as PyTorch's `allow_tf32`). Off by default, where the GPU's kernels match
    /// the CPU backend's.
    #[arg(long)]
    pub tf32: bool,
    /// CUDA: each operation's launches (a unit's forward, backward, recompute) captured as a CUDA
    /// graph the second time it runs and replayed after (DESIGN §6.9). Off by default.
    #[arg(long)]
    pub cuda_graphs: bool,
}

impl BackendChoice {
    /// The backend to start; `--tf32` or `--cuda-graphs` without `--backend cuda` is refused.
    pub fn kind(self) -> Result<BackendKind, shardplan_runtime::Error> {
        let math = if self.tf32 {
            ProductMath::Tf32
        } else {
            ProductMath::Fp32
        };
        let cuda_only = |setting, expected: &str| shardplan_runtime::Error::Setting {
            setting,
            expected: format!("--backend cuda: {expected}"),
        };
        match self.backend {
            BackendArg::Cpu if self.tf32 => {
                Err(cuda_only("--tf32", "the CPU backend's products are fp32"))
            }
            BackendArg::Cpu if self.cuda_graphs => Err(cuda_only(
                "--cuda-graphs",
                "the CPU backend's operations are host calls",
            )),
            BackendArg::Cpu => Ok(BackendKind::Cpu),
            BackendArg::Cuda => Ok(BackendKind::Cuda(CudaOptions {
                math,
                graphs: self.cuda_graphs,
            })),
        }
    }
}

#[derive(Args, Debug)]
pub struct MeasureArgs {
    #[command(flatten)]
    pub backend: BackendChoice,
    /// An MLP model (models/mlp-small.toml: trained as in `run`), or a zoo transformer
    /// (models/llama2-7b.toml: its units' matrix products replayed; CUDA backend only).
    #[arg(long)]
    pub model: PathBuf,
    /// The world size the profile is for: the number of MPI ranks, or any N with one rank and
    /// --device (the catalog's curves for N ranks).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: u32,
    /// Catalog device (h100-sxm, h200, a100-80g): the collective curves when one rank cannot
    /// measure them, and the byte counts of a transformer's profile.
    #[arg(long)]
    pub device: Option<String>,
    /// A replayed zoo transformer's micro-batch (default 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 16))]
    pub micro_batch: Option<u64>,
    /// A replayed zoo transformer's sequence length; defaults to the model's.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub seq_len: Option<u64>,
    /// Largest collective message to time.
    #[arg(long, default_value = "64MiB", value_parser = bytes_arg)]
    pub max_message: u64,
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,
    /// Override the block size derived from the measured curves.
    #[arg(long, value_parser = bytes_arg)]
    pub block_size: Option<u64>,
    /// Ranks per node G (dividing the world size): the profile gets a topology with the curves
    /// of every group of ranks the plan space offers, measured among the ranks (or the
    /// catalog's for --device on one rank); e.g. 4 CPU ranks as 2 nodes of 2 (DESIGN §3.11).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus_per_node: Option<u32>,
    /// Also time every kernel and product of one step, one by one (CUDA backend): where the
    /// step's time goes, per unit kind, pass and launch (the JSON's `details.launches`).
    #[arg(long)]
    pub launch_times: bool,
    /// Also measure the host link (`[host]`, DESIGN §3.13): copies between the device arena
    /// and the host arena for the H2D and D2H curves (CUDA: on its copy stream), the host's
    /// optimizer step per parameter (CUDA: the host's AdamW timed on its own).
    #[arg(long)]
    pub host_link: bool,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Compile the kernels for this architecture (default: GPU 0's, else sm_90).
    #[arg(long)]
    pub arch: Option<String>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub backend: BackendChoice,
    #[arg(long)]
    pub profile: PathBuf,
    #[arg(long)]
    pub plan: PathBuf,
    /// The model the profile was made for: an MLP (models/mlp-small.toml) or a GPT-2 with a
    /// `[training]` table (models/gpt2-tiny.toml).
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// GPT-2: the data to train on: a text file (tokenized as bytes), or a token file as nanoGPT
    /// (`.bin`, raw uint16) or llm.c (its 256-int32 header) write it, memory-mapped.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// GPT-2: start from these weights (safetensors with transformers' names, fp32).
    #[arg(long)]
    pub init_weights: Option<PathBuf>,
    /// GPT-2: write the trained weights (safetensors with transformers' names, fp32).
    #[arg(long)]
    pub save_weights: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = SemanticsArg::Strict)]
    pub semantics: SemanticsArg,
    /// Write a Chrome/Perfetto trace of rank 0's streams.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the trained parameters (JSON, one array per unit) — for checks against a reference.
    #[arg(long)]
    pub dump_params: Option<PathBuf>,
    /// Also train the single-process CPU reference (N·b samples a step) and report the largest
    /// relative difference of the trained weights.
    #[arg(long)]
    pub compare_reference: bool,
    /// Seconds any stream may wait for another or for a peer before the run fails (a watchdog
    /// ends the job when a collective waits longer).
    #[arg(long, default_value_t = 30.0, value_parser = seconds_arg)]
    pub timeout: f64,
    /// Write a checkpoint (parameters, Adam state, step) after every N steps, into
    /// --checkpoint-dir (the last two are kept).
    #[arg(long, requires = "checkpoint_dir")]
    pub checkpoint_every: Option<std::num::NonZeroUsize>,
    #[arg(long, requires = "checkpoint_every")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Continue from the newest complete checkpoint in this folder (same plan and ranks); --steps
    /// counts from the start of training.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}
