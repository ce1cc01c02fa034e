//! GPT-2's element-wise and row kernels for the CUDA backend, compiled by NVRTC when a backend
//! first runs GPT-2. Each computes what its namesake in [`super::kernels`] computes, in the same
//! order of floating-point operations (compiled without fused multiply-adds), so on the host the
//! kernels equal the CPU backend bitwise. Element-wise kernels take one thread per element. The
//! column sums (bias and LayerNorm parameter gradients) take a block per 32 columns, each
//! column's rows split over 8 row lanes whose sums it adds in lane order
//! ([`super::kernels::RowLanes`]). The row kernels (LayerNorm, the attention softmax and its
//! backward, the logits' softmax) take one block of [`LANES`] threads per row: lane l walks the
//! row's elements l, l + LANES, … (a warp reads consecutive floats), and the block adds the
//! lanes' partial sums in lane order through shared memory (`block_sum`, `block_max`), as the
//! CPU backend adds them ([`super::kernels::lane_sum`]). No kernel uses atomics: a test runs
//! this very source on the CPU, each block's threads at once where the kernel synchronises them,
//! else one thread after another (runtime/tests/cuda_gpt2_kernels.rs). The products are
//! cuBLAS's ([`super::launches`]).
//!
//! Every kernel's parameters are pointers (`float*`, `double*`, and `act_t*` or `grad_t*`: the
//! storage of the precision policy the module is compiled for, [`crate::cuda::storage`]),
//! `long long` or `float`, so a launch is a list of [`Arg`]s checked against the signatures
//! [`KERNELS`] reads from the source, resolved for the policy ([`check_arguments`], on the host;
//! the backend checks the device arguments again at launch). The kernels compute in `float` and
//! load and store through `ld`/`st`, so under bf16 each stored value is rounded once, where the
//! CPU backend rounds it (`gpt2/cpu.rs`); a kernel that updates an element in place keeps its
//! intermediate values in registers.

pub use super::kernels::LANES;
use super::launches::{Arg, Kernel};
use crate::backend::FloatFormat;
use crate::cuda::module::{KernelSource, Param};
use crate::{Error, Result};

/// The CUDA C source: one `extern "C"` kernel per operation.
pub const SOURCE: &str = r#"
typedef long long i64;
#define THREAD ((i64)blockIdx.x * blockDim.x + threadIdx.x)
#define GELU_SCALE 0.7978846f
// Threads of a row kernel's block (gpt2::kernels::LANES): one block per row, the grid's blocks.
#define LANES 256
// A column kernel's block: COLUMNS columns, each summed by ROW_LANES lanes (gpt2::kernels).
#define ROW_LANES 8
#define COLUMNS (LANES / ROW_LANES)

union FloatBits { float f; int i; };

// -infinity, which NVRTC does not name.
static __device__ float minus_infinity() {
    union FloatBits bits;
    bits.i = (int)0xff800000;
    return bits.f;
}

// The block's sum of each lane's `partial`: every thread adds the lanes' partials in lane order
// (gpt2::kernels::lane_sum; shared memory broadcasts each to the whole block). Every thread of
// the block calls it and gets the sum.
static __device__ float block_sum(float* lanes, float partial) {
    lanes[threadIdx.x] = partial;
    __syncthreads();
    float total = 0.0f;
    for (unsigned l = 0; l < LANES; ++l) total += lanes[l];
    __syncthreads();
    return total;
}

// The block's largest `partial` (the maximum is exact in any order).
static __device__ float block_max(float* lanes, float partial) {
    lanes[threadIdx.x] = partial;
    __syncthreads();
    float max = lanes[0];
    for (unsigned l = 1; l < LANES; ++l) max = fmaxf(max, lanes[l]);
    __syncthreads();
    return max;
}

extern "C" __global__ void fill_values(act_t* x, float value, i64 n) {
    i64 i = THREAD;
    if (i < n) st(x + i, value);
}

extern "C" __global__ void copy_values(const act_t* src, act_t* dst, i64 n) {
    i64 i = THREAD;
    if (i < n) st(dst + i, ld(src + i));
}

extern "C" __global__ void add_values(const act_t* src, act_t* dst, i64 n) {
    i64 i = THREAD;
    if (i < n) st(dst + i, ld(dst + i) + ld(src + i));
}

// x rounded to bf16's precision in its fp32 storage: what a bf16 run keeps in fp32 (the logits
// and their gradient, parameter gradients reduced in fp32) as its bf16 tensor holds it.
extern "C" __global__ void round_values(float* x, i64 n) {
    i64 i = THREAD;
    if (i < n) x[i] = bf16_round(x[i]);
}

