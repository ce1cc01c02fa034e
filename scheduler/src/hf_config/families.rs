//! The dense decoder families `profile analytic --model config.json` reads, each with the field
//! names and defaults its transformers config class writes, and what its `*ForCausalLM` builds
//! from them (DESIGN §7.1).

use super::Config;
use crate::model::{Biases, ModelSpec, Norm, PositionEmbedding, QkNorm, SlidingWindow};
use crate::{Error, Result};
use serde_json::Value;

/// A `model_type` the bridge reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Olmo2,
}

/// Every `model_type` read, as an error lists them.
pub const KNOWN: &str = "\"gpt2\", \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma2\", \
    \"gemma3_text\", \"phi3\" or \"olmo2\"";

impl Family {
    pub fn of(model_type: &str) -> Option<Family> {
        Some(match model_type {
            "gpt2" => Family::Gpt2,
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma2" => Family::Gemma2,
            "gemma3_text" => Family::Gemma3,
            "phi3" => Family::Phi3,
            "olmo2" => Family::Olmo2,
            _ => return None,
        })
    }
}

/// The config's own name of a spec field, for errors in the user's words.
pub fn field_name(family: Family, field: &str) -> &str {
    match (family, field) {
        (Family::Gpt2, "layers") => "n_layer",
        (Family::Gpt2, "hidden") => "n_embd",
        (Family::Gpt2, "heads" | "kv_heads") => "n_head",
        (Family::Gpt2, "ffn") => "n_inner",
        (Family::Gpt2, "seq_len") => "n_positions",
        (_, "layers") => "num_hidden_layers",
        (_, "hidden") => "hidden_size",
        (_, "heads") => "num_attention_heads",
        (_, "kv_heads") => "num_key_value_heads",
        (_, "ffn") => "intermediate_size",
        (_, "seq_len") => "max_position_embeddings",
        (_, "vocab") => "vocab_size",
        (_, "sliding_window") => "layer_types",
        (_, other) => other,
    }
}

