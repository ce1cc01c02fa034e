//! GPT-2's sizes on one rank, and the parts its units' buffers hold (each in its format: the
//! activations' under the precision policy, LayerNorm's statistics and the loss's probabilities
//! fp32), in the order the module doc of [`super`] lists them.

use super::attention::AttentionShape;
use crate::backend::FloatFormat;
use crate::workload::Part;
use shardplan_scheduler::precision::Precision;

/// GPT-2's sizes on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub seq: usize,
    /// Sequences per rank.
    pub batch: usize,
    /// The precision policy (DESIGN §6.9): activations and their gradients are stored in the
    /// parameters' format (LayerNorm's mean and rstd and the loss's probabilities stay fp32, as
    /// PyTorch keeps them), parameter gradients in the reductions'.
    pub precision: Precision,
}

impl Shape {
    /// The format activations and their gradients are stored in.
    pub fn activations(&self) -> FloatFormat {
        self.precision.param()
    }

    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    pub fn attention(&self) -> AttentionShape {
        AttentionShape {
            batch: self.batch,
            seq: self.seq,
            hidden: self.hidden,
            heads: self.heads,
        }
    }

    /// Lengths of the embedding unit's flat parameters: wte, wpe (as [`tensors::unit_tensors`]).
    pub fn embedding_params(&self) -> [usize; 2] {
        [self.vocab * self.hidden, self.seq * self.hidden]
    }

    /// Lengths of a block's flat parameters: ln1 w, b; qkv w, b; proj w, b; ln2 w, b; fc w, b;
    /// fc proj w, b (as [`tensors::unit_tensors`]).
    pub fn block_params(&self) -> [usize; 12] {
        let (c, f) = (self.hidden, self.ffn);
        [c, c, c * 3 * c, 3 * c, c * c, c, c, c, c * f, f, f * c, c]
    }

    /// `len` elements in the activations' format.
    pub fn act(&self, len: usize) -> Part {
        Part {
            len,
            format: self.activations(),
        }
    }

    /// A unit's output, or its gradient: rows × hidden activations.
    pub fn hidden_states(&self) -> Part {
        self.act(self.rows() * self.hidden)
    }

    /// `values` as the activations' format holds them (bf16: rounded to nearest, ties to even):
    /// what the next operation of a bf16 run reads. fp32 leaves them.
    pub fn round(&self, values: &mut [f32]) {
        if self.activations() == FloatFormat::Bf16 {
            values
                .iter_mut()
                .for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
        }
    }

    /// The embedding's saved buffer: the step's tokens (fp32, exact to 2^24) and its output.
    pub fn embedding_saved(&self) -> [Part; 2] {
        [Part::fp32(self.rows()), self.hidden_states()]
    }

    /// A block's internals, in the order the module doc lists them.
    pub fn block_internals(&self) -> [Part; 12] {
        let (r, c, f) = (self.rows(), self.hidden, self.ffn);
        let p = self.attention().probs_len();
        let stats = Part::fp32(r);
        [
            self.act(r * c),
            stats,
            stats,
            self.act(3 * r * c),
            self.act(p),
            self.act(r * c),
            self.act(r * c),
            self.act(r * c),
            stats,
            stats,
            self.act(r * f),
            self.act(r * f),
        ]
    }

    /// A block's backward workspace.
    pub fn block_workspace(&self) -> [Part; 5] {
        let (r, c, f) = (self.rows(), self.hidden, self.ffn);
        let p = self.attention().probs_len();
        [r * f, r * c, r * c, 3 * r * c, p].map(|len| self.act(len))
    }

    /// The head's backward workspace: d(ln_f), and under bf16 the logits' gradient as bf16 (the
    /// products' operand; fp32 runs read it where the probabilities were).
    pub fn head_workspace(&self) -> [Part; 2] {
        let logits = match self.activations() {
            FloatFormat::Fp32 => 0,
            FloatFormat::Bf16 => self.rows() * self.vocab,
        };
        [self.hidden_states(), self.act(logits)]
    }

    /// The head's internals: ln_f's output, its mean and rstd, and the loss's probabilities
    /// (fp32: the loss is taken over the logits widened, as transformers' loss does).
    pub fn head_internals(&self) -> [Part; 4] {
        let r = self.rows();
        [
            self.hidden_states(),
            Part::fp32(r),
            Part::fp32(r),
            Part::fp32(r * self.vocab),
        ]
    }
}
