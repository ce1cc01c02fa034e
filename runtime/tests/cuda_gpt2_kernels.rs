//! GPT-2 on the CUDA backend without a GPU: every operation's launches (`gpt2::launches`) run on
//! the host — the very kernel source (`gpt2::cuda_source::SOURCE`) compiled as C++ with a shim
//! that runs the backend's own launch grid (a row kernel's block of threads at once, with its
//! shared memory and barrier; any other kernel's threads one after another), the products on the strided
//! host product — against the CPU backend's `Gpt2Kernels` on the same arena. The kernels round
//! as the CPU does and both backends run the same products (attention's too,
//! `gpt2::attention`), so every operation agrees bitwise. The whole arena is compared, so a
//! launch that writes outside its operands fails too. What both backends share (attention's
//! products) is checked against transformers by python/tests/test_gpt2.py.

use shardplan_runtime::backend::{Allocation, Backend, CpuBackend, FloatFormat, Loopback, Region};
use shardplan_runtime::cuda::module::{Param, per_element};
use shardplan_runtime::gpt2::cuda_source::{KERNELS, SOURCE, check_arguments};
use shardplan_runtime::gpt2::kernels::AdamW;
use shardplan_runtime::gpt2::launches::{Arg, Launch, NLL_PARTIALS};
use shardplan_runtime::gpt2::{
    AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape, launches,
};
use shardplan_runtime::workload::words_of;
use std::ffi::c_void;

mod shim;

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

/// The CUDA backend's work on the host: an arena, the loss partials and slots, the kernels.
struct HostDevice {
    lib: libloading::Library,
    /// Where the library lies (removed when dropped).
    _dir: tempfile::TempDir,
    arena: Vec<f32>,
    partials: Vec<f64>,
    losses: Vec<f32>,
}

/// One argument's storage, pointed to from the argument array.
enum Value {
    Pointer(*mut c_void),
    Int(i64),
    Float(f32),
}

