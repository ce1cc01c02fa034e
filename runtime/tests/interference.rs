//! The measuring profiler's interference factors against backends whose interference is known by
//! construction: the CPU backend (one rank) with collectives that take a set time per element
//! and either share one lock with every compute kernel (the streams run one after the other:
//! a slot takes c + Q, κ_q = 1) or hold nothing while they wait (the streams overlap: a slot
//! takes max(c, Q), κ_c = κ_q = 0). A profiler that returned fixed factors fails one of the two.

use shardplan_runtime::Result;
use shardplan_runtime::backend::{
    Allocation, Backend, CpuBackend, DeviceMemory, Loopback, Region, Stream,
};
use shardplan_runtime::measure::{MeasureOptions, measure_workload};
use shardplan_runtime::mlp::{Mlp, MlpKernels, MlpSpec};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A collective's time per element (a 64 KiB block: 65 µs plus the sleep's own latency).
const PER_ELEMENT: Duration = Duration::from_nanos(4);

/// The CPU backend whose collectives wait `PER_ELEMENT` per element, holding `lock` (which every
/// compute kernel takes too) when `serial`.
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

    /// The lock every compute kernel holds.
    fn compute(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap()
    }

    /// A collective of `elements`: the copy, then the wait, under the lock when serial.
    fn collective(&self, elements: usize, copy: impl FnOnce() -> Result<()>) -> Result<()> {
        let _held = self.serial.then(|| self.lock.lock().unwrap());
        copy()?;
        std::thread::sleep(PER_ELEMENT * elements as u32);
        Ok(())
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
    fn all_gather(&self, shard: Region, full: Region) -> Result<()> {
        self.collective(full.len, || self.inner.all_gather(shard, full))
    }
    fn reduce_scatter(&self, full: Region, shard: Region) -> Result<()> {
        self.collective(full.len, || self.inner.reduce_scatter(full, shard))
    }
    fn all_reduce(&self, data: Region) -> Result<()> {
        self.collective(data.len, || self.inner.all_reduce(data))
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
        relu: bool,
    ) -> Result<()> {
        let _held = self.compute();
        self.inner.linear_forward(x, params, out, rows, dims, relu)
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
        relu: bool,
    ) -> Result<()> {
        let _held = self.compute();
        self.inner.linear_backward(
            x, params, output, grad_out, grads, grad_in, rows, dims, relu,
        )
    }
    fn mse_grad(&self, z: Region, y: Region, grad: Region, scale: f32, step: usize) -> Result<()> {
        let _held = self.compute();
        self.inner.mse_grad(z, y, grad, scale, step)
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
        let _held = self.compute();
        self.inner.adam(params, grads, m, v, step, lr)
    }
}

/// (κ_c, κ_q) the profiler fits on `backend`.
fn fitted(backend: KnownInterference) -> (f64, f64) {
    let spec = MlpSpec {
        name: "mlp-known-interference".into(),
        input: 256,
        widths: vec![512, 512, 512, 64],
        batch_per_rank: 64,
        seed: 7,
        learning_rate: 1e-3,
    };
    let options = MeasureOptions {
        world_size: 1,
        device: None,
        micro_batch: 1,
        seq_len: None,
        max_message: 256 << 10,
        repeats: 2,
        block_size: Some(256 << 10),
    };
    let measured = measure_workload(backend, &Mlp::new(spec, 0, 1), &options).unwrap();
    let p = measured.profile;
    (p.overlap_slowdown, p.comm_slowdown)
}

/// Serial streams fit κ_q = 1 (a slot is c + Q); overlapping ones κ_c = κ_q = 0 (max(c, Q)). One
/// test, so that the two measurements do not run at once.
#[test]
fn the_fitted_factors_are_the_backends_own() {
    let (compute, comm) = fitted(KnownInterference::new(true));
    assert!(comm >= 0.8, "serial streams: κ_c {compute}, κ_q {comm}");
    let (compute, comm) = fitted(KnownInterference::new(false));
    assert!(
        compute <= 0.25 && comm <= 0.25,
        "overlapping streams: κ_c {compute}, κ_q {comm}"
    );
}
