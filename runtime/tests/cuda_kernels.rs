//! The NVRTC kernels' very source, compiled by the host C++ compiler with a shim that runs every
//! thread of the launch grid one after another (the kernels use no barriers or shared memory, so
//! this is their semantics), against the CPU backend's functions: the results must be bitwise
//! equal. The grids come from the backend's own launch configuration. The shim's barrier, which
//! the GPT-2 row kernels (runtime/tests/cuda_gpt2_kernels.rs) need, is checked here too.

use shardplan_runtime::cuda::module::per_element;
use shardplan_runtime::mlp::cuda::SOURCE;
use shardplan_runtime::mlp::{self, Activation, BETA1, BETA2, EPSILON};

mod shim;

const WRAPPERS: &str = r#"
extern "C" void run_fill_rows(unsigned g, unsigned t, float* out, const float* row, int rows, int cols) {
    grid(g, t, [&] { fill_rows(out, row, rows, cols); });
}
extern "C" void run_relu(unsigned g, unsigned t, float* x, long long n) {
    grid(g, t, [&] { relu(x, n); });
}
extern "C" void run_relu_mask(unsigned g, unsigned t, float* grad, const float* out, long long n) {
    grid(g, t, [&] { relu_mask(grad, out, n); });
}
extern "C" void run_column_sums_add(unsigned g, unsigned t, float* out, const float* x, int rows, int cols) {
    grid(g, t, [&] { column_sums_add(out, x, rows, cols); });
}
extern "C" void run_mse(unsigned g, unsigned t, unsigned pg, unsigned pt, const float* z,
                        const float* y, float* grad, float scale, long long n, long long parts,
                        float* partials, float* loss) {
    grid(g, t, [&] { mse_grad(z, y, grad, scale, n); });
    grid(pg, pt, [&] { mse_loss_partials(z, y, scale, n, parts, partials); });
    grid(1, 1, [&] { sum_in_order(partials, parts, loss); });
}
extern "C" void run_adam(unsigned g, unsigned t, float* p, const float* gr, float* m, float* v,
                         long long n, float lr, float c1, float c2, float b1, float b2, float e) {
    grid(g, t, [&] { adam(p, gr, m, v, n, lr, c1, c2, b1, b2, e); });
}
"#;

