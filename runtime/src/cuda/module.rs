//! A workload's kernels on the GPU: its CUDA C ([`KernelSource`]) compiled by NVRTC for one real
//! architecture, every kernel's parameters read from the source ([`KernelSource::signatures`]),
//! loaded into a context ([`KernelModule`]), and each launch's arguments ([`KernelArg`]) checked
//! against its kernel's parameters before it runs. The backend launches only through
//! [`KernelModule::checked`], so a workload cannot pass a kernel what it does not take.
//!
//! A kernel's parameters are pointers (`float*`, `bf16*`, `double*`, and `act_t*` or `grad_t*`,
//! the storage types of the precision policy a module is compiled for: [`super::storage`]; each
//! also `const`), `long long` (or its `i64` typedef), `int` or `float`; a source with any other
//! type is refused when it is read.

use super::driver_error;
use super::nvrtc::{self, Compiled};
use super::storage;
use crate::backend::FloatFormat;
use crate::{Error, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::Ptx;
use shardplan_scheduler::precision::Precision;
use std::collections::HashMap;
use std::sync::Arc;

/// A workload's CUDA C source: one `extern "C" __global__ void` kernel per operation.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The model it serves, as messages name it ("MLP", "GPT-2").
    pub model: &'static str,
    /// Its file name in NVRTC's messages.
    pub file: &'static str,
    pub text: &'static str,
}

/// A kernel parameter's type, as [`KernelSource::signatures`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// `float*` or `const float*`.
    Floats,
    /// `bf16*` or `const bf16*`.
    Bf16s,
    /// `act_t*`: the policy's parameter format ([`Param::resolve`]).
    Activations,
    /// `grad_t*`: the policy's reduction format.
    Gradients,
    /// `double*` or `const double*`.
    Doubles,
    /// `long long` (`i64`).
    Int,
    /// `int`.
    Int32,
    /// `float`.
    Float,
}

impl Param {
    /// The parameter in a module compiled for `precision`: `act_t*` and `grad_t*` become the
    /// pointers to the formats they stand for.
    pub fn resolve(self, precision: Precision) -> Param {
        let pointer = |format| match format {
            FloatFormat::Fp32 => Param::Floats,
            FloatFormat::Bf16 => Param::Bf16s,
        };
        match self {
            Param::Activations => pointer(precision.param()),
            Param::Gradients => pointer(precision.reduce()),
            other => other,
        }
    }
}

impl KernelSource {
    /// Every kernel in source order: its name, its parameter list and its text up to the next.
    fn kernel_texts(&self) -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
        self.text
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|text| {
                let open = text.find('(').expect("a kernel has a parameter list");
                let close = text.find(')').expect("a parameter list closes");
                (&text[..open], &text[open + 1..close], text)
            })
    }

    /// Every kernel with its parameters, in source order. Panics on a parameter type outside
    /// [`Param`] (a source its workload's tests reject).
    pub fn signatures(&self) -> Vec<(&'static str, Vec<Param>)> {
        self.kernel_texts()
            .map(|(name, list, _)| {
                let params = list
                    .split(',')
                    .map(|p| {
                        let ty = p
                            .trim()
                            .rsplit_once(char::is_whitespace)
                            .map_or("", |(t, _)| t);
                        match ty.trim() {
                            "float*" | "const float*" => Param::Floats,
                            "bf16*" | "const bf16*" => Param::Bf16s,
                            "act_t*" | "const act_t*" => Param::Activations,
                            "grad_t*" | "const grad_t*" => Param::Gradients,
                            "double*" | "const double*" => Param::Doubles,
                            "i64" | "long long" => Param::Int,
                            "int" => Param::Int32,
                            "float" => Param::Float,
                            other => panic!("kernel parameter type `{other}` in `{}`", p.trim()),
                        }
                    })
                    .collect();
                (name, params)
            })
            .collect()
    }

    /// The kernels that call CUDA's math library (`expf`, `logf`, `tanhf`): they round as CUDA's
    /// library does, not as the host's, and its implementations fuse multiply-adds.
    pub fn library_math(&self) -> Vec<&'static str> {
        self.kernel_texts()
            .filter(|(_, _, text)| {
                ["expf(", "logf(", "tanhf("]
                    .iter()
                    .any(|f| text.contains(f))
            })
            .map(|(name, _, _)| name)
            .collect()
    }

    /// The source, after the prelude of `precision` ([`storage::prelude`]), compiled for the real
    /// architecture `arch` (`sm_90` for Hopper) by NVRTC alone (no driver or GPU) without fused
    /// multiply-adds, with IEEE division and square root and denormals kept, as the CPU backend
    /// rounds. Checks that every kernel is in the PTX under its unmangled name and that no fused
    /// multiply-add is, except in the kernels of [`Self::library_math`] (`--fmad` governs only
    /// the source's own expressions).
    pub fn compile(&self, arch: &str, precision: Precision) -> Result<Compiled> {
        let options = [
            "--fmad=false",
            "--prec-div=true",
            "--prec-sqrt=true",
            "--ftz=false",
            &format!("--gpu-architecture={arch}"),
        ]
        .map(String::from);
        let text = format!("{}{}", storage::prelude(precision), self.text);
        let compiled = nvrtc::compile(&text, self.file, &options)?;
        let name = self.file;
        if let Some((entry, _)) = self
            .signatures()
            .into_iter()
            .find(|(entry, _)| !compiled.ptx.contains(&format!(".entry {entry}(")))
        {
            return Err(Error::Backend(format!(
                "NVRTC's PTX of {name} for {arch} has no entry point {entry}"
            )));
        }
        let library_math = self.library_math();
        if let Some(fused) = ptx_entries(&compiled.ptx)
            .into_iter()
            .find(|(entry, body)| body.contains("fma.") && !library_math.contains(entry))
        {
            return Err(Error::Backend(format!(
                "NVRTC fused multiply-adds in {} of {name}'s PTX for {arch} despite --fmad=false",
                if fused.0.is_empty() {
                    "the module"
                } else {
                    fused.0
                }
            )));
        }
        Ok(compiled)
    }
}

