//! The CPU workload: an MLP of Linear(+ReLU) units with an MSE loss, trained with Adam in fp32 on
//! deterministic synthetic data, and its single-process reference trainer.
//!
//! Unit i maps d_i → d_{i+1} (W: out×in row-major, then the bias; one flat parameter vector per
//! unit) followed by ReLU except on the last unit. ReLU's backward mask is taken from its output
//! (a > 0 ⇔ z > 0), so a unit saves only its output; the first unit also keeps the input batch
//! and the last the targets. Rank r of N holds samples r·b … (r+1)·b−1 of each global batch of
//! N·b; the loss is mean((z − y)²) over the global batch, so summing the ranks' gradients gives
//! exactly the reference gradient (up to the order of floating-point sums).

mod cpu;
pub mod cuda;
mod loader;
mod train;

use crate::gemm::Gemm;

pub use train::{Mlp, MlpKernels};

use crate::{Error, Result};
use serde::Deserialize;
use std::path::Path;

/// `models/mlp-*.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpSpec {
    pub name: String,
    /// Input features d_0.
    pub input: usize,
    /// Output widths d_1 … d_L of the units.
    pub widths: Vec<usize>,
    /// Samples per rank and step (b).
    pub batch_per_rank: usize,
    pub seed: u64,
    pub learning_rate: f32,
}

/// Adam's fixed hyper-parameters.
pub const BETA1: f32 = 0.9;
pub const BETA2: f32 = 0.999;
pub const EPSILON: f32 = 1e-8;

impl MlpSpec {
    /// Loads and validates a model file.
    pub fn load(path: &Path) -> Result<Self> {
        let spec: MlpSpec = shardplan_scheduler::io::read_toml(path)?;
        let origin = path.display().to_string();
        let bad = |field: &str, expected: &str| {
            Err(shardplan_scheduler::Error::invalid(&origin, field, expected).into())
        };
        if spec.input == 0 || spec.widths.is_empty() || spec.widths.contains(&0) {
            return bad(
                "widths",
                "a non-empty list of positive widths and a positive input",
            );
        }
        if spec.batch_per_rank == 0 {
            return bad("batch_per_rank", "a positive integer");
        }
        if !(spec.learning_rate > 0.0 && spec.learning_rate.is_finite()) {
            return bad("learning_rate", "a positive number");
        }
        Ok(spec)
    }

    pub fn units(&self) -> usize {
        self.widths.len()
    }

    /// The output width d_L (`load` refuses a spec without widths).
    pub fn output(&self) -> usize {
        self.widths.last().copied().unwrap_or_default()
    }

    /// (in, out) of unit i.
    pub fn dims(&self, unit: usize) -> (usize, usize) {
        let input = if unit == 0 {
            self.input
        } else {
            self.widths[unit - 1]
        };
        (input, self.widths[unit])
    }

    /// Ψ_i = out·in + out.
    pub fn params(&self, unit: usize) -> usize {
        let (i, o) = self.dims(unit);
        o * i + o
    }

    pub fn unit_name(&self, unit: usize) -> String {
        format!("linear.{}", unit + 1)
    }

    /// ReLU after every unit but the last.
    pub fn activation(&self, unit: usize) -> Activation {
        if unit + 1 < self.units() {
            Activation::Relu
        } else {
            Activation::Identity
        }
    }

    /// The initial flat parameters of a unit (identical on every rank): W uniform in ±1/√in,
    /// bias 0; `padded` ≥ Ψ entries, the padding zero.
    pub fn initial_params(&self, unit: usize, padded: usize) -> Vec<f32> {
        let (i, o) = self.dims(unit);
        let bound = 1.0 / (i as f32).sqrt();
        let mut p = vec![0.0; padded];
        for (k, w) in p.iter_mut().take(o * i).enumerate() {
            *w = bound * uniform(self.seed, 1 + unit as u64, k as u64);
        }
        p
    }

    /// The fixed random teacher T (d_L × d_0) that defines the targets.
    pub fn teacher(&self) -> Vec<f32> {
        let (d0, dl) = (self.input, self.output());
        (0..dl * d0)
            .map(|k| uniform(self.seed ^ 0x7EAC, (k / d0) as u64, (k % d0) as u64))
            .collect()
    }

