//! Where a backend and a model meet, once for every command: [`start`] makes this rank's backend
//! as its launcher asks ([`AnyBackend`]), [`Model::build`] makes a `--model` file the workload a
//! rank trains, and [`AnyBackend::run`] hands both, as concrete types, to a [`Job`] (`run`,
//! `profile measure`); [`AnyBackend::replay`] hands a zoo transformer (no `[training]`) to a
//! [`ReplayJob`] on a GPU, the only backend that replays one. `solve --model` lays out
//! [`Model::workload`] without a backend.
//!
//! Adding a model is its own folder (a workload, its kernel trait, the trait on each backend)
//! and one registration here: a variant of [`Model`], its arm in [`Model::build`] and
//! [`Model::run_on`], its kernel source in [`KERNEL_SOURCES`].

use crate::backend::{Backend, CpuBackend, Loopback, Mpi, MpiUniverse};
use crate::cuda::module::KernelSource;
use crate::cuda::{CudaBackend, CudaOptions};
use crate::gpt2::{self, Gpt2};
use crate::launch::{cuda_backend, under_mpi};
use crate::mlp::{self, Mlp, ReferenceCheck};
use crate::model_file::ModelFile;
use crate::train::Train;
use crate::workload::Workload;
use crate::{Error, Result};
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::model::ModelSpec;
use std::path::Path;

/// Which backend a command asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU: MPI ranks under mpirun, else one rank alone.
    Cpu,
    /// One GPU per process: NCCL ranks under mpirun, else one GPU alone, run as `options` say.
    Cuda(CudaOptions),
}

/// This rank's backend.
pub enum AnyBackend {
    CpuRanks(CpuBackend<Mpi>),
    CpuAlone(CpuBackend<Loopback>),
    /// Boxed: a GPU's handles and buffers outweigh the CPU backends by far.
    Cuda(Box<CudaBackend>),
}

/// Starts this rank's backend of `kind`. The MPI universe, when the launcher started several
/// processes, must outlive the backend's use of MPI (and serves to end the job on a failure).
pub fn start(kind: BackendKind) -> Result<(Option<MpiUniverse>, AnyBackend)> {
    Ok(match kind {
        BackendKind::Cpu if under_mpi() => {
            let (universe, mpi) = Mpi::init()?;
            (Some(universe), AnyBackend::CpuRanks(CpuBackend::new(mpi)))
        }
        BackendKind::Cpu => (None, AnyBackend::CpuAlone(CpuBackend::new(Loopback))),
        BackendKind::Cuda(options) => {
            let (universe, backend) = cuda_backend(options)?;
            (universe, AnyBackend::Cuda(Box::new(backend)))
        }
    })
}

/// What a command does with a backend and a workload, generic over both: [`AnyBackend::run`]
/// calls it with the concrete pair.
pub trait Job {
    type Output;
    fn run<B: Backend, W: Train<B>>(self, backend: B, workload: &W) -> Self::Output;
}

/// What a command does with a zoo transformer's products on a GPU (`profile measure` of a model
/// without `[training]`): [`AnyBackend::replay`] calls it with the GPU backend.
pub trait ReplayJob {
    type Output;
    fn run(self, backend: CudaBackend, model: &ModelSpec) -> Result<Self::Output>;
}

impl AnyBackend {
    pub fn rank(&self) -> usize {
        match self {
            AnyBackend::CpuRanks(b) => b.rank(),
            AnyBackend::CpuAlone(b) => b.rank(),
            AnyBackend::Cuda(b) => b.rank(),
        }
    }

    pub fn world_size(&self) -> usize {
        match self {
            AnyBackend::CpuRanks(b) => b.world_size(),
            AnyBackend::CpuAlone(b) => b.world_size(),
            AnyBackend::Cuda(b) => b.world_size(),
        }
    }

    /// Runs `job` on this backend and `model`'s workload.
    pub fn run<J: Job>(self, model: &Model, job: J) -> J::Output {
        match self {
            AnyBackend::CpuRanks(b) => model.run_on(b, job),
            AnyBackend::CpuAlone(b) => model.run_on(b, job),
            AnyBackend::Cuda(b) => model.run_on(*b, job),
        }
    }

    /// Runs `job` on the zoo transformer `model` (of the file `origin`) replayed on this rank's
    /// GPU; refused on the CPU, which measures a transformer only by training it.
    pub fn replay<J: ReplayJob>(
        self,
        model: &ModelSpec,
        origin: &str,
        job: J,
    ) -> Result<J::Output> {
        match self {
            AnyBackend::Cuda(b) => job.run(*b, model),
            AnyBackend::CpuRanks(_) | AnyBackend::CpuAlone(_) => {
                Err(shardplan_scheduler::Error::invalid(
                    origin,
                    "training",
                    "a [training] table: on the CPU a transformer is measured by training it \
                     (models/gpt2-tiny.toml); zoo models are replayed on a GPU (--backend cuda) \
                     or profiled with `profile analytic`",
                )
                .into())
            }
        }
    }
}

/// Every model's CUDA kernels and the backend's own (what `doctor` compiles and loads).
pub const KERNEL_SOURCES: [KernelSource; 3] = [
    mlp::cuda::KERNELS,
    gpt2::cuda_source::KERNELS,
    crate::cuda::convert::CONVERSIONS,
];

