//! GPT-2's CPU kernels in fp32, each the forward or backward of one operation as Hugging Face's
//! `GPT2LMHeadModel` computes it (checked against transformers by `python/tests/test_gpt2.py`).
//!
//! Activations are row-major `[rows, width]` with rows = batch × seq (token-major within a
//! sequence). Linear weights are stored as transformers' `Conv1D` stores them: `in × out`, so a
//! layer is `y = x·W + b`. Backward kernels *accumulate* into parameter gradients (the executor
//! prepares them, DESIGN §6.10) and *write* input gradients unless the name says `add`.

use crate::gemm::Gemm;
use multiversion::multiversion;
use std::ops::Range;

/// LayerNorm's ε (GPT-2's `layer_norm_epsilon`).
pub const LN_EPS: f32 = 1e-5;

/// Threads per block of the CUDA row kernels (`gpt2::cuda_source`): one block per row.
pub const LANES: usize = 256;

/// Row lanes of a CUDA column kernel (`column_sums_add`, `layernorm_backward_params`): each of a
/// block's 32 columns is summed by this many threads.
pub const ROW_LANES: usize = 8;

/// Sums over rows per column as a CUDA column kernel adds them: row lane q holds the sum of rows
/// q, q + ROW_LANES, … in order from 0; [`RowLanes::add_to`] then adds the lanes' sums to the
/// output in lane order.
pub struct RowLanes {
    width: usize,
    sums: Vec<f32>,
}

impl RowLanes {
    pub fn new(width: usize) -> Self {
        RowLanes {
            width,
            sums: vec![0.0; ROW_LANES * width],
        }
    }

    /// The lane row `r` adds into: one value per column.
    #[inline]
    pub fn of_row(&mut self, r: usize) -> &mut [f32] {
        let q = r % ROW_LANES;
        &mut self.sums[q * self.width..(q + 1) * self.width]
    }

    /// `out[k] += lane 0's sum, then lane 1's, …` for every column k.
    pub fn add_to(&self, out: &mut [f32]) {
        for lane in self.sums.chunks_exact(self.width) {
            out[..self.width]
                .iter_mut()
                .zip(lane)
                .for_each(|(o, s)| *o += s);
        }
    }
}

/// Σ f(k) over k < n as a CUDA row kernel's block sums it, so that both backends round alike:
/// lane l adds f(l), f(l + LANES), … in order from 0, then the lanes' sums are added in lane
/// order from 0 (`block_sum` in `gpt2::cuda_source::SOURCE`). A row no longer than the lanes is
/// that order summed directly: each lane holds its one value (or 0, past n), and adding 0 to a
/// sum begun at +0 leaves it unchanged (the sum is never −0 in round-to-nearest).
#[inline]
pub fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    if n <= LANES {
        return (0..n).fold(0.0, |total, k| total + f(k));
    }
    let mut lanes = [0.0f32; LANES];
    for start in (0..n).step_by(LANES) {
        for (l, lane) in lanes.iter_mut().enumerate().take(n - start) {
            *lane += f(start + l);
        }
    }
    lanes.iter().fold(0.0, |total, lane| total + lane)
}

/// `out = x·W + b` for `x: rows×din`, `W: din×dout`, `b: dout`.
pub fn matmul_forward(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    rows: usize,
    din: usize,
    dout: usize,
) {
    let beta = match b {
        Some(b) => {
            for r in out[..rows * dout].chunks_exact_mut(dout) {
                r.copy_from_slice(&b[..dout]);
            }
            1.0
        }
        None => 0.0,
    };
    Gemm::new(rows, dout, din).host(1.0, x, w, beta, out);
}

