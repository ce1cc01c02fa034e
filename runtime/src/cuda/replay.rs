//! Replaying a transformer unit's matrix products on the GPU (bf16 inputs, fp32 accumulation, as
//! mixed-precision training runs them), timed with CUDA events on the compute stream.

use super::CudaBackend;
use super::driver_error;
use super::work::BlasCall;
use crate::transformer::Gemm;
use crate::{Error, Result};
use cudarc::cublas::sys;
use cudarc::driver::{CudaSlice, DevicePtr};

/// Buffers large enough for every product of a list, filled with random bf16 values (all-zero
/// inputs run measurably faster on Hopper).
pub struct ReplayBuffers {
    a: CudaSlice<u16>,
    b: CudaSlice<u16>,
    c: CudaSlice<u16>,
}

/// Random bf16 bit patterns of moderate magnitude (exponent near 1, either sign).
fn random_bf16(len: usize, seed: u64) -> Vec<u16> {
    let mut z = seed;
    (0..len)
        .map(|_| {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bits = (z >> 33) as u16;
            (bits & 0x807f) | 0x3f00
        })
        .collect()
}

impl CudaBackend {
    /// Buffers for the largest A, B and C of `gemms`.
    pub fn replay_buffers(&self, gemms: &[Gemm]) -> Result<ReplayBuffers> {
        let largest = |f: fn(&Gemm) -> usize| gemms.iter().map(f).max().unwrap_or(1).max(1);
        let sizes = [
            largest(|g| g.elements().0 * g.batch),
            largest(|g| g.elements().1 * g.batch),
            largest(|g| g.elements().2 * g.batch),
        ];
        let upload = |len: usize, seed: u64| {
            self.compute
                .clone_htod(&random_bf16(len, seed))
                .map_err(driver_error("allocating replay buffers"))
        };
        Ok(ReplayBuffers {
            a: upload(sizes[0], 1)?,
            b: upload(sizes[1], 2)?,
            c: upload(sizes[2], 3)?,
        })
    }

    /// Enqueues every product of `gemms` once on the compute stream.
    pub fn replay(&self, gemms: &[Gemm], buffers: &ReplayBuffers) -> Result<()> {
        let bf16 = [sys::cudaDataType::CUDA_R_16BF; 3];
        let compute = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let (a, _) = buffers.a.device_ptr(&self.compute);
        let (b, _) = buffers.b.device_ptr(&self.compute);
        let (c, _) = buffers.c.device_ptr(&self.compute);
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        for g in gemms {
            let call = BlasCall::of(&g.dense())?;
            // SAFETY: the buffers hold the largest batch of each operand (`replay_buffers`), bf16;
            // only this replay uses them.
            unsafe { call.enqueue(self.blas, [a, b, c], bf16, 0.0, compute) }
                .map_err(|e| Error::Backend(format!("cuBLAS GemmStridedBatchedEx {g:?}: {e:?}")))?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// µs of each of `passes` passes over `gemms` on the compute stream, in order, timed with
    /// CUDA events (none for no products); how many warm up and what summarises them is the
    /// caller's.
    pub fn time_replay(
        &self,
        gemms: &[Gemm],
        buffers: &ReplayBuffers,
        passes: usize,
    ) -> Result<Vec<f64>> {
        use crate::backend::{Backend, Stream};
        if gemms.is_empty() {
            return Ok(Vec::new());
        }
        let mut marks = Vec::with_capacity(passes);
        for _ in 0..passes {
            let before = self.mark(Stream::Compute)?;
            self.replay(gemms, buffers)?;
            marks.push((before, self.mark(Stream::Compute)?));
        }
        self.synchronize()?;
        marks.iter().map(|(a, b)| self.elapsed_us(a, b)).collect()
    }
}
