//! GPT-2's launches run on the host (runtime/tests/cuda_gpt2_kernels.rs): the kernel source,
//! after a precision policy's prelude, compiled with the shim; each kernel called through a
//! wrapper that reads its arguments as `cuLaunchKernel` takes them; the products on the host's
//! strided product, each operand widened from its format and the output rounded to its own.

use crate::shim;
use shardplan_runtime::backend::{FloatFormat, Operand};
use shardplan_runtime::cuda::module::{Param, per_element};
use shardplan_runtime::cuda::storage;
use shardplan_runtime::gpt2::cuda_source::{KERNELS, SOURCE, check_arguments};
use shardplan_runtime::gpt2::launches::{Arg, Launch, NLL_PARTIALS};
use shardplan_scheduler::precision::Precision;
use std::ffi::c_void;

/// `run_<kernel>(blocks, threads, args)`: every thread of the grid in turn, the arguments read
/// from an array of pointers to them (as `cuLaunchKernel` takes them), cast to the signature's
/// types.
fn wrappers() -> String {
    let mut out = String::new();
    for (name, params) in KERNELS.signatures() {
        let args: Vec<String> = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ty = match p {
                    Param::Floats => "float*",
                    Param::Bf16s => "bf16*",
                    Param::Activations => "act_t*",
                    Param::Gradients => "grad_t*",
                    Param::Doubles => "double*",
                    Param::Int => "long long",
                    Param::Int32 => "int",
                    Param::Float => "float",
                };
                format!("*({ty}*)args[{i}]")
            })
            .collect();
        let grid = if synchronises(name) {
            "block_grid"
        } else {
            "grid"
        };
        out.push_str(&format!(
            "extern \"C\" void run_{name}(unsigned g, unsigned t, void** args) {{\n    {grid}(g, t, [&] {{ {name}({}); }});\n}}\n",
            args.join(", ")
        ));
    }
    out
}

/// Whether kernel `name` synchronises its block (its body declares shared memory, which only
/// the block reductions use).
fn synchronises(name: &str) -> bool {
    let start = SOURCE
        .find(&format!("__global__ void {name}("))
        .unwrap_or_else(|| panic!("{name} is not in the source"));
    let body = &SOURCE[start..];
    let end = body[1..].find("__global__").map_or(body.len(), |e| e + 1);
    body[..end].contains("__shared__")
}

type Wrapper = unsafe extern "C" fn(u32, u32, *mut *mut c_void);

/// The CUDA backend's work on the host: an arena, the loss partials and slots, the token links,
/// the kernels compiled for one precision policy.
pub struct HostDevice {
    lib: libloading::Library,
    /// Where the library lies (removed when dropped).
    _dir: tempfile::TempDir,
    pub precision: Precision,
    pub arena: Vec<f32>,
    partials: Vec<f64>,
    pub losses: Vec<f32>,
    pub links: Vec<f32>,
}

/// One argument's storage, pointed to from the argument array.
enum Value {
    Pointer(*mut c_void),
    Int(i64),
    Float(f32),
}

/// The `extent` elements of `operand` in `arena`, widened (bf16 as the backend unpacks a
/// download, `storage::unpack_bf16`).
fn read_operand(arena: &[f32], operand: Operand, extent: usize) -> Vec<f32> {
    let Operand { region, at } = operand;
    assert!(at + extent <= region.len, "{operand:?} of {extent}");
    let words = &arena[region.offset..region.offset + region.words()];
    match region.format {
        FloatFormat::Fp32 => words[at..at + extent].to_vec(),
        FloatFormat::Bf16 => {
            let mut values = vec![0.0; at + extent];
            storage::unpack_bf16(words, &mut values);
            values.split_off(at)
        }
    }
}

