//! A workload's compute on a backend: [`Train`] runs a unit's forward, backward and optimizer step
//! on the regions of a [`Layout`]. Each model implements it once over its own kernel trait
//! (`mlp::MlpKernels`, `gpt2::Gpt2Kernels`), which each backend's side of the model implements
//! (`mlp::cpu`, `mlp::cuda`, `gpt2::cpu`, `gpt2::cuda`).

use crate::Result;
use crate::backend::Backend;
use crate::layout::Layout;
use crate::workload::{Pass, Workload};

/// A workload's compute on a backend. `layout` holds every unit's regions; the methods read and
/// write only the regions of `unit` (and, for a borrowing unit, the lender's parameters and
/// gradient).
pub trait Train<B: Backend>: Workload {
    /// Loads the workload's kernels on `backend` (once, before the first timed step).
    fn load_kernels(&self, backend: &B) -> Result<()>;
    /// F_i for data step `step` (or its recomputation into the `recomputed` buffer).
    fn forward(
        &self,
        backend: &B,
        layout: &Layout,
        unit: usize,
        step: usize,
        pass: Pass,
    ) -> Result<()>;
    /// B_i: the full gradient of the unit's parameters and, past the first unit, of its input.
    fn backward(&self, backend: &B, layout: &Layout, unit: usize, step: usize) -> Result<()>;
    /// The optimizer step of the unit's persistent parameters (its shard, when sharded) after its
    /// last reduction; `step` counts from 1.
    fn optimize(&self, backend: &B, layout: &Layout, unit: usize, step: u32) -> Result<()>;
}

/// The optimizer step of `unit` ([`Train::optimize`], which updates [`UnitLayout::trained`]);
/// under the bf16 policy, its fp32 master then rounded into the bf16 parameters that the next
/// gathers and compute read (DESIGN §6.9).
///
/// [`UnitLayout::trained`]: crate::layout::UnitLayout::trained
pub fn optimize_unit<B: Backend, W: Train<B> + ?Sized>(
    workload: &W,
    backend: &B,
    layout: &Layout,
    unit: usize,
    step: u32,
) -> Result<()> {
    workload.optimize(backend, layout, unit, step)?;
    let u = &layout.units[unit];
    match u.master {
        Some(master) => backend.copy(master, u.params),
        None => Ok(()),
    }
}
