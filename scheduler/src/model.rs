//! Model specs (the zoo in `models/*.toml`) and the transformer arithmetic of the DESIGN
//! appendix: parameters, FLOPs and saved activation bytes per unit.
//!
//! Units, in forward order: `embedding`, `block.1` … `block.L`, `head` (final norm + output
//! projection). With tied embeddings the shared matrix is owned by the embedding unit (the head
//! unit then holds only the final norm); see docs/ARCHITECTURE.md for what that approximates.

use crate::precision::{FloatFormat, Precision};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Whether `path` names a Hugging Face transformers config (`*.json`) rather than a zoo file.
pub fn is_hf_config(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Normalisation layer kind; sets the number of parameters per norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// Scale and bias: 2h parameters.
    LayerNorm,
    /// Scale only: h parameters.
    RmsNorm,
}

/// How token positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PositionEmbedding {
    /// A learned table of seq_len × h parameters in the embedding unit (GPT).
    Learned,
    /// Rotary embeddings: no parameters (Llama).
    Rotary,
}

/// A decoder-only transformer, as written in `models/<name>.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    /// Number of transformer blocks L.
    pub layers: u64,
    /// Hidden size h.
    pub hidden: u64,
    /// Attention heads a.
    pub heads: u64,
    /// Key/value heads g (= a without grouped-query attention).
    pub kv_heads: u64,
    /// MLP inner size.
    pub ffn: u64,
    /// Vocabulary size V.
    pub vocab: u64,
    /// Default sequence length s.
    pub seq_len: u64,
    /// Gated MLP (SwiGLU: three matrices) instead of two.
    pub gated_mlp: bool,
    /// Linear layers carry biases.
    pub bias: bool,
    pub norm: Norm,
    pub position_embedding: PositionEmbedding,
    /// Output projection shares the token-embedding matrix.
    pub tied_embeddings: bool,
    /// How the runtime trains it (`[training]`; only the runtime's GPT-2 workload reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingSpec>,
}

/// `[training]` of a model file: the global batch and AdamW's settings (as
/// `torch.optim.AdamW`; weight decay applies to tensors of two or more dimensions only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSpec {
    /// Sequences per step over all ranks (each rank takes batch_size / N of them).
    pub batch_size: u64,
    pub learning_rate: f32,
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f32,
    #[serde(default = "default_betas")]
    pub betas: [f32; 2],
    #[serde(default = "default_eps")]
    pub eps: f32,
    /// Seed of the initial weights (GPT-2's initialisation) when none are given.
    #[serde(default)]
    pub seed: u64,
    /// K, micro-batches of `batch_size` sequences per optimizer step (DESIGN §3.10); 1 when left
    /// out.
    #[serde(
        default = "crate::profile::one_micro_batch",
        skip_serializing_if = "crate::profile::is_one_micro_batch"
    )]
    pub micro_batches: u32,
    /// The dtype parameters are gathered and computed in (DESIGN §6.9); fp32 when left out.
    #[serde(default, skip_serializing_if = "FloatFormat::is_fp32")]
    pub precision: FloatFormat,
    /// The dtype gradients are reduced in; fp32 when left out.
    #[serde(default, skip_serializing_if = "FloatFormat::is_fp32")]
    pub reduce: FloatFormat,
}

fn default_weight_decay() -> f32 {
    0.1
}

fn default_betas() -> [f32; 2] {
    [0.9, 0.95]
}

fn default_eps() -> f32 {
    1e-8
}

impl TrainingSpec {
    /// Checks ranges: a positive batch, a positive finite learning rate, β in [0, 1), ε > 0,
    /// weight decay ≥ 0.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let bad = |field: &str, expected: &str, got: String| {
            Err(Error::invalid(
                origin,
                field,
                format!("{expected}, got {got}"),
            ))
        };
        if !(1..=1 << 24).contains(&self.batch_size) {
            return bad(
                "training.batch_size",
                "an integer in 1..=16777216",
                self.batch_size.to_string(),
            );
        }
        let most = crate::profile::MAX_MICRO_BATCHES;
        if !(1..=most).contains(&self.micro_batches) {
            return bad(
                "training.micro_batches",
                &format!("an integer in 1..={most}"),
                self.micro_batches.to_string(),
            );
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad(
                "training.learning_rate",
                "a positive number",
                self.learning_rate.to_string(),
            );
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(
                "training.weight_decay",
                "a number >= 0",
                self.weight_decay.to_string(),
            );
        }
        if self.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            return bad(
                "training.betas",
                "two numbers in [0, 1)",
                format!("{:?}", self.betas),
            );
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return bad("training.eps", "a positive number", self.eps.to_string());
        }
        self.policy()
            .map(|_| ())
            .map_err(|why| Error::invalid(origin, "training.reduce", why))
    }

    /// The precision policy of `precision` and `reduce`.
    pub fn policy(&self) -> std::result::Result<Precision, String> {
        Precision::new(self.precision, self.reduce)
    }
}

