//! How a kernel source stores floats: the prelude every module is compiled with. It defines
//! `bf16` (the 16 bits of a bfloat16), `ld` and `st` for `float` and `bf16` storage (a bf16
//! value is widened exactly on load and rounded to nearest, ties to even, on store, as the
//! `half` crate and the CPU backend round), `bf16_round` (a float rounded to bf16's precision)
//! and the two storage types of the run's precision policy: `act_t` (parameters, activations and
//! their gradients) and `grad_t` (parameter gradients, in the reduction's format). A kernel
//! computes in `float` and reads and writes `act_t`/`grad_t` through `ld`/`st`, so one source
//! serves every policy (DESIGN §6.9).
//!
//! The prelude is plain C++ apart from `__device__`, so the host tests compile it too. Here too:
//! the host's packing of bf16 values into the arena's words (uploads and downloads).

use crate::backend::FloatFormat;
use shardplan_scheduler::precision::Precision;

/// The prelude without its typedefs.
pub const FORMATS: &str = r#"
struct bf16 { unsigned short bits; };
union FloatWord { float f; unsigned u; };

// v rounded to bf16, to nearest with ties to even; a NaN stays a (quiet) NaN (half::bf16::from_f32).
static __device__ unsigned short bf16_bits(float v) {
    union FloatWord w;
    w.f = v;
    if ((w.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((w.u >> 16) | 0x0040u);
    unsigned short truncated = (unsigned short)(w.u >> 16);
    if ((w.u & 0x8000u) != 0u && (w.u & 0x17fffu) != 0u) return (unsigned short)(truncated + 1u);
    return truncated;
}

static __device__ float bf16_float(unsigned short bits) {
    union FloatWord w;
    w.u = (unsigned)bits << 16;
    return w.f;
}

// v as bf16 holds it, kept in a float.
static __device__ float bf16_round(float v) { return bf16_float(bf16_bits(v)); }

static __device__ float ld(const float* p) { return *p; }
static __device__ float ld(const bf16* p) { return bf16_float(p->bits); }
static __device__ void st(float* p, float v) { *p = v; }
static __device__ void st(bf16* p, float v) { p->bits = bf16_bits(v); }
"#;

/// The C type of `format`.
fn c_type(format: FloatFormat) -> &'static str {
    match format {
        FloatFormat::Fp32 => "float",
        FloatFormat::Bf16 => "bf16",
    }
}

/// [`FORMATS`] and the typedefs of `precision`: `act_t` its parameters' format, `grad_t` its
/// reductions'.
pub fn prelude(precision: Precision) -> String {
    format!(
        "{FORMATS}typedef {} act_t;\ntypedef {} grad_t;\n",
        c_type(precision.param()),
        c_type(precision.reduce())
    )
}

/// `data` as bf16, two to a 4-byte word (the first in the low half), as the arena stores them.
pub fn pack_bf16(data: &[f32]) -> Vec<f32> {
    data.chunks(2)
        .map(|pair| {
            let bits = |k: usize| {
                pair.get(k)
                    .map_or(0, |v| half::bf16::from_f32(*v).to_bits())
            };
            f32::from_bits(u32::from(bits(0)) | (u32::from(bits(1)) << 16))
        })
        .collect()
}

/// The first `out.len()` bf16 values of `words` (as [`pack_bf16`] packs them), widened.
pub fn unpack_bf16(words: &[f32], out: &mut [f32]) {
    for (i, v) in out.iter_mut().enumerate() {
        let word = words[i / 2].to_bits();
        let bits = if i % 2 == 0 {
            word & 0xffff
        } else {
            word >> 16
        };
        *v = half::bf16::from_bits(bits as u16).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing rounds to nearest (ties to even) and unpacking returns what was packed.
    #[test]
    fn packed_bf16_round_to_nearest_and_unpack_exactly() {
        let tie_down = f32::from_bits(0x3f80_8000); // 1 + 2^-8: halfway, even below
        let tie_up = f32::from_bits(0x3f81_8000); // halfway, even above
        let data = [1.0, -2.5, tie_down, tie_up, 3.0e38];
        let words = pack_bf16(&data);
        assert_eq!(words.len(), 3);
        assert_eq!(words[0].to_bits(), 0xc020_3f80);
        let mut out = [0.0; 5];
        unpack_bf16(&words, &mut out);
        assert_eq!(out[..2], [1.0, -2.5]);
        assert_eq!(out[2].to_bits(), 0x3f80_0000);
        assert_eq!(out[3].to_bits(), 0x3f82_0000);
        assert_eq!(out[4], half::bf16::from_f32(3.0e38).to_f32());
    }
}
