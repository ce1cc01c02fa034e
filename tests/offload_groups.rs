//! Offload over shard and secondary groups in the runtime (DESIGN §3.13, §6.12): the test MLP on
//! 4 MPI ranks declared as 2 nodes of 2, under the `hsdp` baseline (shard groups of 2, replica
//! AllReduce across the nodes) with its units offloading `optimizer` and `full` in turn, and under
//! `hpz` (secondary groups of 2) with every sharded unit offloading `optimizer` (`full` at hpZ is
//! no plan: refused, naming the unit's `offload`), each with and without checkpointing. Every run,
//! strict and relaxed, ends with the weights of a single process training on the union of the
//! ranks' batches (≤ 1e-5 relative, as tests/hierarchical.rs holds the same baselines without
//! offload); the device arena is the simulator's device peak to the byte, its live bytes in every
//! slot the simulator's device memory there (up to 64 bytes per buffer: an offloaded unit's
//! reduced gradient shard is alive through its replica AllReduce's slot), and the host arena its
//! host bytes per rank (up to 64 bytes per host buffer).

mod common;

use shardplan_runtime::layout::place;
use shardplan_runtime::mlp::{Mlp, MlpSpec, max_relative_error, reference_training};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::offload::{HostStep, Offload};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, Schedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::Level;

const STEPS: usize = 3;

/// `profile` with a host shared by each node's 2 ranks, one to a host link.
fn with_host(mut profile: Profile) -> Profile {
    profile.host = Some(common::test_host(2, 1));
    profile
}

/// `schedule` with `mode(unit)` for each sharded unit, stepping overlapped.
fn offloaded(
    profile: &Profile,
    schedule: Schedule,
    mode: &dyn Fn(usize) -> Offload,
) -> shardplan_scheduler::Result<Schedule> {
    let modes = (schedule.units().iter().enumerate())
        .map(|(u, s)| match s.level {
            Level::None => Offload::None,
            _ => mode(u),
        })
        .collect();
    schedule.offloaded(profile, modes, HostStep::Overlapped, "test plan")
}

/// The placement's live bytes in every slot of its timeline (two iterations' where the arena
/// alternates layouts) against the simulator's device memory in that slot.
fn check_slots(spec: &MlpSpec, profile: &Profile, name: &str, schedule: &Schedule) {
    let mlp = Mlp::new(spec.clone(), 0, 4);
    let placement = place(&mlp, profile, schedule).unwrap();
    let simulated = simulate(profile, schedule, Semantics::Strict);
    let slots = simulated.slots.len();
    let timeline = placement.regions[0].1.parts[0].alive.len();
    for t in 0..timeline {
        let alive = placement.regions.iter().filter(|(_, r)| r.alive_in(t));
        let (live, buffers) = alive.fold((0.0, 0.0), |(bytes, n), (_, r)| {
            let parts = r.parts.iter().filter(|p| p.alive[t]);
            (bytes + parts.map(|p| p.bytes as f64).sum::<f64>(), n + 1.0)
        });
        let predicted = simulated.slots[t % slots].memory_bytes;
        assert!(
            live >= predicted && live <= predicted + 64.0 * buffers,
            "{name}: slot {t}: {live} bytes live against {predicted} predicted"
        );
    }
}

#[test]
fn offload_over_shard_and_secondary_groups_trains_like_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, model) = common::spec(dir.path());
    let profile = with_host(common::two_nodes_of_two(common::profile(&spec, 4)));
    let profile_path = dir.path().join("profile.toml");
    profile.save(&profile_path).unwrap();
    let (reference, _) = reference_training(&spec, 4, STEPS);
    let alternate = |u: usize| [Offload::Optimizer, Offload::Full][u % 2];
    let mut plans = Vec::new();
    for ckpt in [Recompute::Off, Recompute::On] {
        let hsdp = baseline(&profile, BaselineKind::Hsdp, ckpt, None).unwrap();
        let hpz = baseline(&profile, BaselineKind::Hpz, ckpt, None).unwrap();
        let full = offloaded(&profile, hpz.schedule.clone(), &|_| Offload::Full);
        let refused = full
            .expect_err("full offload at hpZ is no plan")
            .to_string();
        assert!(refused.contains(".offload"), "{refused}");
        let label = |kind: BaselineKind| kind.label(ckpt);
        let groups = offloaded(&profile, hsdp.schedule, &alternate).unwrap();
        let secondary = offloaded(&profile, hpz.schedule, &|_| Offload::Optimizer).unwrap();
        plans.push((label(BaselineKind::Hsdp), groups));
        plans.push((label(BaselineKind::Hpz), secondary));
    }
    for (name, schedule) in &plans {
        let units = schedule.units();
        let over_groups = (0..units.len()).filter(|&u| {
            let grouped = units[u].shard_group.is_some() || units[u].secondary_group.is_some();
            grouped && !schedule.offload(u).is_none()
        });
        assert!(
            over_groups.count() > 0,
            "{name} offloads no unit over a group"
        );
        check_slots(&spec, &profile, name, schedule);
        let simulated = simulate(&profile, schedule, Semantics::Strict);
        let host_per_rank = simulated
            .host
            .expect("an offloading plan's host")
            .memory_bytes
            / 2.0;
        let plan = common::write_plan(dir.path(), name, &profile, schedule);
        let files = (profile_path.as_path(), plan.as_path(), model.as_path());
        for run in common::train_strict_and_relaxed(dir.path(), name, 4, files, STEPS as u64) {
            let (report, semantics) = (&run.report, run.semantics);
            assert_eq!(
                report["arena_bytes"].as_f64(),
                Some(simulated.peak_memory_bytes),
                "{name} {semantics}"
            );
            let hosted = report["host_arena_bytes"].as_f64().unwrap();
            let buffers = 5.0 * units.len() as f64;
            assert!(
                hosted >= host_per_rank && hosted <= host_per_rank + 64.0 * buffers,
                "{name} {semantics}: host arena {hosted} vs predicted {host_per_rank} per rank"
            );
            let error = max_relative_error(&run.params, &reference).unwrap();
            assert!(error <= 1e-5, "{name} {semantics}: {error:e}");
        }
    }
}
