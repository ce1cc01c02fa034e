//! Causal multi-head attention written once for both backends, as matrix products and row
//! passes. Per sample, each product is batched over the heads and reads Q, K and V in place from
//! the fused QKV rows (row stride 3h; head j's part starts j·d columns in); a head's
//! probabilities are dense T × T. Forward: scores Q·Kᵀ into the probabilities, the causal
//! softmax of every row, then Y = P·V into the head columns of the output rows. Backward:
//! dP = dY·Vᵀ and dV = Pᵀ·dY, the softmax backward, then dQ = dS·K and dK = dSᵀ·Q; each of dQ, dK
//! and dV is written once. The CPU backend runs the products on the host (this module's
//! functions), the CUDA backend through cuBLAS (`gpt2::launches`), the same [`Product`]s.

use crate::gemm::{Gemm, Orientation, Strided};
use crate::gpt2::kernels::lane_sum;
use multiversion::multiversion;

/// Shapes of causal self-attention.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub hidden: usize,
    pub heads: usize,
}

/// A buffer attention reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// The fused QKV rows (rows × 3h): Q | K | V, heads contiguous within each.
    Qkv,
    /// The probabilities, [batch, heads, T, T].
    Probs,
    /// The output rows (rows × h), or their gradient in the backward.
    Rows,
    /// The probabilities' gradient (scratch of the backward).
    DProbs,
    /// The gradient of the QKV rows.
    DQkv,
}

/// One sample's product of attention: C ← op(A)·op(B), each operand an element offset into a
/// buffer.
#[derive(Debug, Clone, Copy)]
pub struct Product {
    pub product: Strided,
    pub operands: [(Buffer, usize); 3],
}

impl Product {
    /// Runs on the host; `a`, `b` and `c` are the buffers [`Product::operands`] names (checked).
    pub fn host(&self, a: (Buffer, &[f32]), b: (Buffer, &[f32]), c: (Buffer, &mut [f32])) {
        let [(ba, oa), (bb, ob), (bc, oc)] = self.operands;
        assert_eq!([a.0, b.0, c.0], [ba, bb, bc], "the buffers of {self:?}");
        self.product
            .host(1.0, &a.1[oa..], &b.1[ob..], 0.0, &mut c.1[oc..]);
    }
}

impl AttentionShape {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Elements of the probability tensor `[batch, heads, seq, seq]`.
    pub fn probs_len(&self) -> usize {
        self.batch * self.heads * self.seq * self.seq
    }

    /// 1/√d.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim() as f32).sqrt()
    }

    /// Where sample `b` starts in `buffer`.
    fn sample(&self, buffer: Buffer, b: usize) -> usize {
        let (t, c) = (self.seq, self.hidden);
        match buffer {
            Buffer::Qkv | Buffer::DQkv => b * t * 3 * c,
            Buffer::Probs | Buffer::DProbs => b * self.heads * t * t,
            Buffer::Rows => b * t * c,
        }
    }

    /// The product `gemm` of sample `b` batched over the heads, on `operands` (buffer and column
    /// offset within a row): probabilities are dense per head, rows step `d` elements per head.
    fn product(&self, b: usize, gemm: Gemm, operands: [(Buffer, usize); 3]) -> Product {
        let (t, d) = (self.seq, self.head_dim());
        let row_stride = operands.map(|(buffer, _)| match buffer {
            Buffer::Probs | Buffer::DProbs => t,
            Buffer::Qkv | Buffer::DQkv => 3 * self.hidden,
            Buffer::Rows => self.hidden,
        });
        let batch_stride = operands.map(|(buffer, _)| match buffer {
            Buffer::Probs | Buffer::DProbs => t * t,
            _ => d,
        });
        Product {
            product: gemm.batched(self.heads).strided(row_stride, batch_stride),
            operands: operands.map(|(buffer, column)| (buffer, self.sample(buffer, b) + column)),
        }
    }

    /// [T × T] = [T × d]·[T × d]ᵀ.
    fn scores(&self, b: usize, a: (Buffer, usize), bt: (Buffer, usize), c: Buffer) -> Product {
        let (t, d) = (self.seq, self.head_dim());
        self.product(b, Gemm::new(t, t, d).b_transposed(), [a, bt, (c, 0)])
    }

    /// [T × d] = op([T × T])·[T × d], the probabilities read as `probabilities` says.
    fn weighted(
        &self,
        b: usize,
        probabilities: Orientation,
        p: Buffer,
        v: (Buffer, usize),
        c: (Buffer, usize),
    ) -> Product {
        let (t, d) = (self.seq, self.head_dim());
        let gemm = Gemm::new(t, d, t);
        let gemm = match probabilities {
            Orientation::AsStored => gemm,
            Orientation::Transposed => gemm.a_transposed(),
        };
        self.product(b, gemm, [(p, 0), v, c])
    }

    /// Sample `b`'s scores Q·Kᵀ into the probabilities.
    pub fn forward_scores(&self, b: usize) -> Product {
        let c = self.hidden;
        self.scores(b, (Buffer::Qkv, 0), (Buffer::Qkv, c), Buffer::Probs)
    }

    /// Sample `b`'s Y = P·V into the output rows.
    pub fn forward_values(&self, b: usize) -> Product {
        let c = self.hidden;
        self.weighted(
            b,
            Orientation::AsStored,
            Buffer::Probs,
            (Buffer::Qkv, 2 * c),
            (Buffer::Rows, 0),
        )
    }

    /// Sample `b`'s dP = dY·Vᵀ and dV = Pᵀ·dY.
    pub fn backward_values(&self, b: usize) -> [Product; 2] {
        let c = self.hidden;
        [
            self.scores(b, (Buffer::Rows, 0), (Buffer::Qkv, 2 * c), Buffer::DProbs),
            self.weighted(
                b,
                Orientation::Transposed,
                Buffer::Probs,
                (Buffer::Rows, 0),
                (Buffer::DQkv, 2 * c),
            ),
        ]
    }

    /// Sample `b`'s dQ = dS·K and dK = dSᵀ·Q (dS in the probabilities' gradient).
    pub fn backward_queries_keys(&self, b: usize) -> [Product; 2] {
        let c = self.hidden;
        [
            self.weighted(
                b,
                Orientation::AsStored,
                Buffer::DProbs,
                (Buffer::Qkv, c),
                (Buffer::DQkv, 0),
            ),
            self.weighted(
                b,
                Orientation::Transposed,
                Buffer::DProbs,
                (Buffer::Qkv, 0),
                (Buffer::DQkv, c),
            ),
        ]
    }
}