/// The shape-dependent figures of one unit for a given micro-batch and sequence length.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitShape {
    pub name: String,
    pub params: u64,
    /// Forward FLOPs for one micro-batch.
    pub forward_flops: f64,
    /// Bytes saved from forward to backward without recompute.
    pub activation_bytes: u64,
    /// Bytes saved with full recompute (the unit's input only).
    pub checkpoint_activation_bytes: u64,
    /// Transient bytes during forward and backward.
    pub forward_workspace_bytes: u64,
    pub backward_workspace_bytes: u64,
    /// The earlier unit whose parameters this one reads (the head of tied embeddings).
    pub reads_params_of: Option<String>,
}

/// Attention kernel: flash stores no score matrix, eager stores softmax inputs and outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    Flash,
    Eager,
}

impl ModelSpec {
    /// Loads and validates a zoo model file (a transformers `config.json` is
    /// [`crate::hf_config::load_model`]'s).
    pub fn load(path: &Path) -> Result<Self> {
        let spec: ModelSpec = crate::io::read_toml(path)?;
        spec.validate(&path.display().to_string())?;
        Ok(spec)
    }

    /// Checks that every size is positive and within its bound, and the head counts divide.
    /// The bounds keep parameter counts exact in u64 (hidden · ffn ≤ 2^44) and are far above any
    /// model trained.
    pub fn validate(&self, origin: &str) -> Result<()> {
        for (field, value, max) in [
            ("layers", self.layers, 1u64 << 20),
            ("hidden", self.hidden, 1 << 20),
            ("heads", self.heads, 1 << 20),
            ("kv_heads", self.kv_heads, 1 << 20),
            ("ffn", self.ffn, 1 << 24),
            ("vocab", self.vocab, 1 << 24),
            ("seq_len", self.seq_len, 1 << 24),
        ] {
            if !(1..=max).contains(&value) {
                return Err(Error::invalid(
                    origin,
                    field,
                    format!("an integer in 1..={max}, got {value}"),
                ));
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(Error::invalid(
                origin,
                "heads",
                format!("a divisor of hidden = {}, got {}", self.hidden, self.heads),
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::invalid(
                origin,
                "kv_heads",
                format!("a divisor of heads = {}, got {}", self.heads, self.kv_heads),
            ));
        }
        match &self.training {
            Some(training) => training.validate(origin),
            None => Ok(()),
        }
    }

    fn norm_params(&self) -> u64 {
        match self.norm {
            Norm::LayerNorm => 2 * self.hidden,
            Norm::RmsNorm => self.hidden,
        }
    }

    /// Parameters held in matrices of one block (what the GEMMs multiply by).
    fn block_matrix_params(&self) -> u64 {
        let h = self.hidden;
        let kv_dim = self.kv_heads * (h / self.heads);
        let attention = 2 * h * h + 2 * h * kv_dim;
        let mlp = if self.gated_mlp { 3 } else { 2 } * h * self.ffn;
        attention + mlp
    }

    /// Parameters of one transformer block: Llama ≈ (2 + 2g/a)h² + 3h·ffn + 2h; GPT ≈ 12h² + 13h.
    pub fn block_params(&self) -> u64 {
        let h = self.hidden;
        let kv_dim = self.kv_heads * (h / self.heads);
        let biases = if self.bias {
            (2 * h + 2 * kv_dim)
                + if self.gated_mlp {
                    2 * self.ffn
                } else {
                    self.ffn
                }
                + h
        } else {
            0
        };
        self.block_matrix_params() + biases + 2 * self.norm_params()
    }

    /// Parameters of the embedding unit (token table, plus a learned position table).
    pub fn embedding_params(&self) -> u64 {
        let positions = match self.position_embedding {
            PositionEmbedding::Learned => self.seq_len * self.hidden,
            PositionEmbedding::Rotary => 0,
        };
        self.vocab * self.hidden + positions
    }

    /// Parameters of the head unit (final norm, plus the output matrix unless tied).
    pub fn head_params(&self) -> u64 {
        let projection = if self.tied_embeddings {
            0
        } else {
            self.vocab * self.hidden
        };
        self.norm_params() + projection
    }

    /// Total parameter count.
    pub fn total_params(&self) -> u64 {
        self.embedding_params() + self.layers * self.block_params() + self.head_params()
    }

    /// Per-unit shapes for `micro_batch` sequences of `seq_len` tokens, 16-bit activations.
    ///
    /// Block: forward FLOPs = tokens · (2 · matrix params + 4sh) (appendix: 24h² + 4sh per token
    /// for GPT); activations 34·s·b·h bytes with flash attention, s·b·h·(34 + 5as/h) with eager;
    /// with recompute only the block input, 2·s·b·h. Workspace: forward holds the MLP inner
    /// tensor (2·s·b·ffn', ffn' = 2·ffn when gated); backward holds its gradient twice plus the
    /// input and output gradients (4·s·b·ffn' + 4·s·b·h). Head: the fp32 logits (4·s·b·V) are
    /// saved for the loss and their gradient is workspace in backward.
    pub fn unit_shapes(
        &self,
        micro_batch: u64,
        seq_len: u64,
        attention: Attention,
    ) -> Vec<UnitShape> {
        let (b, s, h) = (micro_batch as f64, seq_len as f64, self.hidden as f64);
        let tokens = b * s;
        let sbh = tokens * h;
        let ffn_inner = if self.gated_mlp { 2.0 } else { 1.0 } * self.ffn as f64;
        let vocab = self.vocab as f64;
        let block_act = match attention {
            Attention::Flash => 34.0 * sbh,
            Attention::Eager => sbh * (34.0 + 5.0 * self.heads as f64 * s / h),
        };
        let mut units = Vec::with_capacity(self.layers as usize + 2);
        units.push(UnitShape {
            name: "embedding".into(),
            params: self.embedding_params(),
            forward_flops: 0.0,
            activation_bytes: (8.0 * tokens) as u64,
            checkpoint_activation_bytes: (8.0 * tokens) as u64,
            forward_workspace_bytes: 0,
            backward_workspace_bytes: (2.0 * sbh) as u64,
            reads_params_of: None,
        });
        for layer in 1..=self.layers {
            units.push(UnitShape {
                name: format!("block.{layer}"),
                params: self.block_params(),
                forward_flops: tokens * (2.0 * self.block_matrix_params() as f64 + 4.0 * s * h),
                activation_bytes: block_act as u64,
                checkpoint_activation_bytes: (2.0 * sbh) as u64,
                forward_workspace_bytes: (2.0 * tokens * ffn_inner) as u64,
                backward_workspace_bytes: (4.0 * tokens * ffn_inner + 4.0 * sbh) as u64,
                reads_params_of: None,
            });
        }
        units.push(UnitShape {
            name: "head".into(),
            params: self.head_params(),
            forward_flops: tokens * 2.0 * vocab * h,
            activation_bytes: (4.0 * sbh + 4.0 * tokens * vocab) as u64,
            checkpoint_activation_bytes: (2.0 * sbh) as u64,
            forward_workspace_bytes: (4.0 * tokens * vocab) as u64,
            backward_workspace_bytes: (4.0 * tokens * vocab + 2.0 * sbh) as u64,
            reads_params_of: self.tied_embeddings.then(|| "embedding".into()),
        });
        units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama(
        layers: u64,
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        ffn: u64,
        vocab: u64,
    ) -> ModelSpec {
        ModelSpec {
            name: "t".into(),
            layers,
            hidden,
            heads,
            kv_heads,
            ffn,
            vocab,
            seq_len: 4096,
            gated_mlp: true,
            bias: false,
            norm: Norm::RmsNorm,
            position_embedding: PositionEmbedding::Rotary,
            tied_embeddings: false,
            training: None,
        }
    }

    #[test]
    fn llama2_7b_block_matches_closed_form() {
        let m = llama(32, 4096, 32, 32, 11008, 32000);
        let h = 4096u64;
        assert_eq!(m.block_params(), 4 * h * h + 3 * h * 11008 + 2 * h);
        assert_eq!(m.total_params(), 6_738_415_616);
    }

    #[test]
    fn gpt_block_is_12h2_plus_13h() {
        let m = ModelSpec {
            gated_mlp: false,
            bias: true,
            norm: Norm::LayerNorm,
            position_embedding: PositionEmbedding::Learned,
            tied_embeddings: true,
            ..llama(96, 12288, 96, 96, 4 * 12288, 50257)
        };
        let h = 12288u64;
        assert_eq!(m.block_params(), 12 * h * h + 13 * h);
    }

    #[test]
    fn validation_names_field() {
        let m = llama(0, 4096, 32, 32, 11008, 32000);
        let e = m.validate("m.toml").unwrap_err().to_string();
        assert_eq!(
            e,
            "m.toml: field `layers`: expected an integer in 1..=1048576, got 0"
        );
        let m = llama(2, 4096, 32, 5, 11008, 32000);
        assert!(
            m.validate("m.toml")
                .unwrap_err()
                .to_string()
                .contains("kv_heads")
        );
    }
}