    /// Fills `x` (rows × d_0) and `y` (rows × d_L) with the samples `first..first+rows` of `step`:
    /// inputs uniform in ±1, targets y = tanh(x·Tᵀ/√d_0) for the `teacher` T.
    pub fn batch(
        &self,
        step: usize,
        first: usize,
        rows: usize,
        teacher: &[f32],
        x: &mut [f32],
        y: &mut [f32],
    ) {
        let (d0, dl) = (self.input, self.output());
        for r in 0..rows {
            let sample = (step as u64) << 32 | (first + r) as u64;
            for k in 0..d0 {
                x[r * d0 + k] = uniform(self.seed ^ 0xDA7A, sample, k as u64);
            }
        }
        let scale = 1.0 / (d0 as f32).sqrt();
        Gemm::linear(rows, d0, dl).host(scale, x, teacher, 0.0, y);
        y.iter_mut().for_each(|v| *v = v.tanh());
    }
}

/// A deterministic uniform value in [−1, 1) from three integers (SplitMix64 finaliser).
pub(crate) fn uniform(a: u64, b: u64, c: u64) -> f32 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ b.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ c.wrapping_mul(0x94D0_49BB_1331_11EB);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// What a unit applies to its linear layer's output: ReLU (the former `relu: bool`'s `true`) or
/// nothing (`false`), the output then being the layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Identity,
}

/// out = x·Wᵀ + bias (rows × out), then ReLU in place where `activation` is ReLU.
pub fn linear_forward(
    x: &[f32],
    params: &[f32],
    out: &mut [f32],
    rows: usize,
    (din, dout): (usize, usize),
    activation: Activation,
) {
    let (w, bias) = params.split_at(dout * din);
    for r in 0..rows {
        out[r * dout..(r + 1) * dout].copy_from_slice(&bias[..dout]);
    }
    Gemm::linear(rows, din, dout).host(1.0, x, w, 1.0, out);
    if activation == Activation::Relu {
        out.iter_mut().for_each(|v| *v = v.max(0.0));
    }
}

/// Backward of one unit. `grad_out` (rows × out) holds dL/d(output) and is turned into dL/dz in
/// place (masked by `output > 0` where `activation` is ReLU); adds the parameter gradient (W then bias) into
/// `grads` (the executor prepares it, DESIGN §6.10) and writes dL/dx, when given, into `grad_in`
/// (rows × in).
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    x: &[f32],
    params: &[f32],
    output: &[f32],
    grad_out: &mut [f32],
    grads: &mut [f32],
    grad_in: Option<&mut [f32]>,
    rows: usize,
    (din, dout): (usize, usize),
    activation: Activation,
) {
    if activation == Activation::Relu {
        grad_out.iter_mut().zip(output).for_each(|(g, a)| {
            if *a <= 0.0 {
                *g = 0.0
            }
        });
    }
    let (gw, gb) = grads.split_at_mut(dout * din);
    let [input_grad, weight_grad] = Gemm::linear(rows, din, dout).backward();
    weight_grad.host(1.0, grad_out, x, 1.0, gw);
    for (j, g) in gb.iter_mut().take(dout).enumerate() {
        *g += (0..rows).map(|r| grad_out[r * dout + j]).sum::<f32>();
    }
    if let Some(gx) = grad_in {
        input_grad.host(1.0, grad_out, params, 0.0, gx);
    }
}

/// The number of partial sums the loss is reduced through (see [`mse_loss`]).
pub const LOSS_PARTIALS: usize = 8192;

/// dL/dz for L = Σ (z − y)² · scale; returns the partial loss [`mse_loss`].
pub fn mse_grad(z: &[f32], y: &[f32], grad: &mut [f32], scale: f32) -> f32 {
    for ((g, a), b) in grad.iter_mut().zip(z).zip(y) {
        *g = 2.0 * (a - b) * scale;
    }
    mse_loss(z, y, scale)
}

/// Σ (z − y)² · scale in the order the GPU sums it: partial `j` adds the elements
/// `j, j + P, j + 2P, …` (P = [`LOSS_PARTIALS`]) in turn, then the partials are added in order of
/// `j`. A GPU thread per partial keeps the reduction parallel and the result bitwise the CPU's.
pub fn mse_loss(z: &[f32], y: &[f32], scale: f32) -> f32 {
    let mut partials = vec![0.0f32; LOSS_PARTIALS.min(z.len())];
    for (k, (a, b)) in z.iter().zip(y).enumerate() {
        let d = a - b;
        partials[k % LOSS_PARTIALS] += d * d * scale;
    }
    partials.iter().fold(0.0, |sum, p| sum + p)
}