// dst = src in the activations' format.
extern "C" __global__ void store_values(const float* src, act_t* dst, i64 n) {
    i64 i = THREAD;
    if (i < n) st(dst + i, src[i]);
}

// out[r, j] = bias[j]: a linear layer's output before its product is added.
extern "C" __global__ void bias_rows(act_t* out, const act_t* bias, i64 rows, i64 cols) {
    i64 i = THREAD;
    if (i < rows * cols) st(out + i, ld(bias + i % cols));
}

// out[j] += the sum over the rows of x[r, j] (a bias gradient): a block per COLUMNS columns;
// row lane q sums rows q, q + ROW_LANES, ... in order, then out[j] adds the lanes' sums in lane
// order (gpt2::kernels::RowLanes).
extern "C" __global__ void column_sums_add(const act_t* x, grad_t* out, i64 rows, i64 cols) {
    __shared__ float lanes[LANES];
    unsigned c = threadIdx.x % COLUMNS, q = threadIdx.x / COLUMNS;
    i64 j = (i64)blockIdx.x * COLUMNS + c;
    float sum = 0.0f;
    if (j < cols)
        for (i64 r = q; r < rows; r += ROW_LANES) sum += ld(x + r * cols + j);
    lanes[threadIdx.x] = sum;
    __syncthreads();
    if (q == 0 && j < cols) {
        float total = ld(out + j);
        for (unsigned p = 0; p < ROW_LANES; ++p) total += lanes[p * COLUMNS + c];
        st(out + j, total);
    }
}

// out[r] = wte[token[r]] + wpe[r mod seq].
extern "C" __global__ void embedding_forward(const float* tokens, const act_t* wte,
                                             const act_t* wpe, act_t* out, i64 rows, i64 seq,
                                             i64 hidden) {
    i64 i = THREAD;
    if (i >= rows * hidden) return;
    i64 r = i / hidden, k = i % hidden;
    i64 token = (i64)tokens[r];
    st(out + i, ld(wte + token * hidden + k) + ld(wpe + (r % seq) * hidden + k));
}

// links[r] = the next row after r with r's token (-1: none); links[rows + r] = 1 where no row
// before r has its token (r leads its token's rows), else 0.
extern "C" __global__ void token_links(const float* tokens, float* links, i64 rows) {
    i64 r = THREAD;
    if (r >= rows) return;
    float token = tokens[r];
    i64 next = -1, lead = 1;
    for (i64 q = r + 1; q < rows && next < 0; ++q)
        if (tokens[q] == token) next = q;
    for (i64 q = r - 1; q >= 0 && lead == 1; --q)
        if (tokens[q] == token) lead = 0;
    links[r] = (float)next;
    links[rows + r] = (float)lead;
}

// dwte[token, k] += dout[r, k] over the token's rows in order (token_links): thread (r, k) of a
// row that leads its token follows the links, its sum in a float, stored once.
extern "C" __global__ void embedding_backward_tokens(const float* tokens, const float* links,
                                                     const act_t* dout, grad_t* dwte, i64 rows,
                                                     i64 hidden) {
    i64 i = THREAD;
    if (i >= rows * hidden) return;
    i64 r = i / hidden, k = i % hidden;
    if (links[rows + r] == 0.0f) return;
    grad_t* d = dwte + (i64)tokens[r] * hidden + k;
    float sum = ld(d);
    for (i64 q = r; q >= 0; q = (i64)links[q]) sum = sum + ld(dout + q * hidden + k);
    st(d, sum);
}

// dwpe[p, k] += dout[r, k] over the rows r of position p, in order.
extern "C" __global__ void embedding_backward_positions(const act_t* dout, grad_t* dwpe,
                                                        i64 rows, i64 seq, i64 hidden) {
    i64 i = THREAD;
    if (i >= seq * hidden) return;
    i64 p = i / hidden, k = i % hidden;
    float sum = ld(dwpe + i);
    for (i64 r = p; r < rows; r += seq) sum += ld(dout + r * hidden + k);
    st(dwpe + i, sum);
}