/// The PTX cut at each `.entry`: (its name, its text); what precedes the first has the name "".
fn ptx_entries(ptx: &str) -> Vec<(&str, &str)> {
    let mut parts = ptx.split(".entry ");
    let mut entries = vec![("", parts.next().unwrap_or(""))];
    entries.extend(parts.map(|part| (part.split('(').next().unwrap_or("").trim(), part)));
    entries
}

/// The real architecture of the context's GPU (`sm_<major><minor>`).
pub fn architecture(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver_error("reading the compute capability"))?;
    Ok(format!("sm_{major}{minor}"))
}

/// One thread per element, 256 per block: the grid of every launch.
pub fn per_element(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What a pointer argument points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F32,
    Bf16,
    F64,
}

impl Element {
    /// The element of a region of `format`.
    pub fn of(format: FloatFormat) -> Element {
        match format {
            FloatFormat::Fp32 => Element::F32,
            FloatFormat::Bf16 => Element::Bf16,
        }
    }
}

/// Device memory a kernel may be given: made only by the backend, from a region checked against
/// the arena, a loss slot, or a buffer it allocated ([`super::CudaBackend::scratch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePointer {
    pub(super) address: CUdeviceptr,
    element: Element,
}

impl DevicePointer {
    /// Only the backend, which owns the memory behind `address`, makes one.
    pub(super) fn new(address: CUdeviceptr, element: Element) -> Self {
        DevicePointer { address, element }
    }
}

/// One argument of a launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    Pointer(DevicePointer),
    Int(i64),
    Int32(i32),
    Float(f32),
}

/// Whether `arg` can be passed for a parameter of type `param`.
fn accepts(param: Param, arg: &KernelArg) -> bool {
    use KernelArg::*;
    matches!(
        (param, arg),
        (Param::Int, Int(_)) | (Param::Int32, Int32(_)) | (Param::Float, Float(_))
    ) || matches!(
        (param, arg),
        (Param::Floats, Pointer(p)) if p.element == Element::F32
    ) || matches!(
        (param, arg),
        (Param::Bf16s, Pointer(p)) if p.element == Element::Bf16
    ) || matches!(
        (param, arg),
        (Param::Doubles, Pointer(p)) if p.element == Element::F64
    )
}

/// A source's kernels compiled for one precision policy and loaded into one context, by name,
/// with their parameters (resolved for that policy).
pub struct KernelModule {
    model: &'static str,
    functions: HashMap<&'static str, (CudaFunction, Vec<Param>)>,
}

