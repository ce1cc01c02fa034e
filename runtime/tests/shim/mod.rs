//! CUDA kernel source run on the host: compiled by the host C++ compiler with a shim that runs a
//! launch grid's blocks one after another. `grid(blocks, threads, kernel)` runs a block's threads
//! one after another too, which is the semantics of a kernel without barriers, shared memory or
//! atomics; `block_grid` runs a block's threads as fibers (`ucontext`) on one host thread, with
//! `__shared__` arrays shared by the block (static: one block runs at a time) and
//! `__syncthreads()` a barrier of the block's threads: each thread runs to its next barrier in
//! turn, and a round in which all of them reached it releases them together — the semantics of a
//! kernel that synchronises its block. No block may leave a barrier behind (a thread that returns
//! while others wait would hang a GPU): the launch stops there and [`failure`] names it.
//! Compiled without floating-point contraction, as NVRTC compiles them without fused
//! multiply-adds.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

/// Declares what a kernel source reads (`blockIdx`, `threadIdx`, `blockDim`, `__global__`,
/// `__device__`, `__shared__`, `__syncthreads`) and `grid` and `block_grid`, which the wrappers
/// call.
const SHIM: &str = r#"
#include <math.h>
#include <stdio.h>
#include <ucontext.h>
#include <memory>
#include <vector>
struct Dim { unsigned x, y, z; };
static Dim blockDim, blockIdx, threadIdx;
#define __global__
#define __device__
#define __shared__ static

// The block's threads as fibers: the scheduler's context, the running thread's, and whether it
// stopped at a barrier (rather than returning).
static ucontext_t block_scheduler;
static ucontext_t* running_thread;
static bool at_barrier;
// What went wrong in the last launch (empty: nothing; each launch clears it), read by `failure`.
static char shim_failure[200];
extern "C" const char* shim_failure_message() { return shim_failure; }
static void sync_block() {
    at_barrier = true;
    swapcontext(running_thread, &block_scheduler);
}
#define __syncthreads() sync_block()

template <class F> static void grid(unsigned blocks, unsigned threads, F kernel) {
    shim_failure[0] = 0;
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            kernel();
        }
}

template <class F> struct Running { static F* kernel; static void entry() { (*kernel)(); } };
template <class F> F* Running<F>::kernel;

// Each block in turn; its threads run in rounds, each thread to its next barrier (or its end),
// until all have returned.
template <class F> static void block_grid(unsigned blocks, unsigned threads, F kernel) {
    const size_t stack_bytes = 64 * 1024;
    shim_failure[0] = 0;
    blockDim = {threads, 1, 1};
    Running<F>::kernel = &kernel;
    std::vector<ucontext_t> fibers(threads);
    std::unique_ptr<char[]> stacks(new char[threads * stack_bytes]);
    for (unsigned b = 0; b < blocks; ++b) {
        blockIdx = {b, 0, 0};
        for (unsigned t = 0; t < threads; ++t) {
            getcontext(&fibers[t]);
            fibers[t].uc_stack.ss_sp = stacks.get() + t * stack_bytes;
            fibers[t].uc_stack.ss_size = stack_bytes;
            fibers[t].uc_link = &block_scheduler;
            makecontext(&fibers[t], Running<F>::entry, 0);
        }
        for (bool waiting = true; waiting;) {
            unsigned returned = 0;
            for (unsigned t = 0; t < threads; ++t) {
                threadIdx = {t, 0, 0};
                running_thread = &fibers[t];
                at_barrier = false;
                swapcontext(&block_scheduler, &fibers[t]);
                returned += !at_barrier;
            }
            if (returned != 0 && returned != threads) {
                snprintf(shim_failure, sizeof shim_failure,
                         "block %u: %u of %u threads returned while the others wait at a barrier",
                         b, returned, threads);
                return;
            }
            waiting = returned == 0;
        }
    }
}
"#;

/// The host compiler's flags: a shared library, without floating-point contraction.
const FLAGS: [&str; 5] = ["-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC"];

/// `source` followed by `wrappers` (the `extern "C"` functions a test calls) as a shared library
/// of the caller's own (its statics — the running block, its shared memory — are no other
/// caller's), in a temporary folder that must outlive the library's use.
pub fn compile(source: &str, wrappers: &str) -> (tempfile::TempDir, libloading::Library) {
    let built = built_library(&format!("{SHIM}{source}{wrappers}"));
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libkernels.so");
    std::fs::copy(&built, &library).unwrap();
    // SAFETY: the library was built from the shim and the caller's source.
    let lib = unsafe { libloading::Library::new(&library) }.unwrap();
    (dir, lib)
}

/// The library compiled from `text`, compiled once per text and flags: kept under cargo's
/// temporary folder for tests, named by their hash (a second process finds it there; a text
/// compiled anew is renamed into place whole).
fn built_library(text: &str) -> PathBuf {
    static COMPILING: Mutex<()> = Mutex::new(());
    let mut hasher = DefaultHasher::new();
    (text, FLAGS).hash(&mut hasher);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-shim");
    let library = cache.join(format!("{:016x}.so", hasher.finish()));
    let _one_at_a_time = COMPILING.lock().unwrap_or_else(PoisonError::into_inner);
    if library.exists() {
        return library;
    }
    std::fs::create_dir_all(&cache).unwrap();
    let dir = tempfile::tempdir_in(&cache).unwrap();
    let path = dir.path().join("kernels.cpp");
    std::fs::write(&path, text).unwrap();
    let compiled = dir.path().join("libkernels.so");
    let out = Command::new("c++")
        .args(FLAGS)
        .arg("-o")
        .arg(&compiled)
        .arg(&path)
        .output()
        .expect("a C++ compiler (c++) is installed: HiGHS needs one too");
    assert!(
        out.status.success(),
        "the kernel source does not compile as C++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&compiled, &library).unwrap();
    library
}

/// What went wrong in `lib`'s last launch: a block that left a barrier behind.
pub fn failure(lib: &libloading::Library) -> Option<String> {
    // SAFETY: every library `compile` builds exports this function, which returns a pointer to
    // its static, NUL-terminated message.
    let message = unsafe {
        let get = lib
            .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(b"shim_failure_message")
            .unwrap();
        std::ffi::CStr::from_ptr(get())
    };
    let message = message.to_string_lossy();
    (!message.is_empty()).then(|| message.into_owned())
}
