//! GPT-2 weights as safetensors files with transformers' names, shapes and layouts (fp32), in both
//! directions: `GPT2LMHeadModel.save_pretrained(..., safe_serialization=True)` files load here, and
//! the files written here load with `GPT2LMHeadModel.from_pretrained`.

use super::tensors::Tensor;
use crate::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// Names transformers writes besides the parameters that are not ours to load: the tied output
/// projection (it is `transformer.wte.weight`) and, in older versions, the attention mask buffers.
fn ignored(name: &str) -> bool {
    name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// Every unit's flat parameters from `path`; `units[i]` lists unit i's tensors. A missing,
/// misshapen, non-fp32 or unknown tensor is an error naming it.
pub fn load(path: &Path, units: &[Vec<Tensor>]) -> Result<Vec<Vec<f32>>> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Mismatch(format!("{origin}: cannot read the weights: {e}")))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Mismatch(format!("{origin}: not a safetensors file: {e}")))?;
    // transformers' GPT2Model (no LM head) writes the names without `transformer.`.
    let lookup = |name: &str| {
        file.tensor(name)
            .or_else(|_| file.tensor(name.trim_start_matches("transformer.")))
            .ok()
    };
    let expected: std::collections::HashSet<&str> =
        units.iter().flatten().map(|t| t.name.as_str()).collect();
    for name in file.names() {
        let known =
            expected.contains(name) || expected.contains(format!("transformer.{name}").as_str());
        if !known && !ignored(name) {
            return Err(Error::Mismatch(format!(
                "{origin}: tensor `{name}` is not a parameter of this model (a file for another configuration?)"
            )));
        }
    }
    units
        .iter()
        .map(|tensors| {
            let mut flat = Vec::with_capacity(tensors.iter().map(Tensor::len).sum());
            for t in tensors {
                let view = lookup(&t.name).ok_or_else(|| {
                    Error::Mismatch(format!("{origin}: tensor `{}` is missing", t.name))
                })?;
                if view.shape() != t.shape.as_slice() {
                    return Err(Error::Mismatch(format!(
                        "{origin}: tensor `{}` has shape {:?}, the model expects {:?}",
                        t.name,
                        view.shape(),
                        t.shape
                    )));
                }
                if view.dtype() != Dtype::F32 {
                    return Err(Error::Mismatch(format!(
                        "{origin}: tensor `{}` is {:?}; fp32 expected (save the model in float32)",
                        t.name,
                        view.dtype()
                    )));
                }
                flat.extend(
                    view.data()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
            }
            Ok(flat)
        })
        .collect()
}

/// The safetensors bytes of every unit's flat parameters (fp32, `format = pt` as transformers
/// writes).
pub fn serialize(units: &[Vec<Tensor>], params: &[Vec<f32>]) -> Result<Vec<u8>> {
    let mut named = Vec::new();
    for (tensors, flat) in units.iter().zip(params) {
        let mut start = 0;
        for t in tensors {
            let bytes: Vec<u8> = flat[start..start + t.len()]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            start += t.len();
            named.push((t.name.clone(), t.shape.clone(), bytes));
        }
    }
    let views = named
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Backend(format!("safetensors: {e}")))?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| Error::Backend(format!("safetensors: {e}")))
}
