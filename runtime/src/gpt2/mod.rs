//! GPT-2 as Hugging Face's `GPT2LMHeadModel` computes it: token + learned position embeddings,
//! pre-LayerNorm blocks (ε 1e-5; causal multi-head attention with a fused QKV projection; MLP with
//! `gelu_new`), a final LayerNorm and an output projection tied to the token embedding; mean
//! cross-entropy over every position of the global batch; no dropout; AdamW (`torch.optim.AdamW`,
//! decay on tensors of two or more dimensions). fp32, or under the bf16 policy (DESIGN §6.9) bf16
//! parameters, activations and their gradients with an fp32 master.
//!
//! Units: `embedding` (wte, wpe: it owns the tied matrix), `block.1` … `block.L`, `head` (ln_f;
//! it borrows the embedding unit's wte for the logits and writes wte's gradient first, which the
//! embedding's backward then adds to). Buffers per unit (rows = sequences per rank × seq):
//! - embedding: saved = tokens (rows) | output (rows·h).
//! - block: saved = output (rows·h); internals = ln1 | ln1 mean | ln1 rstd | qkv | probs |
//!   attention output | residual after attention | ln2 | ln2 mean | ln2 rstd | fc | gelu(fc);
//!   forward workspace = internals (what a recomputed block's forward writes); backward
//!   workspace = d(gelu) (rows·ffn) | d(h) | d(residual) | d(qkv) | d(probs); input gradient rows·h.
//! - head: saved = targets (rows); internals = ln_f | mean | rstd | probabilities (rows·V);
//!   forward workspace = internals; backward workspace = d(ln_f) | under bf16 d(logits) as bf16
//!   (rows·V); input gradient rows·h.

pub mod attention;
mod cpu;
mod cuda;
pub mod cuda_source;
pub mod data;
pub mod kernels;
pub mod launches;
mod shape;
pub mod tensors;
pub mod token_file;
pub mod weights;

use crate::backend::{Backend, FloatFormat, Region};
use crate::layout::Layout;
use crate::lock::recover;
use crate::train::Train;
use crate::workload::{Pass, UnitBuffers, Workload, carve, carve_parts, words_of};
use crate::{Error, Result};
use data::Tokens;
use kernels::AdamW;
pub use shape::Shape;
use shardplan_scheduler::model::{Biases, ModelSpec, Norm, PositionEmbedding, TrainingSpec};
use shardplan_scheduler::precision::Precision;
use shardplan_scheduler::timeline::Level;
use std::ops::Range;
use std::sync::Mutex;
use tensors::Tensor;

/// The device kernels of GPT-2's units, on whole-unit regions (a backend implements them once;
/// the workload never touches memory itself).
pub trait Gpt2Kernels: Backend {
    /// Loads what the kernels of `shape`'s precision policy need on this backend (compiled
    /// kernels, buffers of their own), before anything is timed; a backend that needs nothing
    /// keeps the default.
    fn load_kernels(&self, _shape: &Shape) -> Result<()> {
        Ok(())
    }
    /// `out = wte[tokens] + wpe[positions]`; `params` = wte | wpe.
    fn embedding_forward(
        &self,
        shape: &Shape,
        params: Region,
        tokens: Region,
        out: Region,
    ) -> Result<()>;
    /// Adds the token rows' gradient to wte's (already written by the head) and writes wpe's.
    fn embedding_backward(
        &self,
        shape: &Shape,
        tokens: Region,
        grad_out: Region,
        grads: Region,
    ) -> Result<()>;
    /// One block's forward from `x` into `out`, saving its internals.
    fn block_forward(
        &self,
        shape: &Shape,
        params: Region,
        x: Region,
        out: Region,
        internals: Region,
    ) -> Result<()>;
    /// One block's backward: the parameter gradient (written) and the input gradient.
    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()>;
    /// ln_f, the tied logits and the cross-entropy (scaled by `scale`) into loss slot `step`.
    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()>;
    /// The head's backward: ln_f's gradient, wte's gradient (written), the input gradient.
    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()>;
    /// One AdamW step on `adam.params`; elements in `decayed` (indices into the region) decay.
    fn adamw(
        &self,
        shape: &Shape,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()>;
}

/// The regions of one block's backward.
#[derive(Debug, Clone, Copy)]
pub struct BlockBackward {
    pub params: Region,
    /// The block's input, as its forward read it.
    pub x: Region,
    /// What its forward saved.
    pub internals: Region,
    /// The gradient of its output.
    pub grad_out: Region,
    /// Its parameters' gradient (written).
    pub grads: Region,
    /// Its input's gradient (written).
    pub grad_in: Region,
    pub workspace: Region,
}

/// The regions the head reads in both passes: ln_f's parameters, the tied token embedding (wte),
/// its input, the step's targets and what its forward saved.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub params: Region,
    pub wte: Region,
    pub x: Region,
    pub targets: Region,
    pub internals: Region,
}