fn compile() -> (tempfile::TempDir, libloading::Library) {
    shim::compile(SOURCE, WRAPPERS)
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|k| {
            let z = (k as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97));
            ((z >> 8) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn grid(n: usize) -> (u32, u32) {
    let c = per_element(n);
    (c.grid_dim.0, c.block_dim.0)
}

type Fill = unsafe extern "C" fn(u32, u32, *mut f32, *const f32, i32, i32);
type Relu = unsafe extern "C" fn(u32, u32, *mut f32, i64);
type Mask = unsafe extern "C" fn(u32, u32, *mut f32, *const f32, i64);
type Mse = unsafe extern "C" fn(
    u32,
    u32,
    u32,
    u32,
    *const f32,
    *const f32,
    *mut f32,
    f32,
    i64,
    i64,
    *mut f32,
    *mut f32,
);
type Adam = unsafe extern "C" fn(
    u32,
    u32,
    *mut f32,
    *const f32,
    *mut f32,
    *mut f32,
    i64,
    f32,
    f32,
    f32,
    f32,
    f32,
    f32,
);

/// Linear forward's bias rows and ReLU, and backward's mask and bias gradient, equal the CPU's.
#[test]
fn layer_kernels_equal_the_cpu_backend() {
    let (_dir, lib) = compile();
    let (rows, din, dout) = (37, 5, 300);
    // The CPU forward with zero weights is bias rows then ReLU: the kernels' part of a layer.
    let mut params = vec![0.0f32; dout * din];
    let bias = values(dout, 1);
    params.extend(&bias);
    let x = values(rows * din, 2);
    let mut expected = vec![0.0f32; rows * dout];
    mlp::linear_forward(
        &x,
        &params,
        &mut expected,
        rows,
        (din, dout),
        Activation::Relu,
    );
    let mut out = vec![f32::NAN; rows * dout];
    let (g, t) = grid(rows * dout);
    // SAFETY: the wrappers' signatures are the types above; the buffers have the sizes given.
    unsafe {
        let fill: libloading::Symbol<Fill> = lib.get(b"run_fill_rows").unwrap();
        fill(
            g,
            t,
            out.as_mut_ptr(),
            bias.as_ptr(),
            rows as i32,
            dout as i32,
        );
        let relu: libloading::Symbol<Relu> = lib.get(b"run_relu").unwrap();
        relu(g, t, out.as_mut_ptr(), (rows * dout) as i64);
    }
    assert_eq!(out, expected, "bias rows + ReLU");
    assert!(expected.contains(&0.0) && expected.iter().any(|&v| v > 0.0));

    // Backward: mask dZ by the output, then dZ's column sums are added into the bias gradient
    // (which holds an earlier micro-batch's).
    let output = values(rows * dout, 3);
    let grad_out = values(rows * dout, 4);
    let mut cpu_grad_out = grad_out.clone();
    let earlier = values(dout * din + dout, 6);
    let mut cpu_grads = earlier.clone();
    let params = values(dout * din + dout, 5);
    mlp::linear_backward(
        &x,
        &params,
        &output,
        &mut cpu_grad_out,
        &mut cpu_grads,
        None,
        rows,
        (din, dout),
        Activation::Relu,
    );
    let mut masked = grad_out.clone();
    let mut sums = earlier[dout * din..].to_vec();
    let (gc, tc) = grid(dout);
    // SAFETY: as above.
    unsafe {
        let mask: libloading::Symbol<Mask> = lib.get(b"run_relu_mask").unwrap();
        mask(
            g,
            t,
            masked.as_mut_ptr(),
            output.as_ptr(),
            (rows * dout) as i64,
        );
        let column_sums: libloading::Symbol<Fill> = lib.get(b"run_column_sums_add").unwrap();
        column_sums(
            gc,
            tc,
            sums.as_mut_ptr(),
            masked.as_ptr(),
            rows as i32,
            dout as i32,
        );
    }
    assert_eq!(masked, cpu_grad_out, "ReLU mask");
    assert_eq!(sums, cpu_grads[dout * din..], "bias gradient");
}

/// The loss gradient, the loss (more elements than partial sums, so each partial adds several,
/// and a length that is no multiple of their number) and three Adam steps equal the CPU's bitwise.
#[test]
fn loss_and_adam_kernels_equal_the_cpu_backend() {
    let (_dir, lib) = compile();
    let n = 2 * mlp::LOSS_PARTIALS + 1000;
    let (z, y) = (values(n, 6), values(n, 7));
    let scale = 1.0 / 640.0;
    let mut cpu_grad = vec![0.0f32; n];
    let cpu_loss = mlp::mse_grad(&z, &y, &mut cpu_grad, scale);
    let (mut grad, mut loss) = (vec![f32::NAN; n], f32::NAN);
    let (g, t) = grid(n);
    let parts = mlp::LOSS_PARTIALS.min(n);
    let (pg, pt) = grid(parts);
    let mut partials = vec![f32::NAN; parts];
    // SAFETY: as above.
    unsafe {
        let mse: libloading::Symbol<Mse> = lib.get(b"run_mse").unwrap();
        mse(
            g,
            t,
            pg,
            pt,
            z.as_ptr(),
            y.as_ptr(),
            grad.as_mut_ptr(),
            scale,
            n as i64,
            parts as i64,
            partials.as_mut_ptr(),
            &mut loss,
        );
    }
    assert_eq!(grad, cpu_grad);
    assert_eq!(loss, cpu_loss);

    let (mut p, mut m, mut v) = (values(n, 8), vec![0.0f32; n], vec![0.0f32; n]);
    let (mut cp, mut cm, mut cv) = (p.clone(), m.clone(), v.clone());
    for step in 1..=3u32 {
        let grads = values(n, 10 + step);
        mlp::adam(&mut cp, &grads, &mut cm, &mut cv, step, 1e-2);
        let (c1, c2) = (1.0 - BETA1.powi(step as i32), 1.0 - BETA2.powi(step as i32));
        // SAFETY: as above.
        unsafe {
            let adam: libloading::Symbol<Adam> = lib.get(b"run_adam").unwrap();
            adam(
                g,
                t,
                p.as_mut_ptr(),
                grads.as_ptr(),
                m.as_mut_ptr(),
                v.as_mut_ptr(),
                n as i64,
                1e-2,
                c1,
                c2,
                BETA1,
                BETA2,
                EPSILON,
            );
        }
    }
    assert_eq!((p, m, v), (cp, cm, cv), "three Adam steps");
}

/// Kernels that synchronise their block, for the shim's own check below.
const BARRIER_KERNELS: &str = r#"
__global__ void rotate(float* out) {
    __shared__ float lanes[64];
    lanes[threadIdx.x] = blockIdx.x * 100.0f + threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = lanes[(threadIdx.x + 1) % blockDim.x];
}
__global__ void leave_early(float* out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
extern "C" void run_rotate(unsigned g, unsigned t, float* out) {
    block_grid(g, t, [&] { rotate(out); });
}
extern "C" void run_leave_early(unsigned g, unsigned t, float* out) {
    block_grid(g, t, [&] { leave_early(out); });
}
"#;

/// The shim's barrier (what the GPT-2 row kernels' check rests on): each thread reads its
/// neighbour's shared value, written before the barrier, in every block; a block whose thread
/// returns while the others wait at a barrier is named, until the next launch.
#[test]
fn the_shims_barrier_holds_a_blocks_threads_together() {
    let (_dir, lib) = shim::compile("", BARRIER_KERNELS);
    type Run = unsafe extern "C" fn(u32, u32, *mut f32);
    let (blocks, threads) = (3, 64);
    let mut out = vec![f32::NAN; blocks * threads];
    // SAFETY: the wrappers take (blocks, threads, out); `out` holds every thread's element.
    unsafe {
        let rotate: libloading::Symbol<Run> = lib.get(b"run_rotate").unwrap();
        rotate(blocks as u32, threads as u32, out.as_mut_ptr());
    }
    let expected: Vec<f32> = (0..blocks * threads)
        .map(|i| (i / threads * 100 + (i % threads + 1) % threads) as f32)
        .collect();
    assert_eq!(out, expected);
    assert_eq!(shim::failure(&lib), None);
    // SAFETY: as above, with 8 threads of one block.
    unsafe {
        let leave: libloading::Symbol<Run> = lib.get(b"run_leave_early").unwrap();
        leave(1, 8, out.as_mut_ptr());
    }
    assert_eq!(
        shim::failure(&lib).as_deref(),
        Some("block 0: 1 of 8 threads returned while the others wait at a barrier")
    );
    // SAFETY: as the first launch; the next launch clears the failure.
    unsafe {
        let rotate: libloading::Symbol<Run> = lib.get(b"run_rotate").unwrap();
        rotate(blocks as u32, threads as u32, out.as_mut_ptr());
    }
    assert_eq!(shim::failure(&lib), None);
}