/// Backward of [`matmul_forward`]: `dx = dout·Wᵀ` (written), `dW += xᵀ·dout`, `db += Σ_rows dout`.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets = "simd")]
pub fn matmul_backward(
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    dx: Option<&mut [f32]>,
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    rows: usize,
    din: usize,
    dout_width: usize,
) {
    let n = dout_width;
    let [input_grad, weight_grad] = Gemm::new(rows, n, din).backward();
    if let Some(dx) = dx {
        input_grad.host(1.0, dout, w, 0.0, dx);
    }
    weight_grad.host(1.0, x, dout, 1.0, dw);
    if let Some(db) = db {
        let mut lanes = RowLanes::new(n);
        for (r, row) in dout[..rows * n].chunks_exact(n).enumerate() {
            lanes
                .of_row(r)
                .iter_mut()
                .zip(row)
                .for_each(|(g, d)| *g += d);
        }
        lanes.add_to(db);
    }
}

/// LayerNorm over the last dimension; saves each row's mean and 1/σ for the backward.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets = "simd")]
pub fn layernorm_forward(
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    rows: usize,
    width: usize,
) {
    for r in 0..rows {
        let row = &x[r * width..(r + 1) * width];
        let m = lane_sum(width, |k| row[k]) / width as f32;
        let var = lane_sum(width, |k| (row[k] - m) * (row[k] - m)) / width as f32;
        let s = 1.0 / (var + LN_EPS).sqrt();
        let o = &mut out[r * width..(r + 1) * width];
        for k in 0..width {
            o[k] = (row[k] - m) * s * weight[k] + bias[k];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

/// Backward of [`layernorm_forward`]: `dx += …` (added: the residual stream's gradient is
/// already there), `dweight += Σ dout·x̂`, `dbias += Σ dout`.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets = "simd")]
pub fn layernorm_backward_add(
    dout: &[f32],
    x: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    rows: usize,
    width: usize,
) {
    let (mut weight_lanes, mut bias_lanes) = (RowLanes::new(width), RowLanes::new(width));
    for r in 0..rows {
        let (m, s) = (mean[r], rstd[r]);
        let row = &x[r * width..(r + 1) * width];
        let g = &dout[r * width..(r + 1) * width];
        let mean_dn = lane_sum(width, |k| g[k] * weight[k]) / width as f32;
        let mean_dn_xhat =
            lane_sum(width, |k| g[k] * weight[k] * ((row[k] - m) * s)) / width as f32;
        let d = &mut dx[r * width..(r + 1) * width];
        let (bias_lane, weight_lane) = (bias_lanes.of_row(r), weight_lanes.of_row(r));
        for k in 0..width {
            let xhat = (row[k] - m) * s;
            bias_lane[k] += g[k];
            weight_lane[k] += g[k] * xhat;
            d[k] += s * (g[k] * weight[k] - mean_dn - xhat * mean_dn_xhat);
        }
    }
    weight_lanes.add_to(dweight);
    bias_lanes.add_to(dbias);
}

const GELU_SCALE: f32 = 0.797_884_6; // √(2/π)

/// 1.5·2²³: adding it to an f32 of magnitude below 2²² rounds that value to an integer (to
/// nearest, ties to even), and the sum's bits, less this constant's, are that integer.
const ROUNDING: f32 = 12_582_912.0;

/// e^x in f32 without a library call, so that loops over it vectorize and the CUDA kernels
/// compute the same bits (`exp_poly` in `gpt2::cuda_source::SOURCE`: the same operations on the
/// same constants): x clamped to [−87, 88] (NaN stays NaN), n = ⌊x·log₂e + ½⌋, r = x − n·ln 2
/// with ln 2 in two parts (Cody–Waite), e^r by Cephes' `expf` polynomial, times 2ⁿ made from its
/// exponent bits. The floor is rounding by [`ROUNDING`] and a step down where that rounded up:
/// only float adds, compares and bit casts, which vectorize on every x86-64 (a conversion to an
/// integer saturates in Rust, per lane; `floor` is a library call without SSE4.1). It is the
/// same integer as the CUDA source's truncation and correction, so the bits agree.
#[inline]
pub fn exp_poly(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let m = x * std::f32::consts::LOG2_E + 0.5;
    let nearest = (m + ROUNDING) - ROUNDING;
    let n = if nearest > m { nearest - 1.0 } else { nearest };
    let k = ((n + ROUNDING).to_bits() as i32).wrapping_sub(ROUNDING.to_bits() as i32);
    e_reduced(x - n * 0.693_359_4 - n * -2.121_944_4e-4)
        * f32::from_bits((k.wrapping_add(127) << 23) as u32)
}

/// e^r for |r| ≤ ½·ln 2 (r = x − n·ln 2): Cephes' `expf` polynomial.
#[inline]
fn e_reduced(r: f32) -> f32 {
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_66;
    p = p * r + 0.5;
    p * (r * r) + r + 1.0
}

/// tanh u = 1 − 2/(e^{2u} + 1) through [`exp_poly`]: within 2.4e-7 of tanh u (absolute, tested),
/// which is what GELU's 1 + tanh needs.
#[inline]
pub fn tanh_poly(u: f32) -> f32 {
    1.0 - 2.0 / (exp_poly(2.0 * u) + 1.0)
}

/// GELU, tanh approximation (transformers' `gelu_new`).
#[multiversion(targets = "simd")]
pub fn gelu_forward(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        let cube = 0.044_715 * v * v * v;
        *o = 0.5 * v * (1.0 + tanh_poly(GELU_SCALE * (v + cube)));
    }
}

/// Backward of [`gelu_forward`] given its input: `dx = dout · gelu'(x)` (in place on `d`).
#[multiversion(targets = "simd")]
pub fn gelu_backward_inplace(x: &[f32], d: &mut [f32]) {
    for (g, &v) in d.iter_mut().zip(x) {
        let cube = 0.044_715 * v * v * v;
        let t = tanh_poly(GELU_SCALE * (v + cube));
        let sech2 = 1.0 - t * t;
        let local =
            0.5 * (1.0 + t) + 0.5 * v * sech2 * GELU_SCALE * (1.0 + 3.0 * 0.044_715 * v * v);
        *g *= local;
    }
}

/// `out[r] = wte[token[r]] + wpe[r mod seq]`.
#[multiversion(targets = "simd")]
pub fn embedding_forward(
    tokens: &[f32],
    wte: &[f32],
    wpe: &[f32],
    out: &mut [f32],
    seq: usize,
    hidden: usize,
) {
    for (r, &tok) in tokens.iter().enumerate() {
        let (tok, pos) = (tok as usize, r % seq);
        let o = &mut out[r * hidden..(r + 1) * hidden];
        let (e, p) = (
            &wte[tok * hidden..][..hidden],
            &wpe[pos * hidden..][..hidden],
        );
        for k in 0..hidden {
            o[k] = e[k] + p[k];
        }
    }
}

/// Backward of [`embedding_forward`]: `dwte[token] += dout`, `dwpe[pos] += dout`.
#[multiversion(targets = "simd")]
pub fn embedding_backward(
    tokens: &[f32],
    dout: &[f32],
    dwte: &mut [f32],
    dwpe: &mut [f32],
    seq: usize,
    hidden: usize,
) {
    for (r, &tok) in tokens.iter().enumerate() {
        let (tok, pos) = (tok as usize, r % seq);
        let g = &dout[r * hidden..(r + 1) * hidden];
        dwte[tok * hidden..][..hidden]
            .iter_mut()
            .zip(g)
            .for_each(|(d, v)| *d += v);
        dwpe[pos * hidden..][..hidden]
            .iter_mut()
            .zip(g)
            .for_each(|(d, v)| *d += v);
    }
}

/// Softmax cross-entropy of `logits` (rows × vocab, replaced by the probabilities) against
/// `targets`; returns Σ_rows −log p[target] · `scale`.
pub fn cross_entropy_forward(logits: &mut [f32], targets: &[f32], vocab: usize, scale: f32) -> f32 {
    let mut loss = 0.0f64;
    for (row, &target) in logits.chunks_exact_mut(vocab).zip(targets) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        row.iter_mut().for_each(|v| *v = (*v - max).exp());
        let sum = lane_sum(vocab, |k| row[k]);
        row.iter_mut().for_each(|v| *v /= sum);
        loss -= f64::from(row[target as usize].ln());
    }
    (loss * f64::from(scale)) as f32
}

/// Backward of [`cross_entropy_forward`] in place: `probs ← (probs − onehot(target))·scale`.
#[multiversion(targets = "simd")]
pub fn cross_entropy_backward_inplace(
    probs: &mut [f32],
    targets: &[f32],
    vocab: usize,
    scale: f32,
) {
    for (row, &target) in probs.chunks_exact_mut(vocab).zip(targets) {
        row[target as usize] -= 1.0;
        row.iter_mut().for_each(|v| *v *= scale);
    }
}

/// `logits = x·wteᵀ` (rows × vocab) for the tied output projection (`wte`: vocab × hidden).
pub fn tied_logits(
    x: &[f32],
    wte: &[f32],
    logits: &mut [f32],
    rows: usize,
    hidden: usize,
    vocab: usize,
) {
    Gemm::linear(rows, hidden, vocab).host(1.0, x, wte, 0.0, logits);
}

/// Backward of [`tied_logits`]: `dx = dlogits·wte` (written), `dwte += dlogitsᵀ·x`.
#[allow(clippy::too_many_arguments)]
pub fn tied_logits_backward(
    dlogits: &[f32],
    x: &[f32],
    wte: &[f32],
    dx: &mut [f32],
    dwte: &mut [f32],
    rows: usize,
    hidden: usize,
    vocab: usize,
) {
    let [input_grad, weight_grad] = Gemm::linear(rows, hidden, vocab).backward();
    input_grad.host(1.0, dlogits, wte, 0.0, dx);
    weight_grad.host(1.0, dlogits, x, 1.0, dwte);
}

/// `torch.optim.AdamW`'s hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub learning_rate: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

/// The per-step scalars of an AdamW step, computed on the host once for every element (and
/// passed as they are to the CUDA kernel, so both backends round alike).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// `1 − lr·wd` for decayed elements, 1 for the others.
    pub shrink: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bias_correction2_sqrt: f32,
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
}

