//! CUDA kernel source run on the host: compiled by the host C++ compiler with a shim that runs a
//! launch grid's blocks one after another. `grid(blocks, threads, kernel)` runs a block's threads
//! one after another too, which is the semantics of a kernel without barriers, shared memory or
//! atomics; `block_grid` runs a block's threads at once, each on a host thread of its own, with
//! `__shared__` arrays shared by the block (static: one block runs at a time) and
//! `__syncthreads()` a barrier of the block's threads — the semantics of a kernel that
//! synchronises its block (no block may leave a barrier behind: a thread that returns early
//! would leave the others waiting, as on a GPU). Compiled without floating-point contraction, as NVRTC compiles them
//! without fused multiply-adds.

use std::process::Command;

/// Declares what a kernel source reads (`blockIdx`, `threadIdx`, `blockDim`, `__global__`,
/// `__device__`, `__shared__`, `__syncthreads`) and `grid` and `block_grid`, which the wrappers
/// call.
const SHIM: &str = r#"
#include <math.h>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
struct Dim { unsigned x, y, z; };
static Dim blockDim;
static thread_local Dim blockIdx, threadIdx;
#define __global__
#define __device__
#define __shared__ static

// The threads of the running block wait here until all have arrived.
struct Barrier {
    std::mutex lock;
    std::condition_variable all_arrived;
    unsigned count = 0, arrived = 0, generation = 0;
    void wait() {
        std::unique_lock<std::mutex> held(lock);
        unsigned mine = generation;
        if (++arrived == count) {
            arrived = 0;
            ++generation;
            all_arrived.notify_all();
        } else {
            all_arrived.wait(held, [&] { return generation != mine; });
        }
    }
};
static Barrier block_barrier;
#define __syncthreads() block_barrier.wait()

template <class F> static void grid(unsigned blocks, unsigned threads, F kernel) {
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            kernel();
        }
}

// One host thread per thread of a block, each running the blocks in turn; all of them finish a
// block before any starts the next, so a block's shared memory is its own while it runs.
template <class F> static void block_grid(unsigned blocks, unsigned threads, F kernel) {
    blockDim = {threads, 1, 1};
    block_barrier.count = threads;
    std::vector<std::thread> block;
    for (unsigned t = 0; t < threads; ++t)
        block.emplace_back([t, blocks, &kernel] {
            threadIdx = {t, 0, 0};
            for (unsigned b = 0; b < blocks; ++b) {
                blockIdx = {b, 0, 0};
                kernel();
                block_barrier.wait();
            }
        });
    for (auto& thread : block) thread.join();
}
"#;

/// `source` followed by `wrappers` (the `extern "C"` functions a test calls) as a shared library,
/// in a temporary folder that must outlive the library's use.
pub fn compile(source: &str, wrappers: &str) -> (tempfile::TempDir, libloading::Library) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernels.cpp");
    std::fs::write(&path, format!("{SHIM}{source}{wrappers}")).unwrap();
    let library = dir.path().join("libkernels.so");
    let out = Command::new("c++")
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-shared",
            "-fPIC",
            "-pthread",
            "-o",
        ])
        .arg(&library)
        .arg(&path)
        .output()
        .expect("a C++ compiler (c++) is installed: HiGHS needs one too");
    assert!(
        out.status.success(),
        "the kernel source does not compile as C++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the library was just built from the source above.
    let lib = unsafe { libloading::Library::new(&library) }.unwrap();
    (dir, lib)
}
