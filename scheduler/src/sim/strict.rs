//! Strict semantics: d_s = max(c_s + L_s, max_ℓ Q^ℓ_s + κ_q·c_s), T = Σ_s d_s. Every block of
//! slot s starts at the slot's start, serialised on its link's channel (one channel without a
//! topology, DESIGN §3.11), each stretched by the slot's compute as (Q^ℓ_s + κ_q·c_s)/Q^ℓ_s.

use super::{StepInputs, Timing};
use crate::cost::Interference;

pub(super) fn run(inputs: &StepInputs, interference: Interference) -> Timing {
    let slots = inputs.labels.len();
    let mut start_us = Vec::with_capacity(slots);
    let mut duration_us = Vec::with_capacity(slots);
    let mut blocks = Vec::new();
    let mut now = 0.0;
    for s in 0..slots {
        let (c, per_link) = (inputs.compute_us[s], inputs.link_comm_us[s]);
        let stretch = per_link.map(|q| interference.comm_stretch(c, q));
        let mut channel = [now; 2];
        for entry in &inputs.queue[s] {
            let link = entry.link.index();
            let t = entry.time_us * stretch[link];
            blocks.push(inputs.event(s, entry, channel[link], channel[link] + t));
            channel[link] += t;
        }
        let busiest = per_link.into_iter().fold(0.0, f64::max);
        let d = interference.slot_duration(c, busiest, inputs.load_us[s]);
        start_us.push(now);
        duration_us.push(d);
        now += d;
    }
    Timing {
        compute_start_us: start_us.clone(),
        start_us,
        duration_us,
        iteration_time_us: now,
        blocks,
    }
}