/// Whether an AdamW step decays a run of elements: `Apply` (the former `decay: bool`'s `true`)
/// shrinks them by `1 − lr·wd` first, `Skip` (`false`) leaves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decay {
    Apply,
    Skip,
}

impl AdamW {
    /// The scalars of step `step` (≥ 1), with or without weight decay.
    pub fn at_step(&self, step: u32, decay: Decay) -> AdamWStep {
        let bc1 = 1.0 - self.beta1.powi(step as i32);
        AdamWStep {
            shrink: match decay {
                Decay::Apply => 1.0 - self.learning_rate * self.weight_decay,
                Decay::Skip => 1.0,
            },
            step_size: self.learning_rate / bc1,
            bias_correction2_sqrt: (1.0 - self.beta2.powi(step as i32)).sqrt(),
            one_minus_beta1: 1.0 - self.beta1,
            one_minus_beta2: 1.0 - self.beta2,
        }
    }
}

/// `0..len` cut into runs that decay alike: the `decayed` ranges (sorted, disjoint, within
/// `len`) and the gaps between them, in order, empty runs left out.
pub fn decay_runs(decayed: &[Range<usize>], len: usize) -> Vec<(Range<usize>, Decay)> {
    let mut runs = Vec::with_capacity(2 * decayed.len() + 1);
    let mut at = 0;
    for r in decayed {
        runs.push((at..r.start, Decay::Skip));
        runs.push((r.clone(), Decay::Apply));
        at = r.end;
    }
    runs.push((at..len, Decay::Skip));
    runs.retain(|(r, _)| !r.is_empty());
    runs
}