// One block per row, lane l over the columns l, l + LANES, ...: mean, 1/sigma (saved),
// out = (x - mean) / sigma * weight + bias.
extern "C" __global__ void layernorm_forward(const act_t* x, const act_t* weight,
                                             const act_t* bias, act_t* out, float* mean,
                                             float* rstd, i64 rows, i64 width) {
    __shared__ float lanes[LANES];
    i64 r = blockIdx.x;
    if (r >= rows) return;
    unsigned l = threadIdx.x;
    const act_t* row = x + r * width;
    float sum = 0.0f;
    for (i64 k = l; k < width; k += LANES) sum += ld(row + k);
    float m = block_sum(lanes, sum) / (float)width;
    float squares = 0.0f;
    for (i64 k = l; k < width; k += LANES) squares += (ld(row + k) - m) * (ld(row + k) - m);
    float var = block_sum(lanes, squares) / (float)width;
    float s = 1.0f / sqrtf(var + 1e-5f);
    act_t* o = out + r * width;
    for (i64 k = l; k < width; k += LANES)
        st(o + k, (ld(row + k) - m) * s * ld(weight + k) + ld(bias + k));
    if (l == 0) {
        mean[r] = m;
        rstd[r] = s;
    }
}

// One block per row: dx += the input gradient (the residual stream's is already there).
extern "C" __global__ void layernorm_backward_input(const act_t* dout, const act_t* x,
                                                    const act_t* weight, const float* mean,
                                                    const float* rstd, act_t* dx, i64 rows,
                                                    i64 width) {
    __shared__ float lanes[LANES];
    i64 r = blockIdx.x;
    if (r >= rows) return;
    unsigned l = threadIdx.x;
    float m = mean[r], s = rstd[r];
    const act_t* row = x + r * width;
    const act_t* g = dout + r * width;
    float dn_sum = 0.0f, dn_xhat_sum = 0.0f;
    for (i64 k = l; k < width; k += LANES) {
        float xhat = (ld(row + k) - m) * s;
        float dn = ld(g + k) * ld(weight + k);
        dn_sum += dn;
        dn_xhat_sum += dn * xhat;
    }
    float mean_dn = block_sum(lanes, dn_sum) / (float)width;
    float mean_dn_xhat = block_sum(lanes, dn_xhat_sum) / (float)width;
    act_t* d = dx + r * width;
    for (i64 k = l; k < width; k += LANES) {
        float xhat = (ld(row + k) - m) * s;
        st(d + k, ld(d + k) + s * (ld(g + k) * ld(weight + k) - mean_dn - xhat * mean_dn_xhat));
    }
}

// dweight += sum over rows of dout * xhat, dbias += sum of dout, per column as column_sums_add
// sums (a block per COLUMNS columns, ROW_LANES row lanes, the lanes' sums in lane order).
extern "C" __global__ void layernorm_backward_params(const act_t* dout, const act_t* x,
                                                     const float* mean, const float* rstd,
                                                     grad_t* dweight, grad_t* dbias, i64 rows,
                                                     i64 width) {
    __shared__ float weight_lanes[LANES];
    __shared__ float bias_lanes[LANES];
    unsigned c = threadIdx.x % COLUMNS, q = threadIdx.x / COLUMNS;
    i64 k = (i64)blockIdx.x * COLUMNS + c;
    float dw = 0.0f, db = 0.0f;
    if (k < width)
        for (i64 r = q; r < rows; r += ROW_LANES) {
            float g = ld(dout + r * width + k);
            float xhat = (ld(x + r * width + k) - mean[r]) * rstd[r];
            db = db + g;
            dw = dw + g * xhat;
        }
    weight_lanes[threadIdx.x] = dw;
    bias_lanes[threadIdx.x] = db;
    __syncthreads();
    if (q == 0 && k < width) {
        float w = ld(dweight + k), b = ld(dbias + k);
        for (unsigned p = 0; p < ROW_LANES; ++p) {
            w = w + weight_lanes[p * COLUMNS + c];
            b = b + bias_lanes[p * COLUMNS + c];
        }
        st(dweight + k, w);
        st(dbias + k, b);
    }
}

// e^x without the math library, as gpt2::kernels::exp_poly computes it (same operations, same
// constants): clamp, k = floor(x log2 e + 1/2) from a truncation, r = x - k ln 2 in two parts,
// Cephes' polynomial, times 2^k from the exponent bits.
static __device__ float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // NaN stays NaN, as Rust's clamp
    float m = x * 1.442695f + 0.5f;  // log2 e rounded to f32, as f32::consts::LOG2_E
    int truncated = (int)m;
    int k = truncated - (m < (float)truncated ? 1 : 0);
    float n = (float)k;
    float r = x - n * 0.6933594f;
    r = r - n * -2.1219444e-4f;
    float p = 1.9875691e-4f;
    p = p * r + 1.3981999e-3f;
    p = p * r + 8.333452e-3f;
    p = p * r + 4.1665796e-2f;
    p = p * r + 0.16666666f;
    p = p * r + 0.5f;
    float e = p * (r * r) + r + 1.0f;
    union FloatBits scale;
    scale.i = (k + 127) << 23;
    return e * scale.f;
}