impl HostDevice {
    fn run(&mut self, launches: &[Launch]) {
        let kernels = KERNELS.signatures();
        for launch in launches {
            for r in launch.regions() {
                assert!(r.offset + r.len <= self.arena.len(), "{r:?} in {launch:?}");
            }
            match launch {
                Launch::Kernel(k) => {
                    let params = &kernels.iter().find(|(n, _)| *n == k.name).unwrap().1;
                    check_arguments(k, params).unwrap();
                    let mut values: Vec<Value> = k
                        .args
                        .iter()
                        .map(|a| match *a {
                            Arg::Floats(r) => {
                                Value::Pointer(self.arena[r.offset..].as_mut_ptr().cast())
                            }
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
                    // `check_arguments` matched the arguments to that signature; every region
                    // lies in the arena (asserted above).
                    unsafe {
                        let run: libloading::Symbol<Wrapper> =
                            self.lib.get(symbol.as_bytes()).unwrap();
                        run(config.grid_dim.0, config.block_dim.0, pointers.as_mut_ptr());
                    }
                }
                Launch::Product {
                    product,
                    operands: [a, b, c],
                    beta,
                } => {
                    let [ea, eb, ec] = product.extents();
                    let (a, b) = (
                        self.arena[*a..a + ea].to_vec(),
                        self.arena[*b..b + eb].to_vec(),
                    );
                    product.host(1.0, &a, &b, *beta, &mut self.arena[*c..c + ec]);
                }
            }
        }
    }
}

/// `len` deterministic values in [−1, 1).
fn values(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|k| {
            let z = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(seed.wrapping_mul(1442695040888963407));
            ((z >> 40) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Consecutive regions of the given lengths from `at` on.
fn regions<const N: usize>(at: &mut usize, lens: [usize; N]) -> [Region; N] {
    lens.map(|len| {
        let r = Region::f32(*at, len);
        *at += len;
        r
    })
}

/// The CPU backend and the host device on one arena of random values.
struct Pair {
    cpu: CpuBackend<Loopback>,
    host: HostDevice,
}

impl Pair {
    fn new(elements: usize, seed: u64) -> Pair {
        let (dir, lib) = shim::compile(SOURCE, &wrappers());
        let arena = values(elements, seed);
        let mut cpu = CpuBackend::new(Loopback);
        cpu.allocate(Allocation {
            arena_elements: elements,
            largest_block: 0,
            loss_slots: 2,
        })
        .unwrap();
        let all = Region::f32(0, elements);
        cpu.upload(all, &arena).unwrap();
        Pair {
            cpu,
            host: HostDevice {
                lib,
                _dir: dir,
                arena,
                partials: vec![f64::NAN; NLL_PARTIALS],
                losses: vec![f32::NAN; 2],
            },
        }
    }

    /// Writes `data` into both arenas.
    fn set(&mut self, region: Region, data: &[f32]) {
        self.cpu.upload(region, data).unwrap();
        self.host.arena[region.offset..region.offset + region.len].copy_from_slice(data);
    }

    /// Asserts the two arenas hold the same bits, naming the first element that differs.
    fn assert_bitwise(&self, what: &str) {
        let mut cpu = vec![0.0; self.host.arena.len()];
        let all = Region::f32(0, cpu.len());
        self.cpu.download(all, &mut cpu).unwrap();
        let differs = cpu
            .iter()
            .zip(&self.host.arena)
            .position(|(c, h)| c.to_bits() != h.to_bits());
        if let Some(i) = differs {
            panic!(
                "{what}: element {i} is {} on the CPU, {} from the launches",
                cpu[i], self.host.arena[i]
            );
        }
    }
}

/// Tokens (or targets) as the workload uploads them: integers in [0, vocab) as f32.
fn tokens(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    (0..rows as u64)
        .map(|r| ((r * 7 + seed * 13 + r * r) % vocab as u64) as f32)
        .collect()
}

fn shapes() -> [Shape; 3] {
    [
        Shape {
            layers: 1,
            hidden: 16,
            heads: 2,
            ffn: 40,
            vocab: 37,
            seq: 6,
            batch: 3,
            activations: FloatFormat::Fp32,
        },
        // Rows longer than a block's lanes: every lane walks several elements (LayerNorm's 264
        // columns, the logits' 300, attention rows up to 258 positions).
        Shape {
            layers: 1,
            hidden: 264,
            heads: 1,
            ffn: 8,
            vocab: 300,
            seq: 258,
            batch: 1,
            activations: FloatFormat::Fp32,
        },
        // hidden = seq: a stride mixed up between the two shows.
        Shape {
            layers: 1,
            hidden: 8,
            heads: 4,
            ffn: 24,
            vocab: 70,
            seq: 8,
            batch: 2,
            activations: FloatFormat::Fp32,
        },
    ]
}

/// The embedding forward and backward (the token gradient added to what the head wrote).
#[test]
fn embedding_equals_the_cpu_backend_bitwise() {
    for shape in shapes() {
        let (rows, h) = (shape.rows(), shape.hidden);
        let mut at = 0;
        let [params, tokens_at, out, grad_out, grads] = regions(
            &mut at,
            [
                shape.embedding_params().iter().sum(),
                rows,
                rows * h,
                rows * h,
                shape.embedding_params().iter().sum(),
            ],
        );
        let mut pair = Pair::new(at, 1);
        pair.set(tokens_at, &tokens(rows, shape.vocab, 1));
        pair.cpu
            .embedding_forward(&shape, params, tokens_at, out)
            .unwrap();
        pair.host
            .run(&launches::embedding_forward(&shape, params, tokens_at, out));
        pair.assert_bitwise("embedding forward");
        pair.cpu
            .embedding_backward(&shape, tokens_at, grad_out, grads)
            .unwrap();
        pair.host.run(&launches::embedding_backward(
            &shape, tokens_at, grad_out, grads,
        ));
        pair.assert_bitwise("embedding backward");
    }
}

/// ln_f, the tied logits, the softmax, the loss (its slot too) and the head's backward.
#[test]
fn head_equals_the_cpu_backend_bitwise() {
    for shape in shapes() {
        let (rows, c, v) = (shape.rows(), shape.hidden, shape.vocab);
        let internals = words_of(&shape.head_internals());
        let mut at = 0;
        let [
            params,
            wte,
            x,
            targets,
            saved,
            grads,
            wte_grad,
            grad_in,
            workspace,
        ] = regions(
            &mut at,
            [
                2 * c,
                v * c,
                rows * c,
                rows,
                internals,
                2 * c,
                v * c,
                rows * c,
                rows * c,
            ],
        );
        let mut pair = Pair::new(at, 2);
        pair.set(targets, &tokens(rows, v, 2));
        // Logits of a few units at most, as a trained model's: wte scaled by 1/√hidden (at 264
        // columns of [−1, 1) values some targets' probabilities underflow to 0 otherwise).
        let spread = 1.0 / (c as f32).sqrt();
        let wte_values: Vec<f32> = values(v * c, 7).iter().map(|w| w * spread).collect();
        pair.set(wte, &wte_values);
        let scale = 1.0 / (2 * rows) as f32;
        let head = Head {
            params,
            wte,
            x,
            targets,
            internals: saved,
        };
        pair.cpu.head_forward(&shape, &head, scale, 1).unwrap();
        pair.host
            .run(&launches::head_forward(&shape, &head, scale, 1));
        pair.assert_bitwise("head forward");
        let loss = pair.cpu.losses(2).unwrap()[1];
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        assert_eq!(loss.to_bits(), pair.host.losses[1].to_bits(), "the loss");
        let head_grads = HeadGrads {
            grads,
            wte_grad,
            grad_in,
            workspace,
        };
        pair.cpu
            .head_backward(&shape, &head, &head_grads, scale)
            .unwrap();
        pair.host
            .run(&launches::head_backward(&shape, &head, &head_grads, scale));
        pair.assert_bitwise("head backward");
    }
}

/// A block forward then backward (its saved internals feed the backward).
#[test]
fn block_equals_the_cpu_backend_bitwise() {
    for (seed, shape) in shapes().into_iter().enumerate() {
        let (rows, c) = (shape.rows(), shape.hidden);
        let params_len: usize = shape.block_params().iter().sum();
        let mut at = 0;
        let [
            params,
            x,
            out,
            internals,
            grad_out,
            grads,
            grad_in,
            workspace,
        ] = regions(
            &mut at,
            [
                params_len,
                rows * c,
                rows * c,
                words_of(&shape.block_internals()),
                rows * c,
                params_len,
                rows * c,
                words_of(&shape.block_workspace()),
            ],
        );
        let mut pair = Pair::new(at, 3 + seed as u64);
        pair.cpu
            .block_forward(&shape, params, x, out, internals)
            .unwrap();
        pair.host
            .run(&launches::block_forward(&shape, params, x, out, internals));
        pair.assert_bitwise("block forward");
        let backward = BlockBackward {
            params,
            x,
            internals,
            grad_out,
            grads,
            grad_in,
            workspace,
        };
        pair.cpu.block_backward(&shape, &backward).unwrap();
        pair.host.run(&launches::block_backward(&shape, &backward));
        pair.assert_bitwise("block backward");
    }
}

/// AdamW over runs that decay and runs that do not (a step past the first, so the bias
/// corrections matter).
#[test]
fn adamw_equals_the_cpu_backend_bitwise() {
    let n = 40;
    let mut at = 0;
    let [params, grads, m, v] = regions(&mut at, [n; 4]);
    let mut pair = Pair::new(at, 5);
    let second_moment: Vec<f32> = values(n, 6).iter().map(|x| x * x).collect();
    pair.set(v, &second_moment);
    let hp = AdamW {
        learning_rate: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let decayed = [0..3, 10..25, 31..32];
    let adam = AdamRegions {
        params,
        grads,
        m,
        v,
    };
    pair.cpu.adamw(&adam, 3, &hp, &decayed).unwrap();
    pair.host.run(&launches::adamw(&adam, 3, &hp, &decayed));
    pair.assert_bitwise("AdamW");
}
