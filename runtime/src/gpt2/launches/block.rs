//! A block's launches: its attention ([`crate::gpt2::attention`]'s products and the softmax
//! kernels) and the layers around it.

use super::{Arg, Shape};
use super::{
    Launch, add, copy, int, kernel, layernorm_backward_add, layernorm_forward, linear_backward,
    linear_forward, round_fp32,
};
use crate::backend::{Operand, Region};
use crate::gpt2::BlockBackward;
use crate::gpt2::attention::{Buffer, Product as AttentionProduct};
use crate::gpt2::kernels::LANES;
use crate::workload::{carve, carve_parts};

/// An attention product of [`crate::gpt2::attention`] on the regions of its buffers.
fn attention_product(p: AttentionProduct, region: impl Fn(Buffer) -> Region) -> Launch {
    Launch::Product {
        product: p.product,
        operands: p.operands.map(|(buffer, at)| Operand {
            region: region(buffer),
            at,
        }),
        beta: 0.0,
    }
}

/// [`crate::gpt2::attention::attention_forward`]'s products and softmax.
fn attention_forward(qkv: Region, probs: Region, y: Region, shape: &Shape) -> Vec<Launch> {
    let a = shape.attention();
    let region = |buffer| match buffer {
        Buffer::Qkv => qkv,
        Buffer::Probs => probs,
        _ => y,
    };
    let mut launches: Vec<Launch> = (0..a.batch)
        .map(|b| attention_product(a.forward_scores(b), region))
        .collect();
    let rows = a.batch * a.heads * a.seq;
    launches.push(kernel(
        "causal_softmax",
        rows * LANES,
        vec![
            Arg::Floats(probs),
            Arg::Float(a.scale()),
            int(rows),
            int(a.seq),
        ],
    ));
    launches.extend((0..a.batch).map(|b| attention_product(a.forward_values(b), region)));
    launches
}

/// [`crate::gpt2::attention::attention_backward`]'s products and softmax backward.
fn attention_backward(
    dy: Region,
    qkv: Region,
    probs: Region,
    dprobs: Region,
    dqkv: Region,
    shape: &Shape,
) -> Vec<Launch> {
    let a = shape.attention();
    let region = |buffer| match buffer {
        Buffer::Qkv => qkv,
        Buffer::Probs => probs,
        Buffer::Rows => dy,
        Buffer::DProbs => dprobs,
        Buffer::DQkv => dqkv,
    };
    let mut launches: Vec<Launch> = (0..a.batch)
        .flat_map(|b| a.backward_values(b))
        .map(|p| attention_product(p, region))
        .collect();
    let rows = a.batch * a.heads * a.seq;
    launches.push(kernel(
        "causal_softmax_backward",
        rows * LANES,
        vec![
            Arg::Floats(probs),
            Arg::Floats(dprobs),
            Arg::Float(a.scale()),
            int(rows),
            int(a.seq),
        ],
    ));
    launches.extend(
        (0..a.batch)
            .flat_map(|b| a.backward_queries_keys(b))
            .map(|p| attention_product(p, region)),
    );
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
        carve_parts(internals, shape.block_internals());
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
pub fn block_backward(shape: &Shape, regions: &BlockBackward) -> Vec<Launch> {
    let BlockBackward {
        params,
        x,
        internals,
        grad_out,
        grads,
        grad_in,
        workspace,
    } = *regions;
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
        carve_parts(internals, shape.block_internals());
    let [d_ff, d_h, d_res1, d_qkv, d_probs] = carve_parts(workspace, shape.block_workspace());
    let mut l = Vec::new();
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
    l.extend(round_fp32(shape, &[grads]));
    l
}