// tanh u = 1 - 2 / (e^(2u) + 1), as gpt2::kernels::tanh_poly.
static __device__ float tanh_poly(float u) {
    return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f);
}

// GELU, tanh approximation (transformers' gelu_new).
extern "C" __global__ void gelu_forward(const act_t* x, act_t* out, i64 n) {
    i64 i = THREAD;
    if (i >= n) return;
    float v = ld(x + i);
    float cube = 0.044715f * v * v * v;
    st(out + i, 0.5f * v * (1.0f + tanh_poly(GELU_SCALE * (v + cube))));
}

// d *= gelu'(x), in place.
extern "C" __global__ void gelu_backward(const act_t* x, act_t* d, i64 n) {
    i64 i = THREAD;
    if (i >= n) return;
    float v = ld(x + i);
    float cube = 0.044715f * v * v * v;
    float t = tanh_poly(GELU_SCALE * (v + cube));
    float sech2 = 1.0f - t * t;
    float local = 0.5f * (1.0f + t) + 0.5f * v * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * v * v);
    st(d + i, ld(d + i) * local);
}

// One block per score row (sample, head, t), in place: softmax of scale * q.k over the
// positions up to t, zero after it. Each score is read three times and written once, so a bf16
// row is rounded once (the exponentials are taken again rather than stored).
extern "C" __global__ void causal_softmax(act_t* scores, float scale, i64 rows, i64 seq) {
    __shared__ float lanes[LANES];
    i64 i = blockIdx.x;
    if (i >= rows) return;
    unsigned l = threadIdx.x;
    i64 t = i % seq;
    act_t* p = scores + i * seq;
    float max = minus_infinity();
    for (i64 u = l; u <= t; u += LANES) max = fmaxf(max, ld(p + u) * scale);
    max = block_max(lanes, max);
    float sum = 0.0f;
    for (i64 u = l; u <= t; u += LANES) sum += expf(ld(p + u) * scale - max);
    sum = block_sum(lanes, sum);
    for (i64 u = l; u <= t; u += LANES) st(p + u, expf(ld(p + u) * scale - max) / sum);
    for (i64 u = t + 1 + l; u < seq; u += LANES) st(p + u, 0.0f);
}

// One block per row, in place on d(probs): d(scores) = p * (dp - sum p*dp) * scale.
extern "C" __global__ void causal_softmax_backward(const act_t* probs, act_t* dprobs,
                                                   float scale, i64 rows, i64 seq) {
    __shared__ float lanes[LANES];
    i64 i = blockIdx.x;
    if (i >= rows) return;
    unsigned l = threadIdx.x;
    i64 t = i % seq;
    const act_t* p = probs + i * seq;
    act_t* dp = dprobs + i * seq;
    float inner = 0.0f;
    for (i64 u = l; u <= t; u += LANES) inner += ld(p + u) * ld(dp + u);
    inner = block_sum(lanes, inner);
    for (i64 u = l; u <= t; u += LANES) st(dp + u, ld(p + u) * (ld(dp + u) - inner) * scale);
    for (i64 u = t + 1 + l; u < seq; u += LANES) st(dp + u, 0.0f);
}

// One block per row of logits, replaced by its softmax.
extern "C" __global__ void softmax_rows(float* logits, i64 rows, i64 vocab) {
    __shared__ float lanes[LANES];
    i64 r = blockIdx.x;
    if (r >= rows) return;
    unsigned l = threadIdx.x;
    float* row = logits + r * vocab;
    float max = minus_infinity();
    for (i64 k = l; k < vocab; k += LANES) max = fmaxf(max, row[k]);
    max = block_max(lanes, max);
    float sum = 0.0f;
    for (i64 k = l; k < vocab; k += LANES) {
        row[k] = expf(row[k] - max);
        sum += row[k];
    }
    sum = block_sum(lanes, sum);
    for (i64 k = l; k < vocab; k += LANES) row[k] = row[k] / sum;
}

// partials[j] = -sum of log p[target] over the rows j, j + parts, ... (in double).
extern "C" __global__ void nll_partials(const float* probs, const float* targets, i64 rows,
                                        i64 vocab, i64 parts, double* partials) {
    i64 j = THREAD;
    if (j >= parts) return;
    double sum = 0.0;
    for (i64 r = j; r < rows; r += parts)
        sum = sum - (double)logf(probs[r * vocab + (i64)targets[r]]);
    partials[j] = sum;
}

