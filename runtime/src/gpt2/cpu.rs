//! [`Gpt2Kernels`] on the CPU backend: each unit's forward and backward composed from
//! [`super::kernels`] on arena regions, each borrowed to read or to write for the call (the
//! arena refuses a borrow that overlaps another operation's).
//!
//! Under the bf16 policy (DESIGN §6.9) the kernels compute in f32 on widened copies; every
//! tensor PyTorch stores in bf16 is rounded where it is written ([`Shape::round`], a no-op in
//! fp32): an activation, activation gradient or parameter gradient a later kernel of the same
//! call reads, a linear layer's output before its residual is added, attention's scores and
//! probabilities — so the CUDA kernels, which store each value once, agree bit for bit; what a
//! call leaves in a bf16 region is rounded when its borrow ends.

use super::attention::{attention_backward, attention_forward};
use super::kernels::{self as k, AdamW};
use super::{AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape};
use crate::Result;
use crate::backend::{Backend, Collectives, CpuBackend, HostMemory, Region, each};
use crate::workload::{carve, carve_parts};
use std::ops::Range;

fn block_params(shape: &Shape, params: Region) -> [Region; 12] {
    carve(params, shape.block_params())
}

impl<C: Collectives> Gpt2Kernels for CpuBackend<C> {
    fn embedding_forward(
        &self,
        shape: &Shape,
        params: Region,
        tokens: Region,
        out: Region,
    ) -> Result<()> {
        let [wte, wpe] = carve(params, shape.embedding_params());
        k::embedding_forward(
            &self.read(tokens)?,
            &self.read(wte)?,
            &self.read(wpe)?,
            &mut self.write(out)?,
            shape.seq,
            shape.hidden,
        );
        Ok(())
    }

    fn embedding_backward(
        &self,
        shape: &Shape,
        tokens: Region,
        grad_out: Region,
        grads: Region,
    ) -> Result<()> {
        let [wte, wpe] = carve(grads, shape.embedding_params());
        let (mut dwte, mut dwpe) = (self.write(wte)?, self.write(wpe)?);
        let (t, g) = (self.read(tokens)?, self.read(grad_out)?);
        k::embedding_backward(&t, &g, &mut dwte, &mut dwpe, shape.seq, shape.hidden);
        shape.round(&mut dwte);
        shape.round(&mut dwpe);
        Ok(())
    }

