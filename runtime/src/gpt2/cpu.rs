//! [`Gpt2Kernels`] on the CPU backend: each unit's forward and backward composed from
//! [`super::kernels`] on arena slices (the executor never runs two operations on overlapping
//! regions at once).

use super::kernels::{self as k, AdamW};
use super::{Gpt2Kernels, Shape};
use crate::Result;
use crate::backend::{Collectives, CpuBackend, Region};
use crate::workload::carve;
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
        let s = |r| &*self.slice(r);
        k::embedding_forward(
            s(tokens),
            s(wte),
            s(wpe),
            self.slice(out),
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
        let dwpe = self.slice(wpe);
        dwpe.fill(0.0);
        let (t, g) = (&*self.slice(tokens), &*self.slice(grad_out));
        k::embedding_backward(t, g, self.slice(wte), dwpe, shape.seq, shape.hidden);
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
        ] = block_params(shape, params).map(|r| &*self.slice(r));
        let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
            carve(internals, shape.block_internals()).map(|r| self.slice(r));
        let (x, out) = (&*self.slice(x), self.slice(out));
        k::layernorm_forward(x, ln1w, ln1b, ln1, m1, r1, rows, c);
        k::matmul_forward(ln1, wqkv, Some(bqkv), qkv, rows, c, 3 * c);
        k::attention_forward(qkv, probs, atty, shape.attention());
        k::matmul_forward(atty, wproj, Some(bproj), res1, rows, c, c);
        res1.iter_mut().zip(x).for_each(|(r, v)| *r += v);
        k::layernorm_forward(res1, ln2w, ln2b, ln2, m2, r2, rows, c);
        k::matmul_forward(ln2, wfc, Some(bfc), fch, rows, c, f);
        k::gelu_forward(fch, gelu);
        k::matmul_forward(gelu, wfp, Some(bfp), out, rows, f, c);
        out.iter_mut().zip(&*res1).for_each(|(o, r)| *o += r);
        Ok(())
    }

    fn block_backward(
        &self,
        shape: &Shape,
        params: Region,
        x: Region,
        internals: Region,
        grad_out: Region,
        grads: Region,
        grad_in: Region,
        workspace: Region,
    ) -> Result<()> {
        let (rows, c, f) = (shape.rows(), shape.hidden, shape.ffn);
        let [ln1w, _, wqkv, _, wproj, _, ln2w, _, wfc, _, wfp, _] =
            block_params(shape, params).map(|r| &*self.slice(r));
        self.slice(grads).fill(0.0);
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
        ] = block_params(shape, grads).map(|r| self.slice(r));
        let [ln1, m1, r1, qkv, probs, atty, res1, ln2, m2, r2, fch, gelu] =
            carve(internals, shape.block_internals()).map(|r| &*self.slice(r));
        let [d_ff, d_h, d_res1, d_qkv, d_probs] =
            carve(workspace, shape.block_workspace()).map(|r| self.slice(r));
        let (x, dres2, dx) = (&*self.slice(x), &*self.slice(grad_out), self.slice(grad_in));
        // MLP: out = res1 + gelu(ln2·Wfc + bfc)·Wfp + bfp.
        k::matmul_backward(dres2, gelu, wfp, Some(d_ff), dwfp, Some(dbfp), rows, f, c);
        k::gelu_backward_inplace(fch, d_ff);
        k::matmul_backward(d_ff, ln2, wfc, Some(d_h), dwfc, Some(dbfc), rows, c, f);
        d_res1.copy_from_slice(dres2);
        k::layernorm_backward_add(d_h, res1, ln2w, m2, r2, d_res1, dln2w, dln2b, rows, c);
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
        k::attention_backward(d_h, qkv, probs, d_probs, d_qkv, shape.attention());
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
        dx.copy_from_slice(d_res1);
        k::layernorm_backward_add(d_h, x, ln1w, m1, r1, dx, dln1w, dln1b, rows, c);
        Ok(())
    }

    fn head_forward(
        &self,
        shape: &Shape,
        params: Region,
        wte: Region,
        x: Region,
        targets: Region,
        internals: Region,
        scale: f32,
        step: usize,
    ) -> Result<()> {
        let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
        let [w, b] = carve(params, [c, c]).map(|r| &*self.slice(r));
        let [lnf, mean, rstd, probs] =
            carve(internals, shape.head_internals()).map(|r| self.slice(r));
        k::layernorm_forward(self.slice(x), w, b, lnf, mean, rstd, rows, c);
        k::tied_logits(lnf, self.slice(wte), probs, rows, c, v);
        let loss = k::cross_entropy_forward(probs, self.slice(targets), v, scale);
        self.record_loss(step, loss)
    }

    fn head_backward(
        &self,
        shape: &Shape,
        params: Region,
        wte: Region,
        x: Region,
        targets: Region,
        internals: Region,
        grads: Region,
        wte_grad: Region,
        grad_in: Region,
        workspace: Region,
        scale: f32,
    ) -> Result<()> {
        let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
        let w = &*self.slice(carve(params, [c])[0]);
        self.slice(grads).fill(0.0);
        let [dw, db] = carve(grads, [c, c]).map(|r| self.slice(r));
        let [lnf, mean, rstd, probs] =
            carve(internals, shape.head_internals()).map(|r| self.slice(r));
        k::cross_entropy_backward_inplace(probs, self.slice(targets), v, scale);
        let (dlnf, dwte) = (self.slice(workspace), self.slice(wte_grad));
        dwte.fill(0.0);
        k::tied_logits_backward(probs, lnf, self.slice(wte), dlnf, dwte, rows, c, v);
        let dx = self.slice(grad_in);
        dx.fill(0.0);
        k::layernorm_backward_add(dlnf, self.slice(x), w, mean, rstd, dx, dw, db, rows, c);
        Ok(())
    }

    fn adamw(
        &self,
        params: Region,
        grads: Region,
        m: Region,
        v: Region,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        let (p, g, m, v) = (
            self.slice(params),
            &*self.slice(grads),
            self.slice(m),
            self.slice(v),
        );
        let mut at = 0;
        let mut run = |range: Range<usize>, decay: bool| {
            k::adamw(
                &mut p[range.clone()],
                &g[range.clone()],
                &mut m[range.clone()],
                &mut v[range],
                step,
                hp,
                decay,
            );
        };
        for r in decayed {
            run(at..r.start, false);
            run(r.clone(), true);
            at = r.end;
        }
        run(at..params.len, false);
        Ok(())
    }
}
