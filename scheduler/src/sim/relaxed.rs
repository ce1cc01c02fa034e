//! Relaxed semantics. Each link's channel stays FIFO in plan order (one channel without a
//! topology, DESIGN §3.11); a block starts when its channel is free and the compute stream has
//! reached its launch slot; a slot's compute starts when the previous compute is done and the
//! blocks it needs are done (the unit's gathers; for a `none` unit's forward, its AllReduce of
//! the previous iteration); compute takes c_s + L_s, and the blocks launched in slot s on link ℓ
//! take (Q^ℓ_s + κ_q·c_s)/Q^ℓ_s times their own time (the slot's compute beside them).
//! Reductions are launched after their B_i, so they wait for their gradient; a replica AllReduce
//! also waits for its unit's ReduceScatter blocks launched in earlier slots, and a shard group's
//! forward gather for its replica AllReduce (they may run on different links).
//!
//! The timeline is cyclic (gathers launched in one iteration feed the next), so iterations are
//! simulated until the iteration time is stationary; the last iteration is reported. Relaxed has
//! a subset of strict's waits, hence T_relaxed ≤ T_strict for every plan.
//!
//! With offloaded units (DESIGN §3.13) a gather block also waits for its unit's parameters (and,
//! `full`, its shard's H2D), an offloaded unit's last reduction block starts its host chain, and
//! E's compute ends no earlier than the `after-backward` steps.

use super::host::{Hook, HostState};
use super::{StepInputs, Timing};
use crate::cost::Interference;

/// Iterations after which a non-stationary (periodic) regime is averaged instead.
pub(super) const MAX_ITERATIONS: usize = 64;
/// Relative change of the iteration time that counts as stationary.
const STATIONARY: f64 = 1e-12;

/// Whether the last three of `times` are equal within [`STATIONARY`] relative.
pub(super) fn stationary(times: &[f64]) -> bool {
    let n = times.len();
    n >= 3 && {
        let scale = STATIONARY * times[n - 1].max(1.0);
        (times[n - 1] - times[n - 2]).abs() <= scale && (times[n - 2] - times[n - 3]).abs() <= scale
    }
}

/// The reported iteration time of `times`: the last where it became stationary, else (after
/// [`MAX_ITERATIONS`]) the mean of the second half.
pub(super) fn steady_time(times: &[f64]) -> f64 {
    let n = times.len();
    if n < MAX_ITERATIONS {
        times[n - 1]
    } else {
        let tail = &times[n / 2..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }
}

pub(super) fn run(inputs: &StepInputs, interference: Interference) -> Timing {
    let slots = inputs.labels.len();
    // Latest end of the blocks of an op instance launched since its window opened.
    let mut ready = vec![f64::NEG_INFINITY; inputs.instances];
    let mut channel_free = [0.0f64; 2];
    let mut compute_end = 0.0f64;
    let mut iteration_times: Vec<f64> = Vec::new();
    let mut last = None;
    // Per block of a slot, the readiness of what it waits for across links (reused slot to slot).
    let mut launched_before: Vec<f64> = Vec::new();
    let mut host = inputs.host.as_ref().map(|h| (h, HostState::new(h)));
    for _ in 0..MAX_ITERATIONS {
        let iteration_start = compute_end;
        if let Some((_, state)) = host.as_mut() {
            state.begin();
        }
        let mut start_us = Vec::with_capacity(slots);
        let mut compute_start_us = Vec::with_capacity(slots);
        let mut duration_us = Vec::with_capacity(slots);
        let mut blocks = Vec::new();
        for (s, opening) in inputs.opens.iter().enumerate() {
            let launch = compute_end;
            for &instance in opening {
                ready[instance] = f64::NEG_INFINITY;
            }
            let c = inputs.compute_us[s];
            let stretch = inputs.link_comm_us[s].map(|q| interference.comm_stretch(c, q));
            // What a block waits for across links was launched in an earlier slot: its readiness
            // as this slot starts, not including this slot's own blocks.
            launched_before.clear();
            launched_before.extend(
                inputs.queue[s]
                    .iter()
                    .map(|e| e.after.map_or(f64::NEG_INFINITY, |i| ready[i])),
            );
            for (k, (entry, &waits)) in inputs.queue[s].iter().zip(&launched_before).enumerate() {
                let link = entry.link.index();
                let t = entry.time_us * stretch[link];
                let mut start = channel_free[link].max(launch).max(waits);
                let hook = inputs.hook(s, k);
                if let (Some((h, state)), Hook::Gather(unit)) = (host.as_mut(), hook) {
                    start = start.max(state.gather_start(h, unit, launch));
                }
                let end = start + t;
                if let (Some((h, state)), Hook::EndsReduction(unit)) = (host.as_mut(), hook) {
                    state.reduction_done(h, unit, end);
                }
                channel_free[link] = end;
                ready[entry.instance] = ready[entry.instance].max(end);
                blocks.push(inputs.event(s, entry, start - iteration_start, end - iteration_start));
            }
            let wait = inputs.needs[s]
                .iter()
                .map(|&instance| ready[instance])
                .fold(f64::NEG_INFINITY, f64::max);
            let compute_start = compute_end.max(wait);
            compute_end = compute_start + inputs.compute_us[s] + inputs.load_us[s];
            if let Some((_, state)) = &host
                && s + 1 == inputs.opens.len()
            {
                compute_end = compute_end.max(state.barrier);
            }
            start_us.push(launch - iteration_start);
            compute_start_us.push(compute_start - iteration_start);
            duration_us.push(compute_end - launch);
        }
        let time = compute_end - iteration_start;
        iteration_times.push(time);
        let host_events = host
            .as_ref()
            .map_or_else(Vec::new, |(_, state)| state.events_from(iteration_start));
        last = Some((start_us, compute_start_us, duration_us, blocks, host_events));
        if stationary(&iteration_times) {
            break;
        }
    }
    let iteration_time_us = steady_time(&iteration_times);
    let (start_us, compute_start_us, duration_us, blocks, host_events) =
        last.expect("at least one iteration");
    Timing {
        start_us,
        compute_start_us,
        duration_us,
        iteration_time_us,
        blocks,
        host_events,
    }
}
