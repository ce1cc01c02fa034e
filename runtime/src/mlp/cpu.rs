//! [`MlpKernels`] on the CPU backend: the host functions of [`super`] on arena regions, each
//! borrowed to read or to write for the call (the arena refuses a borrow that overlaps another
//! operation's).

use super::{self as k, Activation, MlpKernels};
use crate::Result;
use crate::backend::{Collectives, CpuBackend, HostMemory, Region};

impl<C: Collectives> MlpKernels for CpuBackend<C> {
    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        dims: (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        k::linear_forward(
            &self.read(x)?,
            &self.read(params)?,
            &mut self.write(out)?,
            rows,
            dims,
            activation,
        );
        Ok(())
    }
    fn linear_backward(
        &self,
        x: Region,
        params: Region,
        output: Region,
        grad_out: Region,
        grads: Region,
        grad_in: Option<Region>,
        rows: usize,
        dims: (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        let mut grad_in = grad_in.map(|r| self.write(r)).transpose()?;
        k::linear_backward(
            &self.read(x)?,
            &self.read(params)?,
            &self.read(output)?,
            &mut self.write(grad_out)?,
            &mut self.write(grads)?,
            grad_in.as_deref_mut(),
            rows,
            dims,
            activation,
        );
        Ok(())
    }
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        let loss = k::mse_grad(
            &self.read(z)?,
            &self.read(y)?,
            &mut self.write(grad)?,
            scale,
        );
        self.record_loss(step, loss)
    }
    fn adam(
        &self,
        params: Region,
        grads: Region,
        m: Region,
        v: Region,
        step: u32,
        lr: f32,
    ) -> Result<()> {
        adam_on(self, [params, grads, m, v], step, lr)
    }
}

/// The Adam step on regions of host memory (parameters, gradients, m, v): the CPU backend's, and
/// the CUDA backend's host step of an offloaded unit on its pinned host arena (DESIGN §6.12).
pub(crate) fn adam_on(
    memory: &impl HostMemory,
    [params, grads, m, v]: [Region; 4],
    step: u32,
    lr: f32,
) -> Result<()> {
    k::adam(
        &mut memory.write(params)?,
        &memory.read(grads)?,
        &mut memory.write(m)?,
        &mut memory.write(v)?,
        step,
        lr,
    );
    Ok(())
}
