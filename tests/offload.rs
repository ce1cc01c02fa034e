//! Offload in the runtime (DESIGN §6.12): GPT-2 plans that offload units (`full`, `optimizer`,
//! mixed with units kept on the device; the host stepping after the backward or overlapped)
//! train on the CPU backend at N = 1 and 2 (MPI), strict and relaxed, to the losses and weights
//! of the N = 1 DDP run without offload — which python/tests/test_gpt2.py checks against
//! Hugging Face transformers; the device arena's live peak is the simulator's device peak and
//! the host arena the simulator's host bytes per rank.

mod common;

use common::{
    Rng, assert_relaxed_is_strict_with_slow_communication, gpt2_tiny as gpt2, gpt2_tiny_bf16_path,
    gpt2_tiny_bf16_profile, gpt2_tiny_path as model_path, gpt2_tiny_profile, random_schedule,
    relative_update_error, run_plan,
};
use shardplan_runtime::layout::place;
use shardplan_runtime::workload::Workload;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::offload::{HostStep, Offload};
use shardplan_scheduler::plan::{Producer, plan_with_prediction};
use shardplan_scheduler::precision::FloatFormat;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, Schedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::Level;
use std::path::{Path, PathBuf};

const STEPS: usize = 3;

/// `profile` with a host for `world` ranks on one node, two to a host link.
fn with_host(mut profile: Profile, world: usize) -> Profile {
    profile.host = Some(common::test_host(world as u32, world.min(2) as u32));
    profile
}

struct Setup {
    dir: tempfile::TempDir,
    data: PathBuf,
    model: PathBuf,
    bf16: bool,
}

impl Setup {
    fn new(bf16: bool) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.txt");
        let mut text =
            std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
        text.extend(0..=255u8);
        std::fs::write(&data, text).unwrap();
        let model = match bf16 {
            true => gpt2_tiny_bf16_path(dir.path(), FloatFormat::Fp32),
            false => model_path(),
        };
        Setup {
            dir,
            data,
            model,
            bf16,
        }
    }

    fn profile(&self, world: usize) -> Profile {
        let profile = match self.bf16 {
            true => gpt2_tiny_bf16_profile(world, FloatFormat::Fp32),
            false => gpt2_tiny_profile(world),
        };
        with_host(profile, world)
    }

    /// Trains `schedule` for `STEPS` steps; the report and the trained parameters.
    fn train(
        &self,
        (world, name): (usize, &str),
        profile: &Profile,
        schedule: &Schedule,
        semantics: &str,
    ) -> (serde_json::Value, Vec<Vec<f32>>) {
        let profile_path = self.dir.path().join(format!("{name}.profile.toml"));
        profile.save(&profile_path).unwrap();
        let producer = Producer {
            name: name.into(),
            details: Default::default(),
        };
        let (plan, _) = plan_with_prediction(profile, schedule, producer, None);
        let plan_path = self.dir.path().join(format!("{name}.plan.toml"));
        plan.save(&plan_path).unwrap();
        let dump = self.dir.path().join(format!("{name}-{semantics}.json"));
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let extra = [
            "--data",
            &s(&self.data),
            "--semantics",
            semantics,
            "--dump-params",
            &s(&dump),
            "--json",
        ];
        let out = run_plan(
            world,
            &profile_path,
            &plan_path,
            &self.model,
            STEPS as u64,
            &extra,
        );
        assert!(
            out.status.success(),
            "{name} {semantics} N={world}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = serde_json::from_slice(&out.stdout).unwrap();
        let params = serde_json::from_slice(&std::fs::read(dump).unwrap()).unwrap();
        (report, params)
    }
}

/// `schedule` with `modes(unit)` for every sharded unit and `host_step`.
fn offloaded(
    profile: &Profile,
    schedule: Schedule,
    modes: &dyn Fn(usize) -> Offload,
    host_step: HostStep,
) -> Schedule {
    let modes = (schedule.units().iter().enumerate())
        .map(|(u, s)| match s.level {
            Level::None => Offload::None,
            _ => modes(u),
        })
        .collect();
    schedule
        .offloaded(profile, modes, host_step, "test plan")
        .unwrap()
}

