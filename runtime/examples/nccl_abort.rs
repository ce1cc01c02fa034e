//! On one GPU: NCCL's abort returns while a collective can never complete (DESIGN §6.8), which is
//! what the watchdog relies on when a peer stops. The communication stream is held by a kernel
//! that spins on a flag nobody sets, an AllReduce is enqueued behind it on the non-blocking
//! communicator, and its completion event recorded. The event must stay incomplete, `Nccl::abort`
//! must return, and the process exits without waiting for the stream (as `launch::end_job` does).
//!
//! `cargo run --release -p shardplan-runtime --example nccl_abort` (scripts/gpu-check runs it).

use cudarc::driver::{CudaContext, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use shardplan_runtime::cuda::libraries::{self, Needed};
use shardplan_runtime::cuda::module::architecture;
use shardplan_runtime::cuda::nccl::{DeviceFloats, Nccl, NcclSetup};
use shardplan_runtime::cuda::nvrtc;
use shardplan_runtime::{Error, Result};
use std::time::{Duration, Instant};

const SPIN: &str = r#"
extern "C" __global__ void spin(volatile int* flag) {
    while (*flag == 0) {}
}
"#;

/// How long the event is watched before the abort, and the longest the abort may take.
const WATCHED: Duration = Duration::from_secs(2);
const ABORT_LIMIT: Duration = Duration::from_secs(10);

fn main() {
    match check() {
        Ok(took) => {
            println!(
                "nccl abort: returned in {:.1} ms while the AllReduce's stream stayed blocked",
                took.as_secs_f64() * 1e3
            );
            // The spinning kernel never ends: exit without synchronising the context.
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("nccl abort: {e}");
            std::process::exit(1)
        }
    }
}

fn check() -> Result<Duration> {
    libraries::prepare_for(&[Needed::Driver, Needed::Nvrtc, Needed::Nccl])?;
    let failed = |what: &'static str| {
        move |e: cudarc::driver::DriverError| Error::Backend(format!("CUDA: {what}: {e}"))
    };
    let ctx = CudaContext::new(0).map_err(failed("opening GPU 0"))?;
    ctx.bind_to_thread()
        .map_err(failed("binding the context"))?;
    let nccl = Nccl::new(NcclSetup::Single)?;
    let stream = ctx.new_stream().map_err(failed("creating a stream"))?;
    let options = [format!("--gpu-architecture={}", architecture(&ctx)?)];
    let compiled = nvrtc::compile(SPIN, "spin.cu", &options)?;
    let module = ctx
        .load_module(Ptx::from_binary(compiled.cubin))
        .map_err(failed("loading the kernel"))?;
    let spin = module
        .load_function("spin")
        .map_err(failed("finding the kernel"))?;
    let flag = stream.alloc_zeros::<i32>(1).map_err(failed("allocating"))?;
    let data = stream
        .alloc_zeros::<f32>(1 << 20)
        .map_err(failed("allocating"))?;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&spin);
    launch.arg(&flag);
    // SAFETY: `spin` takes one pointer to an int, and `flag` is one, allocated on this context.
    unsafe { launch.launch(one) }.map_err(failed("launching the spin"))?;
    let (address, _) = data.device_ptr(&stream);
    // SAFETY: `data` holds 2^20 floats on this GPU and is never freed (the process exits first).
    let floats = unsafe { DeviceFloats::new(address, 1 << 20) };
    nccl.all_reduce(floats, floats, &stream)?;
    let done = stream
        .record_event(None)
        .map_err(failed("recording an event"))?;
    std::thread::sleep(WATCHED);
    if done.is_complete() {
        return Err(Error::Backend(
            "the AllReduce behind the spinning kernel completed: the check proves nothing".into(),
        ));
    }
    let start = Instant::now();
    nccl.abort();
    let took = start.elapsed();
    if took > ABORT_LIMIT {
        return Err(Error::Backend(format!(
            "ncclCommAbort took {took:?}, past {ABORT_LIMIT:?}"
        )));
    }
    if done.is_complete() {
        return Err(Error::Backend(
            "the AllReduce completed though its stream is blocked".into(),
        ));
    }
    Ok(took)
}
