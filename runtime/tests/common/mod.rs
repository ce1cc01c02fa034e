//! Fixtures of the runtime's tests (the root crate's tests include them too): the scheduler's
//! (`scheduler/tests/common`), gpt2-tiny, and the runtime's own profile of a workload.
#![allow(dead_code)]

#[path = "../../../scheduler/tests/common/mod.rs"]
mod scheduler_fixtures;

pub use scheduler_fixtures::*;
use shardplan_runtime::backend::{Collectives, CpuBackend};
use shardplan_runtime::executor::RunOptions;
use shardplan_runtime::mlp::{Mlp, MlpSpec};
use shardplan_runtime::session;
use shardplan_scheduler::plan::{Plan, Producer, plan_with_prediction};
use shardplan_scheduler::precision::FloatFormat;
use shardplan_scheduler::profile::{CommCurves, Host, Profile};
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::Semantics;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// models/gpt2-tiny.toml.
pub fn gpt2_tiny_path() -> std::path::PathBuf {
    repo_root().join("models/gpt2-tiny.toml")
}

/// gpt2-tiny as rank 0 of `world` lays it out (synthetic tokens, the model's initialisation).
pub fn gpt2_tiny(world: usize) -> shardplan_runtime::gpt2::Gpt2 {
    gpt2_tiny_accumulating(world, 1)
}

/// gpt2-tiny with `micro_batches` micro-batches per optimizer step (`[training]
/// micro_batches`), as rank 0 of `world` lays it out.
pub fn gpt2_tiny_accumulating(world: usize, micro_batches: u32) -> shardplan_runtime::gpt2::Gpt2 {
    let mut model = shardplan_scheduler::model::ModelSpec::load(&gpt2_tiny_path()).unwrap();
    model.training.as_mut().unwrap().micro_batches = micro_batches;
    shardplan_runtime::gpt2::Gpt2::synthetic(&model, "gpt2-tiny", 0, world).unwrap()
}

/// models/gpt2-tiny.toml with `micro_batches = k` in its `[training]` table, written into `dir`.
pub fn gpt2_tiny_accumulating_path(dir: &Path, micro_batches: u32) -> PathBuf {
    let text = std::fs::read_to_string(gpt2_tiny_path()).unwrap();
    let path = dir.join(format!("gpt2-tiny-k{micro_batches}.toml"));
    let training = format!("[training]\nmicro_batches = {micro_batches}\n");
    std::fs::write(&path, text.replace("[training]\n", &training)).unwrap();
    path
}

/// gpt2-tiny under the bf16 policy with reductions in `reduce` (DESIGN §6.9), as rank 0 of
/// `world` lays it out.
pub fn gpt2_tiny_bf16(world: usize, reduce: FloatFormat) -> shardplan_runtime::gpt2::Gpt2 {
    let mut model = shardplan_scheduler::model::ModelSpec::load(&gpt2_tiny_path()).unwrap();
    let training = model.training.as_mut().unwrap();
    (training.precision, training.reduce) = (FloatFormat::Bf16, reduce);
    shardplan_runtime::gpt2::Gpt2::synthetic(&model, "gpt2-tiny", 0, world).unwrap()
}

/// [`gpt2_tiny_profile`] of [`gpt2_tiny_bf16`].
pub fn gpt2_tiny_bf16_profile(world: usize, reduce: FloatFormat) -> Profile {
    runtime_profile(&gpt2_tiny_bf16(world, reduce), world as u32, 32 << 10)
}

/// models/gpt2-tiny.toml under the bf16 policy with reductions in `reduce`, written into `dir`.
pub fn gpt2_tiny_bf16_path(dir: &Path, reduce: FloatFormat) -> PathBuf {
    let text = std::fs::read_to_string(gpt2_tiny_path()).unwrap();
    let path = dir.join(format!("gpt2-tiny-bf16-{}.toml", reduce.name()));
    let training = format!(
        "[training]\nprecision = \"bf16\"\nreduce = \"{}\"\n",
        reduce.name()
    );
    std::fs::write(&path, text.replace("[training]\n", &training)).unwrap();
    path
}

/// The runtime's own profile of `workload` on `world` ranks with blocks of `block_size_bytes`,
/// arbitrary unit times (unit u: forward 10 + u, backward 20 + u, recompute 8 + u, optimizer
/// 3 + u µs) and affine curves: times only shape random plans.
pub fn runtime_profile(
    workload: &dyn shardplan_runtime::workload::Workload,
    world: u32,
    block_size_bytes: u64,
) -> Profile {
    use shardplan_runtime::measure::{UnitTime, workload_profile};
    let times = (0..workload.unit_count())
        .map(|u| UnitTime {
            forward_us: 10.0 + u as f64,
            checkpointed_forward_us: 9.0 + u as f64,
            backward_us: 20.0 + u as f64,
            recompute_us: 8.0 + u as f64,
            optimizer_us: 3.0 + u as f64,
        })
        .collect();
    let comm = CommCurves {
        all_gather: affine(5.0, 100.0),
        reduce_scatter: affine(5.0, 100.0),
        all_reduce: affine(8.0, 100.0),
    };
    workload_profile(
        workload,
        world,
        &times,
        comm,
        Some(block_size_bytes),
        Default::default(),
    )
    .unwrap()
}