// One thread: the partials summed in order, times scale, into the step's loss slot.
extern "C" __global__ void sum_loss(const double* partials, i64 parts, float scale,
                                    float* loss) {
    if (THREAD != 0) return;
    double sum = 0.0;
    for (i64 j = 0; j < parts; ++j) sum = sum + partials[j];
    *loss = (float)(sum * (double)scale);
}

// probs <- (probs - onehot(target)) * scale, in place.
extern "C" __global__ void cross_entropy_backward(float* probs, const float* targets, i64 rows,
                                                  i64 vocab, float scale) {
    i64 i = THREAD;
    if (i >= rows * vocab) return;
    float v = probs[i];
    if (i % vocab == (i64)targets[i / vocab]) v = v - 1.0f;
    probs[i] = v * scale;
}

// One AdamW step on elements from, ..., from + n - 1 (a run that decays alike); the step's
// scalars come from the host (AdamW::at_step).
extern "C" __global__ void adamw(float* params, const grad_t* grads, float* m, float* v, i64 from,
                                 i64 n, float shrink, float beta2, float eps,
                                 float one_minus_beta1, float one_minus_beta2, float step_size,
                                 float bias_correction2_sqrt) {
    i64 k = THREAD;
    if (k >= n) return;
    k += from;
    float g = ld(grads + k);
    float p = params[k] * shrink;
    m[k] = m[k] + (g - m[k]) * one_minus_beta1;
    v[k] = v[k] * beta2 + one_minus_beta2 * g * g;
    float denom = sqrtf(v[k]) / bias_correction2_sqrt + eps;
    params[k] = p - step_size * m[k] / denom;
}
"#;

/// GPT-2's kernels as the backend compiles and loads them.
pub const KERNELS: KernelSource = KernelSource {
    model: "GPT-2",
    file: "shardplan_gpt2.cu",
    text: SOURCE,
};

/// Whether `arg` can be passed for a parameter of type `param` (resolved for a policy).
fn accepts(param: Param, arg: &Arg) -> bool {
    matches!(
        (param, arg),
        (Param::Floats, Arg::LossSlot(_) | Arg::TokenLinks)
            | (Param::Doubles, Arg::LossPartials)
            | (Param::Int, Arg::Int(_))
            | (Param::Float, Arg::Float(_))
    ) || matches!(
        (param, arg),
        (Param::Floats, Arg::Floats(r)) if r.format == FloatFormat::Fp32
    ) || matches!(
        (param, arg),
        (Param::Bf16s, Arg::Floats(r)) if r.format == FloatFormat::Bf16
    )
}

/// Why `kernel`'s arguments do not fit `params` (resolved for the policy of its module), if they
/// do not.
pub fn check_arguments(kernel: &Kernel, params: &[Param]) -> Result<()> {
    let fits = kernel.args.len() == params.len()
        && params.iter().zip(&kernel.args).all(|(p, a)| accepts(*p, a));
    if fits {
        Ok(())
    } else {
        Err(Error::Backend(format!(
            "kernel {} takes {params:?}, launched with {:?}",
            kernel.name, kernel.args
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signature reader finds every kernel of the source with its parameters.
    #[test]
    fn signatures_read_every_kernel() {
        let kernels = KERNELS.signatures();
        assert_eq!(
            kernels.len(),
            SOURCE.matches("__global__").count(),
            "{kernels:?}"
        );
        let (name, params) = &kernels[0];
        assert_eq!(*name, "fill_values");
        assert_eq!(params, &[Param::Activations, Param::Float, Param::Int]);
        let nll = kernels.iter().find(|(n, _)| *n == "nll_partials").unwrap();
        assert_eq!(nll.1.last(), Some(&Param::Doubles));
    }

    /// The row and column kernels' blocks are the launch grid's blocks, of the CPU's lanes.
    #[test]
    fn a_row_kernels_block_is_the_grids_block_of_the_cpus_lanes() {
        assert!(SOURCE.contains(&format!("#define LANES {LANES}\n")));
        let row_lanes = super::super::kernels::ROW_LANES;
        assert!(SOURCE.contains(&format!("#define ROW_LANES {row_lanes}\n")));
        let grid = crate::cuda::module::per_element(3 * LANES);
        assert_eq!((grid.grid_dim.0, grid.block_dim.0), (3, LANES as u32));
    }

    /// Exactly the kernels that call exp, log or tanh may hold the library's fused multiply-adds.
    #[test]
    fn library_math_names_the_transcendental_kernels() {
        assert_eq!(
            KERNELS.library_math(),
            ["causal_softmax", "softmax_rows", "nll_partials"]
        );
    }
}
