//! The MLP as a [`Workload`]: unit i saves its output (ReLU's mask is read from it), the first unit
//! also the input batch, the last the targets; the last unit's backward workspace is the loss
//! gradient. Nothing is recomputable (internals are empty), and the optimizer is Adam.

use super::loader::{Batch, Loader};
use super::{Activation, MlpSpec};
use crate::Result;
use crate::backend::{Backend, Region};
use crate::layout::Layout;
use crate::lock::recover;
use crate::train::Train;
use crate::workload::{Pass, UnitBuffers, Workload, carve};
use std::sync::Mutex;

/// The MLP trained by rank `rank` of `world` (each takes `batch_per_rank` samples of a step).
pub struct Mlp {
    spec: MlpSpec,
    world: usize,
    loader: Loader,
    /// The current step's batch, taken at the first unit's forward of every step (the
    /// profiler's rounds of step 0 each take it again, as a run's steps do), the targets uploaded
    /// at the last unit's.
    batch: Mutex<Option<Batch>>,
}

impl Mlp {
    pub fn new(spec: MlpSpec, rank: usize, world: usize) -> Mlp {
        let rows = spec.batch_per_rank;
        Mlp {
            loader: Loader::new(spec.clone(), rank * rows, rows),
            batch: Mutex::new(None),
            spec,
            world,
        }
    }

    pub fn spec(&self) -> &MlpSpec {
        &self.spec
    }

    /// The number of ranks it is trained on.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Elements of unit i's `saved` parts: output, input batch (first unit), targets (last).
    fn saved_lens(&self, unit: usize) -> [usize; 3] {
        let rows = self.spec.batch_per_rank;
        let (din, dout) = self.spec.dims(unit);
        let first = if unit == 0 { rows * din } else { 0 };
        let last = if unit + 1 == self.spec.units() {
            rows * dout
        } else {
            0
        };
        [rows * dout, first, last]
    }

    fn saved_parts(&self, saved: Region, unit: usize) -> [Region; 3] {
        carve(saved, self.saved_lens(unit))
    }

    /// The input of unit i: the batch or the previous unit's output.
    fn input(&self, layout: &Layout, unit: usize) -> Region {
        if unit == 0 {
            self.saved_parts(layout.units[0].saved, 0)[1]
        } else {
            self.saved_parts(layout.units[unit - 1].saved, unit - 1)[0]
        }
    }
}

impl Workload for Mlp {
    fn name(&self) -> &str {
        &self.spec.name
    }
    fn unit_count(&self) -> usize {
        self.spec.units()
    }
    fn unit_name(&self, unit: usize) -> String {
        self.spec.unit_name(unit)
    }
    fn params(&self, unit: usize) -> usize {
        self.spec.params(unit)
    }
    fn buffers(&self, unit: usize) -> UnitBuffers {
        let rows = self.spec.batch_per_rank;
        let (din, dout) = self.spec.dims(unit);
        let last = unit + 1 == self.spec.units();
        UnitBuffers {
            saved: self.saved_lens(unit).iter().sum(),
            internals: 0,
            forward_workspace: 0,
            backward_workspace: if last { rows * dout } else { 0 },
            input_gradient: if unit > 0 { rows * din } else { 0 },
        }
    }
    fn initial_params(&self, unit: usize) -> Result<Vec<f32>> {
        Ok(self.spec.initial_params(unit, self.spec.params(unit)))
    }
}

/// The device kernels of the MLP's units (a backend implements them once; the workload never
/// touches memory itself).
pub trait MlpKernels: Backend {
    /// Loads what the kernels need on this backend (compiled kernels, buffers of their own),
    /// before anything is timed; a backend that needs nothing keeps the default.
    fn load_kernels(&self) -> Result<()> {
        Ok(())
    }
    /// `out = x·Wᵀ + b` (then ReLU where `activation` is ReLU), `params` = W | b, `dims` = (in, out).
    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        dims: (usize, usize),
        activation: Activation,
    ) -> Result<()>;
    /// The gradients of `linear_forward` from `grad_out` (turned into dL/dz in place, masked by
    /// `output > 0` where `activation` is ReLU): W's then b's added into `grads`, the input's written into
    /// `grad_in` if given.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// Writes dL/dz into `grad` and this rank's partial loss into loss slot `step`.
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()>;
    /// One Adam step on the communication stream (after the unit's last reduction).
    fn adam(
        &self,
        params: Region,
        grads: Region,
        m: Region,
        v: Region,
        step: u32,
        lr: f32,
    ) -> Result<()>;
}

impl<B: MlpKernels> Train<B> for Mlp {
    fn load_kernels(&self, backend: &B) -> Result<()> {
        backend.load_kernels()
    }

    fn forward(
        &self,
        backend: &B,
        layout: &Layout,
        unit: usize,
        step: usize,
        pass: Pass,
    ) -> Result<()> {
        let u = &layout.units[unit];
        let rows = self.spec.batch_per_rank;
        let last = unit + 1 == self.spec.units();
        if pass == Pass::Forward && (unit == 0 || last) {
            let mut batch = recover(self.batch.lock());
            if unit == 0 {
                *batch = Some(if backend.host_computes() {
                    self.loader.make_now(step)
                } else {
                    self.loader.take(step)
                });
            }
            let taken = batch.as_ref().ok_or_else(|| {
                crate::Error::Backend("the last unit ran before the first".into())
            })?;
            if unit == 0 {
                backend.upload(self.input(layout, 0), &taken.x)?;
            }
            if last {
                backend.upload(self.saved_parts(u.saved, unit)[2], &taken.y)?;
            }
        }
        let params = u.params_for(pass);
        let output = self.saved_parts(u.saved, unit)[0];
        let input = self.input(layout, unit);
        backend.linear_forward(
            input,
            params,
            output,
            rows,
            self.spec.dims(unit),
            self.spec.activation(unit),
        )
    }

    fn backward(&self, backend: &B, layout: &Layout, unit: usize, step: usize) -> Result<()> {
        let u = &layout.units[unit];
        let rows = self.spec.batch_per_rank;
        let [output, _, targets] = self.saved_parts(u.saved, unit);
        let grad_out = if unit + 1 == self.spec.units() {
            let dl = self.spec.dims(unit).1;
            let scale = 1.0 / (self.world * rows * dl) as f32;
            backend.mse_grad(output, targets, u.backward_workspace, scale, step)?;
            u.backward_workspace
        } else {
            layout.output_gradient(unit)
        };
        backend.linear_backward(
            self.input(layout, unit),
            u.backward_params(),
            output,
            grad_out,
            u.backward_grads(),
            u.input_gradient,
            rows,
            self.spec.dims(unit),
            self.spec.activation(unit),
        )
    }

    fn optimize(&self, backend: &B, layout: &Layout, unit: usize, step: u32) -> Result<()> {
        let u = &layout.units[unit];
        backend.adam(
            u.trained(),
            u.grads,
            u.adam_m,
            u.adam_v,
            step,
            self.spec.learning_rate,
        )
    }
}
