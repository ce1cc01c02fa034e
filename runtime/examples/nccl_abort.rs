//! On one GPU: NCCL's abort against a collective that cannot complete (DESIGN §6.8), which is what
//! the watchdog relies on when a peer stops. The communication stream is held by a kernel that
//! spins on a flag in mapped host memory, an AllReduce is enqueued behind it on the non-blocking
//! communicator, and its completion event recorded. Checked: the enqueue returns while the stream
//! is held (no host thread waits inside NCCL), the event stays incomplete, and the abort either
//! returns or is still waiting for the device when the watchdog's bound ends the process (on an
//! H100 with NCCL 2.28.3 it waits: docs/gpu-results.md, 2026-11-26). Every stage prints its time since the start. Should a stage wait
//! for the device instead, a releaser sets the flag after `RELEASE_AFTER`, so the check ends and
//! names the stage. The process ends through `launch::end_job`, as the watchdog ends a job: with
//! every GPU object alive and without the exit handlers, both of which would wait for the held
//! stream (a plain exit waited for the release, then crashed: docs/gpu-results.md).
//!
//! `cargo run --release -p shardplan-runtime --example nccl_abort` (scripts/gpu-check runs it).

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, sys};
use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use shardplan_runtime::backend::FloatFormat;
use shardplan_runtime::cuda::libraries::{self, Needed};
use shardplan_runtime::cuda::module::architecture;
use shardplan_runtime::cuda::nccl::{DeviceBuffer, Nccl, NcclSetup};
use shardplan_runtime::cuda::nvrtc;
use shardplan_runtime::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SPIN: &str = r#"
extern "C" __global__ void spin(volatile int* flag) {
    while (*flag == 0) {}
}
"#;

/// How long the event is watched before the abort.
const WATCHED: Duration = Duration::from_secs(2);
/// The watchdog's bound on the abort (`executor::watchdog`'s `ABORT_WAIT`).
const ABORT_LIMIT: Duration = Duration::from_secs(5);
/// When the releaser lets the spinning kernel end, should a stage still be waiting.
const RELEASE_AFTER: Duration = Duration::from_secs(15);

/// The GPU objects of the check, alive until the process exits.
struct Held {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    spin: CudaFunction,
    data: CudaSlice<f32>,
    /// The spinning kernel's flag: mapped, page-locked host memory, never freed.
    flag: *mut i32,
}

