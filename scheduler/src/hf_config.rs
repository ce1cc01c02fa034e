//! A Hugging Face transformers `config.json` as a zoo [`ModelSpec`]: the dense decoder
//! families of [`families::Family`] (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma-2, Gemma-3 text,
//! Phi-3, OLMo-2), read with the field names and defaults transformers writes. A mixture of
//! experts or another `model_type` is refused, naming the field: a plan for a model that is not
//! the one described would be a wrong plan. Errors name the config's own fields.

mod families;

use crate::model::ModelSpec;
use crate::{Error, Result};
use families::{Family, KNOWN, field_name};
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
    config.refuse_experts()?;
    let family = match config.text("model_type") {
        Some(t) => Family::of(t).ok_or_else(|| {
            let hint = if t == "gemma3" {
                " (for Gemma-3 pass its text_config, saved as Gemma3TextConfig)"
            } else {
                ""
            };
            Error::invalid(
                origin,
                "model_type",
                format!("one of the dense decoder families {KNOWN}, got \"{t}\"{hint}"),
            )
        })?,
        None => return Err(Error::invalid(origin, "model_type", "a string")),
    };
    let spec = config.spec(family, name)?;
    spec.validate_named(origin, &|field| field_name(family, field))?;
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

    /// Whether the config gives `key` a value (not null, false or 0).
    fn is_set(&self, key: &str) -> bool {
        self.fields
            .get(key)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false) && v.as_f64() != Some(0.0))
    }

    /// A mixture of experts is refused, naming its experts: expert parallelism is outside the
    /// plan space.
    fn refuse_experts(&self) -> Result<()> {
        for key in ["num_local_experts", "num_experts", "n_routed_experts"] {
            if self.is_set(key) {
                return Err(Error::invalid(
                    self.origin,
                    key,
                    format!(
                        "a dense model, got {} experts: a mixture of experts needs expert \
                         parallelism, which is outside the plan space",
                        self.fields[key]
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Biases, Norm, PositionEmbedding, QkNorm};

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
        assert!(spec.gated_mlp && spec.bias == Biases::NONE && !spec.tied_embeddings);
        assert_eq!(
            (spec.norm, spec.position_embedding, spec.head_dim),
            (Norm::RmsNorm, PositionEmbedding::Rotary, None)
        );
    }

    fn with(base: &str, changes: &[(&str, &str)]) -> Result<ModelSpec> {
        let mut v: Value = serde_json::from_str(base).unwrap();
        for (key, value) in changes {
            v[*key] = serde_json::from_str(value).unwrap();
        }
        parse(&v.to_string(), "config.json", "m")
    }

    /// Mixtures of experts, unknown families and malformed fields are refused, each naming the
    /// config's own field.
    #[test]
    fn what_the_plan_cannot_model_is_refused_by_the_configs_name() {
        for (base, key, value, named) in [
            (LLAMA, "model_type", "\"t5\"", "model_type"),
            (LLAMA, "model_type", "\"gemma3\"", "text_config"),
            (LLAMA, "sliding_window", "4096", "sliding_window"),
            (LLAMA, "num_local_experts", "8", "8 experts"),
            (LLAMA, "n_routed_experts", "64", "n_routed_experts"),
            (LLAMA, "hidden_size", "0", "hidden_size"),
            (LLAMA, "num_key_value_heads", "3", "num_key_value_heads"),
            (LLAMA, "num_hidden_layers", "1000000", "num_hidden_layers"),
            (GPT2, "n_head", "\"four\"", "n_head"),
            (GPT2, "n_head", "3", "a divisor of n_embd = 128"),
            (GPT2, "n_layer", "1000000", "n_layer"),
        ] {
            let err = with(base, &[(key, value)]).unwrap_err().to_string();
            assert!(err.contains(named), "{key}={value}: {err}");
            assert!(err.starts_with("config.json: "), "{err}");
        }
        let err = with(
            LLAMA,
            &[
                ("model_type", "\"gemma2\""),
                ("layer_types", "[\"full_attention\"]"),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("layer_types") && err.contains("num_hidden_layers = 2"),
            "{err}"
        );
        let err = parse("[1, 2]", "config.json", "m").unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
        let err = parse("{\"model_type\": ", "config.json", "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.json:1:"), "{err}");
    }

    /// Each family's features, from the fields its config class writes.
    #[test]
    fn families_read_their_features() {
        let mistral = with(
            LLAMA,
            &[("model_type", "\"mistral\""), ("sliding_window", "64")],
        );
        let window = mistral.unwrap().sliding_window.unwrap();
        assert_eq!((window.tokens, window.layers), (64, vec![1, 2]));
        let qwen2 = with(
            LLAMA,
            &[("model_type", "\"qwen2\""), ("sliding_window", "64")],
        );
        let qwen2 = qwen2.unwrap();
        assert_eq!((qwen2.bias.qkv, qwen2.bias.output), (true, false));
        assert_eq!(qwen2.sliding_window, None, "use_sliding_window is false");
        let gemma2 = with(
            LLAMA,
            &[
                ("model_type", "\"gemma2\""),
                ("head_dim", "24"),
                ("final_logit_softcapping", "30.0"),
                ("sliding_window", "4096"),
                ("tie_word_embeddings", "null"),
            ],
        )
        .unwrap();
        assert_eq!(gemma2.head_dim, Some(24));
        assert_eq!(gemma2.norms_per_block, 4);
        assert!(gemma2.tied_embeddings && gemma2.final_logit_softcapping);
        assert!(!gemma2.attention_logit_softcapping);
        assert_eq!(gemma2.sliding_window.unwrap().layers, vec![1]);
        let olmo2 = with(LLAMA, &[("model_type", "\"olmo2\"")]).unwrap();
        assert_eq!(olmo2.qk_norm, Some(QkNorm::PerProjection));
    }
}