/// The runtime's own profile of gpt2-tiny at `world` ranks with 32 KiB blocks (blocks split into
/// ~25 blocks, so launches spread over several slots); times are arbitrary (they only shape
/// random plans).
pub fn gpt2_tiny_profile(world: usize) -> Profile {
    gpt2_tiny_accumulating_profile(world, 1)
}

/// [`gpt2_tiny_profile`] with `micro_batches` micro-batches per step.
pub fn gpt2_tiny_accumulating_profile(world: usize, micro_batches: u32) -> Profile {
    runtime_profile(
        &gpt2_tiny_accumulating(world, micro_batches),
        world as u32,
        32 << 10,
    )
}

/// Rank 0 of `size` ranks that all hold the same data, with collectives that take a millisecond
/// each: under relaxed semantics compute then runs far ahead of communication, as a slow network
/// lets it. (The numbers are not a real N-rank run's, but strict and relaxed must agree on them.)
struct SlowMirror {
    size: usize,
}

impl SlowMirror {
    fn wait(&self) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Collectives for SlowMirror {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        self.size
    }
    fn split(&self, _: usize, _: usize) -> shardplan_runtime::Result<SlowMirror> {
        unreachable!("the mirrored plans are flat: they open no group")
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) {
        self.wait();
        recv.chunks_exact_mut(send.len())
            .for_each(|c| c.copy_from_slice(send));
    }
    fn reduce_scatter(&self, send: &[f32], recv: &mut [f32]) {
        self.wait();
        let n = self.size as f32;
        recv.iter_mut().zip(send).for_each(|(r, s)| *r = n * s);
    }
    fn all_reduce(&self, send: &[f32], recv: &mut [f32]) {
        self.wait();
        let n = self.size as f32;
        recv.iter_mut().zip(send).for_each(|(r, s)| *r = n * s);
    }
    fn all_gather_bits(&self, _: &[u16], _: &mut [u16]) {
        unreachable!("the mirrored plans train in fp32")
    }
    fn reduce_scatter_bf16(&self, _: &[u16], _: &mut [u16]) {
        unreachable!("the mirrored plans train in fp32")
    }
    fn all_reduce_bf16(&self, _: &[u16], _: &mut [u16]) {
        unreachable!("the mirrored plans train in fp32")
    }
}

/// `schedule` of `profile` as the plan `name`, with its prediction and no memory cap.
pub fn uncapped_plan(name: &str, profile: &Profile, schedule: &Schedule) -> Plan {
    let producer = Producer {
        name: name.into(),
        details: Default::default(),
    };
    plan_with_prediction(profile, schedule, producer, None).0
}

/// The options of an in-process run of `steps` steps from `first_step`: no trace, no callbacks, a
/// minute's patience.
pub fn run_options(first_step: usize, steps: usize, semantics: Semantics) -> RunOptions {
    RunOptions {
        first_step,
        steps,
        semantics,
        timeout: Duration::from_secs(60),
        trace: false,
        on_step: None,
        on_stall: None,
    }
}

/// Runs `schedule` for 3 steps on rank 0 of `world` [`SlowMirror`] ranks, strict and relaxed: the CPU arena
/// refuses any borrow of memory an operation in flight still uses, and the losses agree exactly.
pub fn assert_relaxed_is_strict_with_slow_communication(
    world: usize,
    name: &str,
    profile: &Profile,
    schedule: &Schedule,
) {
    let g = gpt2_tiny_accumulating(world, profile.micro_batches);
    let plan = uncapped_plan(name, profile, schedule);
    let losses = |semantics| {
        let options = run_options(0, 3, semantics);
        let backend = CpuBackend::new(SlowMirror { size: world });
        let run = session::run_plan(
            backend,
            &g,
            profile,
            &plan,
            name,
            &options,
            &Default::default(),
        )
        .unwrap_or_else(|e| panic!("{name} {semantics:?}: {e}"));
        run.report.losses
    };
    assert_eq!(
        losses(Semantics::Relaxed),
        losses(Semantics::Strict),
        "{name}"
    );
}

/// The test MLP: units of 1–2 k parameters.
const MLP_TEST: &str = "name = \"mlp-test\"\ninput = 24\nwidths = [40, 32, 48, 8]\nbatch_per_rank = 6\nseed = 11\nlearning_rate = 0.01\n";

/// The offload tests' host (DESIGN §3.13): `ranks_per_node` ranks share a node's host and
/// `ranks_per_link` each host link; copies of 10 µs + 1 µs per 10 kB, a step of 1 ns per
/// parameter, 16 GiB.
pub fn test_host(ranks_per_node: u32, ranks_per_link: u32) -> Host {
    Host {
        ranks_per_node,
        ranks_per_link,
        memory_bytes: 16 << 30,
        optimizer_us_per_param: 1e-3,
        host_to_device: affine(10.0, 1e4),
        device_to_host: affine(10.0, 1e4),
    }
}

/// The test MLP's spec, and its model file written in `dir`.
pub fn spec(dir: &Path) -> (MlpSpec, PathBuf) {
    let path = dir.join("mlp.toml");
    std::fs::write(&path, MLP_TEST).unwrap();
    (MlpSpec::load(&path).unwrap(), path)
}

/// A profile of `spec` with 2–4 blocks per unit (block size 1 KiB).
pub fn profile(spec: &MlpSpec, world: u32) -> Profile {
    runtime_profile(&Mlp::new(spec.clone(), 0, world as usize), world, 1024)
}