fn main() {
    let start = Instant::now();
    let stage = |what: &str| eprintln!("{:>8.1} ms  {what}", start.elapsed().as_secs_f64() * 1e3);
    let held = match hold() {
        Ok(held) => held,
        Err(e) => fail(&e),
    };
    stage("context and kernel ready");
    let released = Arc::new(AtomicBool::new(false));
    release_later(held.flag as usize, Arc::clone(&released), start);
    match check(&held, &released, &stage) {
        Ok(outcome) => {
            match outcome {
                Outcome::Returned(took) => println!(
                    "nccl abort: returned in {:.1} ms while the AllReduce's stream stayed blocked",
                    took.as_secs_f64() * 1e3
                ),
                Outcome::Bounded => println!(
                    "nccl abort: ncclCommAbort waits for the blocked stream; the process ends at \
                     the watchdog's {} s bound",
                    ABORT_LIMIT.as_secs()
                ),
            }
            // The spinning kernel has not ended: the job ends as the watchdog ends it, without
            // dropping `held` or running the exit handlers that wait for the device.
            shardplan_runtime::launch::end_job(0)
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> ! {
    eprintln!("nccl abort: {e}");
    shardplan_runtime::launch::end_job(1)
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Backend(format!("CUDA: {what}: {e}"))
}

fn hold() -> Result<Held> {
    libraries::prepare_for(&[Needed::Driver, Needed::Nvrtc, Needed::Nccl])?;
    let ctx = CudaContext::new(0).map_err(driver("opening GPU 0"))?;
    ctx.bind_to_thread()
        .map_err(driver("binding the context"))?;
    let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
    let options = [format!("--gpu-architecture={}", architecture(&ctx)?)];
    let compiled = nvrtc::compile(SPIN, "spin.cu", &options)?;
    let module = ctx
        .load_module(Ptx::from_binary(compiled.cubin))
        .map_err(driver("loading the kernel"))?;
    let spin = module
        .load_function("spin")
        .map_err(driver("finding the kernel"))?;
    let data = stream
        .alloc_zeros::<f32>(1 << 20)
        .map_err(driver("allocating"))?;
    // SAFETY: one int of page-locked host memory mapped into the device's address space; it is
    // written below before any kernel reads it, and never freed.
    let flag = unsafe { cudarc::driver::result::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
        .map_err(driver("allocating the mapped flag"))? as *mut i32;
    // SAFETY: `flag` points at the int just allocated.
    unsafe { flag.write_volatile(0) };
    stream.synchronize().map_err(driver("synchronizing"))?;
    Ok(Held {
        ctx,
        stream,
        _module: module,
        spin,
        data,
        flag,
    })
}

/// Sets the flag (the host address of the mapped int) after `RELEASE_AFTER`, saying so.
fn release_later(flag: usize, released: Arc<AtomicBool>, start: Instant) {
    std::thread::spawn(move || {
        std::thread::sleep(RELEASE_AFTER.saturating_sub(start.elapsed()));
        released.store(true, Ordering::SeqCst);
        eprintln!(
            "{:>8.1} ms  released the spinning kernel",
            start.elapsed().as_secs_f64() * 1e3
        );
        // SAFETY: the mapped int is never freed; the kernel reads it through a volatile pointer.
        unsafe { (flag as *mut i32).write_volatile(1) };
    });
}

fn check(held: &Held, released: &AtomicBool, stage: &dyn Fn(&str)) -> Result<Outcome> {
    let nccl = Nccl::new(NcclSetup::Single)?;
    stage("communicator created");
    let mut device_flag: sys::CUdeviceptr = 0;
    // SAFETY: `flag` was allocated by cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_flag, held.flag.cast(), 0) }
        .result()
        .map_err(driver("mapping the flag"))?;
    held.ctx
        .bind_to_thread()
        .map_err(driver("binding the context"))?;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = held.stream.launch_builder(&held.spin);
    launch.arg(&device_flag);
    // SAFETY: `spin` takes one pointer to an int, and `device_flag` is the device's address of
    // the mapped int, valid for the whole process.
    unsafe { launch.launch(one) }.map_err(driver("launching the spin"))?;
    stage("spinning kernel launched");
    let (address, _) = held.data.device_ptr(&held.stream);
    // SAFETY: `data` holds 2^20 floats on this GPU and is never freed (the process exits first).
    let floats = unsafe { DeviceBuffer::new(address, 1 << 20, FloatFormat::Fp32) };
    nccl.all_reduce(floats, floats, &held.stream)?;
    stage("AllReduce enqueued behind it");
    if released.load(Ordering::SeqCst) {
        return Err(Error::Backend(
            "the AllReduce's enqueue waited for the held stream".into(),
        ));
    }
    let done = held
        .stream
        .record_event(None)
        .map_err(driver("recording an event"))?;
    std::thread::sleep(WATCHED);
    if done.is_complete() {
        return Err(Error::Backend(
            "the AllReduce behind the spinning kernel completed: the check proves nothing".into(),
        ));
    }
    stage("its event still incomplete; aborting");
    let aborting = Instant::now();
    let (aborted, returned) = std::sync::mpsc::channel();
    let nccl = Arc::new(Aborting(nccl));
    let communicator = Arc::clone(&nccl);
    std::thread::spawn(move || {
        communicator.0.abort();
        let _ = aborted.send(());
    });
    let outcome = match returned.recv_timeout(ABORT_LIMIT) {
        Ok(()) => Outcome::Returned(aborting.elapsed()),
        Err(_) => Outcome::Bounded,
    };
    stage(match outcome {
        Outcome::Returned(_) => "ncclCommAbort returned",
        Outcome::Bounded => "ncclCommAbort still waiting: the job ends regardless",
    });
    // No device call from here on, not even the event's destruction: while the abort waits, the
    // driver holds every other call on this context (docs/gpu-results.md).
    std::mem::forget(done);
    std::mem::forget(nccl);
    if released.load(Ordering::SeqCst) {
        return Err(Error::Backend(
            "the spinning kernel was released before the abort's bound".into(),
        ));
    }
    Ok(outcome)
}

/// The communicator, handed to the thread that aborts it, as the watchdog does.
struct Aborting(Nccl);

// SAFETY: the other thread calls only `Nccl::abort` (ncclCommAbort, which NCCL allows from any
// thread beside the communicator's operations); this thread makes no further call on it.
unsafe impl Send for Aborting {}
unsafe impl Sync for Aborting {}

/// How the abort ended: it returned (after this long), or was still waiting for the device when
/// the watchdog's bound ran out.
enum Outcome {
    Returned(Duration),
    Bounded,
}