/// What the head's backward writes (ln_f's gradient, wte's gradient, its input's gradient) and
/// its workspace.
#[derive(Debug, Clone, Copy)]
pub struct HeadGrads {
    pub grads: Region,
    pub wte_grad: Region,
    pub grad_in: Region,
    pub workspace: Region,
}

/// The regions of one AdamW step: the parameters, their gradient and the two moments.
#[derive(Debug, Clone, Copy)]
pub struct AdamRegions {
    pub params: Region,
    pub grads: Region,
    pub m: Region,
    pub v: Region,
}

/// GPT-2 trained by rank `rank` of `world`.
pub struct Gpt2 {
    name: String,
    shape: Shape,
    hp: AdamW,
    /// Sequences per step over all ranks.
    global_batch: usize,
    /// K, micro-batches of `global_batch` sequences per optimizer step.
    micro_batches: usize,
    precision: Precision,
    rank: usize,
    world: usize,
    units: Vec<Vec<Tensor>>,
    initial: Vec<Vec<f32>>,
    tokens: Tokens,
    /// The step's (inputs, targets): read at the embedding's forward, targets uploaded at the
    /// head's.
    batch: Mutex<(Vec<f32>, Vec<f32>)>,
}

/// Why a zoo model is not a GPT-2 this workload can train, if it is not.
fn check_architecture(model: &ModelSpec, origin: &str) -> Result<()> {
    let problems = [
        (model.norm != Norm::LayerNorm, "norm", "\"layernorm\""),
        (
            model.position_embedding != PositionEmbedding::Learned,
            "position_embedding",
            "\"learned\"",
        ),
        (!model.tied_embeddings, "tied_embeddings", "true"),
        (model.bias != Biases::ALL, "bias", "true"),
        (model.gated_mlp, "gated_mlp", "false"),
        (model.kv_heads != model.heads, "kv_heads", "heads"),
    ];
    match problems.iter().find(|(bad, _, _)| *bad) {
        Some((_, field, value)) => Err(shardplan_scheduler::Error::invalid(
            origin,
            *field,
            format!("{field} = {value}, which the GPT-2 workload needs"),
        )
        .into()),
        None => Ok(()),
    }
}

impl Gpt2 {
    /// The model of `model` (a zoo GPT-2 with `[training]`) on rank `rank` of `world`; initial
    /// weights from a safetensors file, or GPT-2's initialisation from the training seed.
    pub fn new(
        model: &ModelSpec,
        origin: &str,
        rank: usize,
        world: usize,
        tokens: Tokens,
        initial: Option<&std::path::Path>,
    ) -> Result<Gpt2> {
        check_architecture(model, origin)?;
        let invalid = |field: &str, expected: String| -> Error {
            shardplan_scheduler::Error::invalid(origin, field, expected).into()
        };
        let training: &TrainingSpec = model.training.as_ref().ok_or_else(|| {
            invalid(
                "training",
                "a [training] table (batch_size, learning_rate), which the GPT-2 workload needs"
                    .into(),
            )
        })?;
        let global_batch = training.batch_size as usize;
        if !global_batch.is_multiple_of(world) {
            return Err(invalid(
                "training.batch_size",
                format!("a multiple of the {world} ranks, got {global_batch}"),
            ));
        }
        let precision = training
            .policy()
            .map_err(|why| invalid("training.reduce", why))?;
        if precision.param() == FloatFormat::Bf16 {
            let odd = [("hidden", model.hidden), ("ffn", model.ffn)]
                .into_iter()
                .find(|(_, size)| size % 2 == 1);
            if let Some((field, size)) = odd {
                return Err(invalid(
                    field,
                    format!(
                        "an even size under `training.precision = \"bf16\"` (each bf16 tensor \
                         starts on a 4-byte word), got {size}"
                    ),
                ));
            }
        }
        let shape = Shape {
            layers: model.layers as usize,
            hidden: model.hidden as usize,
            heads: model.heads as usize,
            ffn: model.ffn as usize,
            vocab: model.vocab as usize,
            seq: model.seq_len as usize,
            batch: global_batch / world,
            precision,
        };
        let units: Vec<Vec<Tensor>> = (0..shape.layers + 2)
            .map(|u| tensors::unit_tensors(&shape, u))
            .collect();
        let initial = match initial {
            Some(path) => weights::load(path, &units)?,
            None => (0..units.len())
                .map(|u| tensors::initial_params(&units[u], training.seed, u))
                .collect(),
        };
        let rows = shape.rows();
        Ok(Gpt2 {
            name: model.name.clone(),
            shape,
            hp: AdamW {
                learning_rate: training.learning_rate,
                beta1: training.betas[0],
                beta2: training.betas[1],
                eps: training.eps,
                weight_decay: training.weight_decay,
            },
            global_batch,
            micro_batches: training.micro_batches as usize,
            precision,
            rank,
            world,
            units,
            initial,
            tokens,
            batch: Mutex::new((vec![0.0; rows], vec![0.0; rows])),
        })
    }