    fn block_forward(
        &self,
        shape: &Shape,
        params: Region,
        x: Region,
        out: Region,
        internals: Region,
    ) -> Result<()> {
        let (rows, c, f) = (shape.rows(), shape.hidden, shape.ffn);
        let weights = each(block_params(shape, params), |r| self.read(r))?;
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
        ] = weights.each_ref().map(|w| &**w);
        let mut saved = each(carve_parts(internals, shape.block_internals()), |r| {
            self.write(r)
        })?;
        let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
            saved.each_mut().map(|s| &mut **s);
        let (x, mut out) = (self.read(x)?, self.write(out)?);
        let (x, out) = (&*x, &mut *out);
        let round = |values: &mut [f32]| shape.round(values);
        k::layernorm_forward(x, ln1w, ln1b, ln1, m1, r1, rows, c);
        round(ln1);
        k::matmul_forward(ln1, wqkv, Some(bqkv), qkv, rows, c, 3 * c);
        round(qkv);
        attention_forward(qkv, probs, atty, shape.attention(), round);
        round(atty);
        k::matmul_forward(atty, wproj, Some(bproj), res1, rows, c, c);
        round(res1);
        res1.iter_mut().zip(x).for_each(|(r, v)| *r += v);
        round(res1);
        k::layernorm_forward(res1, ln2w, ln2b, ln2, m2, r2, rows, c);
        round(ln2);
        k::matmul_forward(ln2, wfc, Some(bfc), fch, rows, c, f);
        round(fch);
        k::gelu_forward(fch, gelu);
        round(gelu);
        k::matmul_forward(gelu, wfp, Some(bfp), out, rows, f, c);
        round(out);
        out.iter_mut().zip(&*res1).for_each(|(o, r)| *o += r);
        Ok(())
    }

    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()> {
        let (rows, c, f) = (shape.rows(), shape.hidden, shape.ffn);
        let weights = each(block_params(shape, regions.params), |r| self.read(r))?;
        let [ln1w, _, wqkv, _, wproj, _, ln2w, _, wfc, _, wfp, _] =
            weights.each_ref().map(|w| &**w);
        let mut grad_parts = each(block_params(shape, regions.grads), |r| self.write(r))?;
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
        ] = grad_parts.each_mut().map(|g| &mut **g);
        let saved = each(
            carve_parts(regions.internals, shape.block_internals()),
            |r| self.read(r),
        )?;
        let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
            saved.each_ref().map(|s| &**s);
        let mut scratch = each(
            carve_parts(regions.workspace, shape.block_workspace()),
            |r| self.write(r),
        )?;
        let [d_ff, d_h, d_res1, d_qkv, d_probs] = scratch.each_mut().map(|s| &mut **s);
        let (x, dres2) = (self.read(regions.x)?, self.read(regions.grad_out)?);
        let mut dx = self.write(regions.grad_in)?;
        let (x, dres2, dx) = (&*x, &*dres2, &mut *dx);
        let round = |values: &mut [f32]| shape.round(values);
        // MLP: out = res1 + gelu(ln2·Wfc + bfc)·Wfp + bfp.
        k::matmul_backward(dres2, gelu, wfp, Some(d_ff), dwfp, Some(dbfp), rows, f, c);
        round(d_ff);
        k::gelu_backward_inplace(fch, d_ff);
        round(d_ff);
        k::matmul_backward(d_ff, ln2, wfc, Some(d_h), dwfc, Some(dbfc), rows, c, f);
        round(d_h);
        d_res1.copy_from_slice(dres2);
        k::layernorm_backward_add(d_h, res1, ln2w, m2, r2, d_res1, dln2w, dln2b, rows, c);
        round(d_res1);
        // Attention: res1 = x + attention(ln1(x))·Wproj + bproj.
        k::matmul_backward(
            d_res1,
            atty,
            wproj,
            Some(d_h),
            dwproj,
            Some(dbproj),
            rows,
            c,
            c,
        );
        round(d_h);
        attention_backward(d_h, qkv, probs, d_probs, d_qkv, shape.attention(), round);
        round(d_qkv);
        k::matmul_backward(
            d_qkv,
            ln1,
            wqkv,
            Some(d_h),
            dwqkv,
            Some(dbqkv),
            rows,
            c,
            3 * c,
        );
        round(d_h);
        dx.copy_from_slice(d_res1);
        k::layernorm_backward_add(d_h, x, ln1w, m1, r1, dx, dln1w, dln1b, rows, c);
        // The parameters' gradients as PyTorch's bf16 parameters receive them.
        grad_parts.iter_mut().for_each(|g| round(g));
        Ok(())
    }

    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()> {
        let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
        let [w, b] = each(carve(head.params, [c, c]), |r| self.read(r))?;
        let mut saved = each(carve_parts(head.internals, shape.head_internals()), |r| {
            self.write(r)
        })?;
        let [lnf, mean, rstd, probs] = saved.each_mut().map(|s| &mut **s);
        k::layernorm_forward(&self.read(head.x)?, &w, &b, lnf, mean, rstd, rows, c);
        shape.round(lnf);
        k::tied_logits(lnf, &self.read(head.wte)?, probs, rows, c, v);
        // The logits as a bf16 tensor holds them; the loss widens them (fp32 probabilities).
        shape.round(probs);
        let loss = k::cross_entropy_forward(probs, &self.read(head.targets)?, v, scale);
        self.record_loss(step, loss)
    }

    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()> {
        let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
        let w = self.read(carve(head.params, [c])[0])?;
        let [mut dw, mut db] = each(carve(out.grads, [c, c]), |r| self.write(r))?;
        let [lnf, mean, rstd, mut probs] =
            each(carve_parts(head.internals, shape.head_internals()), |r| {
                self.write(r)
            })?;
        k::cross_entropy_backward_inplace(&mut probs, &self.read(head.targets)?, v, scale);
        // Under bf16 the logits' gradient is stored as a bf16 tensor, the products' operand on
        // both backends; in fp32 it is `probs` itself.
        let [dlnf, stored_dlogits] = carve_parts(out.workspace, shape.head_workspace());
        let stored;
        let dlogits: &[f32] = if stored_dlogits.len > 0 {
            self.upload(stored_dlogits, &probs)?;
            stored = self.read(stored_dlogits)?;
            &stored
        } else {
            &probs
        };
        let (mut dlnf, mut dwte) = (self.write(dlnf)?, self.write(out.wte_grad)?);
        let wte = self.read(head.wte)?;
        k::tied_logits_backward(dlogits, &lnf, &wte, &mut dlnf, &mut dwte, rows, c, v);
        shape.round(&mut dlnf);
        shape.round(&mut dwte);
        let mut dx = self.write(out.grad_in)?;
        dx.fill(0.0);
        let x = self.read(head.x)?;
        k::layernorm_backward_add(
            &dlnf, &x, &w, &mean, &rstd, &mut dx, &mut dw, &mut db, rows, c,
        );
        shape.round(&mut dw);
        shape.round(&mut db);
        Ok(())
    }

    fn adamw(
        &self,
        _shape: &Shape,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        adamw_on(self, adam, step, hp, decayed)
    }
}

/// The AdamW step on regions of host memory: the CPU backend's, and the CUDA backend's host step
/// of an offloaded unit on its pinned host arena (DESIGN §6.12).
pub(crate) fn adamw_on(
    memory: &impl HostMemory,
    adam: &AdamRegions,
    step: u32,
    hp: &AdamW,
    decayed: &[Range<usize>],
) -> Result<()> {
    let (mut p, g, mut m, mut v) = (
        memory.write(adam.params)?,
        memory.read(adam.grads)?,
        memory.write(adam.m)?,
        memory.write(adam.v)?,
    );
    for (range, decay) in k::decay_runs(decayed, adam.params.len) {
        k::adamw(
            &mut p[range.clone()],
            &g[range.clone()],
            &mut m[range.clone()],
            &mut v[range],
            step,
            hp,
            decay,
        );
    }
    Ok(())
}
