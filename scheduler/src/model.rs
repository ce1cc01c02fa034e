//! Model specs (the zoo in `models/*.toml`) and the transformer arithmetic of the DESIGN
//! appendix: parameters, FLOPs and saved activation bytes per unit.
//!
//! Units, in forward order: `embedding`, `block.1` … `block.L`, `head` (final norm + output
//! projection). With tied embeddings the shared matrix is owned by the embedding unit (the head
//! unit then holds only the final norm); see docs/ARCHITECTURE.md for what that approximates.
//! The features the families differ by are `model::features`' (DESIGN §7.1).

mod features;

pub use features::{Biases, QkNorm, SlidingWindow};

use crate::precision::{FloatFormat, Precision};
use crate::{Error, Result};
use features::{is_two_norms, two_norms};
use serde::{Deserialize, Serialize};
use std::path::Path;

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
    /// The linear layers that carry biases (`bias = true`: every one).
    pub bias: Biases,
    pub norm: Norm,
    pub position_embedding: PositionEmbedding,
    /// Output projection shares the token-embedding matrix.
    pub tied_embeddings: bool,
    /// The size of one attention head; hidden / heads when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// Norms on the queries and keys (Qwen3, Gemma-3, OLMo-2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_norm: Option<QkNorm>,
    /// Norms of hidden size per block: 2 (before attention and before the MLP) when left out,
    /// 4 in Gemma-2 and -3 (after each as well).
    #[serde(default = "two_norms", skip_serializing_if = "is_two_norms")]
    pub norms_per_block: u64,
    /// The blocks that attend through a sliding window, and its width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<SlidingWindow>,
    /// The head's logits pass through c·tanh(x / c) before the loss (Gemma-2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub final_logit_softcapping: bool,
    /// The attention scores pass through c·tanh(x / c) before the softmax (Gemma-2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_logit_softcapping: bool,
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

    /// Checks that every size is positive and within its bound, the head counts divide and the
    /// windowed blocks exist. The bounds keep parameter counts exact in u64 (hidden · ffn ≤
    /// 2^44) and a profile's units within [`crate::profile::MAX_UNITS`].
    pub fn validate(&self, origin: &str) -> Result<()> {
        self.validate_named(origin, &|field| field)
    }

    /// [`Self::validate`], naming each field as `name` gives it (a config's own names).
    pub fn validate_named(&self, origin: &str, name: &dyn Fn(&str) -> &str) -> Result<()> {
        let bad =
            |field: &str, expected: String| Err(Error::invalid(origin, name(field), expected));
        let most_layers = crate::profile::MAX_UNITS as u64 - 2;
        for (field, value, max) in [
            ("layers", self.layers, most_layers),
            ("hidden", self.hidden, 1 << 20),
            ("heads", self.heads, 1 << 20),
            ("kv_heads", self.kv_heads, 1 << 20),
            ("ffn", self.ffn, 1 << 24),
            ("vocab", self.vocab, 1 << 24),
            ("seq_len", self.seq_len, 1 << 24),
            ("head_dim", self.head_dim.unwrap_or(1), 1 << 16),
            ("norms_per_block", self.norms_per_block, 4),
        ] {
            if !(1..=max).contains(&value) {
                return bad(field, format!("an integer in 1..={max}, got {value}"));
            }
        }
        if self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads) {
            return bad(
                "heads",
                format!(
                    "a divisor of {} = {}, got {}",
                    name("hidden"),
                    self.hidden,
                    self.heads
                ),
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(
                "kv_heads",
                format!(
                    "a divisor of {} = {}, got {}",
                    name("heads"),
                    self.heads,
                    self.kv_heads
                ),
            );
        }
        if let Some(window) = &self.sliding_window {
            let increasing = window.layers.windows(2).all(|w| w[0] < w[1]);
            let within = window.layers.iter().all(|l| (1..=self.layers).contains(l));
            if window.tokens == 0 || !increasing || !within {
                return bad(
                    "sliding_window",
                    format!(
                        "a positive width and increasing block numbers in 1..={}",
                        self.layers
                    ),
                );
            }
        }
        match &self.training {
            Some(training) => training.validate(origin),
            None => Ok(()),
        }
    }

    fn norm_params(&self, width: u64) -> u64 {
        match self.norm {
            Norm::LayerNorm => 2 * width,
            Norm::RmsNorm => width,
        }
    }

    /// The size of one attention head.
    pub fn head_size(&self) -> u64 {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// Widths of the query and of the key (or value) projections: heads · head size, kv_heads ·
    /// head size.
    pub fn attention_widths(&self) -> (u64, u64) {
        let d = self.head_size();
        (self.heads * d, self.kv_heads * d)
    }

    /// Parameters held in matrices of one block (what the GEMMs multiply by).
    fn block_matrix_params(&self) -> u64 {
        let h = self.hidden;
        let (q, kv) = self.attention_widths();
        let attention = 2 * h * q + 2 * h * kv;
        let mlp = if self.gated_mlp { 3 } else { 2 } * h * self.ffn;
        attention + mlp
    }

    /// Parameters of one transformer block: Llama ≈ (2 + 2g/a)h² + 3h·ffn + 2h; GPT ≈ 12h² + 13h;
    /// plus the biases, q/k norms and extra norms the model has.
    pub fn block_params(&self) -> u64 {
        let h = self.hidden;
        let (q, kv) = self.attention_widths();
        let up = if self.gated_mlp { 2 } else { 1 } * self.ffn;
        let biases = self.bias.params(q, kv, h, up);
        let qk_norm = match self.qk_norm {
            None => 0,
            Some(QkNorm::PerHead) => self.norm_params(2 * self.head_size()),
            Some(QkNorm::PerProjection) => self.norm_params(q + kv),
        };
        self.block_matrix_params() + biases + self.norms_per_block * self.norm_params(h) + qk_norm
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
        self.norm_params(self.hidden) + projection
    }

    /// Total parameter count.
    pub fn total_params(&self) -> u64 {
        self.embedding_params() + self.layers * self.block_params() + self.head_params()
    }

    /// The keys one query of block `layer` multiplies with at `seq_len` under `attention`:
    /// the window's width where the block has one and the kernel skips what it masks (flash),
    /// else the whole sequence (eager computes the full s × s scores and masks them).
    fn keys_per_query(&self, layer: u64, seq_len: u64, attention: Attention) -> u64 {
        match (&self.sliding_window, attention) {
            (Some(window), Attention::Flash) if window.covers(layer) => window.tokens.min(seq_len),
            _ => seq_len,
        }
    }

    /// Per-unit shapes for `micro_batch` sequences of `seq_len` tokens, 16-bit activations
    /// (DESIGN §7, §7.1).
    ///
    /// Block: forward FLOPs = tokens · (2 · matrix params + 4 · keys · q), q = heads · head size,
    /// keys the sequence or a flash kernel's window (appendix: 24h² + 4sh per token for GPT);
    /// activations 34·s·b·h bytes with flash attention, plus 2·s·b·h per norm beyond two and
    /// 2·s·b·(q + kv) for q/k norms; eager adds the scores, 5·a·s²·b, and 2·a·s²·b more when they
    /// are soft-capped; with recompute only the block input, 2·s·b·h. Workspace: forward holds the
    /// MLP inner tensor (2·s·b·ffn', ffn' = 2·ffn when gated); backward holds its gradient twice
    /// plus the input and output gradients (4·s·b·ffn' + 4·s·b·h). Head: the fp32 logits
    /// (4·s·b·V) are saved for the loss, once more when soft-capped (the tanh's output), and
    /// their gradient is workspace in backward.
    pub fn unit_shapes(
        &self,
        micro_batch: u64,
        seq_len: u64,
        attention: Attention,
    ) -> Vec<UnitShape> {
        let (b, s, h) = (micro_batch as f64, seq_len as f64, self.hidden as f64);
        let tokens = b * s;
        let sbh = tokens * h;
        let (q, kv) = self.attention_widths();
        let (q, kv) = (q as f64, kv as f64);
        let ffn_inner = if self.gated_mlp { 2.0 } else { 1.0 } * self.ffn as f64;
        let vocab = self.vocab as f64;
        let extra_norms = self.norms_per_block.saturating_sub(2) as f64;
        let qk_norm_inputs = if self.qk_norm.is_some() { q + kv } else { 0.0 };
        let flash_act = (34.0 + 2.0 * extra_norms) * sbh + 2.0 * tokens * qk_norm_inputs;
        let block_act = match attention {
            Attention::Flash => flash_act,
            Attention::Eager => {
                let per_score = if self.attention_logit_softcapping {
                    7.0
                } else {
                    5.0
                };
                flash_act + per_score * self.heads as f64 * s * tokens
            }
        };
        let logits = 4.0 * tokens * vocab;
        let saved_logits = if self.final_logit_softcapping {
            2.0 * logits
        } else {
            logits
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
            let keys = self.keys_per_query(layer, seq_len, attention) as f64;
            units.push(UnitShape {
                name: format!("block.{layer}"),
                params: self.block_params(),
                forward_flops: tokens * (2.0 * self.block_matrix_params() as f64 + 4.0 * keys * q),
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
            activation_bytes: (4.0 * sbh + saved_logits) as u64,
            checkpoint_activation_bytes: (2.0 * sbh) as u64,
            forward_workspace_bytes: logits as u64,
            backward_workspace_bytes: (logits + 2.0 * sbh) as u64,
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
            bias: Biases::NONE,
            norm: Norm::RmsNorm,
            position_embedding: PositionEmbedding::Rotary,
            tied_embeddings: false,
            head_dim: None,
            qk_norm: None,
            norms_per_block: 2,
            sliding_window: None,
            final_logit_softcapping: false,
            attention_logit_softcapping: false,
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
            bias: Biases::ALL,
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
            "m.toml: field `layers`: expected an integer in 1..=99998, got 0"
        );
        let m = llama(2, 4096, 32, 5, 11008, 32000);
        assert!(
            m.validate("m.toml")
                .unwrap_err()
                .to_string()
                .contains("kv_heads")
        );
    }

    /// A window cuts the attention FLOPs of its blocks under flash, not under eager (which
    /// computes and masks the full scores), and not past the sequence; soft-capping saves the
    /// tanh's output.
    #[test]
    fn windows_and_soft_caps_change_flops_and_memory_where_they_apply() {
        let full = llama(2, 64, 4, 2, 96, 300);
        let windowed = ModelSpec {
            sliding_window: Some(SlidingWindow {
                tokens: 16,
                layers: vec![1],
            }),
            final_logit_softcapping: true,
            attention_logit_softcapping: true,
            ..full.clone()
        };
        let (a, b) = (
            full.unit_shapes(1, 256, Attention::Flash),
            windowed.unit_shapes(1, 256, Attention::Flash),
        );
        let attention = |keys: f64| 256.0 * 4.0 * keys * 64.0;
        assert_eq!(
            a[1].forward_flops - b[1].forward_flops,
            attention(256.0) - attention(16.0)
        );
        assert_eq!(
            a[2].forward_flops, b[2].forward_flops,
            "block 2 attends fully"
        );
        assert_eq!(b[3].activation_bytes - a[3].activation_bytes, 4 * 256 * 300);
        let short = windowed.unit_shapes(1, 8, Attention::Flash);
        assert_eq!(
            short[1].forward_flops,
            full.unit_shapes(1, 8, Attention::Flash)[1].forward_flops
        );
        let (a, b) = (
            full.unit_shapes(1, 256, Attention::Eager),
            windowed.unit_shapes(1, 256, Attention::Eager),
        );
        assert_eq!(a[1].forward_flops, b[1].forward_flops);
        assert_eq!(
            b[1].activation_bytes - a[1].activation_bytes,
            2 * 4 * 256 * 256
        );
    }
}
