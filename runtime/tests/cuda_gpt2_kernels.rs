//! GPT-2 on the CUDA backend without a GPU: every operation's launches (`gpt2::launches`) run on
//! the host — the very kernel source (`gpt2::cuda_source::SOURCE`) compiled as C++ with a shim
//! that runs the backend's own launch grid (a row kernel's block of threads at once, with its
//! shared memory and barrier; any other kernel's threads one after another), the products on the strided
//! host product — against the CPU backend's `Gpt2Kernels` on the same arena. The kernels round
//! as the CPU does and both backends run the same products (attention's too,
//! `gpt2::attention`), so every operation agrees bitwise. The whole arena is compared, so a
//! launch that writes outside its operands fails too. Every check runs under each precision
//! policy — fp32, bf16 with fp32 reductions, bf16 — the source compiled after that policy's
//! prelude (`cuda::storage`), bf16 regions holding bf16 values, the products widening their
//! operands and rounding their output to its format (`gpt2_host`). What both backends share
//! (attention's products) is checked against transformers by python/tests/test_gpt2.py.

use shardplan_runtime::backend::{Allocation, Backend, CpuBackend, FloatFormat, Loopback, Region};
use shardplan_runtime::cuda::storage;
use shardplan_runtime::gpt2::kernels::AdamW;
use shardplan_runtime::gpt2::launches::{Launch, token_links_len};
use shardplan_runtime::gpt2::{
    AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape, launches,
};
use shardplan_runtime::workload::{Part, words_of};
use shardplan_scheduler::precision::Precision;

mod gpt2_host;
mod shim;

use gpt2_host::HostDevice;

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

/// Consecutive regions of the given parts from word `at` on.
fn regions<const N: usize>(at: &mut usize, parts: [Part; N]) -> [Region; N] {
    parts.map(|part| {
        let r = Region {
            offset: *at,
            len: part.len,
            format: part.format,
        };
        *at += part.words();
        r
    })
}

/// A buffer of parts, counted in words.
fn words(parts: &[Part]) -> Part {
    Part::fp32(words_of(parts))
}

/// The CPU backend and the host device on one arena of random values.
struct Pair {
    cpu: CpuBackend<Loopback>,
    host: HostDevice,
}

impl Pair {
    /// An arena of `words` random words, each of `typed` (regions of their formats, bf16 ones
    /// among them) holding random values of its format.
    fn new(precision: Precision, words: usize, seed: u64, typed: &[Region]) -> Pair {
        let mut cpu = CpuBackend::new(Loopback);
        cpu.allocate(Allocation {
            arena_elements: words,
            host_arena_elements: 0,
            largest_block: 0,
            loss_slots: 2,
        })
        .unwrap();
        cpu.upload(Region::f32(0, words), &values(words, seed))
            .unwrap();
        for (k, r) in typed.iter().enumerate() {
            cpu.upload(*r, &values(r.len, seed + 100 + k as u64))
                .unwrap();
        }
        let mut arena = vec![0.0; words];
        cpu.download(Region::f32(0, words), &mut arena).unwrap();
        Pair {
            cpu,
            host: HostDevice::new(precision, arena),
        }
    }

    /// Writes `data` into both arenas (rounded to the region's format).
    fn set(&mut self, region: Region, data: &[f32]) {
        self.cpu.upload(region, data).unwrap();
        let words = Region::f32(region.offset, region.words());
        let at = region.offset;
        self.cpu
            .download(words, &mut self.host.arena[at..at + words.len])
            .unwrap();
    }

