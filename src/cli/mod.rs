//! Command-line grammar (clap). Sizes accept `40GiB`, `512MiB`, `80GB` or plain bytes.

mod runtime;
mod values;

pub use runtime::{DoctorArgs, MeasureArgs, RunArgs};
pub use values::{CapsArg, MemoryCap, MethodsArg, bytes_arg};

use crate::output::Output;
use clap::{Args, Parser, Subcommand, ValueEnum};
use shardplan_scheduler::analytic::NodeLayout;
use shardplan_scheduler::baselines::BaselineKind;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use values::{
    caps_arg, comm_slowdown_arg, effort_arg, gap_arg, memory_cap_arg, methods_arg, mfu_arg,
    node_size_arg, slowdown_arg, time_limit_arg,
};

#[derive(Parser, Debug)]
#[command(
    name = "shardplan",
    version,
    about = "Plan and simulate the communication of sharded data-parallel training (FSDP / ZeRO)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Build a profile of a model on a cluster.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Solve for the plan (levels, recompute, launch slots) that minimises iteration time under a
    /// memory cap, or peak memory under a time ceiling.
    Solve(SolveArgs),
    /// Compare the ILP with the baselines across memory caps: CSV, charts, summary.
    Sweep(SweepArgs),
    /// Export a plan to other systems.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Collective curves: import measurements.
    #[command(subcommand)]
    Comm(CommCommand),
    /// Execute a plan: one process per rank (under mpirun), real training of an MLP or GPT-2 model.
    Run(RunArgs),
    /// Write the plan of a baseline (ddp, zero2, fsdp1, fsdp2, zero3, best-grid; with micro-batches
    /// also ddp-nosync, fsdp2-nosync; with a host link fsdp2-offload, zero3-offload).
    Baseline(BaselineArgs),
    /// Simulate a plan: iteration time, communication, per-slot memory, optional trace.
    Simulate(SimulateArgs),
    /// Show a plan as a table: per unit level and launch slots, and the memory peak.
    Inspect(InspectArgs),
    /// Run the main job on a bundled profile: every baseline under the device's memory.
    Demo(DemoArgs),
    /// Check what the CUDA backend finds here: its libraries, the GPUs, the MLP and GPT-2 kernels
    /// compiled by NVRTC under each precision policy (no GPU needed); exit 1 when `run --backend
    /// cuda` cannot start.
    Doctor(DoctorArgs),
}

