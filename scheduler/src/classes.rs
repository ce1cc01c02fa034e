//! The strict simulation of a step of many micro-batches from its three classes (DESIGN §3.10):
//! micro-batches 2 … K−1 carry the same blocks, compute and memory, so the step simulated at
//! K' = 3 holds every distinct slot, and each steady micro-batch past the second adds what the
//! fourth adds at K' = 4. Planning (baselines, warm starts, solves) evaluates plans this way, in a
//! time that does not grow with K; the simulator itself unrolls all K.

use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, Simulation, simulate};

/// Micro-batches up to which the step is simulated whole.
const UNROLLED_UP_TO: u32 = 4;

/// The strict simulation of `schedule`. At K ≤ 4 the simulator's own; above, the step's totals
/// are the simulator's at K' = 3 and 4 extended linearly to K (exact, each steady micro-batch
/// adding the same), and its slots and blocks are the first, one steady (micro-batch 2, standing
/// for 2 … K−1) and the last micro-batch, the last's times as they fall in the whole step. The
/// peak is the whole step's: every slot of a steady micro-batch is micro-batch 2's.
pub fn simulate_strict(profile: &Profile, schedule: &Schedule) -> Simulation {
    let k = schedule.micro_batches();
    let at = |micro_batches: u32| {
        let profile = Profile {
            micro_batches,
            ..profile.clone()
        };
        let schedule = Schedule::new(&profile, schedule.units().to_vec()).ok()?;
        Some(simulate(&profile, &schedule, Semantics::Strict))
    };
    let classes = if k > UNROLLED_UP_TO {
        at(3).zip(at(4))
    } else {
        None
    };
    // A schedule valid at K is valid at K' (its launches are per boundary kind, not per K);
    // were it not, the whole step is simulated.
    let Some((three, four)) = classes else {
        return simulate(profile, schedule, Semantics::Strict);
    };
    let steady_micro_batches = f64::from(k - 3);
    let extend =
        |of: fn(&Simulation) -> f64| of(&three) + steady_micro_batches * (of(&four) - of(&three));
    let steady_us = four.iteration_time_us - three.iteration_time_us;
    let shift_us = steady_micro_batches * steady_us;
    let mut sim = three.clone();
    sim.iteration_time_us = extend(|s| s.iteration_time_us);
    sim.compute_us = extend(|s| s.compute_us);
    sim.comm_us = extend(|s| s.comm_us);
    sim.overlap_slowdown_us = extend(|s| s.overlap_slowdown_us);
    sim.comm_slowdown_us = extend(|s| s.comm_slowdown_us);
    sim.exposed_comm_us =
        (sim.iteration_time_us - sim.compute_us - sim.overlap_slowdown_us).max(0.0);
    let last = |micro_batch: &mut Option<u32>| {
        let is_last = *micro_batch == Some(3);
        if is_last {
            *micro_batch = Some(k);
        }
        is_last
    };
    for slot in &mut sim.slots {
        if last(&mut slot.micro_batch) {
            slot.start_us += shift_us;
            slot.compute_start_us += shift_us;
        }
    }
    for block in &mut sim.blocks {
        // A block launched in the last micro-batch runs in its slots; one of the step boundary
        // launched there and running into the first micro-batch too.
        if last(&mut block.micro_batch) {
            block.start_us += shift_us;
            block.end_us += shift_us;
        }
    }
    last(&mut sim.peak_micro_batch);
    sim
}