impl Config<'_> {
    /// The spec of `family`'s config.
    pub fn spec(&self, family: Family, name: String) -> Result<ModelSpec> {
        match family {
            Family::Gpt2 => self.gpt2(name),
            _ => self.decoder(family, name),
        }
    }

    /// `GPT2Config`: n_embd, n_layer, n_head, n_inner (null: 4·n_embd), vocab_size, n_positions;
    /// LayerNorm, learned positions, biases, tied embeddings unless `tie_word_embeddings` is false.
    fn gpt2(&self, name: String) -> Result<ModelSpec> {
        let hidden = self.count("n_embd")?;
        let heads = self.count("n_head")?;
        if self.flag("add_cross_attention", false)? {
            return Err(Error::invalid(
                self.origin,
                "add_cross_attention",
                "false: a decoder-only GPT-2 (cross-attention is an encoder-decoder's)",
            ));
        }
        Ok(ModelSpec {
            name,
            layers: self.count("n_layer")?,
            hidden,
            heads,
            kv_heads: heads,
            ffn: self.optional_count("n_inner")?.unwrap_or(4 * hidden),
            vocab: self.count("vocab_size")?,
            seq_len: self.count("n_positions")?,
            gated_mlp: false,
            bias: Biases::ALL,
            norm: Norm::LayerNorm,
            position_embedding: PositionEmbedding::Learned,
            tied_embeddings: self.flag("tie_word_embeddings", true)?,
            head_dim: None,
            qk_norm: None,
            norms_per_block: 2,
            sliding_window: None,
            final_logit_softcapping: false,
            attention_logit_softcapping: false,
            training: None,
        })
    }

    /// The Llama-shaped families: hidden_size, num_hidden_layers, num_attention_heads,
    /// num_key_value_heads (default: the heads), head_dim (default hidden / heads),
    /// intermediate_size, vocab_size, max_position_embeddings; RMSNorm, rotary positions, a gated
    /// MLP (SwiGLU; GeGLU in Gemma), and each family's biases, norms, windows and soft-caps.
    fn decoder(&self, family: Family, name: String) -> Result<ModelSpec> {
        let hidden = self.count("hidden_size")?;
        let heads = self.count("num_attention_heads")?;
        let layers = self.count("num_hidden_layers")?;
        let head_dim = self
            .optional_count("head_dim")?
            .filter(|&d| d.checked_mul(heads) != Some(hidden));
        let gemma = matches!(family, Family::Gemma2 | Family::Gemma3);
        Ok(ModelSpec {
            name,
            layers,
            hidden,
            heads,
            kv_heads: self.optional_count("num_key_value_heads")?.unwrap_or(heads),
            ffn: self.count("intermediate_size")?,
            vocab: self.count("vocab_size")?,
            seq_len: self.count("max_position_embeddings")?,
            gated_mlp: true,
            bias: self.biases(family)?,
            norm: Norm::RmsNorm,
            position_embedding: PositionEmbedding::Rotary,
            tied_embeddings: self.flag("tie_word_embeddings", gemma)?,
            head_dim,
            qk_norm: match family {
                Family::Qwen3 | Family::Gemma3 => Some(QkNorm::PerHead),
                Family::Olmo2 => Some(QkNorm::PerProjection),
                _ => None,
            },
            norms_per_block: if gemma { 4 } else { 2 },
            sliding_window: self.sliding_window(family, layers)?,
            final_logit_softcapping: gemma && self.is_set("final_logit_softcapping"),
            attention_logit_softcapping: gemma && self.is_set("attn_logit_softcapping"),
            training: None,
        })
    }

    /// Llama: `attention_bias` on q, k, v and o, `mlp_bias` on the MLP; Qwen2: q, k and v always;
    /// Mistral and Phi-3: none; the others `attention_bias` on q, k, v and o.
    fn biases(&self, family: Family) -> Result<Biases> {
        let attention = || self.flag("attention_bias", false);
        Ok(match family {
            Family::Qwen2 => Biases {
                qkv: true,
                output: false,
                mlp: false,
            },
            Family::Mistral | Family::Phi3 | Family::Gpt2 => Biases::NONE,
            Family::Llama => {
                let attention = attention()?;
                Biases {
                    qkv: attention,
                    output: attention,
                    mlp: self.flag("mlp_bias", false)?,
                }
            }
            Family::Qwen3 | Family::Gemma2 | Family::Gemma3 | Family::Olmo2 => {
                let attention = attention()?;
                Biases {
                    qkv: attention,
                    output: attention,
                    mlp: false,
                }
            }
        })
    }

    /// The windowed blocks: those `layer_types` calls "sliding_attention", or where the config
    /// has none, the family's rule as its config class fills them in (Mistral and Phi-3 every
    /// block, Qwen2/3 blocks past `max_window_layers` under `use_sliding_window`, Gemma-2 every
    /// other one from the first, Gemma-3 all but every `sliding_window_pattern`-th).
    fn sliding_window(&self, family: Family, layers: u64) -> Result<Option<SlidingWindow>> {
        let qwen = matches!(family, Family::Qwen2 | Family::Qwen3);
        if family == Family::Llama && self.is_set("sliding_window") {
            return Err(Error::invalid(
                self.origin,
                "sliding_window",
                "none: a Llama attends over the whole sequence (a sliding window is \
                 \"mistral\"'s, \"qwen2\"'s or \"gemma2\"'s)",
            ));
        }
        if qwen && !self.flag("use_sliding_window", false)? {
            return Ok(None);
        }
        let sliding: Vec<u64> = match self.fields.get("layer_types") {
            Some(Value::Array(types)) => self.layer_types(types, layers)?,
            None | Some(Value::Null) => (0..layers)
                .filter(|&i| match family {
                    Family::Gemma2 => i % 2 == 0,
                    Family::Gemma3 => (i + 1) % self.gemma3_pattern() != 0,
                    _ if qwen => i >= self.max_window_layers(),
                    _ => true,
                })
                .map(|i| i + 1)
                .collect(),
            Some(other) => {
                return Err(Error::invalid(
                    self.origin,
                    "layer_types",
                    format!("a list of \"full_attention\" or \"sliding_attention\", got {other}"),
                ));
            }
        };
        let window = self.optional_count("sliding_window")?;
        Ok(match (window, sliding.is_empty()) {
            (_, true) => None,
            (Some(tokens), false) => Some(SlidingWindow {
                tokens,
                layers: sliding,
            }),
            (None, false) if self.fields.contains_key("layer_types") => {
                return Err(Error::invalid(
                    self.origin,
                    "sliding_window",
                    "a positive integer (layer_types names sliding_attention layers)",
                ));
            }
            (None, false) => None,
        })
    }

    /// The 1-based blocks `layer_types` marks "sliding_attention", checked one type per block.
    fn layer_types(&self, types: &[Value], layers: u64) -> Result<Vec<u64>> {
        if types.len() as u64 != layers {
            return Err(Error::invalid(
                self.origin,
                "layer_types",
                format!(
                    "one entry per layer (num_hidden_layers = {layers}), got {}",
                    types.len()
                ),
            ));
        }
        let mut sliding = Vec::new();
        for (i, t) in types.iter().enumerate() {
            match t.as_str() {
                Some("sliding_attention") => sliding.push(i as u64 + 1),
                Some("full_attention") => {}
                _ => {
                    return Err(Error::invalid(
                        self.origin,
                        "layer_types",
                        format!("\"full_attention\" or \"sliding_attention\", got {t} at {i}"),
                    ));
                }
            }
        }
        Ok(sliding)
    }

    /// Qwen's count of full-attention blocks before the windowed ones (28 when left out).
    fn max_window_layers(&self) -> u64 {
        self.fields
            .get("max_window_layers")
            .and_then(Value::as_u64)
            .unwrap_or(28)
    }

    /// Gemma-3's period of full-attention blocks (6 when the config leaves it out).
    fn gemma3_pattern(&self) -> u64 {
        ["sliding_window_pattern", "_sliding_window_pattern"]
            .iter()
            .find_map(|k| self.fields.get(*k).and_then(Value::as_u64))
            .filter(|&p| p > 0)
            .unwrap_or(6)
    }
}