/// The plans the tests train at `world` ranks: the two offload baselines (± checkpointing),
/// fsdp2 with `full`, `optimizer` and none alternating, stepping overlapped, and two random plans
/// whose sharded units all offload (alternating modes, overlapped).
fn plans(profile: &Profile, world: usize) -> Vec<(String, Schedule)> {
    let mut plans = Vec::new();
    for kind in BaselineKind::OFFLOAD {
        for checkpoint in [Recompute::Off, Recompute::On] {
            let b = baseline(profile, kind, checkpoint, None).unwrap();
            plans.push((
                format!("{}-{checkpoint:?}-n{world}", kind.name()),
                b.schedule,
            ));
        }
    }
    let fsdp2 = baseline(profile, BaselineKind::Fsdp2, Recompute::Off, None)
        .unwrap()
        .schedule;
    let cycle = |u: usize| [Offload::Full, Offload::Optimizer, Offload::None][u % 3];
    let mixed = offloaded(profile, fsdp2, &cycle, HostStep::Overlapped);
    plans.push((format!("fsdp2-mixed-n{world}"), mixed));
    let mut rng = Rng(world as u64 * 17 + 3);
    for k in 0..2 {
        let random = random_schedule(&mut rng, profile);
        let alternate = |u: usize| [Offload::Optimizer, Offload::Full][(u + k) % 2];
        let plan = offloaded(profile, random, &alternate, HostStep::Overlapped);
        plans.push((format!("random{k}-n{world}"), plan));
    }
    plans
}

/// Every plan's device arena has the simulator's device peak as its live peak (up to 64-byte
/// alignment per buffer), and its host arena is the simulator's host bytes per rank (up to 64
/// bytes per host buffer: five per offloaded unit at most).
fn check_arenas(setup: &Setup, world: usize) {
    let (g, profile) = match setup.bf16 {
        true => (
            common::gpt2_tiny_bf16(world, FloatFormat::Fp32),
            setup.profile(world),
        ),
        false => (gpt2(world), setup.profile(world)),
    };
    for (name, schedule) in plans(&profile, world) {
        let l = place(&g, &profile, &schedule).unwrap();
        let simulated = simulate(&profile, &schedule, Semantics::Strict);
        let (predicted, live) = (simulated.peak_memory_bytes, l.arena.live_peak_bytes as f64);
        let alignment = 64.0 * l.regions.len() as f64;
        assert!(
            live >= predicted && live <= predicted.ceil() + alignment,
            "{name}: live peak {live} vs predicted {predicted}"
        );
        let host = simulated
            .host
            .expect("an offloading plan's host")
            .memory_bytes;
        let per_rank = host / world as f64;
        let offloaded = (0..g.unit_count())
            .filter(|&u| !schedule.offload(u).is_none())
            .count();
        let hosted = l.host_arena_bytes as f64;
        assert!(
            hosted >= per_rank && hosted <= per_rank + 64.0 * 5.0 * offloaded as f64,
            "{name}: host arena {hosted} vs predicted {per_rank} per rank"
        );
    }
}

#[test]
fn the_arenas_are_the_predicted_device_peak_and_host_bytes() {
    for bf16 in [false, true] {
        let setup = Setup::new(bf16);
        for world in [1, 2, 4] {
            check_arenas(&setup, world);
        }
    }
}

/// The N = 1 DDP run without offload that every offloading plan is held to: its losses, its
/// trained weights and the initial ones.
struct DdpRun {
    losses: Vec<f64>,
    weights: Vec<Vec<f32>>,
    initial: Vec<Vec<f32>>,
}

impl DdpRun {
    fn train(setup: &Setup) -> DdpRun {
        let p1 = setup.profile(1);
        let ddp = baseline(&p1, BaselineKind::Ddp, Recompute::Off, None)
            .unwrap()
            .schedule;
        let (report, weights) = setup.train((1, "ddp"), &p1, &ddp, "strict");
        let losses: Vec<f64> = serde_json::from_value(report["losses"].clone()).unwrap();
        assert!(losses[2] < losses[0], "the loss falls: {losses:?}");
        let initial = (0..gpt2(1).unit_count())
            .map(|u| gpt2(1).initial_params(u).unwrap())
            .collect();
        DdpRun {
            losses,
            weights,
            initial,
        }
    }

