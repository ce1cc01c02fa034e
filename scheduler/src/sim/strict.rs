//! Strict semantics: d_s = max(c_s + L_s, Q_s + κ_q·c_s), T = Σ_s d_s. Every block of slot s
//! starts at the slot's start, serialised on the one channel, each stretched by the slot's
//! compute as (Q_s + κ_q·c_s)/Q_s.

use super::{StepInputs, Timing};
use crate::cost::Interference;

pub(super) fn run(inputs: &StepInputs, interference: Interference) -> Timing {
    let slots = inputs.labels.len();
    let mut start_us = Vec::with_capacity(slots);
    let mut duration_us = Vec::with_capacity(slots);
    let mut blocks = Vec::new();
    let mut now = 0.0;
    for s in 0..slots {
        let (c, q) = (inputs.compute_us[s], inputs.comm_us[s]);
        let mut channel = now;
        let stretch = interference.comm_stretch(c, q);
        for entry in &inputs.queue[s] {
            let t = entry.time_us * stretch;
            blocks.push(inputs.event(s, entry, channel, channel + t));
            channel += t;
        }
        let d = interference.slot_duration(c, q, inputs.load_us[s]);
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
