//! CUDA kernel source run on the host: compiled by the host C++ compiler with a shim that runs
//! every thread of a launch grid one after another (`grid(blocks, threads, kernel)`). For kernels
//! without barriers, shared memory or atomics this is their semantics. Compiled without
//! floating-point contraction, as NVRTC compiles them without fused multiply-adds.

use std::process::Command;

/// Declares what a kernel source reads (`blockIdx`, `threadIdx`, `blockDim`, `__global__`,
/// `__device__`) and
/// `grid`, which the wrappers call.
const SHIM: &str = r#"
#include <math.h>
struct Dim { unsigned x, y, z; };
static Dim blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
template <class F> static void grid(unsigned blocks, unsigned threads, F kernel) {
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            kernel();
        }
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