    /// A run's losses within 1e-4 (relative) of DDP's and its weights' update within
    /// `tolerance`.
    fn check(&self, what: &str, report: &serde_json::Value, params: &[Vec<f32>], tolerance: f64) {
        let got: Vec<f64> = serde_json::from_value(report["losses"].clone()).unwrap();
        for (a, b) in got.iter().zip(&self.losses) {
            assert!(
                (a - b).abs() / b.abs() < 1e-4,
                "{what}: {got:?} vs {:?}",
                self.losses
            );
        }
        let error = relative_update_error(params, &self.weights, &self.initial);
        assert!(
            error < tolerance,
            "{what}: the weights' update differs by {error:.2e}"
        );
        eprintln!("{what}: update error {error:.2e}");
    }
}

/// Trains every plan of [`plans`] at N = 1 and 2, strict and relaxed, against the N = 1 DDP run:
/// losses within 1e-4 (relative), the weights' update within 1e-2 (5e-2 under bf16); the
/// reports' arenas are the placements'.
fn trains_like_ddp(bf16: bool) {
    let setup = Setup::new(bf16);
    let ddp = DdpRun::train(&setup);
    let update_tolerance = if bf16 { 5e-2 } else { 1e-2 };
    for world in [1, 2] {
        let profile = setup.profile(world);
        for (name, schedule) in plans(&profile, world) {
            for semantics in ["strict", "relaxed"] {
                let (report, params) = setup.train((world, &name), &profile, &schedule, semantics);
                ddp.check(
                    &format!("{name} {semantics}"),
                    &report,
                    &params,
                    update_tolerance,
                );
                assert!(report["host_arena_bytes"].as_u64().unwrap() > 0, "{name}");
            }
        }
    }
}

#[test]
fn offloading_plans_train_like_ddp_on_one() {
    trains_like_ddp(false);
}

#[test]
fn bf16_offloading_plans_train_like_bf16_ddp_on_one() {
    trains_like_ddp(true);
}

