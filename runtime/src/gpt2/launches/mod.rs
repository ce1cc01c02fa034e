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
use crate::backend::{FloatFormat, Operand, Region};
use crate::gemm::{Gemm, Strided};
use crate::workload::{carve, carve_parts};
use std::ops::Range;

/// Partial sums of the loss (f64, one thread each, rows strided over them); then one thread adds
/// them in order. With no more rows than partials each row is its own partial and the loss is
/// summed in the CPU's order.
pub const NLL_PARTIALS: usize = 8192;

/// One argument of a kernel, in the order of its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// The device address of an arena region (`float*` or `bf16*`, as its format).
    Floats(Region),
    /// The backend's links between rows of one token ([`token_links_len`] floats, `float*`).
    TokenLinks,
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

/// The floats of the token links the embedding's backward needs for `rows` rows: the next row of
/// each row's token, and whether each row is its token's first.
pub fn token_links_len(rows: usize) -> usize {
    2 * rows
}

/// One piece of device work on the compute stream (AdamW's on the communication stream).
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    Kernel(Kernel),
    /// C ← op(A)·op(B) + beta·C for every product of the batch, computed in f32 from the
    /// operands' formats (A's and B's one format), C stored in its own; each operand spans the
    /// product's [`Strided::extents`] from its start.
    Product {
        product: Strided,
        operands: [Operand; 3],
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
            Launch::Product { operands, .. } => operands.iter().map(|o| o.region).collect(),
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

/// A product on whole regions.
fn product(product: Strided, a: Region, b: Region, c: Region, beta: f32) -> Launch {
    Launch::Product {
        product,
        operands: [a, b, c].map(Operand::whole),
        beta,
    }
}

/// Under bf16 parameters, `regions` stored in fp32 (parameter gradients reduced in fp32, the
/// logits) rounded to bf16's precision, as the CPU backend rounds them ([`Shape::round`]).
fn round_fp32(shape: &Shape, regions: &[Region]) -> Vec<Launch> {
    let rounds = shape.activations() == FloatFormat::Bf16;
    regions
        .iter()
        .filter(|r| rounds && r.format == FloatFormat::Fp32)
        .map(|&r| kernel("round_values", r.len, vec![Arg::Floats(r), int(r.len)]))
        .collect()
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
        product(gemm, x, w, out, 1.0),
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
        product(input_grad.dense(), dout, w, dx, 0.0),
        product(weight_grad.dense(), x, dout, dw, 1.0),
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

/// [`super::Gpt2Kernels::embedding_backward`]: both gradients added to (wte's holds the head's).
pub fn embedding_backward(
    shape: &Shape,
    tokens: Region,
    grad_out: Region,
    grads: Region,
) -> Vec<Launch> {
    let [dwte, dwpe] = carve(grads, shape.embedding_params());
    let (rows, h, seq) = (shape.rows(), shape.hidden, shape.seq);
    let mut launches = vec![
        kernel(
            "token_links",
            rows,
            vec![Arg::Floats(tokens), Arg::TokenLinks, int(rows)],
        ),
        kernel(
            "embedding_backward_tokens",
            rows * h,
            vec![
                Arg::Floats(tokens),
                Arg::TokenLinks,
                Arg::Floats(grad_out),
                Arg::Floats(dwte),
                int(rows),
                int(h),
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
    ];
    launches.extend(round_fp32(shape, &[grads]));
    launches
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
        product(Gemm::linear(rows, c, v).dense(), lnf, wte, probs, 0.0),
    ]
    .into_iter()
    .chain(round_fp32(shape, &[probs]))
    .chain([
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
    ])
    .collect()
}

/// [`super::Gpt2Kernels::head_backward`]. Under bf16 the logits' gradient is stored as bf16 in
/// the workspace (rounded on the way), which the products read; in fp32 they read it in place.
pub fn head_backward(shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Vec<Launch> {
    let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
    let w = carve(head.params, [c])[0];
    let [dw, db] = carve(out.grads, [c, c]);
    let [lnf, mean, rstd, probs] = carve_parts(head.internals, shape.head_internals());
    let [dlnf, stored_dlogits] = carve_parts(out.workspace, shape.head_workspace());
    let [input_grad, weight_grad] = Gemm::linear(rows, c, v).backward();
    let mut l = vec![kernel(
        "cross_entropy_backward",
        rows * v,
        vec![
            Arg::Floats(probs),
            Arg::Floats(head.targets),
            int(rows),
            int(v),
            Arg::Float(scale),
        ],
    )];
    let dlogits = match shape.activations() {
        FloatFormat::Fp32 => probs,
        FloatFormat::Bf16 => {
            l.push(kernel(
                "store_values",
                probs.len,
                vec![
                    Arg::Floats(probs),
                    Arg::Floats(stored_dlogits),
                    int(probs.len),
                ],
            ));
            stored_dlogits
        }
    };
    l.extend([
        product(input_grad.dense(), dlogits, head.wte, dlnf, 0.0),
        product(weight_grad.dense(), dlogits, lnf, out.wte_grad, 1.0),
        fill(out.grad_in, 0.0),
    ]);
    l.extend(round_fp32(shape, &[out.wte_grad]));
    l.extend(layernorm_backward_add(
        dlnf,
        head.x,
        w,
        [mean, rstd],
        out.grad_in,
        [dw, db],
        shape,
    ));
    l.extend(round_fp32(shape, &[out.grads]));
    l
}

/// [`super::Gpt2Kernels::adamw`]: one launch per run of elements that decay alike, on the whole
/// regions from the run's first element (a bf16 gradient's run may start inside a word).
pub fn adamw(adam: &AdamRegions, step: u32, hp: &AdamW, decayed: &[Range<usize>]) -> Vec<Launch> {
    let AdamRegions {
        params,
        grads,
        m,
        v,
    } = *adam;
    decay_runs(decayed, params.len)
        .into_iter()
        .map(|(range, decay)| {
            let s = hp.at_step(step, decay);
            let mut args: Vec<Arg> = [params, grads, m, v].map(Arg::Floats).into();
            args.extend([int(range.start), int(range.len())]);
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