/// `values` into `operand` in `arena`, rounded to its format.
fn write_operand(arena: &mut [f32], operand: Operand, values: &[f32]) {
    let Operand { region, at } = operand;
    for (j, v) in values.iter().enumerate() {
        let e = at + j;
        match region.format {
            FloatFormat::Fp32 => arena[region.offset + e] = *v,
            FloatFormat::Bf16 => {
                let w = &mut arena[region.offset + e / 2];
                let bits = u32::from(half::bf16::from_f32(*v).to_bits());
                let word = match e % 2 {
                    0 => (w.to_bits() & 0xffff_0000) | bits,
                    _ => (w.to_bits() & 0xffff) | (bits << 16),
                };
                *w = f32::from_bits(word);
            }
        }
    }
}

impl HostDevice {
    pub fn run(&mut self, launches: &[Launch]) {
        let kernels = KERNELS.signatures();
        for launch in launches {
            for r in launch.regions() {
                assert!(
                    r.offset + r.words() <= self.arena.len(),
                    "{r:?} in {launch:?}"
                );
            }
            match launch {
                Launch::Kernel(k) => {
                    let params: Vec<Param> = kernels
                        .iter()
                        .find(|(n, _)| *n == k.name)
                        .unwrap()
                        .1
                        .iter()
                        .map(|p| p.resolve(self.precision))
                        .collect();
                    check_arguments(k, &params).unwrap();
                    let mut values: Vec<Value> = k
                        .args
                        .iter()
                        .map(|a| match *a {
                            Arg::Floats(r) => {
                                Value::Pointer(self.arena[r.offset..].as_mut_ptr().cast())
                            }
                            Arg::TokenLinks => Value::Pointer(self.links.as_mut_ptr().cast()),
                            Arg::LossPartials => Value::Pointer(self.partials.as_mut_ptr().cast()),
                            Arg::LossSlot(step) => {
                                Value::Pointer(self.losses[step..].as_mut_ptr().cast())
                            }
                            Arg::Int(v) => Value::Int(v),
                            Arg::Float(v) => Value::Float(v),
                        })
                        .collect();
                    let mut pointers: Vec<*mut c_void> = values
                        .iter_mut()
                        .map(|v| match v {
                            Value::Pointer(p) => (p as *mut *mut c_void).cast(),
                            Value::Int(i) => (i as *mut i64).cast(),
                            Value::Float(f) => (f as *mut f32).cast(),
                        })
                        .collect();
                    let config = per_element(k.threads);
                    let symbol = format!("run_{}", k.name);
                    // SAFETY: the wrapper reads each argument as its signature's type, and
                    // `check_arguments` matched the arguments to that signature, resolved for the
                    // library's policy; every region lies in the arena (asserted above).
                    unsafe {
                        let run: libloading::Symbol<Wrapper> =
                            self.lib.get(symbol.as_bytes()).unwrap();
                        run(config.grid_dim.0, config.block_dim.0, pointers.as_mut_ptr());
                    }
                    if let Some(failure) = shim::failure(&self.lib) {
                        panic!("{}: {failure}", k.name);
                    }
                }
                Launch::Product {
                    product,
                    operands: [a, b, c],
                    beta,
                } => {
                    let [ea, eb, ec] = product.extents();
                    let (a, b) = (
                        read_operand(&self.arena, *a, ea),
                        read_operand(&self.arena, *b, eb),
                    );
                    let mut out = read_operand(&self.arena, *c, ec);
                    product.host(1.0, &a, &b, *beta, &mut out);
                    write_operand(&mut self.arena, *c, &out);
                }
            }
        }
    }
}

impl HostDevice {
    /// The kernels compiled for `precision`, on `arena`.
    pub fn new(precision: Precision, arena: Vec<f32>) -> HostDevice {
        let source = format!("{}{SOURCE}", storage::prelude(precision));
        let (dir, lib) = shim::compile(&source, &wrappers());
        HostDevice {
            lib,
            _dir: dir,
            precision,
            arena,
            partials: vec![f64::NAN; NLL_PARTIALS],
            losses: vec![f32::NAN; 2],
            links: Vec::new(),
        }
    }
}