    /// Asserts the two arenas hold the same bits, naming the first word that differs.
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
                "{what} under {}: word {i} is {:#010x} on the CPU, {:#010x} from the launches",
                self.host.precision.describe(),
                cpu[i].to_bits(),
                self.host.arena[i].to_bits()
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

/// Each shape under each precision policy.
fn shapes() -> Vec<Shape> {
    let shapes = [
        Shape {
            layers: 1,
            hidden: 16,
            heads: 2,
            ffn: 40,
            vocab: 37,
            seq: 6,
            batch: 3,
            precision: Precision::FP32,
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
            precision: Precision::FP32,
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
            precision: Precision::FP32,
        },
    ];
    Precision::ALL
        .into_iter()
        .flat_map(|precision| shapes.map(|s| Shape { precision, ..s }))
        .collect()
}

/// `len` parameters (or activations) of `shape`'s policy, and `len` parameter gradients.
fn act(shape: &Shape, len: usize) -> Part {
    shape.act(len)
}

fn grad(shape: &Shape, len: usize) -> Part {
    Part {
        len,
        format: shape.precision.reduce(),
    }
}

/// The embedding forward and backward (the token gradient added to what the head wrote).
#[test]
fn embedding_equals_the_cpu_backend_bitwise() {
    for shape in shapes() {
        let (rows, h) = (shape.rows(), shape.hidden);
        let params_len = shape.embedding_params().iter().sum();
        let mut at = 0;
        let typed = regions(
            &mut at,
            [
                act(&shape, params_len),
                Part::fp32(rows),
                act(&shape, rows * h),
                act(&shape, rows * h),
                grad(&shape, params_len),
            ],
        );
        let [params, tokens_at, out, grad_out, grads] = typed;
        let mut pair = Pair::new(shape.precision, at, 1, &typed);
        pair.host.links = vec![f32::NAN; token_links_len(rows)];
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
        let mut at = 0;
        let typed = regions(
            &mut at,
            [
                act(&shape, 2 * c),
                act(&shape, v * c),
                act(&shape, rows * c),
                Part::fp32(rows),
                words(&shape.head_internals()),
                grad(&shape, 2 * c),
                grad(&shape, v * c),
                act(&shape, rows * c),
                words(&shape.head_workspace()),
            ],
        );
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
        ] = typed;
        let mut pair = Pair::new(shape.precision, at, 2, &typed);
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
        let typed = regions(
            &mut at,
            [
                act(&shape, params_len),
                act(&shape, rows * c),
                act(&shape, rows * c),
                words(&shape.block_internals()),
                act(&shape, rows * c),
                grad(&shape, params_len),
                act(&shape, rows * c),
                words(&shape.block_workspace()),
            ],
        );
        let [
            params,
            x,
            out,
            internals,
            grad_out,
            grads,
            grad_in,
            workspace,
        ] = typed;
        let mut pair = Pair::new(shape.precision, at, 3 + seed as u64, &typed);
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
/// corrections matter), its gradient in each policy's reduction format.
#[test]
fn adamw_equals_the_cpu_backend_bitwise() {
    let n = 40;
    for shape in shapes() {
        let mut at = 0;
        let fp32 = Part::fp32(n);
        let typed = regions(&mut at, [fp32, grad(&shape, n), fp32, fp32]);
        let [params, grads, m, v] = typed;
        let mut pair = Pair::new(shape.precision, at, 5, &typed);
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
        pair.cpu.adamw(&shape, &adam, 3, &hp, &decayed).unwrap();
        pair.host.run(&launches::adamw(&adam, 3, &hp, &decayed));
        pair.assert_bitwise("AdamW");
    }
}

/// The prelude's rounding to bf16 (`bf16_bits`, on the host) is `half`'s, the CPU backend's:
/// every exponent with mantissas around each rounding boundary, zeros, infinities and NaNs.
#[test]
fn the_preludes_bf16_rounding_is_the_cpus() {
    let wrapper = r#"
extern "C" unsigned short round_bits(float v) { return bf16_bits(v); }
"#;
    let (_dir, lib) = shim::compile(&storage::prelude(Precision::FP32), wrapper);
    // SAFETY: `round_bits` is defined above with this signature.
    let round: libloading::Symbol<unsafe extern "C" fn(f32) -> u16> =
        unsafe { lib.get(b"round_bits") }.unwrap();
    let mut checked = 0;
    for sign in [0u32, 0x8000_0000] {
        for exponent in 0..=255u32 {
            for low in [
                0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_7fff, 0x1_8000, 0x7f_ffff,
            ] {
                for high in [0u32, 0x1_0000, 0x7f_0000] {
                    let bits = sign | (exponent << 23) | ((high | low) & 0x7f_ffff);
                    let v = f32::from_bits(bits);
                    // SAFETY: a plain function of a float.
                    let got = unsafe { round(v) };
                    let want = half::bf16::from_f32(v).to_bits();
                    assert_eq!(got, want, "{bits:#010x}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 256 * 9 * 3);
}

/// The launches follow the policy: fp32 runs launch no rounding and their products read and
/// write fp32; bf16 runs round the fp32 gradients and logits, their products take bf16 operands.
#[test]
fn launches_round_exactly_under_bf16() {
    for shape in shapes() {
        let (rows, c) = (shape.rows(), shape.hidden);
        let params_len: usize = shape.block_params().iter().sum();
        let mut at = 0;
        let [params, x, internals, grads, workspace] = regions(
            &mut at,
            [
                act(&shape, params_len),
                act(&shape, rows * c),
                words(&shape.block_internals()),
                grad(&shape, params_len),
                words(&shape.block_workspace()),
            ],
        );
        let backward = BlockBackward {
            params,
            x,
            internals,
            grad_out: x,
            grads,
            grad_in: x,
            workspace,
        };
        let launches = launches::block_backward(&shape, &backward);
        let rounds = launches
            .iter()
            .filter(|l| matches!(l, Launch::Kernel(k) if k.name == "round_values"))
            .count();
        let bf16_fp32 = shape.activations() == FloatFormat::Bf16
            && shape.precision.reduce() == FloatFormat::Fp32;
        assert_eq!(rounds, usize::from(bf16_fp32), "{:?}", shape.precision);
        for l in &launches {
            if let Launch::Product { operands, .. } = l {
                assert_eq!(operands[0].region.format, shape.activations());
            }
        }
    }
}
