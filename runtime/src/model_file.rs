//! What a `--model` file names: an MLP (`models/mlp-*.toml`, it has `widths`) or a transformer
//! (a zoo file `models/<name>.toml`, GPT-2s with a `[training]` table trainable; or a transformers
//! `config.json`).

use crate::Result;
use crate::mlp::MlpSpec;
use shardplan_scheduler::model::{ModelSpec, is_hf_config};
use std::path::Path;

pub enum ModelFile {
    Mlp(MlpSpec),
    Transformer(ModelSpec),
}

impl ModelFile {
    pub fn load(path: &Path) -> Result<ModelFile> {
        if is_hf_config(path) {
            return Ok(ModelFile::Transformer(ModelSpec::load(path)?));
        }
        let table: toml::Table = shardplan_scheduler::io::read_toml(path)?;
        Ok(if table.contains_key("widths") {
            ModelFile::Mlp(MlpSpec::load(path)?)
        } else {
            ModelFile::Transformer(ModelSpec::load(path)?)
        })
    }
}
