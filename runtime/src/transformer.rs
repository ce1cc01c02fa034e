//! The matrix products of a zoo transformer's units, for replaying a unit's compute on a GPU.
//!
//! Per block, for T = b·s tokens, hidden h, key/value width h_kv = g·h/a, head width d = h/a:
//! QKV (T × (h + 2h_kv) × h), attention scores Q·Kᵀ and values P·V per (sample, head) (s × s × d
//! and s × d × s, batched b·a times), the output projection (T × h × h) and the MLP (T × 2ffn × h
//! and T × h × ffn when gated, T × ffn × h and T × h × ffn otherwise). The head is T × V × h; the
//! embedding is a lookup (no product). Linear layers multiply by Wᵀ with W stored out × in, as
//! frameworks store it, so the replay runs the same operand layouts as training. Backward runs
//! each forward product's input and weight gradients ([`Gemm::backward`]). The forward FLOPs equal
//! `ModelSpec::unit_shapes`' (tested), so a replay times exactly the work the analytic profile
//! counts; element-wise work (norms, activations, rotary embeddings, softmax) is left out.

pub use crate::gemm::Gemm;
use shardplan_scheduler::model::ModelSpec;

/// A product of `batch` independent m × n × k products.
fn product(m: u64, n: u64, k: u64, batch: u64) -> Gemm {
    Gemm::new(m as usize, n as usize, k as usize).batched(batch as usize)
}

/// Which unit of the zoo model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum UnitKind {
    Embedding,
    Block,
    Head,
}

impl UnitKind {
    /// The kind of unit `index` of a model with `layers` blocks (embedding, blocks, head).
    pub fn of(index: usize, layers: usize) -> Self {
        match index {
            0 => UnitKind::Embedding,
            i if i <= layers => UnitKind::Block,
            _ => UnitKind::Head,
        }
    }
}

/// The forward products of one unit for `micro_batch` sequences of `seq_len` tokens.
pub fn forward_gemms(
    model: &ModelSpec,
    unit: UnitKind,
    micro_batch: u64,
    seq_len: u64,
) -> Vec<Gemm> {
    let (b, s, h) = (micro_batch, seq_len, model.hidden);
    let tokens = b * s;
    let head_width = model.head_size();
    let (q, kv) = model.attention_widths();
    let linear = |out: u64, inp: u64| Gemm::linear(tokens as usize, inp as usize, out as usize);
    match unit {
        UnitKind::Embedding => vec![],
        UnitKind::Head => vec![linear(model.vocab, h)],
        UnitKind::Block => {
            let up = if model.gated_mlp {
                2 * model.ffn
            } else {
                model.ffn
            };
            vec![
                linear(q + 2 * kv, h),
                product(s, s, head_width, b * model.heads).b_transposed(),
                product(s, head_width, s, b * model.heads),
                linear(h, q),
                linear(up, h),
                linear(h, model.ffn),
            ]
        }
    }
}

/// The backward products: each forward product's input and weight gradients
/// ([`Gemm::backward`]), in the forward's order.
pub fn backward_gemms(forward: &[Gemm]) -> Vec<Gemm> {
    forward.iter().flat_map(Gemm::backward).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardplan_scheduler::model::Attention;
    use std::path::Path;

    /// Every zoo model: the replayed forward FLOPs of each unit equal the analytic profile's, and
    /// backward is exactly twice forward.
    #[test]
    fn replayed_flops_equal_the_analytic_model() {
        let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
        let mut checked = 0;
        for entry in std::fs::read_dir(&zoo).unwrap() {
            let path = entry.unwrap().path();
            let Ok(model) = ModelSpec::load(&path) else {
                continue;
            };
            let (b, s) = (2, 512);
            let shapes = model.unit_shapes(b, s, Attention::Flash);
            for (i, shape) in shapes.iter().enumerate() {
                let kind = UnitKind::of(i, model.layers as usize);
                let forward = forward_gemms(&model, kind, b, s);
                let flops: f64 = forward.iter().map(Gemm::flops).sum();
                assert!(
                    (flops - shape.forward_flops).abs() <= 1e-9 * shape.forward_flops.max(1.0),
                    "{} {}: replay {flops}, model {}",
                    model.name,
                    shape.name,
                    shape.forward_flops
                );
                let backward: f64 = backward_gemms(&forward).iter().map(Gemm::flops).sum();
                assert_eq!(backward, 2.0 * flops);
            }
            checked += 1;
        }
        assert!(
            checked >= 8,
            "only {checked} zoo models found in {}",
            zoo.display()
        );
    }
}