/// Refuses `setting` given (`given` is Some) for the MLP of `origin`, which `why`.
fn refuse_for_mlp(
    origin: &str,
    setting: &'static str,
    given: Option<&Path>,
    why: &str,
) -> Result<()> {
    match given {
        None => Ok(()),
        Some(_) => Err(Error::Setting {
            setting,
            expected: format!(
                "a GPT-2 model with [training] for {setting}: {origin} is an MLP, which {why}"
            ),
        }),
    }
}

/// What a GPT-2 trains on.
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    /// Synthetic tokens and the model's own initialisation: timing and layout depend on neither.
    Synthetic,
    /// A text or token file (`--data`, required) and optionally initial weights (`--init-weights`).
    Text {
        text: Option<&'a Path>,
        init_weights: Option<&'a Path>,
    },
}

/// What a run does with its trained weights.
#[derive(Debug, Clone, Copy)]
pub struct AfterRun<'a> {
    /// The MLP: train the single-process reference for `steps` and compare.
    pub compare_reference: bool,
    pub steps: usize,
    /// GPT-2: write the weights here (safetensors, `save_pretrained`'s names).
    pub save_weights: Option<&'a Path>,
}

/// A model as rank `rank` of `world` trains it.
pub enum Model {
    Mlp(Mlp),
    Gpt2(Gpt2),
}

impl Model {
    /// The workload of `file` (named `origin` in errors) for rank `rank` of `world`; a GPT-2
    /// reads its data as `data` says (the MLP makes its own).
    pub fn build(
        file: ModelFile,
        origin: &str,
        (rank, world): (usize, usize),
        data: Data,
    ) -> Result<Model> {
        Ok(match file {
            ModelFile::Mlp(spec) => {
                if let Data::Text { text, init_weights } = data {
                    refuse_for_mlp(origin, "--data", text, "makes its own samples")?;
                    refuse_for_mlp(origin, "--init-weights", init_weights, "initialises itself")?;
                }
                Model::Mlp(Mlp::new(spec, rank, world))
            }
            ModelFile::Transformer(model) => Model::Gpt2(match data {
                Data::Synthetic => Gpt2::synthetic(&model, origin, rank, world)?,
                Data::Text { text, init_weights } => {
                    let text = text.ok_or_else(|| Error::Setting {
                        setting: "--data",
                        expected: format!(
                            "a text or token file: {origin} is a GPT-2, which trains on tokens"
                        ),
                    })?;
                    let tokens = gpt2::data::Tokens::load(
                        text,
                        model.seq_len as usize,
                        model.vocab as usize,
                    )?;
                    Gpt2::new(&model, origin, rank, world, tokens, init_weights)?
                }
            }),
        })
    }

    /// The workload as sizes (what a layout needs).
    pub fn workload(&self) -> &dyn Workload {
        match self {
            Model::Mlp(m) => m,
            Model::Gpt2(g) => g,
        }
    }

    /// What one step trains on over all ranks: a count and its unit (samples, tokens).
    pub fn per_step(&self) -> (u64, &'static str) {
        match self {
            Model::Mlp(m) => ((m.spec().batch_per_rank * m.world()) as u64, "samples"),
            Model::Gpt2(g) => ((g.shape().rows() * g.world()) as u64, "tokens"),
        }
    }

    /// Refuses what a run would do with its trained weights that this model cannot (before any
    /// step): `--save-weights` writes a GPT-2's safetensors, `--compare-reference` trains the
    /// MLP's single-process reference. `origin` names the model file.
    pub fn check_after(&self, after: &AfterRun, origin: &str) -> Result<()> {
        match self {
            Model::Mlp(_) => refuse_for_mlp(
                origin,
                "--save-weights",
                after.save_weights,
                "has no safetensors names (--dump-params writes its parameters)",
            ),
            Model::Gpt2(_) if after.compare_reference => Err(Error::Setting {
                setting: "--compare-reference",
                expected: format!(
                    "a model with a single-process reference: {origin} is a GPT-2, whose \
                     reference is PyTorch's (python/shardplan_torch)"
                ),
            }),
            Model::Gpt2(_) => Ok(()),
        }
    }

    /// Rank 0's work with a run's trained weights (each unit's `params`): the MLP compared with
    /// its single-process reference when asked, GPT-2's weights saved as safetensors when asked.
    pub fn finish(&self, params: &[Vec<f32>], after: &AfterRun) -> Result<Option<ReferenceCheck>> {
        match self {
            Model::Mlp(m) if after.compare_reference => {
                ReferenceCheck::of(m, params, after.steps).map(Some)
            }
            Model::Mlp(_) => Ok(None),
            Model::Gpt2(g) => {
                if let Some(path) = after.save_weights {
                    write_atomic(path, &gpt2::weights::serialize(g.tensors(), params)?)?;
                }
                Ok(None)
            }
        }
    }

    fn run_on<B: Backend, J: Job>(&self, backend: B, job: J) -> J::Output
    where
        Mlp: Train<B>,
        Gpt2: Train<B>,
    {
        match self {
            Model::Mlp(m) => job.run(backend, m),
            Model::Gpt2(g) => job.run(backend, g),
        }
    }
}
