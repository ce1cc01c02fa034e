//! GPT-2's units as device work: each [`super::Gpt2Kernels`] operation written once as a list of
//! [`Launch`]es — kernels of [`crate::gpt2::cuda_source::SOURCE`] and strided matrix products —
//! on arena regions, in the order and on the operands the CPU backend uses (`gpt2/cpu.rs`). The
//! CUDA backend runs them through NVRTC and cuBLAS; a test runs them on the host with the kernel
//! source compiled as C++ and the products on `matrixmultiply`, against the CPU backend
//! (runtime/tests/cuda_gpt2_kernels.rs). Building a list needs no GPU.

mod block;

pub use block::{block_backward, block_forward};

use super::kernels::{AdamW, LANES, ROW_LANES, decay_runs};
use super::{AdamRegions, Head, HeadGrads, Shape};
use crate::backend::Region;
use crate::gemm::{Gemm, Strided};
use crate::workload::{carve, carve_parts};
use std::ops::Range;

/// Partial sums of the loss (f64, one thread each, rows strided over them); then one thread adds
/// them in order. With no more rows than partials each row is its own partial and the loss is
/// summed in the CPU's order.
pub const NLL_PARTIALS: usize = 8192;

/// Slices of the vocabulary in the token-embedding backward: thread (slice, column) adds the rows
/// whose token is that slice modulo this, so no two threads write one element.
pub const TOKEN_SLICES: usize = 64;

/// One argument of a kernel, in the order of its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// The device address of an arena region (`float*`).
    Floats(Region),
    /// The backend's [`NLL_PARTIALS`] loss partials (`double*`).
    LossPartials,
    /// The loss slot of a step (`float*`).
    LossSlot(usize),
    Int(i64),
    Float(f32),
}

/// One kernel launch: `threads` threads (the grid is [`crate::cuda::module::per_element`]'s).
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub name: &'static str,
    pub threads: usize,
    pub args: Vec<Arg>,
}

/// One piece of device work on the compute stream (AdamW's on the communication stream).
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    Kernel(Kernel),
    /// C ← op(A)·op(B) + beta·C for every product of the batch; A, B and C start at these
    /// element offsets of the arena and span the product's [`Strided::extents`].
    Product {
        product: Strided,
        operands: [usize; 3],
        beta: f32,
    },
}

impl Launch {
    /// The regions a launch reads or writes, for bounds checks.
    pub fn regions(&self) -> Vec<Region> {
        match self {
            Launch::Kernel(k) => k
                .args
                .iter()
                .filter_map(|a| match a {
                    Arg::Floats(r) => Some(*r),
                    _ => None,
                })
                .collect(),
            Launch::Product {
                product, operands, ..
            } => operands
                .iter()
                .zip(product.extents())
                .map(|(&offset, len)| Region::f32(offset, len))
                .collect(),
        }
    }
}

fn int(v: usize) -> Arg {
    Arg::Int(v as i64)
}

fn kernel(name: &'static str, threads: usize, args: Vec<Arg>) -> Launch {
    Launch::Kernel(Kernel {
        name,
        threads,
        args,
    })
}

/// The threads of a column kernel over `columns`: a block of [`LANES`] threads per
/// `LANES / ROW_LANES` columns.
fn column_blocks(columns: usize) -> usize {
    columns.div_ceil(LANES / ROW_LANES) * LANES
}

fn fill(x: Region, value: f32) -> Launch {
    kernel(
        "fill_values",
        x.len,
        vec![Arg::Floats(x), Arg::Float(value), int(x.len)],
    )
}

fn copy(src: Region, dst: Region) -> Launch {
    kernel(
        "copy_values",
        dst.len,
        vec![Arg::Floats(src), Arg::Floats(dst), int(dst.len)],
    )
}

fn add(src: Region, dst: Region) -> Launch {
    kernel(
        "add_values",
        dst.len,
        vec![Arg::Floats(src), Arg::Floats(dst), int(dst.len)],
    )
}

fn product(product: Strided, a: usize, b: usize, c: usize, beta: f32) -> Launch {
    Launch::Product {
        product,
        operands: [a, b, c],
        beta,
    }
}