impl Command {
    /// What the command was asked to print (`--json`: machine output); errors follow it.
    pub fn output(&self) -> Output {
        Output::of_json_flag(match self {
            Command::Profile(ProfileCommand::Analytic(a)) => a.json,
            Command::Profile(ProfileCommand::Measure(a)) => a.json,
            Command::Solve(a) => a.json,
            Command::Sweep(a) => a.json,
            Command::Export(ExportCommand::Fsdp2(a)) => a.json,
            Command::Comm(CommCommand::Import(a)) => a.json,
            Command::Run(a) => a.json,
            Command::Baseline(a) => a.json,
            Command::Simulate(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Demo(a) => a.json,
            Command::Doctor(_) => false,
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Analytic profile from a model spec and a hardware spec.
    Analytic(AnalyticArgs),
    /// Measured profile of an MLP model: unit times on this machine, collective curves across the
    /// ranks of `mpirun -np N`.
    Measure(MeasureArgs),
}

#[derive(Args, Debug)]
pub struct AnalyticArgs {
    /// Model spec, e.g. models/llama2-7b.toml.
    #[arg(long)]
    pub model: PathBuf,
    /// Device name from the hardware catalog (h100-sxm, h200, a100-80g).
    #[arg(long)]
    pub device: String,
    /// Data-parallel world size N (above 8: multi-node).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: u32,
    /// Sequences per micro-batch (B).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1 << 16))]
    pub micro_batch: u64,
    /// Micro-batches per optimizer step (K, gradient accumulation; DESIGN §3.10).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1 << 16))]
    pub micro_batches: u32,
    /// Sequence length; defaults to the model's.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub seq_len: Option<u64>,
    /// Model FLOP utilisation in (0, 1].
    #[arg(long, default_value_t = 0.5, value_parser = mfu_arg)]
    pub mfu: f64,
    #[arg(long, value_enum, default_value_t = AttentionArg::Flash)]
    pub attention: AttentionArg,
    /// Bytes per gathered parameter (p).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub param_bytes: u64,
    /// Bytes per gradient element (g).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub grad_bytes: u64,
    /// Optimizer bytes per parameter (o; Adam mixed precision: 12).
    #[arg(long, default_value_t = 12)]
    pub optimizer_bytes: u64,
    /// Override the block size (default: smallest power of two reaching 90% of peak busbw).
    #[arg(long, value_parser = bytes_arg)]
    pub block_size: Option<u64>,
    /// Overlap slowdown κ (compute µs lost per µs of concurrent communication).
    #[arg(long, default_value_t = 0.0, value_parser = slowdown_arg)]
    pub overlap_slowdown: f64,
    /// Communication slowdown κ_q (communication µs lost per µs of concurrent compute, 0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = comm_slowdown_arg)]
    pub comm_slowdown: f64,
    /// Ranks per node G, or `catalog` for the device's: writes the topology, with the curves of
    /// every group of ranks the plan space offers (DESIGN §3.11). Default: the device's nodes
    /// wherever --world-size spans more than one (a multiple of the node size), else one link.
    #[arg(long, value_parser = node_size_arg)]
    pub gpus_per_node: Option<NodeLayout>,
    /// One link for every collective, no node layout (the inter-node interconnect once
    /// --world-size spans nodes).
    #[arg(long, conflicts_with = "gpus_per_node")]
    pub flat: bool,
    /// Hardware catalog; defaults to the bundled models/hardware.toml.
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub json: bool,
}

impl AnalyticArgs {
    /// The node layout the flags ask for: `--gpus-per-node`'s, one link under `--flat` (clap
    /// refuses the two together), else the device's nodes.
    pub fn node_layout(&self) -> NodeLayout {
        match (self.gpus_per_node, self.flat) {
            (Some(layout), _) => layout,
            (None, true) => NodeLayout::Flat,
            (None, false) => NodeLayout::DeviceNodes,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum AttentionArg {
    Flash,
    Eager,
}

#[derive(Args, Debug)]
pub struct BaselineArgs {
    #[arg(long)]
    pub profile: PathBuf,
    /// ddp, zero2, fsdp1, fsdp2, zero3, best-grid; with micro-batches ddp-nosync, fsdp2-nosync;
    /// on a profile with nodes (DESIGN §3.11) hsdp (within the cap, the smallest shard group of
    /// whole nodes that fits) or hpz, and with micro-batches hsdp-nosync, hsdp-ra-once,
    /// hpz-nosync (DESIGN §3.11.1); on a profile with a host link (DESIGN §3.13)
    /// fsdp2-offload or zero3-offload.
    #[arg(long, value_parser = str::parse::<BaselineKind>)]
    pub kind: BaselineKind,
    /// Activation checkpointing for every unit.
    #[arg(long)]
    pub checkpoint: bool,
    /// Memory cap recorded in the plan (bytes or `unlimited`); best-grid chooses within it.
    #[arg(long, value_parser = memory_cap_arg)]
    pub memory_cap: Option<MemoryCap>,
    /// Record the plan as made for this target (DESIGN §4.9): with fsdp2, a baseline FSDP2
    /// cannot run as built (a tied fsdp lender) is refused.
    #[arg(long, value_enum, default_value_t = TargetArg::Runtime)]
    pub target: TargetArg,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum SemanticsArg {
    Strict,
    Relaxed,
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    #[arg(long)]
    pub profile: PathBuf,
    #[arg(long)]
    pub plan: PathBuf,
    #[arg(long, value_enum, default_value_t = SemanticsArg::Strict)]
    pub semantics: SemanticsArg,
    /// Write a Chrome/Perfetto trace (JSON) here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[arg(long)]
    pub profile: PathBuf,
    #[arg(long)]
    pub plan: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Write each plan and the traces into this directory.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Micro-batches per optimizer step (K, gradient accumulation; DESIGN §3.10).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1 << 16))]
    pub micro_batches: u32,
    /// Plan on one link for every collective (no nodes: no shard or secondary groups), as
    /// before the topology (DESIGN §3.11).
    #[arg(long)]
    pub flat: bool,
    /// The ILP's work, in thousands of LP iterations per search (default 60): the same
    /// effort gives the same plan on any machine and under any load (DESIGN §4.6).
    #[arg(long, value_parser = effort_arg)]
    pub effort: Option<NonZeroU64>,
    /// The outer guard: seconds after which the ILP stops wherever it is (its status then says
    /// `time_limit`, and the plan may differ from run to run), or `unlimited`.
    #[arg(long, default_value_t = 120.0, value_parser = time_limit_arg)]
    pub time_limit: f64,
    /// Solve only for this target (DESIGN §4.9); default: both the runtime's ILP and FSDP2's.
    #[arg(long, value_enum)]
    pub target: Option<TargetArg>,
    #[arg(long)]
    pub json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum ObjectiveArg {
    Time,
    Memory,
}

/// Whose execution a plan is made for (DESIGN §4.9).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Default)]
pub enum TargetArg {
    /// The project's runtime: blocks launched anywhere in their windows.
    #[default]
    Runtime,
    /// PyTorch FSDP2: exactly the settings `fully_shard` executes (`export fsdp2` is exact).
    Fsdp2,
}

impl From<TargetArg> for shardplan_scheduler::target::Target {
    fn from(arg: TargetArg) -> Self {
        match arg {
            TargetArg::Runtime => Self::Runtime,
            TargetArg::Fsdp2 => Self::Fsdp2,
        }
    }
}

#[derive(Args, Debug)]
pub struct SolveArgs {
    #[arg(long)]
    pub profile: PathBuf,
    /// Per-rank memory cap: bytes (80GiB, 85899345920) or `unlimited`; required for
    /// --objective time.
    #[arg(long, value_parser = memory_cap_arg)]
    pub memory_cap: Option<MemoryCap>,
    #[arg(long)]
    pub out: PathBuf,
    /// The solver's work, in thousands of LP iterations per search (default 60): the same
    /// profile, cap and options (--threads included) give the same plan on any machine and under
    /// any load (DESIGN §4.6).
    #[arg(long, value_parser = effort_arg)]
    pub effort: Option<NonZeroU64>,
    /// The outer guard: seconds after which the solve stops wherever it is, baselines and warm
    /// starts included (its status then says `time_limit`, and the plan may differ from run to
    /// run), or `unlimited`.
    #[arg(long, default_value_t = 60.0, value_parser = time_limit_arg)]
    pub time_limit: f64,
    /// Relative MIP gap at which to stop.
    #[arg(long, default_value_t = 1e-4, value_parser = gap_arg)]
    pub gap: f64,
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,
    /// Limit windows: gathers in the last D slots, reductions in the first D (D >= 1); sets
    /// both --gather-depth and --reduce-depth.
    #[arg(long, conflicts_with_all = ["gather_depth", "reduce_depth"])]
    pub window_depth: Option<NonZeroUsize>,
    /// Gathers only in the last D slots of their window (D >= 1).
    #[arg(long)]
    pub gather_depth: Option<NonZeroUsize>,
    /// Reductions only in the first R slots after the unit's backward (R >= 1).
    #[arg(long)]
    pub reduce_depth: Option<NonZeroUsize>,
    /// Solve the full windows directly instead of the two-phase strategy (with micro-batches:
    /// instead of within depth 4, for a large model).
    #[arg(long)]
    pub single_phase: bool,
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Time)]
    pub objective: ObjectiveArg,
    /// The plans searched: the runtime's, or exactly what FSDP2 executes (its export is exact).
    #[arg(long, value_enum, default_value_t = TargetArg::Runtime)]
    pub target: TargetArg,
    /// With --objective memory: the iteration-time ceiling (8.5s, 900ms, 1200us).
    #[arg(long, value_parser = shardplan_scheduler::size::parse_duration_us)]
    pub max_iteration_time: Option<f64>,
    /// Never recompute activations.
    #[arg(long)]
    pub no_recompute: bool,
    /// Pack the plan's buffers as `run` will for this model (an MLP, or a GPT-2 with
    /// [training]) and, while the packed arena exceeds --memory-cap, search a lower cap to solve
    /// under; the plan returned (the best of those solves and the baselines) packs within
    /// --memory-cap.
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[arg(long)]
    pub profile: PathBuf,
    /// Micro-batches per optimizer step (K; DESIGN §3.10) in place of the profile's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1 << 16))]
    pub micro_batches: Option<u32>,
    /// `LOW..HIGH` (e.g. 20GiB..80GiB, with --points) or a list (24GiB,32GiB,48GiB). Default: from
    /// the smallest feasible cap to the peak of the fastest unconstrained plan.
    #[arg(long, value_parser = caps_arg)]
    pub caps: Option<CapsArg>,
    /// Caps in a range (`--caps LOW..HIGH` or the default one), evenly spaced (default 20).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub points: Option<u64>,
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Comma-separated: ilp, ddp, zero2, fsdp1, fsdp2, zero3, best-grid; with micro-batches
    /// ddp-nosync, fsdp2-nosync; on a profile with nodes (DESIGN §3.11) hsdp, hpz, and with
    /// micro-batches hsdp-nosync, hsdp-ra-once, hpz-nosync (default: all of them).
    #[arg(long, value_parser = methods_arg)]
    pub methods: Option<MethodsArg>,
    /// Each ILP solve's work, in thousands of LP iterations per search (default 60; with the
    /// ilp method): the same effort gives the same sweep on any machine (DESIGN §4.6).
    #[arg(long, value_parser = effort_arg)]
    pub effort: Option<NonZeroU64>,
    /// The outer guard of each ILP solve: seconds, or `unlimited` (default 60; with the ilp
    /// method). A solve it stops reports `time_limit`.
    #[arg(long, value_parser = time_limit_arg)]
    pub time_limit: Option<f64>,
    /// Relative MIP gap at which each solve stops (default 1e-3; with the ilp method).
    #[arg(long, value_parser = gap_arg)]
    pub gap: Option<f64>,
    /// The ILP's target (DESIGN §4.9): its rows are the plans FSDP2 runs exactly with fsdp2.
    #[arg(long, value_enum, default_value_t = TargetArg::Runtime)]
    pub target: TargetArg,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum CommCommand {
    /// Replace a profile's collective curves with nccl-tests outputs (text or -J JSON) and
    /// recompute its block size.
    Import(CommImportArgs),
}

#[derive(Args, Debug)]
pub struct CommImportArgs {
    /// Output of all_gather_perf.
    #[arg(long)]
    pub all_gather: Option<PathBuf>,
    /// Output of reduce_scatter_perf.
    #[arg(long)]
    pub reduce_scatter: Option<PathBuf>,
    /// Output of all_reduce_perf.
    #[arg(long)]
    pub all_reduce: Option<PathBuf>,
    /// The profile to update.
    #[arg(long)]
    pub into: PathBuf,
    /// Write the updated profile here instead of replacing --into.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep this block size instead of recomputing it from the curves.
    #[arg(long, value_parser = bytes_arg)]
    pub block_size: Option<u64>,
    /// The curves are of a group of the profile's topology on this link (its size: the files'
    /// rank count), not of the world (DESIGN §3.11).
    #[arg(long, value_enum)]
    pub link: Option<LinkArg>,
    #[arg(long)]
    pub json: bool,
}

/// The link of `comm import --link`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum LinkArg {
    Intra,
    Inter,
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// PyTorch FSDP2 settings per unit (JSON for python/shardplan_torch's apply_plan).
    Fsdp2(ExportFsdp2Args),
}

#[derive(Args, Debug)]
pub struct ExportFsdp2Args {
    #[arg(long)]
    pub plan: PathBuf,
    #[arg(long)]
    pub profile: PathBuf,
    #[arg(long)]
    pub out: PathBuf,
    /// Export a plan whose simulated peak is above its own memory cap.
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
}