/// One Adam step (step ≥ 1) on matching slices.
pub fn adam(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], step: u32, lr: f32) {
    let (c1, c2) = (1.0 - BETA1.powi(step as i32), 1.0 - BETA2.powi(step as i32));
    for k in 0..params.len() {
        let g = grads[k];
        m[k] = BETA1 * m[k] + (1.0 - BETA1) * g;
        v[k] = BETA2 * v[k] + (1.0 - BETA2) * g * g;
        params[k] -= lr * (m[k] / c1) / ((v[k] / c2).sqrt() + EPSILON);
    }
}

/// The reference: one process trains on the union of the ranks' batches (N·b samples a step)
/// for `steps` steps; returns each unit's final parameters (Ψ entries) and the loss per step.
pub fn reference_training(
    spec: &MlpSpec,
    world_size: usize,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let initial = (0..spec.units())
        .map(|u| spec.initial_params(u, spec.params(u)))
        .collect();
    reference_training_from(spec, world_size, steps, initial)
}

/// [`reference_training`] from the given parameters (one Ψ_i vector per unit).
pub fn reference_training_from(
    spec: &MlpSpec,
    world_size: usize,
    steps: usize,
    mut params: Vec<Vec<f32>>,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let rows = spec.batch_per_rank * world_size;
    let l = spec.units();
    let mut m: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v = m.clone();
    let mut losses = Vec::with_capacity(steps);
    let (d0, dl) = (spec.input, spec.output());
    let scale = 1.0 / (rows * dl) as f32;
    let teacher = spec.teacher();
    for step in 0..steps {
        let mut x = vec![0.0; rows * d0];
        let mut y = vec![0.0; rows * dl];
        spec.batch(step, 0, rows, &teacher, &mut x, &mut y);
        let mut outputs: Vec<Vec<f32>> = Vec::with_capacity(l);
        for u in 0..l {
            let (din, dout) = spec.dims(u);
            let mut out = vec![0.0; rows * dout];
            linear_forward(
                if u == 0 { &x } else { &outputs[u - 1] },
                &params[u],
                &mut out,
                rows,
                (din, dout),
                spec.activation(u),
            );
            outputs.push(out);
        }
        let mut grad = vec![0.0; rows * dl];
        losses.push(mse_grad(&outputs[l - 1], &y, &mut grad, scale));
        for u in (0..l).rev() {
            let dims = spec.dims(u);
            let mut grads = vec![0.0; params[u].len()];
            let mut grad_in = (u > 0).then(|| vec![0.0; rows * dims.0]);
            let input = if u == 0 { &x } else { &outputs[u - 1] };
            linear_backward(
                input,
                &params[u],
                &outputs[u],
                &mut grad,
                &mut grads,
                grad_in.as_deref_mut(),
                rows,
                dims,
                spec.activation(u),
            );
            adam(
                &mut params[u],
                &grads,
                &mut m[u],
                &mut v[u],
                step as u32 + 1,
                spec.learning_rate,
            );
            if let Some(g) = grad_in {
                grad = g;
            }
        }
    }
    (params, losses)
}

/// Compares trained parameters with a reference: the largest |a − b| over the unit's largest
/// |b| (a relative error per unit, robust to near-zero entries such as biases).
pub fn max_relative_error(a: &[Vec<f32>], b: &[Vec<f32>]) -> Result<f64> {
    same_units(a, b)?;
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12) as f64;
        let err = x
            .iter()
            .zip(y)
            .fold(0.0f32, |m, (p, q)| m.max((p - q).abs())) as f64;
        worst = worst.max(err / scale);
    }
    Ok(worst)
}

/// Per unit ‖a − b‖ / ‖b − initial‖, the worst unit's: how far `a` is from the reference `b`
/// against how far training moved the reference from where both started. Adam turns a gradient
/// near zero into a step of ±lr whatever its size, so another summation order (cuBLAS against
/// the CPU) can flip a few steps entirely; this norm weighs them as the share of the update they
/// are, where [`max_relative_error`] reports the single worst entry.
pub fn update_relative_error(a: &[Vec<f32>], b: &[Vec<f32>], initial: &[Vec<f32>]) -> Result<f64> {
    same_units(a, b)?;
    same_units(b, initial)?;
    let distance = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (f64::from(*p) - f64::from(*q)).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    Ok(a.iter()
        .zip(b)
        .zip(initial)
        .map(|((x, y), x0)| distance(x, y) / distance(y, x0).max(1e-30))
        .fold(0.0, f64::max))
}

