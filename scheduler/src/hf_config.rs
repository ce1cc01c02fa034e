//! A Hugging Face transformers `config.json` as a zoo [`ModelSpec`]: the GPT-2 (`model_type =
//! "gpt2"`) and Llama (`"llama"`) families, read with the field names and defaults transformers
//! writes (`GPT2Config`, `LlamaConfig`). A field the zoo model cannot represent (another
//! `model_type`, a sliding window, experts, a head size other than hidden / heads, biases on
//! attention but not on the MLP) is refused, naming it: a plan for a model that is not the one
//! described would be a wrong plan.

use crate::model::{ModelSpec, Norm, PositionEmbedding};
use crate::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// Whether `path` names a transformers config (`*.json`) rather than a zoo file.
pub fn is_config(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The transformer a `--model` path names: a transformers `config.json`, else a zoo file.
pub fn load_model(path: &Path) -> Result<ModelSpec> {
    if is_config(path) {
        load(path)
    } else {
        ModelSpec::load(path)
    }
}

/// Reads `path` (a transformers `config.json`).
pub fn load(path: &Path) -> Result<ModelSpec> {
    let origin = path.display().to_string();
    let text = crate::io::read_text(path)?;
    let name = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("model");
    parse(&text, &origin, name)
}

/// The spec of a config's JSON `text`; `name` is the spec's name unless the config carries
/// `_name_or_path`.
pub fn parse(text: &str, origin: &str, name: &str) -> Result<ModelSpec> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::Parse {
        origin: origin.to_string(),
        location: format!(":{}:{}", e.line(), e.column()),
        field: None,
        message: e.to_string(),
    })?;
    let Value::Object(fields) = value else {
        return Err(Error::invalid(origin, ".", "a JSON object (a config.json)"));
    };
    let config = Config {
        fields: &fields,
        origin,
    };
    let name = config
        .text("_name_or_path")
        .filter(|n| !n.is_empty())
        .unwrap_or(name)
        .to_string();
    let spec = match config.text("model_type") {
        Some("gpt2") => config.gpt2(name)?,
        Some("llama") => config.llama(name)?,
        Some(other) => {
            return Err(Error::invalid(
                origin,
                "model_type",
                format!("\"gpt2\" or \"llama\" (the families the zoo models), got \"{other}\""),
            ));
        }
        None => return Err(Error::invalid(origin, "model_type", "a string")),
    };
    config.refuse_what_the_zoo_cannot_model()?;
    spec.validate(origin)?;
    Ok(spec)
}

/// A config's fields, read with its file named in errors.
struct Config<'a> {
    fields: &'a Map<String, Value>,
    origin: &'a str,
}

