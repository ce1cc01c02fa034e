//! The measuring profiler's interference factors against backends whose interference is known by
//! construction: the CPU backend (one rank) running a tiny MLP whose compute kernels and
//! collectives each also wait a set time asleep (so the slots are made of those waits and take
//! no core: other work on the machine changes them little), and either hold one lock while they
//! run (the streams run one after the other: a slot takes c + Q, which d = max(c + κ_c·Q,
//! Q + κ_q·c) fits with κ_c or κ_q at 1) or hold nothing (the streams overlap: a slot takes
//! max(c, Q), κ_c = κ_q = 0). A profiler that returned fixed factors fails one of the two.

use shardplan_runtime::Result;
use shardplan_runtime::backend::{
    Allocation, Backend, CpuBackend, DeviceMemory, Group, Loopback, Region, Stream,
};
use shardplan_runtime::measure::{MeasureOptions, measure_workload};
use shardplan_runtime::mlp::{Activation, Mlp, MlpKernels, MlpSpec};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A collective's wait per element (a 256 KiB block: 262 µs).
const PER_ELEMENT: Duration = Duration::from_nanos(4);
/// A compute kernel's wait (a unit's forward is one kernel, its backward one).
const KERNEL: Duration = Duration::from_micros(300);

/// The CPU backend whose compute kernels wait [`KERNEL`] and collectives [`PER_ELEMENT`] per
/// element, all holding one lock while they run when `serial`.
struct KnownInterference {
    inner: CpuBackend<Loopback>,
    serial: bool,
    lock: Mutex<()>,
}

impl KnownInterference {
    fn new(serial: bool) -> Self {
        KnownInterference {
            inner: CpuBackend::new(Loopback),
            serial,
            lock: Mutex::new(()),
        }
    }

    /// `work`, then `wait`, under the lock when serial.
    fn timed(&self, wait: Duration, work: impl FnOnce() -> Result<()>) -> Result<()> {
        let _held: Option<MutexGuard<'_, ()>> = self.serial.then(|| self.lock.lock().unwrap());
        work()?;
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        Ok(())
    }

    /// A collective of `elements`.
    fn collective(&self, elements: usize, copy: impl FnOnce() -> Result<()>) -> Result<()> {
        self.timed(PER_ELEMENT * elements as u32, copy)
    }

    /// A compute kernel.
    fn kernel(&self, work: impl FnOnce() -> Result<()>) -> Result<()> {
        self.timed(KERNEL, work)
    }
}

impl Backend for KnownInterference {
    type Mark = Instant;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn allocate(&mut self, sizes: Allocation) -> Result<()> {
        self.inner.allocate(sizes)
    }
    fn device_memory(&self) -> Result<Option<DeviceMemory>> {
        self.inner.device_memory()
    }
    fn upload(&self, region: Region, data: &[f32]) -> Result<()> {
        self.inner.upload(region, data)
    }
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()> {
        self.inner.download(region, out)
    }
    fn losses(&self, steps: usize) -> Result<Vec<f32>> {
        self.inner.losses(steps)
    }
    fn zero(&self, region: Region) -> Result<()> {
        self.inner.zero(region)
    }
    fn copy(&self, from: Region, to: Region) -> Result<()> {
        self.inner.copy(from, to)
    }
    fn open_groups(&mut self, groups: &[Group]) -> Result<()> {
        self.inner.open_groups(groups)
    }
    fn all_gather(&self, group: Group, shard: Region, full: Region) -> Result<()> {
        self.collective(full.len, || self.inner.all_gather(group, shard, full))
    }
    fn reduce_scatter(&self, group: Group, full: Region, shard: Region) -> Result<()> {
        self.collective(full.len, || self.inner.reduce_scatter(group, full, shard))
    }
    fn all_reduce(&self, group: Group, data: Region) -> Result<()> {
        self.collective(data.len, || self.inner.all_reduce(group, data))
    }
    fn all_reduce_host(&self, data: &mut [f32]) -> Result<()> {
        self.inner.all_reduce_host(data)
    }
    fn mark(&self, stream: Stream) -> Result<Instant> {
        self.inner.mark(stream)
    }
    fn wait_mark(&self, stream: Stream, mark: &Instant) -> Result<()> {
        self.inner.wait_mark(stream, mark)
    }
    fn elapsed_us(&self, from: &Instant, to: &Instant) -> Result<f64> {
        self.inner.elapsed_us(from, to)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn host_computes(&self) -> bool {
        true
    }
    fn enter_stream_thread(&self, stream: Stream) -> Result<()> {
        self.inner.enter_stream_thread(stream)
    }
}

impl MlpKernels for KnownInterference {
    fn linear_forward(
        &self,
        x: Region,
        params: Region,
        out: Region,
        rows: usize,
        dims: (usize, usize),
        activation: Activation,
    ) -> Result<()> {
        self.kernel(|| {
            self.inner
                .linear_forward(x, params, out, rows, dims, activation)
        })
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
        self.kernel(|| {
            self.inner.linear_backward(
                x, params, output, grad_out, grads, grad_in, rows, dims, activation,
            )
        })
    }
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        self.kernel(|| self.inner.mse_grad(z, y, grad, scale, step))
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
        self.kernel(|| self.inner.adam(params, grads, m, v, step, lr))
    }
}

/// (κ_c, κ_q) the profiler fits on `backend`.
fn fitted(backend: KnownInterference) -> (f64, f64) {
    let spec = MlpSpec {
        name: "mlp-known-interference".into(),
        input: 32,
        widths: vec![32, 32, 32, 8],
        batch_per_rank: 8,
        seed: 7,
        learning_rate: 1e-3,
    };
    let options = MeasureOptions {
        world_size: 1,
        device: None,
        micro_batch: None,
        seq_len: None,
        max_message: 256 << 10,
        repeats: 2,
        block_size: Some(256 << 10),
        gpus_per_node: None,
        launch_times: false,
        host_link: false,
    };
    let measured = measure_workload(backend, &Mlp::new(spec, 0, 1), &options).unwrap();
    let p = measured.profile;
    (p.overlap_slowdown, p.comm_slowdown)
}

/// Serial streams fit κ_c or κ_q at 1 (a slot is c + Q), overlapping ones both at 0 (max(c, Q)).
/// Other work on the machine only adds interference (it takes the core a waking collective
/// needs), so each case gets three tries: a serial backend must once fit at least 0.8, an
/// overlapping one once at most 0.2. One test, so that the measurements never run at once.
#[test]
fn the_fitted_factors_are_the_backends_own() {
    let tries = |serial: bool, holds: fn(f64) -> bool| {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (compute, comm) = fitted(KnownInterference::new(serial));
            seen.push((compute, comm));
            if holds(compute.max(comm)) {
                return Ok(());
            }
        }
        Err(seen)
    };
    let serial = tries(true, |kappa| kappa >= 0.8);
    assert!(
        serial.is_ok(),
        "serial streams fitted (κ_c, κ_q) {serial:?}"
    );
    let overlapping = tries(false, |kappa| kappa <= 0.2);
    assert!(
        overlapping.is_ok(),
        "overlapping streams fitted (κ_c, κ_q) {overlapping:?}"
    );
}