/// One AdamW step (`step` ≥ 1) as `torch.optim.AdamW` (single-tensor path) computes it:
/// `p ← p·(1 − lr·wd)` where `decay` applies, then the Adam update with bias corrections.
#[multiversion(targets = "simd")]
pub fn adamw(
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    step: u32,
    hp: &AdamW,
    decay: Decay,
) {
    let s = hp.at_step(step, decay);
    for k in 0..params.len() {
        let g = grads[k];
        params[k] *= s.shrink;
        m[k] += (g - m[k]) * s.one_minus_beta1;
        v[k] = v[k] * hp.beta2 + s.one_minus_beta2 * g * g;
        let denom = v[k].sqrt() / s.bias_correction2_sqrt + hp.eps;
        params[k] -= s.step_size * m[k] / denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `lane_sum` is its definition — LANES lanes, each from +0, then added in lane order —
        /// bitwise, for rows shorter and longer than the lanes and values that include ±0.
        #[test]
        fn lane_sum_is_the_blocks_order(
            values in prop::collection::vec(
                prop_oneof![Just(0.0f32), Just(-0.0f32), -1e6f32..1e6f32],
                0..700,
            )
        ) {
            let mut lanes = [0.0f32; LANES];
            for (k, v) in values.iter().enumerate() {
                lanes[k % LANES] += v;
            }
            let mut defined = 0.0f32;
            for lane in lanes {
                defined += lane;
            }
            let summed = lane_sum(values.len(), |k| values[k]);
            prop_assert_eq!(summed.to_bits(), defined.to_bits());
        }
    }

    /// The floor by rounding is `f32::floor` (the library's) at every input whose x·log₂e + ½
    /// lies at or next to an integer, where a wrong step would show, and on a grid over the
    /// clamped range and beyond; NaN stays NaN.
    #[test]
    fn the_floor_by_rounding_is_the_library_floor() {
        let reference = |x: f32| {
            let x = x.clamp(-87.0, 88.0);
            let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
            e_reduced(x - n * 0.693_359_4 - n * -2.121_944_4e-4) * 2f32.powi(n as i32)
        };
        let edges = (-127..=128).flat_map(|k: i32| {
            let x = (k as f32 - 0.5) / std::f32::consts::LOG2_E;
            let bits = x.to_bits();
            [bits - 2, bits - 1, bits, bits + 1, bits + 2].map(f32::from_bits)
        });
        let grid = (0..=2_000_000).map(|k| -100.0 + k as f32 * 1e-4);
        for x in edges
            .chain(grid)
            .chain([0.0, -0.0, 88.0, -87.0, 1e30, -1e30])
        {
            assert_eq!(exp_poly(x).to_bits(), reference(x).to_bits(), "x = {x:e}");
        }
        assert!(exp_poly(f32::NAN).is_nan());
    }

    /// e^x within 3·2⁻²⁴ relative over the clamped range, exactly 1 at 0, finite and positive at
    /// both clamps; tanh within 2.4e-7 absolute over [−10, 10] and exactly ±1 far out.
    #[test]
    fn polynomial_exp_and_tanh_are_accurate() {
        let mut worst = 0.0f64;
        for k in 0..=175_000 {
            let x = (-87.0 + k as f32 * 0.001).min(88.0);
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(exp_poly(x)) - exact).abs() / exact);
        }
        assert!(
            worst <= 3.0 * f64::from(f32::EPSILON) / 2.0,
            "exp: {worst:e}"
        );
        assert_eq!(exp_poly(0.0), 1.0);
        assert_eq!(exp_poly(1000.0), exp_poly(88.0));
        assert!(exp_poly(88.0).is_finite() && exp_poly(-1000.0) > 0.0);
        let mut worst = 0.0f64;
        for k in 0..=200_000 {
            let u = -10.0 + k as f32 * 1e-4;
            worst = worst.max((f64::from(tanh_poly(u)) - f64::from(u).tanh()).abs());
        }
        assert!(worst <= 2.4e-7, "tanh: {worst:e}");
        assert_eq!(tanh_poly(50.0), 1.0);
        assert_eq!(tanh_poly(-50.0), -1.0);
    }
}