/// How a run's trained weights compare with the single-process reference trained for as many
/// steps on the union of the ranks' batches.
#[derive(Debug, Clone)]
pub struct ReferenceCheck {
    /// [`max_relative_error`] of the weights.
    pub weights_max_relative_error: f64,
    /// [`update_relative_error`] of the weights against the initial ones.
    pub update_relative_error: f64,
    /// The reference's loss per step.
    pub losses: Vec<f32>,
}

impl ReferenceCheck {
    /// Trains the reference for `steps` steps and compares `params` (each unit's trained weights)
    /// with it.
    pub fn of(mlp: &Mlp, params: &[Vec<f32>], steps: usize) -> Result<ReferenceCheck> {
        let spec = mlp.spec();
        let (reference, losses) = reference_training(spec, mlp.world(), steps);
        let initial: Vec<Vec<f32>> = (0..spec.units())
            .map(|u| spec.initial_params(u, spec.params(u)))
            .collect();
        Ok(ReferenceCheck {
            weights_max_relative_error: max_relative_error(params, &reference)?,
            update_relative_error: update_relative_error(params, &reference, &initial)?,
            losses,
        })
    }
}

fn same_units(a: &[Vec<f32>], b: &[Vec<f32>]) -> Result<()> {
    let lengths = |v: &[Vec<f32>]| v.iter().map(Vec::len).collect::<Vec<_>>();
    if lengths(a) == lengths(b) {
        Ok(())
    } else {
        Err(Error::Mismatch(format!(
            "parameters of {} units against {} (or units of other sizes)",
            a.len(),
            b.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MlpSpec {
        MlpSpec {
            name: "t".into(),
            input: 8,
            widths: vec![16, 12, 4],
            batch_per_rank: 5,
            seed: 3,
            learning_rate: 1e-2,
        }
    }

    /// Finite differences check the analytic gradient of a tiny network.
    #[test]
    fn backward_matches_finite_differences() {
        let s = spec();
        let rows = 5;
        let mut x = vec![0.0; rows * 8];
        let mut y = vec![0.0; rows * 4];
        s.batch(0, 0, rows, &s.teacher(), &mut x, &mut y);
        let mut params: Vec<Vec<f32>> = (0..3).map(|u| s.initial_params(u, s.params(u))).collect();
        let loss = |params: &[Vec<f32>]| -> f64 {
            let mut input = x.clone();
            for (u, p) in params.iter().enumerate() {
                let mut out = vec![0.0; rows * s.dims(u).1];
                linear_forward(&input, p, &mut out, rows, s.dims(u), s.activation(u));
                input = out;
            }
            input
                .iter()
                .zip(&y)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum()
        };
        // Analytic gradient of unit 1 (the middle one).
        let mut outs = vec![x.clone()];
        for u in 0..3 {
            let mut out = vec![0.0; rows * s.dims(u).1];
            linear_forward(
                &outs[u],
                &params[u],
                &mut out,
                rows,
                s.dims(u),
                s.activation(u),
            );
            outs.push(out);
        }
        let mut g = vec![0.0; rows * 4];
        mse_grad(&outs[3], &y, &mut g, 1.0);
        let mut gin = vec![0.0; rows * 12];
        let mut grads2 = vec![0.0; s.params(2)];
        linear_backward(
            &outs[2],
            &params[2],
            &outs[3],
            &mut g,
            &mut grads2,
            Some(&mut gin),
            rows,
            s.dims(2),
            Activation::Identity,
        );
        let mut grads1 = vec![0.0; s.params(1)];
        linear_backward(
            &outs[1],
            &params[1],
            &outs[2],
            &mut gin,
            &mut grads1,
            None,
            rows,
            s.dims(1),
            Activation::Relu,
        );
        for k in [0, 7, 50, s.params(1) - 1] {
            let h = 1e-2f32;
            params[1][k] += h;
            let up = loss(&params);
            params[1][k] -= 2.0 * h;
            let down = loss(&params);
            params[1][k] += h;
            let numeric = (up - down) / (2.0 * h as f64);
            assert!(
                (numeric - grads1[k] as f64).abs() < 2e-2 * numeric.abs().max(1e-2),
                "param {k}: numeric {numeric}, analytic {}",
                grads1[k]
            );
        }
    }

    #[test]
    fn reference_training_reduces_the_loss() {
        let (_, losses) = reference_training(
            &MlpSpec {
                learning_rate: 3e-3,
                ..spec()
            },
            2,
            60,
        );
        assert!(losses[59] < 0.5 * losses[0], "{losses:?}");
    }
}