/// In place on every score row (sample, head, t): softmax of `scale`·score over the positions
/// up to t, zero after it (the CUDA kernel `causal_softmax` does the same, row by row).
#[multiversion(targets = "simd")]
pub fn causal_softmax(scores: &mut [f32], scale: f32, seq: usize) {
    for (i, p) in scores.chunks_exact_mut(seq).enumerate() {
        let t = i % seq;
        let mut max = f32::NEG_INFINITY;
        for v in &mut p[..=t] {
            *v *= scale;
            max = max.max(*v);
        }
        p[..=t].iter_mut().for_each(|v| *v = (*v - max).exp());
        let sum = lane_sum(t + 1, |u| p[u]);
        p[..=t].iter_mut().for_each(|v| *v /= sum);
        p[t + 1..].iter_mut().for_each(|v| *v = 0.0);
    }
}

/// Backward of [`causal_softmax`] in place on d(probs): dS = p·(dp − Σ p·dp)·scale, zero after t.
#[multiversion(targets = "simd")]
pub fn causal_softmax_backward(probs: &[f32], dprobs: &mut [f32], scale: f32, seq: usize) {
    for (i, (p, dp)) in probs
        .chunks_exact(seq)
        .zip(dprobs.chunks_exact_mut(seq))
        .enumerate()
    {
        let t = i % seq;
        let inner = lane_sum(t + 1, |u| p[u] * dp[u]);
        for (d, &pv) in dp[..=t].iter_mut().zip(&p[..=t]) {
            *d = pv * (*d - inner) * scale;
        }
        dp[t + 1..].iter_mut().for_each(|v| *v = 0.0);
    }
}

/// Causal multi-head attention from the fused `qkv` (`rows × 3h`): `probs` (saved) and `y`
/// (`rows × h`, heads concatenated). `round` stores the scores and the probabilities as the
/// activations' format holds them ([`super::Shape::round`]), as each is a tensor of PyTorch's.
pub fn attention_forward(
    qkv: &[f32],
    probs: &mut [f32],
    y: &mut [f32],
    shape: AttentionShape,
    round: impl Fn(&mut [f32]),
) {
    for b in 0..shape.batch {
        shape.forward_scores(b).host(
            (Buffer::Qkv, qkv),
            (Buffer::Qkv, qkv),
            (Buffer::Probs, probs),
        );
    }
    round(probs);
    causal_softmax(&mut probs[..shape.probs_len()], shape.scale(), shape.seq);
    round(probs);
    for b in 0..shape.batch {
        shape.forward_values(b).host(
            (Buffer::Probs, probs),
            (Buffer::Qkv, qkv),
            (Buffer::Rows, y),
        );
    }
}

/// Backward of [`attention_forward`]: `dqkv` (written) from `dy`; `dprobs` is scratch of
/// [`AttentionShape::probs_len`] elements, rounded by `round` after each step that writes it.
pub fn attention_backward(
    dy: &[f32],
    qkv: &[f32],
    probs: &[f32],
    dprobs: &mut [f32],
    dqkv: &mut [f32],
    shape: AttentionShape,
    round: impl Fn(&mut [f32]),
) {
    for b in 0..shape.batch {
        let [dp, dv] = shape.backward_values(b);
        dp.host(
            (Buffer::Rows, dy),
            (Buffer::Qkv, qkv),
            (Buffer::DProbs, dprobs),
        );
        dv.host(
            (Buffer::Probs, probs),
            (Buffer::Rows, dy),
            (Buffer::DQkv, dqkv),
        );
    }
    let n = shape.probs_len();
    round(dprobs);
    causal_softmax_backward(&probs[..n], &mut dprobs[..n], shape.scale(), shape.seq);
    round(dprobs);
    for b in 0..shape.batch {
        let [dq, dk] = shape.backward_queries_keys(b);
        dq.host(
            (Buffer::DProbs, dprobs),
            (Buffer::Qkv, qkv),
            (Buffer::DQkv, dqkv),
        );
        dk.host(
            (Buffer::DProbs, dprobs),
            (Buffer::Qkv, qkv),
            (Buffer::DQkv, dqkv),
        );
    }
}
