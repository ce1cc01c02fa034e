//! The reference simulator (DESIGN §3): iteration time, per-slot durations and memory of any
//! validated schedule, under strict or relaxed semantics, and its Chrome/Perfetto trace.

mod memory;
mod relaxed;
mod strict;
pub mod trace;

pub use memory::{MemoryBreakdown, memory_by_slot};
pub use trace::chrome_trace;

use crate::cost::{Interference, block_time, block_time_us, compute_us};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::timeline::{Op, Slot};
use serde::Serialize;

/// When compute and communication wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Semantics {
    /// A slot ends when its compute and all of its communication are done.
    Strict,
    /// FIFO channel in plan order; compute waits only for the blocks it needs.
    Relaxed,
}

impl Semantics {
    pub fn name(self) -> &'static str {
        match self {
            Semantics::Strict => "strict",
            Semantics::Relaxed => "relaxed",
        }
    }
}

/// One slot of the steady-state iteration. Times are µs from the iteration's start.
#[derive(Debug, Clone, Serialize)]
pub struct SlotReport {
    pub slot: Slot,
    /// When the slot's blocks are launched (the compute stream reaches the slot).
    pub start_us: f64,
    pub compute_start_us: f64,
    /// c_s, without overlap slowdown.
    pub compute_us: f64,
    /// Q_s: total time of the blocks launched at the slot.
    pub comm_us: f64,
    /// d_s.
    pub duration_us: f64,
    pub memory: MemoryBreakdown,
    pub memory_bytes: f64,
}

/// One communication block as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct BlockEvent {
    pub unit: usize,
    pub op: Op,
    /// The slot at whose start the block was launched.
    pub slot: Slot,
    pub start_us: f64,
    pub end_us: f64,
}

/// The simulator's answer for one schedule.
#[derive(Debug, Clone, Serialize)]
pub struct Simulation {
    pub semantics: Semantics,
    /// T = Σ d_s.
    pub iteration_time_us: f64,
    /// Σ c_s.
    pub compute_us: f64,
    /// Σ Q_s.
    pub comm_us: f64,
    /// Σ L_s (κ_c·Σ Q_s when κ_u = κ_c): compute stretched by concurrent communication-stream
    /// work.
    pub overlap_slowdown_us: f64,
    /// κ_q·Σ_{s: Q_s > 0} c_s: communication stretched by concurrent compute.
    pub comm_slowdown_us: f64,
    /// T − Σ (c_s + L_s): time the compute stream waits on communication.
    pub exposed_comm_us: f64,
    pub peak_memory_bytes: f64,
    pub peak_slot: Slot,
    pub slots: Vec<SlotReport>,
    #[serde(skip)]
    pub blocks: Vec<BlockEvent>,
}

/// Per-slot inputs both semantics share: compute, the queue of block times, memory.
struct SlotInputs {
    compute_us: Vec<f64>,
    /// Per slot: (unit, op, time) of every block, in plan order.
    queue: Vec<Vec<(usize, Op, f64)>>,
    comm_us: Vec<f64>,
    /// Per slot: the compute its communication-stream work costs, L_s (DESIGN §3.4).
    load_us: Vec<f64>,
    memory: Vec<MemoryBreakdown>,
}

impl SlotInputs {
    fn new(profile: &Profile, schedule: &Schedule) -> Self {
        let timeline = schedule.timeline();
        let compute_us = (0..timeline.slot_count())
            .map(|s| compute_us(profile, timeline, s, |u| schedule.units()[u].recompute))
            .collect();
        let queue: Vec<Vec<(usize, Op, f64)>> = schedule
            .queues()
            .into_iter()
            .map(|q| {
                q.into_iter()
                    .flat_map(|e| {
                        let t = block_time_us(profile, e.unit, e.op);
                        std::iter::repeat_n((e.unit, e.op, t), e.blocks as usize)
                    })
                    .collect()
            })
            .collect();
        let comm_us = queue
            .iter()
            .map(|q: &Vec<(usize, Op, f64)>| q.iter().map(|b| b.2).sum())
            .collect();
        let interference = Interference::of(profile);
        let load_us = queue
            .iter()
            .map(|q| {
                q.iter()
                    .map(|&(unit, op, _)| interference.load_us(op, block_time(profile, unit, op)))
                    .sum()
            })
            .collect();
        SlotInputs {
            compute_us,
            queue,
            comm_us,
            load_us,
            memory: memory_by_slot(profile, schedule),
        }
    }
}

/// Slot timings produced by one semantics, from which the report is assembled.
struct Timing {
    start_us: Vec<f64>,
    compute_start_us: Vec<f64>,
    duration_us: Vec<f64>,
    iteration_time_us: f64,
    blocks: Vec<BlockEvent>,
}

/// Simulates a validated schedule.
pub fn simulate(profile: &Profile, schedule: &Schedule, semantics: Semantics) -> Simulation {
    let inputs = SlotInputs::new(profile, schedule);
    let interference = Interference::of(profile);
    let timing = match semantics {
        Semantics::Strict => strict::run(schedule, &inputs, interference),
        Semantics::Relaxed => relaxed::run(schedule, &inputs, interference),
    };
    let timeline = schedule.timeline();
    let totals = |v: &[f64]| v.iter().sum::<f64>();
    let compute = totals(&inputs.compute_us);
    let comm = totals(&inputs.comm_us);
    let load = totals(&inputs.load_us);
    let slots: Vec<SlotReport> = (0..timeline.slot_count())
        .map(|s| SlotReport {
            slot: timeline.slot(s),
            start_us: timing.start_us[s],
            compute_start_us: timing.compute_start_us[s],
            compute_us: inputs.compute_us[s],
            comm_us: inputs.comm_us[s],
            duration_us: timing.duration_us[s],
            memory: inputs.memory[s],
            memory_bytes: inputs.memory[s].total(),
        })
        .collect();
    let peak = slots.iter().enumerate().fold(0, |best, (s, r)| {
        if r.memory_bytes > slots[best].memory_bytes {
            s
        } else {
            best
        }
    });
    Simulation {
        semantics,
        iteration_time_us: timing.iteration_time_us,
        compute_us: compute,
        comm_us: comm,
        overlap_slowdown_us: load,
        comm_slowdown_us: interference.comm
            * (0..timeline.slot_count())
                .filter(|&s| inputs.comm_us[s] > 0.0)
                .map(|s| inputs.compute_us[s])
                .sum::<f64>(),
        exposed_comm_us: (timing.iteration_time_us - compute - load).max(0.0),
        peak_memory_bytes: slots[peak].memory_bytes,
        peak_slot: slots[peak].slot,
        slots,
        blocks: timing.blocks,
    }
}
