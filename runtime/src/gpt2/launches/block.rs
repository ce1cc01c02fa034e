//! A block's launches: its attention (products batched over the heads, read in place from the
//! fused QKV rows) and the layers around it.

use super::{Arg, Shape};
use super::{
    Launch, add, copy, fill, int, kernel, layernorm_backward_add, layernorm_forward,
    linear_backward, linear_forward, product,
};
use crate::backend::Region;
use crate::gemm::{Gemm, Strided};
use crate::workload::carve;

/// head (T × T), the head outputs in place in rows of h.
struct Attention {
    seq: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
}

impl Attention {
    fn of(shape: &Shape) -> Self {
        Attention {
            seq: shape.seq,
            hidden: shape.hidden,
            heads: shape.heads,
            head_dim: shape.hidden / shape.heads,
        }
    }

    /// op(A)·op(B) batched over the heads: a head's probabilities are dense [T × T], every other
    /// operand is rows of the given stride, a head's part `d` elements after the previous one's.
    fn product(&self, gemm: Gemm, operands: [Operand; 3]) -> Strided {
        let (t, d) = (self.seq, self.head_dim);
        let row_stride = operands.map(|o| match o {
            Operand::Probabilities => t,
            Operand::Rows(stride) => stride,
        });
        let batch_stride = operands.map(|o| match o {
            Operand::Probabilities => t * t,
            Operand::Rows(_) => d,
        });
        gemm.batched(self.heads).strided(row_stride, batch_stride)
    }

    /// Rows of QKV (3h) and of an attention output or its gradient (h).
    fn rows(&self) -> (Operand, Operand) {
        (Operand::Rows(3 * self.hidden), Operand::Rows(self.hidden))
    }

    /// [T × T] = [T × d]·[T × d]ᵀ.
    fn scores(&self, a: Operand, b: Operand) -> Strided {
        let (t, d) = (self.seq, self.head_dim);
        self.product(
            Gemm::new(t, t, d).b_transposed(),
            [a, b, Operand::Probabilities],
        )
    }

    /// [T × d] = op([T × T])·[T × d]: the probabilities (transposed when `transposed`) times `b`.
    fn weighted(&self, transposed: bool, b: Operand, c: Operand) -> Strided {
        let (t, d) = (self.seq, self.head_dim);
        let gemm = Gemm::new(t, d, t);
        let gemm = if transposed {
            gemm.a_transposed()
        } else {
            gemm
        };
        self.product(gemm, [Operand::Probabilities, b, c])
    }
}

/// An operand of an attention product.
#[derive(Debug, Clone, Copy)]
enum Operand {
    /// A head's probabilities (or their gradient): [T × T], dense.
    Probabilities,
    /// Rows of this stride.
    Rows(usize),
}

/// [`crate::gpt2::kernels::attention_forward`]: per sample, scores = Q·Kᵀ (into `probs`), the causal
/// softmax over all rows, then y = P·V.
fn attention_forward(qkv: Region, probs: Region, y: Region, shape: &Shape) -> Vec<Launch> {
    let a = Attention::of(shape);
    let (q_rows, y_rows) = a.rows();
    let (t, c, h) = (a.seq, a.hidden, a.heads);
    let sample = |b: usize| (qkv.offset + b * t * 3 * c, probs.offset + b * h * t * t);
    let mut launches: Vec<Launch> = (0..shape.batch)
        .map(|b| {
            let (qkv_at, probs_at) = sample(b);
            product(a.scores(q_rows, q_rows), qkv_at, qkv_at + c, probs_at, 0.0)
        })
        .collect();
    let scale = 1.0 / (a.head_dim as f32).sqrt();
    let rows = shape.batch * h * t;
    launches.push(kernel(
        "causal_softmax",
        rows,
        vec![Arg::Floats(probs), Arg::Float(scale), int(rows), int(t)],
    ));
    launches.extend((0..shape.batch).map(|b| {
        let (qkv_at, probs_at) = sample(b);
        let y_at = y.offset + b * t * c;
        product(
            a.weighted(false, q_rows, y_rows),
            probs_at,
            qkv_at + 2 * c,
            y_at,
            0.0,
        )
    }));
    launches
}

/// [`crate::gpt2::kernels::attention_backward`]: per sample dP = dY·Vᵀ and dV = Pᵀ·dY, the softmax
/// backward over all rows, then dQ = dS·K and dK = dSᵀ·Q (each of dQ, dK, dV written once).
fn attention_backward(
    dy: Region,
    qkv: Region,
    probs: Region,
    dprobs: Region,
    dqkv: Region,
    shape: &Shape,
) -> Vec<Launch> {
    let a = Attention::of(shape);
    let (q_rows, y_rows) = a.rows();
    let (t, c, h) = (a.seq, a.hidden, a.heads);
    let at = |b: usize| {
        (
            qkv.offset + b * t * 3 * c,
            dqkv.offset + b * t * 3 * c,
            probs.offset + b * h * t * t,
            dprobs.offset + b * h * t * t,
            dy.offset + b * t * c,
        )
    };
    let mut launches = Vec::new();
    for b in 0..shape.batch {
        let (qkv_at, dqkv_at, p_at, dp_at, dy_at) = at(b);
        launches.push(product(
            a.scores(y_rows, q_rows),
            dy_at,
            qkv_at + 2 * c,
            dp_at,
            0.0,
        ));
        launches.push(product(
            a.weighted(true, y_rows, q_rows),
            p_at,
            dy_at,
            dqkv_at + 2 * c,
            0.0,
        ));
    }
    let scale = 1.0 / (a.head_dim as f32).sqrt();
    let rows = shape.batch * h * t;
    launches.push(kernel(
        "causal_softmax_backward",
        rows,
        vec![
            Arg::Floats(probs),
            Arg::Floats(dprobs),
            Arg::Float(scale),
            int(rows),
            int(t),
        ],
    ));
    for b in 0..shape.batch {
        let (qkv_at, dqkv_at, _, dp_at, _) = at(b);
        launches.push(product(
            a.weighted(false, q_rows, q_rows),
            dp_at,
            qkv_at + c,
            dqkv_at,
            0.0,
        ));
        launches.push(product(
            a.weighted(true, q_rows, q_rows),
            dp_at,
            qkv_at,
            dqkv_at + c,
            0.0,
        ));
    }
    launches
}

