//! Relaxed semantics. The channel stays FIFO in plan order; a block starts when the channel is
//! free and the compute stream has reached its launch slot; a slot's compute starts when the
//! previous compute is done and the blocks it needs are done (the unit's gathers; for a `none`
//! unit's forward, its AllReduce of the previous iteration); compute takes
//! c_s + L_s, and the blocks launched in slot s take (Q_s + κ_q·c_s)/Q_s times their own time
//! (the slot's compute beside them). Reductions are launched after their B_i, so they wait for
//! their gradient.
//!
//! The timeline is cyclic (gathers launched in one iteration feed the next), so iterations are
//! simulated until the iteration time is stationary; the last iteration is reported. Relaxed has
//! a subset of strict's waits, hence T_relaxed ≤ T_strict for every plan.

use super::{BlockEvent, SlotInputs, Timing};
use crate::cost::Interference;
use crate::schedule::Schedule;
use crate::timeline::{Level, Op};

/// Iterations after which a non-stationary (periodic) regime is averaged instead.
const MAX_ITERATIONS: usize = 64;
/// Relative change of the iteration time that counts as stationary.
const STATIONARY: f64 = 1e-12;

/// The blocks the compute of a slot must wait for: the unit's gathers, and for a replicated
/// unit's forward its previous AllReduce (the optimizer step needs the reduced gradient).
fn needed(schedule: &Schedule, slot: usize) -> Option<(usize, Op)> {
    let timeline = schedule.timeline();
    let unit = timeline.compute_unit(slot)?;
    match (schedule.units()[unit].level, slot == timeline.forward(unit)) {
        (Level::None, true) => Some((unit, Op::AllReduce)),
        (Level::None, false) => None,
        (Level::Sdp, true) => Some((unit, Op::Gather)),
        (Level::Sdp, false) => None,
        (Level::Fsdp, true) => Some((unit, Op::GatherForward)),
        (Level::Fsdp, false) => Some((unit, Op::GatherBackward)),
    }
}

pub(super) fn run(schedule: &Schedule, inputs: &SlotInputs, interference: Interference) -> Timing {
    let timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let units = schedule.units().len();
    // Latest end of the blocks of (unit, op) launched since its window opened.
    let op_index = |op: Op| Op::ALL.iter().position(|&o| o == op).expect("known op");
    let mut ready = vec![[f64::NEG_INFINITY; 5]; units];
    let window_opens: Vec<Vec<(usize, usize)>> = (0..slots)
        .map(|s| {
            (0..units)
                .flat_map(|u| Op::ALL.map(|op| (u, op)))
                .filter(|&(u, op)| {
                    let w = timeline.window(u, op.window_kind());
                    w.len > 0 && w.first == s
                })
                .map(|(u, op)| (u, op_index(op)))
                .collect()
        })
        .collect();
    let mut channel_free = 0.0f64;
    let mut compute_end = 0.0f64;
    let mut iteration_times: Vec<f64> = Vec::new();
    let mut last = None;
    for iteration in 0..MAX_ITERATIONS {
        let iteration_start = compute_end;
        let mut start_us = Vec::with_capacity(slots);
        let mut compute_start_us = Vec::with_capacity(slots);
        let mut duration_us = Vec::with_capacity(slots);
        let mut blocks = Vec::new();
        for (s, opening) in window_opens.iter().enumerate() {
            let launch = compute_end;
            for &(u, k) in opening {
                ready[u][k] = f64::NEG_INFINITY;
            }
            let stretch = interference.comm_stretch(inputs.compute_us[s], inputs.comm_us[s]);
            for &(unit, op, t) in &inputs.queue[s] {
                let t = t * stretch;
                let start = channel_free.max(launch);
                channel_free = start + t;
                let k = op_index(op);
                ready[unit][k] = ready[unit][k].max(channel_free);
                blocks.push(BlockEvent {
                    unit,
                    op,
                    slot: timeline.slot(s),
                    start_us: start - iteration_start,
                    end_us: channel_free - iteration_start,
                });
            }
            let wait =
                needed(schedule, s).map_or(f64::NEG_INFINITY, |(u, op)| ready[u][op_index(op)]);
            let compute_start = compute_end.max(wait);
            compute_end = compute_start + inputs.compute_us[s] + inputs.load_us[s];
            start_us.push(launch - iteration_start);
            compute_start_us.push(compute_start - iteration_start);
            duration_us.push(compute_end - launch);
        }
        let time = compute_end - iteration_start;
        iteration_times.push(time);
        last = Some((start_us, compute_start_us, duration_us, blocks));
        let n = iteration_times.len();
        if iteration >= 2
            && (iteration_times[n - 1] - iteration_times[n - 2]).abs() <= STATIONARY * time.max(1.0)
            && (iteration_times[n - 2] - iteration_times[n - 3]).abs() <= STATIONARY * time.max(1.0)
        {
            break;
        }
    }
    let n = iteration_times.len();
    let iteration_time_us = if n < MAX_ITERATIONS {
        iteration_times[n - 1]
    } else {
        let tail = &iteration_times[n / 2..];
        tail.iter().sum::<f64>() / tail.len() as f64
    };
    let (start_us, compute_start_us, duration_us, blocks) = last.expect("at least one iteration");
    Timing {
        start_us,
        compute_start_us,
        duration_us,
        iteration_time_us,
        blocks,
    }
}
