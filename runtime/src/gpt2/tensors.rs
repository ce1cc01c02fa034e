//! GPT-2's parameter tensors per unit, in the order of each unit's flat parameter vector, with
//! the names and shapes `GPT2LMHeadModel.save_pretrained` writes (the output projection is tied to
//! `transformer.wte.weight`, which the embedding unit owns).

use super::Shape;

/// How a tensor starts without `--init-weights` (GPT-2's initialisation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

/// One named tensor of a unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl Tensor {
    fn new(name: String, shape: &[usize], init: Init) -> Tensor {
        Tensor {
            name,
            shape: shape.to_vec(),
            init,
        }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// AdamW decays tensors of two or more dimensions only (not biases or LayerNorm).
    pub fn decays(&self) -> bool {
        self.shape.len() >= 2
    }
}

/// GPT-2's initializer range.
const STD: f32 = 0.02;

/// The tensors of unit `unit` (0 embedding, 1..=L blocks, L+1 head).
pub fn unit_tensors(shape: &Shape, unit: usize) -> Vec<Tensor> {
    let (c, f) = (shape.hidden, shape.ffn);
    let layers = shape.layers;
    if unit == 0 {
        return vec![
            Tensor::new(
                "transformer.wte.weight".into(),
                &[shape.vocab, c],
                Init::Normal(STD),
            ),
            Tensor::new(
                "transformer.wpe.weight".into(),
                &[shape.seq, c],
                Init::Normal(STD),
            ),
        ];
    }
    if unit == layers + 1 {
        return vec![
            Tensor::new("transformer.ln_f.weight".into(), &[c], Init::Ones),
            Tensor::new("transformer.ln_f.bias".into(), &[c], Init::Zeros),
        ];
    }
    let p = |n: &str| format!("transformer.h.{}.{n}", unit - 1);
    let residual = Init::Normal(STD / (2.0 * layers as f32).sqrt());
    vec![
        Tensor::new(p("ln_1.weight"), &[c], Init::Ones),
        Tensor::new(p("ln_1.bias"), &[c], Init::Zeros),
        Tensor::new(p("attn.c_attn.weight"), &[c, 3 * c], Init::Normal(STD)),
        Tensor::new(p("attn.c_attn.bias"), &[3 * c], Init::Zeros),
        Tensor::new(p("attn.c_proj.weight"), &[c, c], residual),
        Tensor::new(p("attn.c_proj.bias"), &[c], Init::Zeros),
        Tensor::new(p("ln_2.weight"), &[c], Init::Ones),
        Tensor::new(p("ln_2.bias"), &[c], Init::Zeros),
        Tensor::new(p("mlp.c_fc.weight"), &[c, f], Init::Normal(STD)),
        Tensor::new(p("mlp.c_fc.bias"), &[f], Init::Zeros),
        Tensor::new(p("mlp.c_proj.weight"), &[f, c], residual),
        Tensor::new(p("mlp.c_proj.bias"), &[c], Init::Zeros),
    ]
}

/// The flat index ranges of a unit's decayed tensors.
pub fn decayed_ranges(tensors: &[Tensor]) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    let mut ranges = Vec::new();
    for t in tensors {
        if t.decays() {
            ranges.push(start..start + t.len());
        }
        start += t.len();
    }
    ranges
}

/// A standard normal value from three integers (Box–Muller on the project's hash).
fn standard_normal(seed: u64, a: u64, b: u64) -> f32 {
    let u1 = (crate::mlp::uniform(seed, a, 2 * b) + 1.0) / 2.0;
    let u2 = (crate::mlp::uniform(seed, a, 2 * b + 1) + 1.0) / 2.0;
    let u1 = 1.0 - u1; // (0, 1]
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// A unit's initial flat parameters from `seed`.
pub fn initial_params(tensors: &[Tensor], seed: u64, unit: usize) -> Vec<f32> {
    let mut flat = Vec::with_capacity(tensors.iter().map(Tensor::len).sum());
    for (k, t) in tensors.iter().enumerate() {
        let stream = ((unit as u64) << 16) | k as u64;
        match t.init {
            Init::Normal(std) => {
                flat.extend((0..t.len()).map(|e| std * standard_normal(seed, stream, e as u64)))
            }
            Init::Zeros => flat.extend(std::iter::repeat_n(0.0, t.len())),
            Init::Ones => flat.extend(std::iter::repeat_n(1.0, t.len())),
        }
    }
    flat
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardplan_scheduler::precision::Precision;

    /// The kernels carve flat parameters with `Shape`'s lengths; they must be the tensors' own.
    #[test]
    fn kernel_lengths_are_the_tensors_lengths() {
        let shape = Shape {
            layers: 2,
            hidden: 8,
            heads: 2,
            ffn: 24,
            vocab: 11,
            seq: 5,
            batch: 1,
            precision: Precision::FP32,
        };
        let lens = |unit| {
            unit_tensors(&shape, unit)
                .iter()
                .map(Tensor::len)
                .collect::<Vec<_>>()
        };
        assert_eq!(lens(0), shape.embedding_params());
        assert_eq!(lens(1), shape.block_params());
        assert_eq!(lens(2), shape.block_params());
        assert_eq!(lens(3), [8, 8]);
    }
}