fn layernorm_forward(x: Region, params: [Region; 2], saved: [Region; 3], shape: &Shape) -> Launch {
    let (rows, width) = (shape.rows(), shape.hidden);
    let [weight, bias] = params;
    let [out, mean, rstd] = saved;
    let args = [x, weight, bias, out, mean, rstd].map(Arg::Floats);
    let mut args = args.to_vec();
    args.extend([int(rows), int(width)]);
    kernel("layernorm_forward", rows * LANES, args)
}

/// `dx += …`, `dweight += …`, `dbias += …` ([`super::kernels::layernorm_backward_add`]).
fn layernorm_backward_add(
    dout: Region,
    x: Region,
    weight: Region,
    [mean, rstd]: [Region; 2],
    dx: Region,
    [dweight, dbias]: [Region; 2],
    shape: &Shape,
) -> [Launch; 2] {
    let (rows, width) = (shape.rows(), shape.hidden);
    let sizes = [int(rows), int(width)];
    let mut input: Vec<Arg> = [dout, x, weight, mean, rstd, dx].map(Arg::Floats).into();
    input.extend(sizes);
    let mut params: Vec<Arg> = [dout, x, mean, rstd, dweight, dbias]
        .map(Arg::Floats)
        .into();
    params.extend(sizes);
    [
        kernel("layernorm_backward_input", rows * LANES, input),
        kernel("layernorm_backward_params", column_blocks(width), params),
    ]
}

/// `out = x·W + b` (`W`: din × dout, as transformers' `Conv1D` stores it).
fn linear_forward(
    x: Region,
    w: Region,
    b: Region,
    out: Region,
    din: usize,
    dout: usize,
    rows: usize,
) -> [Launch; 2] {
    let gemm = Gemm::new(rows, dout, din).dense();
    [
        kernel(
            "bias_rows",
            rows * dout,
            vec![Arg::Floats(out), Arg::Floats(b), int(rows), int(dout)],
        ),
        product(gemm, x.offset, w.offset, out.offset, 1.0),
    ]
}

/// Backward of [`linear_forward`]: `dx = dout·Wᵀ` (written), `dW += xᵀ·dout`, `db += Σ dout`.
#[allow(clippy::too_many_arguments)]
fn linear_backward(
    dout: Region,
    x: Region,
    w: Region,
    dx: Region,
    dw: Region,
    db: Region,
    (din, n): (usize, usize),
    rows: usize,
) -> [Launch; 3] {
    let [input_grad, weight_grad] = Gemm::new(rows, n, din).backward();
    [
        product(input_grad.dense(), dout.offset, w.offset, dx.offset, 0.0),
        product(weight_grad.dense(), x.offset, dout.offset, dw.offset, 1.0),
        kernel(
            "column_sums_add",
            column_blocks(n),
            vec![Arg::Floats(dout), Arg::Floats(db), int(rows), int(n)],
        ),
    ]
}

/// [`super::Gpt2Kernels::embedding_forward`].
pub fn embedding_forward(
    shape: &Shape,
    params: Region,
    tokens: Region,
    out: Region,
) -> Vec<Launch> {
    let [wte, wpe] = carve(params, shape.embedding_params());
    let (rows, h) = (shape.rows(), shape.hidden);
    let mut args: Vec<Arg> = [tokens, wte, wpe, out].map(Arg::Floats).into();
    args.extend([int(rows), int(shape.seq), int(h)]);
    vec![kernel("embedding_forward", rows * h, args)]
}

/// [`super::Gpt2Kernels::embedding_backward`]: wte's gradient added to, wpe's written.
pub fn embedding_backward(
    shape: &Shape,
    tokens: Region,
    grad_out: Region,
    grads: Region,
) -> Vec<Launch> {
    let [dwte, dwpe] = carve(grads, shape.embedding_params());
    let (rows, h, seq) = (shape.rows(), shape.hidden, shape.seq);
    let slices = TOKEN_SLICES.min(shape.vocab);
    vec![
        kernel(
            "embedding_backward_tokens",
            slices * h,
            vec![
                Arg::Floats(tokens),
                Arg::Floats(grad_out),
                Arg::Floats(dwte),
                int(rows),
                int(h),
                int(slices),
            ],
        ),
        kernel(
            "embedding_backward_positions",
            seq * h,
            vec![
                Arg::Floats(grad_out),
                Arg::Floats(dwpe),
                int(rows),
                int(seq),
                int(h),
            ],
        ),
    ]
}

