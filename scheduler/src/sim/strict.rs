//! Strict semantics: d_s = max(c_s + L_s, max_ℓ Q^ℓ_s + κ_q·c_s), T = Σ_s d_s. Every block of
//! slot s starts at the slot's start, serialised on its link's channel (one channel without a
//! topology, DESIGN §3.11), each stretched by the slot's compute as (Q^ℓ_s + κ_q·c_s)/Q^ℓ_s.
//!
//! With offloaded units (DESIGN §3.13) a gather block starts no earlier than its unit's
//! parameters (and, `full`, its shard's H2D), and a slot whose gathers waited ends no earlier than
//! its link's last block; E ends no earlier than the `after-backward` steps. Host chains feed the
//! next iteration, so iterations repeat until the time is stationary and the last is reported.

use super::host::{Hook, HostState};
use super::relaxed::{MAX_ITERATIONS, stationary, steady_time};
use super::{StepInputs, Timing};
use crate::cost::Interference;

pub(super) fn run(inputs: &StepInputs, interference: Interference) -> Timing {
    let Some(host) = &inputs.host else {
        return pass(inputs, interference, None, 0.0);
    };
    let mut state = HostState::new(host);
    let mut times = Vec::new();
    let mut start = 0.0;
    loop {
        let timing = pass(inputs, interference, Some(&mut state), start);
        start += timing.iteration_time_us;
        times.push(timing.iteration_time_us);
        if stationary(&times) || times.len() == MAX_ITERATIONS {
            return Timing {
                iteration_time_us: steady_time(&times),
                ..timing
            };
        }
    }
}

/// One iteration from `start` (µs); times in the result are from the iteration's start.
fn pass(
    inputs: &StepInputs,
    interference: Interference,
    mut host: Option<&mut HostState>,
    start: f64,
) -> Timing {
    let slots = inputs.labels.len();
    let mut start_us = Vec::with_capacity(slots);
    let mut duration_us = Vec::with_capacity(slots);
    let mut blocks = Vec::new();
    let mut now = start;
    if let Some(state) = host.as_deref_mut() {
        state.begin();
    }
    for s in 0..slots {
        let (c, per_link) = (inputs.compute_us[s], inputs.link_comm_us[s]);
        let stretch = per_link.map(|q| interference.comm_stretch(c, q));
        let mut channel = [now; 2];
        let mut waited = [false; 2];
        for (k, entry) in inputs.queue[s].iter().enumerate() {
            let link = entry.link.index();
            let t = entry.time_us * stretch[link];
            let mut begin = channel[link];
            let hook = inputs.hook(s, k);
            if let (Some(state), Hook::Gather(unit)) = (host.as_deref_mut(), hook) {
                let ready = state.gather_start(host_inputs(inputs), unit, now);
                if ready > begin {
                    begin = ready;
                    waited[link] = true;
                }
            }
            blocks.push(inputs.event(s, entry, begin - start, begin + t - start));
            channel[link] = begin + t;
            if let (Some(state), Hook::EndsReduction(unit)) = (host.as_deref_mut(), hook) {
                state.reduction_done(host_inputs(inputs), unit, begin + t);
            }
        }
        let busiest = per_link.into_iter().fold(0.0, f64::max);
        let mut d = interference.slot_duration(c, busiest, inputs.load_us[s]);
        for link in 0..2 {
            if waited[link] {
                d = d.max(channel[link] - now);
            }
        }
        if let Some(state) = host.as_deref()
            && s + 1 == slots
        {
            d = d.max(state.barrier - now);
        }
        start_us.push(now - start);
        duration_us.push(d);
        now += d;
    }
    Timing {
        compute_start_us: start_us.clone(),
        start_us,
        duration_us,
        iteration_time_us: now - start,
        blocks,
        host_events: host.map_or_else(Vec::new, |state| state.events_from(start)),
    }
}

/// The host inputs of a step that has a host state.
fn host_inputs(inputs: &StepInputs) -> &super::host::HostInputs {
    inputs
        .host
        .as_ref()
        .expect("a host state exists only for a step with host inputs")
}