/// A plan that offloads on a profile without `[host]` is refused, naming the field.
#[test]
fn offload_without_a_host_link_is_refused() {
    let setup = Setup::new(false);
    let profile = setup.profile(1);
    let schedule = baseline(&profile, BaselineKind::Fsdp2Offload, Recompute::Off, None)
        .unwrap()
        .schedule;
    let profile_path = setup.dir.path().join("host.profile.toml");
    profile.save(&profile_path).unwrap();
    let producer = Producer {
        name: "offload".into(),
        details: Default::default(),
    };
    let (mut plan, _) = plan_with_prediction(&profile, &schedule, producer, None);
    // A plan written by hand for the profile, which names no digest to check.
    plan.profile_digest = None;
    let plan_path = setup.dir.path().join("offload.plan.toml");
    plan.save(&plan_path).unwrap();
    let mut hostless = profile.clone();
    hostless.host = None;
    let hostless_path = setup.dir.path().join("hostless.profile.toml");
    hostless.save(&hostless_path).unwrap();
    let data = setup.data.to_str().unwrap();
    let out = run_plan(
        1,
        &hostless_path,
        &plan_path,
        &setup.model,
        1,
        &["--data", data, "--json"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let error = String::from_utf8_lossy(&out.stdout);
    assert!(
        error.contains("units[0].offload") && error.contains("no [host]"),
        "{error}"
    );
}

/// `profile measure --host-link` on the CPU backend at N = 1 and 2 (MPI): a `[host]` with both
/// copy curves (their sizes from 4 KiB to --max-message), the host's step per parameter the
/// measured optimizer steps' (Σ o_i / Σ Ψ_i) and the system's memory; the fsdp2-offload
/// baseline of that profile trains on it.
#[test]
fn profile_measure_measures_the_host_link() {
    let setup = Setup::new(false);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    for world in [1, 2] {
        let out = setup.dir.path().join(format!("measured{world}.toml"));
        let args = [
            "profile",
            "measure",
            "--backend",
            "cpu",
            "--model",
            setup.model.to_str().unwrap(),
            "--world-size",
            &world.to_string(),
            "--host-link",
            "--max-message",
            "1MiB",
            "--repeats",
            "2",
            "--out",
            out.to_str().unwrap(),
        ];
        let measured = common::run(world, &args);
        assert!(
            measured.status.success(),
            "N={world}: {}",
            String::from_utf8_lossy(&measured.stderr)
        );
        let profile = Profile::load(&out).unwrap();
        let host = profile.host.clone().expect("a measured [host]");
        assert_eq!(host.ranks_per_node, world as u32);
        assert_eq!(host.memory_bytes, total * 1024);
        for curve in [&host.host_to_device, &host.device_to_host] {
            let sizes: Vec<u64> = curve.points.iter().map(|p| p.0).collect();
            assert_eq!(sizes, (12..=20).map(|e| 1u64 << e).collect::<Vec<_>>());
        }
        let (steps, params) = (profile.units.iter()).fold((0.0, 0.0), |(t, n), u| {
            (t + u.optimizer_us, n + u.params as f64)
        });
        let per_param = steps / params;
        assert!((host.optimizer_us_per_param - per_param).abs() <= 1e-9 * per_param);
        let schedule = baseline(&profile, BaselineKind::Fsdp2Offload, Recompute::Off, None)
            .unwrap()
            .schedule;
        let (report, _) = setup.train((world, "measured"), &profile, &schedule, "strict");
        assert!(report["host_arena_bytes"].as_u64().unwrap() > 0);
    }
}

/// An offloading run checkpointed and resumed (its master and Adam moments in the host arena,
/// `optimizer`'s parameters on the device, `full`'s on the host) trains like the uninterrupted
/// run: the same losses after the resumed step and the same weights, bit for bit, at N = 2.
#[test]
fn a_resumed_offloading_run_trains_like_an_uninterrupted_one() {
    let setup = Setup::new(false);
    let profile = setup.profile(2);
    let fsdp2 = baseline(&profile, BaselineKind::Fsdp2, Recompute::Off, None)
        .unwrap()
        .schedule;
    let cycle = |u: usize| [Offload::Full, Offload::Optimizer][u % 2];
    let schedule = offloaded(&profile, fsdp2, &cycle, HostStep::Overlapped);
    let at = |name: &str| setup.dir.path().join(name);
    profile.save(&at("resumed.profile.toml")).unwrap();
    let producer = Producer {
        name: "resumed".into(),
        details: Default::default(),
    };
    let (plan, _) = plan_with_prediction(&profile, &schedule, producer, None);
    plan.save(&at("resumed.plan.toml")).unwrap();
    let data = setup.data.to_str().unwrap().to_string();
    let run = |steps: u64, extra: &[&str], weights: &str| {
        let saved = at(weights);
        let mut args = vec![
            "--data",
            &data,
            "--json",
            "--save-weights",
            saved.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (profile, plan) = (at("resumed.profile.toml"), at("resumed.plan.toml"));
        let out = run_plan(2, &profile, &plan, &setup.model, steps, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (report, std::fs::read(saved).unwrap())
    };
    let (whole, whole_weights) = run(5, &[], "whole.safetensors");
    let checkpoints = at("checkpoints");
    let dir = checkpoints.to_str().unwrap();
    let (first, _) = run(
        3,
        &["--checkpoint-every", "3", "--checkpoint-dir", dir],
        "first.safetensors",
    );
    assert_eq!(first["checkpoints_written"], 1, "{first}");
    let (resumed, resumed_weights) = run(5, &["--resume", dir], "resumed.safetensors");
    assert_eq!(resumed["first_step"], 3);
    assert_eq!(
        resumed["losses"].as_array().unwrap()[..],
        whole["losses"].as_array().unwrap()[3..]
    );
    assert!(
        resumed_weights == whole_weights,
        "the trained weights differ"
    );
}

/// Random offloading plans (alternating `optimizer` and `full`, overlapped steps) at N = 2 on
/// ranks whose collectives take a millisecond each: relaxed runs, whose compute runs ahead of
/// communication, agree exactly with strict ones and no operation touches memory a copy or a
/// collective in flight still uses (the CPU arenas refuse such a borrow); a plan whose offloaded
/// unit would gather its parameters before the reduction its host step needs is refused, naming
/// the unit's `offload`.
#[test]
fn random_offloading_plans_with_slow_communication_never_reuse_memory_in_flight() {
    let world = 2;
    let profile = with_host(gpt2_tiny_profile(world), world);
    let mut rng = Rng(97);
    let (mut ran, mut refused) = (0, 0);
    for k in 0..24 {
        let alternate = |u: usize| [Offload::Optimizer, Offload::Full][(u + k) % 2];
        let random = random_schedule(&mut rng, &profile);
        let schedule = offloaded(&profile, random, &alternate, HostStep::Overlapped);
        let name = format!("slow-random{k}");
        let run = std::panic::catch_unwind(|| {
            assert_relaxed_is_strict_with_slow_communication(world, &name, &profile, &schedule)
        });
        match run {
            Ok(()) => ran += 1,
            Err(panic) => {
                let message = (panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                if !message.contains("before its reduction of the step before") {
                    std::panic::resume_unwind(panic);
                }
                assert!(message.contains(".offload is `"), "{message}");
                refused += 1;
            }
        }
    }
    eprintln!("{ran} ran, {refused} refused");
    assert!(ran >= 12, "{ran} ran, {refused} refused");
}

/// Offload on nodes (DESIGN §3.13, §6.12) at N = 4 as 2 nodes of 2: hsdp with `full`,
/// `optimizer` and none cycling over the units (overlapped) and with checkpointing and every unit
/// `optimizer` (after the backward), hpz with every unit `optimizer` (overlapped), strict and
/// relaxed: losses within 1e-4 of the N = 1 DDP run, the weights' update within 1e-2, strict and
/// relaxed bit-identical, the device arena's live peak the predicted peak and the host arena the
/// predicted host bytes per rank.
#[test]
fn offloading_plans_over_shard_groups_and_hpz_train_like_ddp() {
    let setup = Setup::new(false);
    let ddp = DdpRun::train(&setup);
    let profile = with_host(common::two_nodes_of_two(gpt2_tiny_profile(4)), 2);
    let of = |kind, checkpoint| baseline(&profile, kind, checkpoint, None).unwrap().schedule;
    let cycle = |u: usize| [Offload::Full, Offload::Optimizer, Offload::None][u % 3];
    let optimizer = |_: usize| Offload::Optimizer;
    let (hsdp, hsdp_ckpt) = (
        of(BaselineKind::Hsdp, Recompute::Off),
        of(BaselineKind::Hsdp, Recompute::On),
    );
    let plans = [
        (
            "hsdp-mixed",
            offloaded(&profile, hsdp, &cycle, HostStep::Overlapped),
        ),
        (
            "hsdp-ckpt-optimizer",
            offloaded(&profile, hsdp_ckpt, &optimizer, HostStep::AfterBackward),
        ),
        (
            "hpz-optimizer",
            offloaded(
                &profile,
                of(BaselineKind::Hpz, Recompute::Off),
                &optimizer,
                HostStep::Overlapped,
            ),
        ),
    ];
    for (name, schedule) in &plans {
        let mut trained = Vec::new();
        for semantics in ["strict", "relaxed"] {
            let (report, params) = setup.train((4, name), &profile, schedule, semantics);
            ddp.check(&format!("{name} {semantics}"), &report, &params, 1e-2);
            let live = &report["arena_live_peak_bytes"];
            assert_eq!(
                live, &report["predicted_peak_memory_bytes"],
                "{name} {semantics}"
            );
            let host = report["host_arena_bytes"].as_u64().unwrap();
            let predicted = report["predicted_host_node_bytes"].as_u64().unwrap();
            assert_eq!(
                host * 2,
                predicted,
                "{name} {semantics}: host arena per rank of 2"
            );
            trained.push(params);
        }
        assert_eq!(trained[0], trained[1], "{name}: strict and relaxed differ");
    }
}