/// [`crate::gpt2::Gpt2Kernels::block_forward`].
pub fn block_forward(
    shape: &Shape,
    params: Region,
    x: Region,
    out: Region,
    internals: Region,
) -> Vec<Launch> {
    let (rows, c, f) = (shape.rows(), shape.hidden, shape.ffn);
    let [
        ln1w,
        ln1b,
        wqkv,
        bqkv,
        wproj,
        bproj,
        ln2w,
        ln2b,
        wfc,
        bfc,
        wfp,
        bfp,
    ] = carve(params, shape.block_params());
    let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
        carve(internals, shape.block_internals());
    let mut l = vec![layernorm_forward(x, [ln1w, ln1b], [ln1, m1, r1], shape)];
    l.extend(linear_forward(ln1, wqkv, bqkv, qkv, c, 3 * c, rows));
    l.extend(attention_forward(qkv, probs, atty, shape));
    l.extend(linear_forward(atty, wproj, bproj, res1, c, c, rows));
    l.push(add(x, res1));
    l.push(layernorm_forward(res1, [ln2w, ln2b], [ln2, m2, r2], shape));
    l.extend(linear_forward(ln2, wfc, bfc, fch, c, f, rows));
    l.push(kernel(
        "gelu_forward",
        rows * f,
        vec![Arg::Floats(fch), Arg::Floats(gelu), int(rows * f)],
    ));
    l.extend(linear_forward(gelu, wfp, bfp, out, f, c, rows));
    l.push(add(res1, out));
    l
}

/// [`crate::gpt2::Gpt2Kernels::block_backward`].
#[allow(clippy::too_many_arguments)]
pub fn block_backward(
    shape: &Shape,
    params: Region,
    x: Region,
    internals: Region,
    grad_out: Region,
    grads: Region,
    grad_in: Region,
    workspace: Region,
) -> Vec<Launch> {
    let (rows, c, f) = (shape.rows(), shape.hidden, shape.ffn);
    let [ln1w, _, wqkv, _, wproj, _, ln2w, _, wfc, _, wfp, _] = carve(params, shape.block_params());
    let [
        dln1w,
        dln1b,
        dwqkv,
        dbqkv,
        dwproj,
        dbproj,
        dln2w,
        dln2b,
        dwfc,
        dbfc,
        dwfp,
        dbfp,
    ] = carve(grads, shape.block_params());
    let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
        carve(internals, shape.block_internals());
    let [d_ff, d_h, d_res1, d_qkv, d_probs] = carve(workspace, shape.block_workspace());
    let mut l = vec![fill(grads, 0.0)];
    // MLP: out = res1 + gelu(ln2·Wfc + bfc)·Wfp + bfp.
    l.extend(linear_backward(
        grad_out,
        gelu,
        wfp,
        d_ff,
        dwfp,
        dbfp,
        (f, c),
        rows,
    ));
    l.push(kernel(
        "gelu_backward",
        rows * f,
        vec![Arg::Floats(fch), Arg::Floats(d_ff), int(rows * f)],
    ));
    l.extend(linear_backward(
        d_ff,
        ln2,
        wfc,
        d_h,
        dwfc,
        dbfc,
        (c, f),
        rows,
    ));
    l.push(copy(grad_out, d_res1));
    l.extend(layernorm_backward_add(
        d_h,
        res1,
        ln2w,
        [m2, r2],
        d_res1,
        [dln2w, dln2b],
        shape,
    ));
    // Attention: res1 = x + attention(ln1(x))·Wproj + bproj.
    l.extend(linear_backward(
        d_res1,
        atty,
        wproj,
        d_h,
        dwproj,
        dbproj,
        (c, c),
        rows,
    ));
    l.extend(attention_backward(d_h, qkv, probs, d_probs, d_qkv, shape));
    l.extend(linear_backward(
        d_qkv,
        ln1,
        wqkv,
        d_h,
        dwqkv,
        dbqkv,
        (c, 3 * c),
        rows,
    ));
    l.push(copy(d_res1, grad_in));
    l.extend(layernorm_backward_add(
        d_h,
        x,
        ln1w,
        [m1, r1],
        grad_in,
        [dln1w, dln1b],
        shape,
    ));
    l
}
