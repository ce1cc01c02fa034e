//! The step of many micro-batches simulated by its classes (`classes::simulate_strict`) against
//! the simulator unrolling all K: every total, the peak, and each class slot's timing and memory
//! where the whole step has it, for random plans (random accumulate and keep, κ > 0; on nodes,
//! with shard groups, random `replica_reduce` and secondary groups, DESIGN §3.11.1) and the
//! baselines of a zoo profile (on nodes too).

mod common;

use common::{Rng, close, random_profile, random_schedule, with_topology};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::classes::simulate_strict;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Recompute, Schedule};
use shardplan_scheduler::sim::{Semantics, simulate};

/// Asserts that the class simulation of `schedule` is the whole step's.
fn agrees(profile: &Profile, schedule: &Schedule, case: &str) {
    let k = profile.micro_batches as usize;
    let whole = simulate(profile, schedule, Semantics::Strict);
    let classes = simulate_strict(profile, schedule);
    let totals = [
        ("time", whole.iteration_time_us, classes.iteration_time_us),
        ("compute", whole.compute_us, classes.compute_us),
        ("comm", whole.comm_us, classes.comm_us),
        (
            "overlap",
            whole.overlap_slowdown_us,
            classes.overlap_slowdown_us,
        ),
        (
            "comm slowdown",
            whole.comm_slowdown_us,
            classes.comm_slowdown_us,
        ),
        ("exposed", whole.exposed_comm_us, classes.exposed_comm_us),
        ("peak", whole.peak_memory_bytes, classes.peak_memory_bytes),
    ];
    for (what, expected, actual) in totals {
        close(actual, expected, &format!("{case}: {what}"));
    }
    assert_eq!(classes.peak_slot, whole.peak_slot, "{case}: peak slot");
    assert_eq!(
        classes.peak_micro_batch, whole.peak_micro_batch,
        "{case}: peak micro-batch"
    );
    let width = whole.slots.len() / k;
    assert_eq!(classes.slots.len(), 3 * width, "{case}: three classes");
    for (i, slot) in classes.slots.iter().enumerate() {
        let (class, j) = (i / width, i % width);
        let at = if class == 2 { (k - 1) * width + j } else { i };
        let expected = &whole.slots[at];
        let name = format!("{case}: slot {}", expected.label());
        assert_eq!(slot.label(), expected.label(), "{name}");
        close(slot.start_us, expected.start_us, &format!("{name} start"));
        close(
            slot.duration_us,
            expected.duration_us,
            &format!("{name} duration"),
        );
        close(
            slot.memory_bytes,
            expected.memory_bytes,
            &format!("{name} memory"),
        );
    }
}

#[test]
fn random_plans_of_many_micro_batches() {
    let mut rng = Rng(6767);
    for case in 0..120 {
        let mut profile = random_profile(&mut rng, 1 + case % 5, 0.3, 5000);
        profile.micro_batches = 5 + (case % 4) as u32;
        let schedule = random_schedule(&mut rng, &profile);
        agrees(&profile, &schedule, &format!("case {case}"));
    }
}

/// Hierarchical plans at K = 5 and 8: RS and RA on two links, at every inner boundary or the
/// step's only.
#[test]
fn random_hierarchical_plans_of_many_micro_batches() {
    let mut rng = Rng(6311);
    let mut hierarchical = 0;
    for case in 0..120 {
        let mut profile = random_profile(&mut rng, 2 + case % 4, 0.3, 5000);
        if !with_topology(&mut rng, &mut profile) {
            continue;
        }
        profile.micro_batches = [5, 8][case % 2];
        let schedule = random_schedule(&mut rng, &profile);
        hierarchical += usize::from(schedule.units().iter().any(|u| u.shard_group.is_some()));
        agrees(&profile, &schedule, &format!("case {case}"));
    }
    assert!(
        hierarchical >= 20,
        "only {hierarchical} plans over a shard group"
    );
}

/// The hierarchical baselines and their micro-batch forms on llama2-7b at N = 64 on nodes of 2
/// or 32 (random curves), K = 5 and 8.
#[test]
fn hierarchical_baselines_of_many_micro_batches() {
    let base = common::zoo_profile("llama2-7b");
    for k in [5, 8] {
        let mut profile = base.clone();
        profile.micro_batches = k;
        assert!(with_topology(&mut Rng(5), &mut profile));
        for kind in BaselineKind::HIERARCHICAL {
            for checkpoint in [Recompute::Off, Recompute::On] {
                let plan = baseline(&profile, kind, checkpoint, None).unwrap();
                agrees(
                    &profile,
                    &plan.schedule,
                    &format!("K = {k}, {}", kind.label(checkpoint)),
                );
            }
        }
    }
}

#[test]
fn baselines_of_many_micro_batches() {
    let mut profile = common::zoo_profile("gpt2-small");
    profile.micro_batches = 7;
    let kinds = BaselineKind::of(&profile);
    for kind in kinds {
        for checkpoint in [Recompute::Off, Recompute::On] {
            let plan = baseline(&profile, kind, checkpoint, None).unwrap();
            agrees(&profile, &plan.schedule, &kind.label(checkpoint));
        }
    }
}

/// Up to K = 4 the simulator's own answer: every slot of the step.
#[test]
fn few_micro_batches_are_simulated_whole() {
    let mut rng = Rng(76);
    for k in 1..=4 {
        let mut profile = random_profile(&mut rng, 3, 0.3, 5000);
        profile.micro_batches = k;
        let schedule = random_schedule(&mut rng, &profile);
        let classes = simulate_strict(&profile, &schedule);
        assert_eq!(classes.slots.len(), k as usize * 7, "K = {k}");
        close(
            classes.iteration_time_us,
            simulate(&profile, &schedule, Semantics::Strict).iteration_time_us,
            &format!("K = {k}"),
        );
    }
}