/// [`super::Gpt2Kernels::head_forward`]: ln_f, the tied logits, their softmax and the loss of
/// step `step`.
pub fn head_forward(shape: &Shape, head: &Head, scale: f32, step: usize) -> Vec<Launch> {
    let Head {
        params,
        wte,
        x,
        targets,
        internals,
    } = *head;
    let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
    let [w, b] = carve(params, [c, c]);
    let [lnf, mean, rstd, probs] = carve_parts(internals, shape.head_internals());
    let parts = NLL_PARTIALS.min(rows);
    vec![
        layernorm_forward(x, [w, b], [lnf, mean, rstd], shape),
        product(
            Gemm::linear(rows, c, v).dense(),
            lnf.offset,
            wte.offset,
            probs.offset,
            0.0,
        ),
        kernel(
            "softmax_rows",
            rows * LANES,
            vec![Arg::Floats(probs), int(rows), int(v)],
        ),
        kernel(
            "nll_partials",
            parts,
            vec![
                Arg::Floats(probs),
                Arg::Floats(targets),
                int(rows),
                int(v),
                int(parts),
                Arg::LossPartials,
            ],
        ),
        kernel(
            "sum_loss",
            1,
            vec![
                Arg::LossPartials,
                int(parts),
                Arg::Float(scale),
                Arg::LossSlot(step),
            ],
        ),
    ]
}

/// [`super::Gpt2Kernels::head_backward`].
pub fn head_backward(shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Vec<Launch> {
    let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
    let w = carve(head.params, [c])[0];
    let [dw, db] = carve(out.grads, [c, c]);
    let [lnf, mean, rstd, probs] = carve_parts(head.internals, shape.head_internals());
    let [input_grad, weight_grad] = Gemm::linear(rows, c, v).backward();
    let mut l = vec![
        kernel(
            "cross_entropy_backward",
            rows * v,
            vec![
                Arg::Floats(probs),
                Arg::Floats(head.targets),
                int(rows),
                int(v),
                Arg::Float(scale),
            ],
        ),
        product(
            input_grad.dense(),
            probs.offset,
            head.wte.offset,
            out.workspace.offset,
            0.0,
        ),
        product(
            weight_grad.dense(),
            probs.offset,
            lnf.offset,
            out.wte_grad.offset,
            1.0,
        ),
        fill(out.grad_in, 0.0),
    ];
    l.extend(layernorm_backward_add(
        out.workspace,
        head.x,
        w,
        [mean, rstd],
        out.grad_in,
        [dw, db],
        shape,
    ));
    l
}

/// [`super::Gpt2Kernels::adamw`]: one launch per run of elements that decay alike.
pub fn adamw(adam: &AdamRegions, step: u32, hp: &AdamW, decayed: &[Range<usize>]) -> Vec<Launch> {
    let AdamRegions {
        params,
        grads,
        m,
        v,
    } = *adam;
    let sub = |r: Region, range: &Range<usize>| r.sub(range.start, range.len());
    decay_runs(decayed, params.len)
        .into_iter()
        .map(|(range, decay)| {
            let s = hp.at_step(step, decay);
            let mut args: Vec<Arg> = [params, grads, m, v]
                .map(|r| Arg::Floats(sub(r, &range)))
                .into();
            args.push(int(range.len()));
            args.extend(
                [
                    s.shrink,
                    hp.beta2,
                    hp.eps,
                    s.one_minus_beta1,
                    s.one_minus_beta2,
                    s.step_size,
                    s.bias_correction2_sqrt,
                ]
                .map(Arg::Float),
            );
            kernel("adamw", range.len(), args)
        })
        .collect()
}