impl KernelModule {
    /// Compiles `source` for the context's GPU and `precision` and loads its machine code into
    /// `ctx`.
    pub fn load(
        ctx: &Arc<CudaContext>,
        source: &KernelSource,
        precision: Precision,
    ) -> Result<Self> {
        let compiled = source.compile(&architecture(ctx)?, precision)?;
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(|e| {
                Error::Backend(format!("cannot load the {} kernels: {e}", source.model))
            })?;
        let functions = source
            .signatures()
            .into_iter()
            .map(|(name, params)| {
                let params = params.into_iter().map(|p| p.resolve(precision)).collect();
                module
                    .load_function(name)
                    .map(|f| (name, (f, params)))
                    .map_err(|e| Error::Backend(format!("kernel {name} is missing: {e}")))
            })
            .collect::<Result<_>>()?;
        Ok(KernelModule {
            model: source.model,
            functions,
        })
    }

    /// The function `kernel` names, once `args` are checked against its parameters.
    pub(super) fn checked(&self, kernel: &str, args: &[KernelArg]) -> Result<&CudaFunction> {
        let (function, params) = self
            .functions
            .get(kernel)
            .ok_or_else(|| Error::Backend(format!("no {} kernel named {kernel}", self.model)))?;
        let fits =
            args.len() == params.len() && params.iter().zip(args).all(|(p, a)| accepts(*p, a));
        if !fits {
            return Err(Error::Backend(format!(
                "kernel {kernel} takes {params:?}, launched with {args:?}"
            )));
        }
        Ok(function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: KernelSource = KernelSource {
        model: "test",
        file: "test.cu",
        text: r#"
typedef long long i64;
extern "C" __global__ void scale(float* x, const float* y, float s, i64 n) {
    i64 i = blockIdx.x;
    if (i < n) x[i] = y[i] * s;
}
extern "C" __global__ void rows(double* out, int rows, long long cols) {
    out[0] = expf((float)rows * cols);
}
extern "C" __global__ void stored(const act_t* x, grad_t* g, bf16* b) {
    st(g, ld(x));
    st(b, ld(x));
}
"#,
    };

    /// The reader finds every kernel with its parameters, and the library's callers.
    #[test]
    fn signatures_read_every_kernel_and_its_parameter_types() {
        assert_eq!(
            SOURCE.signatures(),
            [
                (
                    "scale",
                    vec![Param::Floats, Param::Floats, Param::Float, Param::Int]
                ),
                ("rows", vec![Param::Doubles, Param::Int32, Param::Int]),
                (
                    "stored",
                    vec![Param::Activations, Param::Gradients, Param::Bf16s]
                ),
            ]
        );
        assert_eq!(SOURCE.library_math(), ["rows"]);
    }

    /// `act_t*` and `grad_t*` become the pointers of each policy's formats.
    #[test]
    fn storage_parameters_resolve_to_each_policys_formats() {
        let [fp32, bf16_fp32, bf16] = Precision::ALL;
        let resolved = |p: Precision| {
            [
                Param::Activations,
                Param::Gradients,
                Param::Floats,
                Param::Int,
            ]
            .map(|q| q.resolve(p))
        };
        use Param::*;
        assert_eq!(resolved(fp32), [Floats, Floats, Floats, Int]);
        assert_eq!(resolved(bf16_fp32), [Bf16s, Floats, Floats, Int]);
        assert_eq!(resolved(bf16), [Bf16s, Bf16s, Floats, Int]);
    }

    /// A pointer is accepted only for its own element type, a number only for its own width.
    #[test]
    fn arguments_fit_only_their_own_parameter_types() {
        let floats = KernelArg::Pointer(DevicePointer::new(256, Element::F32));
        let doubles = KernelArg::Pointer(DevicePointer::new(256, Element::F64));
        let halves = KernelArg::Pointer(DevicePointer::new(256, Element::Bf16));
        assert!(accepts(Param::Floats, &floats));
        assert!(!accepts(Param::Floats, &doubles));
        assert!(!accepts(Param::Floats, &halves));
        assert!(accepts(Param::Bf16s, &halves));
        assert!(!accepts(Param::Bf16s, &floats));
        // An unresolved storage parameter takes nothing: a module resolves them when it loads.
        assert!(!accepts(Param::Activations, &floats));
        assert!(!accepts(Param::Activations, &halves));
        assert!(accepts(Param::Doubles, &doubles));
        assert!(!accepts(Param::Doubles, &floats));
        assert!(accepts(Param::Int, &KernelArg::Int(3)));
        assert!(!accepts(Param::Int, &KernelArg::Int32(3)));
        assert!(!accepts(Param::Int32, &KernelArg::Int(3)));
        assert!(!accepts(Param::Float, &KernelArg::Int(3)));
        assert!(!accepts(Param::Floats, &KernelArg::Float(1.0)));
    }
}
