//! The matrix products of a zoo transformer's units, for replaying a unit's compute on a GPU.
//!
//! Per block, for T = b·s tokens, hidden h, key/value width h_kv = g·h/a, head width d = h/a:
//! QKV (T × (h + 2h_kv) × h), attention scores and values per (sample, head) (s × s × d and
//! s × d × s, batched b·a times), the output projection (T × h × h) and the MLP (T × 2ffn × h and
//! T × h × ffn when gated, T × ffn × h and T × h × ffn otherwise). The head is T × V × h; the
//! embedding is a lookup (no product). Backward runs two products per forward product: the input
//! gradient (m × k × n) and the weight gradient (n × k × m). The forward FLOPs equal
//! `ModelSpec::unit_shapes`' (tested), so a replay times exactly the work the analytic profile
//! counts; element-wise work (norms, activations, rotary embeddings, softmax) is left out.

use shardplan_scheduler::model::ModelSpec;

/// C (m × n) = A (m × k) · B (k × n), `batch` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
}

impl Gemm {
    fn new(m: u64, n: u64, k: u64, batch: u64) -> Self {
        Gemm {
            m: m as usize,
            n: n as usize,
            k: k as usize,
            batch: batch as usize,
        }
    }

    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }

    /// Elements of A, B and C of one product.
    pub fn elements(&self) -> (usize, usize, usize) {
        (self.m * self.k, self.k * self.n, self.m * self.n)
    }
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
    let head_width = h / model.heads;
    let kv = model.kv_heads * head_width;
    match unit {
        UnitKind::Embedding => vec![],
        UnitKind::Head => vec![Gemm::new(tokens, model.vocab, h, 1)],
        UnitKind::Block => {
            let mut gemms = vec![
                Gemm::new(tokens, h + 2 * kv, h, 1),
                Gemm::new(s, s, head_width, b * model.heads),
                Gemm::new(s, head_width, s, b * model.heads),
                Gemm::new(tokens, h, h, 1),
            ];
            if model.gated_mlp {
                gemms.push(Gemm::new(tokens, 2 * model.ffn, h, 1));
            } else {
                gemms.push(Gemm::new(tokens, model.ffn, h, 1));
            }
            gemms.push(Gemm::new(tokens, h, model.ffn, 1));
            gemms
        }
    }
}

/// The backward products: for each forward product, the input gradient dA = dC·Bᵀ (m × k × n)
/// and the weight gradient dB = Aᵀ·dC (k × n × m).
pub fn backward_gemms(forward: &[Gemm]) -> Vec<Gemm> {
    forward
        .iter()
        .flat_map(|g| {
            [
                Gemm {
                    m: g.m,
                    n: g.k,
                    k: g.n,
                    batch: g.batch,
                },
                Gemm {
                    m: g.k,
                    n: g.n,
                    k: g.m,
                    batch: g.batch,
                },
            ]
        })
        .collect()
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