impl Config<'_> {
    fn text(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// A positive integer field; `None` where the config leaves it out or writes null.
    fn optional_count(&self, key: &str) -> Result<Option<u64>> {
        match self.fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().filter(|&n| n > 0).map(Some).ok_or_else(|| {
                Error::invalid(self.origin, key, format!("a positive integer, got {v}"))
            }),
        }
    }

    fn count(&self, key: &str) -> Result<u64> {
        self.optional_count(key)?
            .ok_or_else(|| Error::invalid(self.origin, key, "a positive integer"))
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.fields.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Error::invalid(
                self.origin,
                key,
                format!("true or false, got {v}"),
            )),
        }
    }

    /// `GPT2Config`: n_embd, n_layer, n_head, n_inner (null: 4·n_embd), vocab_size, n_positions;
    /// LayerNorm, learned positions, biases, tied embeddings unless `tie_word_embeddings` is false.
    fn gpt2(&self, name: String) -> Result<ModelSpec> {
        let hidden = self.count("n_embd")?;
        let heads = self.count("n_head")?;
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
            bias: true,
            norm: Norm::LayerNorm,
            position_embedding: PositionEmbedding::Learned,
            tied_embeddings: self.flag("tie_word_embeddings", true)?,
            training: None,
        })
    }

    /// `LlamaConfig`: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads
    /// (default: the heads), intermediate_size, vocab_size, max_position_embeddings; RMSNorm,
    /// rotary positions, SwiGLU, biases only as attention_bias and mlp_bias together, an untied
    /// head unless `tie_word_embeddings`.
    fn llama(&self, name: String) -> Result<ModelSpec> {
        let hidden = self.count("hidden_size")?;
        let heads = self.count("num_attention_heads")?;
        if let Some(head_dim) = self.optional_count("head_dim")?
            && head_dim * heads != hidden
        {
            return Err(Error::invalid(
                self.origin,
                "head_dim",
                format!(
                    "hidden_size / num_attention_heads = {} (the zoo models heads of that size), got {head_dim}",
                    hidden / heads
                ),
            ));
        }
        let (attention_bias, mlp_bias) = (
            self.flag("attention_bias", false)?,
            self.flag("mlp_bias", false)?,
        );
        if attention_bias != mlp_bias {
            return Err(Error::invalid(
                self.origin,
                "mlp_bias",
                format!(
                    "{attention_bias}, as attention_bias (the zoo models biases on every linear layer or on none)"
                ),
            ));
        }
        Ok(ModelSpec {
            name,
            layers: self.count("num_hidden_layers")?,
            hidden,
            heads,
            kv_heads: self.optional_count("num_key_value_heads")?.unwrap_or(heads),
            ffn: self.count("intermediate_size")?,
            vocab: self.count("vocab_size")?,
            seq_len: self.count("max_position_embeddings")?,
            gated_mlp: true,
            bias: attention_bias,
            norm: Norm::RmsNorm,
            position_embedding: PositionEmbedding::Rotary,
            tied_embeddings: self.flag("tie_word_embeddings", false)?,
            training: None,
        })
    }

    /// Sliding windows and mixtures of experts change what a unit computes and holds.
    fn refuse_what_the_zoo_cannot_model(&self) -> Result<()> {
        let set = |key: &str| {
            self.fields
                .get(key)
                .is_some_and(|v| !v.is_null() && v != &Value::Bool(false) && v.as_u64() != Some(0))
        };
        for (key, what) in [
            ("sliding_window", "sliding-window attention"),
            ("num_local_experts", "a mixture of experts"),
            ("num_experts", "a mixture of experts"),
            ("n_routed_experts", "a mixture of experts"),
        ] {
            if set(key) {
                return Err(Error::invalid(
                    self.origin,
                    key,
                    format!("none: the zoo models dense full attention, not {what}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=256, n_positions=64)
    /// .save_pretrained` writes (the fields the spec reads; `n_inner` null).
    const GPT2: &str = r#"{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_inner": null, "n_layer": 4,
        "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": true}"#;

    /// What `LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
    /// num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
    /// max_position_embeddings=128).save_pretrained` writes (the fields the spec reads).
    const LLAMA: &str = r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
        "head_dim": 16, "hidden_size": 64, "intermediate_size": 160, "max_position_embeddings": 128,
        "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "tie_word_embeddings": false, "vocab_size": 300}"#;

    #[test]
    fn gpt2_reads_as_the_zoo_writes_gpt2_tiny() {
        let spec = parse(GPT2, "config.json", "tiny").unwrap();
        let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gpt2-tiny.toml");
        let zoo = ModelSpec::load(&zoo).unwrap();
        assert_eq!(
            spec,
            ModelSpec {
                name: "tiny".into(),
                training: None,
                ..zoo
            }
        );
    }

    #[test]
    fn llama_reads_grouped_query_attention_and_an_untied_head() {
        let spec = parse(LLAMA, "config.json", "tiny-llama").unwrap();
        assert_eq!(
            (
                spec.hidden,
                spec.heads,
                spec.kv_heads,
                spec.ffn,
                spec.layers
            ),
            (64, 4, 2, 160, 2)
        );
        assert!(spec.gated_mlp && !spec.bias && !spec.tied_embeddings);
        assert_eq!(
            (spec.norm, spec.position_embedding),
            (Norm::RmsNorm, PositionEmbedding::Rotary)
        );
    }

    /// Each field the zoo cannot represent is refused, named.
    #[test]
    fn what_the_zoo_cannot_model_is_refused_by_name() {
        let with = |base: &str, key: &str, value: &str| {
            let mut v: Value = serde_json::from_str(base).unwrap();
            v[key] = serde_json::from_str(value).unwrap();
            parse(&v.to_string(), "config.json", "m")
                .unwrap_err()
                .to_string()
        };
        for (base, key, value) in [
            (LLAMA, "model_type", "\"mistral\""),
            (LLAMA, "sliding_window", "4096"),
            (LLAMA, "num_local_experts", "8"),
            (LLAMA, "head_dim", "32"),
            (LLAMA, "attention_bias", "true"),
            (LLAMA, "hidden_size", "0"),
            (GPT2, "n_head", "\"four\""),
        ] {
            let err = with(base, key, value);
            let named = if key == "attention_bias" {
                "mlp_bias"
            } else {
                key
            };
            assert!(err.contains(named), "{key}={value}: {err}");
        }
        let err = parse("[1, 2]", "config.json", "m").unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
        let err = parse("{\"model_type\": ", "config.json", "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.json:1:"), "{err}");
    }
}