    /// The model of `model` on rank `rank` of `world` with GPT-2's initialisation and synthetic
    /// tokens: for timing and layout, which depend on neither the data nor the weights.
    pub fn synthetic(model: &ModelSpec, origin: &str, rank: usize, world: usize) -> Result<Gpt2> {
        let tokens = Tokens::Synthetic {
            seed: 1,
            vocab: model.vocab as usize,
        };
        Gpt2::new(model, origin, rank, world, tokens, None)
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The number of ranks it is trained on.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Every unit's tensors (names, shapes), in flat order.
    pub fn tensors(&self) -> &[Vec<Tensor>] {
        &self.units
    }

    fn head(&self) -> usize {
        self.shape.layers + 1
    }

    /// 1 / (tokens in the step's K micro-batches): the mean over every position of the step.
    fn loss_scale(&self) -> f32 {
        1.0 / (self.micro_batches * self.global_batch * self.shape.seq) as f32
    }

    /// The output of unit `unit` (the next unit's input).
    fn output(&self, layout: &Layout, unit: usize) -> Region {
        let saved = layout.units[unit].saved;
        if unit == 0 {
            carve_parts(saved, self.shape.embedding_saved())[1]
        } else {
            self.hidden_states(saved)
        }
    }

    /// A buffer of rows × hidden activations (a block's output, an input gradient) in the
    /// activations' format.
    fn hidden_states(&self, buffer: Region) -> Region {
        carve_parts(buffer, [self.shape.hidden_states()])[0]
    }

    fn wte(&self, params: Region) -> Region {
        carve(params, self.shape.embedding_params())[0]
    }

    /// `decayed` flat ranges of unit `unit` as indices into this rank's persistent region.
    fn local_decayed(&self, layout: &Layout, unit: usize) -> Vec<Range<usize>> {
        let u = &layout.units[unit];
        let global = tensors::decayed_ranges(&self.units[unit]);
        if u.level == Level::None {
            return global;
        }
        let mut local = Vec::new();
        for (j, (start, shard)) in u.shard_of(self.rank).enumerate() {
            for r in &global {
                let (a, b) = (r.start.max(start), r.end.min(start + shard));
                if a < b {
                    local.push(a - start + j * shard..b - start + j * shard);
                }
            }
        }
        local
    }
}

impl Workload for Gpt2 {
    fn name(&self) -> &str {
        &self.name
    }
    fn unit_count(&self) -> usize {
        self.shape.layers + 2
    }
    fn unit_name(&self, unit: usize) -> String {
        match unit {
            0 => "embedding".into(),
            u if u == self.head() => "head".into(),
            u => format!("block.{u}"),
        }
    }
    fn params(&self, unit: usize) -> usize {
        self.units[unit].iter().map(Tensor::len).sum()
    }
    fn buffers(&self, unit: usize) -> UnitBuffers {
        let s = &self.shape;
        let hidden = s.hidden_states().words();
        match unit {
            0 => UnitBuffers {
                saved: words_of(&s.embedding_saved()),
                ..UnitBuffers::default()
            },
            u if u == self.head() => {
                let internals = words_of(&s.head_internals());
                UnitBuffers {
                    saved: s.rows(),
                    internals,
                    forward_workspace: internals,
                    backward_workspace: words_of(&s.head_workspace()),
                    input_gradient: hidden,
                }
            }
            _ => {
                let internals = words_of(&s.block_internals());
                UnitBuffers {
                    saved: hidden,
                    internals,
                    forward_workspace: internals,
                    backward_workspace: words_of(&s.block_workspace()),
                    input_gradient: hidden,
                }
            }
        }
    }
    fn initial_params(&self, unit: usize) -> Result<Vec<f32>> {
        Ok(self.initial[unit].clone())
    }
    fn borrows_params_of(&self, unit: usize) -> Option<usize> {
        (unit == self.head()).then_some(0)
    }
    fn micro_batches(&self) -> usize {
        self.micro_batches
    }
    fn precision(&self) -> Precision {
        self.precision
    }
}

impl<B: Gpt2Kernels> Train<B> for Gpt2 {
    fn load_kernels(&self, backend: &B) -> Result<()> {
        backend.load_kernels(&self.shape)
    }

