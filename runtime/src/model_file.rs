//! What a `--model` file names: an MLP (`models/mlp-*.toml`, it has `widths`) or a transformer
//! (a zoo file `models/<name>.toml`, GPT-2s with a `[training]` table trainable; or a transformers
//! `config.json`).

use crate::Result;
use crate::mlp::MlpSpec;
use shardplan_scheduler::hf_config;
use shardplan_scheduler::model::ModelSpec;
use std::path::Path;

pub enum ModelFile {
    Mlp(MlpSpec),
    Transformer(ModelSpec),
}

impl ModelFile {
    pub fn load(path: &Path) -> Result<ModelFile> {
        if hf_config::is_config(path) {
            return Ok(ModelFile::Transformer(hf_config::load(path)?));
        }
        let table: toml::Table = shardplan_scheduler::io::read_toml(path)?;
        Ok(if table.contains_key("widths") {
            ModelFile::Mlp(MlpSpec::load(path)?)
        } else {
            ModelFile::Transformer(ModelSpec::load(path)?)
        })
    }
}