    fn forward(
        &self,
        backend: &B,
        layout: &Layout,
        unit: usize,
        step: usize,
        pass: Pass,
    ) -> Result<()> {
        let s = &self.shape;
        let u = &layout.units[unit];
        let params = u.params_for(pass);
        let internals = u.forward_internals(pass);
        match unit {
            0 => {
                let [tokens, out] = carve_parts(u.saved, s.embedding_saved());
                if pass == Pass::Forward {
                    let mut batch = recover(self.batch.lock());
                    let (inputs, targets) = &mut *batch;
                    let (b, r, w) = (self.global_batch, self.rank, self.world);
                    self.tokens
                        .rank_batch(step, b, r, w, s.seq, inputs, targets);
                    backend.upload(tokens, inputs)?;
                }
                backend.embedding_forward(s, params, tokens, out)
            }
            h if h == self.head() => {
                if pass == Pass::Forward {
                    let batch = recover(self.batch.lock());
                    backend.upload(u.saved, &batch.1)?;
                }
                // The lender's forward parameters stay until the head's backward (layout).
                let wte = self.wte(layout.units[0].forward_params());
                let x = self.output(layout, h - 1);
                let head = Head {
                    params,
                    wte,
                    x,
                    targets: u.saved,
                    internals,
                };
                backend.head_forward(s, &head, self.loss_scale(), step)
            }
            b => {
                let x = self.output(layout, b - 1);
                let out = self.hidden_states(u.saved);
                backend.block_forward(s, params, x, out, internals)
            }
        }
    }

    fn backward(&self, backend: &B, layout: &Layout, unit: usize, _step: usize) -> Result<()> {
        let s = &self.shape;
        let u = &layout.units[unit];
        let grad_in = || {
            self.hidden_states(
                u.input_gradient
                    .expect("units after the first pass an input gradient"),
            )
        };
        match unit {
            0 => {
                let [tokens, _] = carve_parts(u.saved, s.embedding_saved());
                let grad_out = self.hidden_states(layout.output_gradient(0));
                backend.embedding_backward(s, tokens, grad_out, u.backward_grads())
            }
            h if h == self.head() => {
                let lender = &layout.units[0];
                let wte = self.wte(lender.forward_params());
                let wte_grad = self.wte(lender.backward_grads());
                let head = Head {
                    params: u.backward_params(),
                    wte,
                    x: self.output(layout, h - 1),
                    targets: u.saved,
                    internals: u.backward_internals(),
                };
                let grads = HeadGrads {
                    grads: u.backward_grads(),
                    wte_grad,
                    grad_in: grad_in(),
                    workspace: u.backward_workspace,
                };
                backend.head_backward(s, &head, &grads, self.loss_scale())
            }
            b => backend.block_backward(
                s,
                &BlockBackward {
                    params: u.backward_params(),
                    x: self.output(layout, b - 1),
                    internals: u.backward_internals(),
                    grad_out: self.hidden_states(layout.output_gradient(b)),
                    grads: u.backward_grads(),
                    grad_in: grad_in(),
                    workspace: u.backward_workspace,
                },
            ),
        }
    }

    fn optimize(&self, backend: &B, layout: &Layout, unit: usize, step: u32) -> Result<()> {
        let u = &layout.units[unit];
        let decayed = self.local_decayed(layout, unit);
        let adam = AdamRegions {
            params: u.trained(),
            grads: u.grads,
            m: u.adam_m,
            v: u.adam_v,
        };
        backend.adamw(&self.shape, &adam, step, &self.hp, &decayed)
    }
}
