//! The reference simulator (DESIGN §3): iteration time, per-slot durations and memory of any
//! validated schedule, under strict or relaxed semantics, and its Chrome/Perfetto trace.

mod host;
mod memory;
mod relaxed;
mod steps;
mod strict;
pub mod trace;

pub use host::{HostEvent, HostReport, HostTrack};
pub use memory::{MemoryBreakdown, memory_by_slot};
pub use trace::chrome_trace;

use crate::cost::{Interference, among, compute_us};
use crate::offload::offloaded_block_time;
use crate::profile::{Link, Profile};
use crate::schedule::Schedule;
use crate::timeline::{Level, Op, Slot};
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
    /// The slot's micro-batch (1-based) when the step has several (DESIGN §3.10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
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

impl SlotReport {
    /// The slot's name with its micro-batch when the step has several: `F3`, `F3 [2]`.
    pub fn label(&self) -> String {
        labelled(self.slot, self.micro_batch)
    }
}

/// `slot`, and `[m]` after it for micro-batch m of a step of several.
fn labelled(slot: Slot, micro_batch: Option<u32>) -> String {
    match micro_batch {
        Some(m) => format!("{slot} [{m}]"),
        None => slot.to_string(),
    }
}

/// One communication block as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct BlockEvent {
    pub unit: usize,
    pub op: Op,
    /// The slot at whose start the block was launched.
    pub slot: Slot,
    /// That slot's micro-batch (1-based) when the step has several.
    pub micro_batch: Option<u32>,
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
    /// The peak slot's micro-batch (1-based) when the step has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_micro_batch: Option<u32>,
    pub slots: Vec<SlotReport>,
    /// The host's memory and work where the schedule offloads (DESIGN §3.13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostReport>,
    #[serde(skip)]
    pub blocks: Vec<BlockEvent>,
    /// The host's copies and steps as they ran (DESIGN §3.13); empty without offload.
    #[serde(skip)]
    pub host_events: Vec<HostEvent>,
    /// The index of the peak slot in `slots`.
    #[serde(skip)]
    peak_index: usize,
}

impl BlockEvent {
    /// The launch slot's name with its micro-batch when the step has several.
    pub fn launched_at(&self) -> String {
        labelled(self.slot, self.micro_batch)
    }
}

impl Simulation {
    /// The slot where memory peaks (the first of equals).
    pub fn peak(&self) -> &SlotReport {
        &self.slots[self.peak_index]
    }

    /// Where memory peaks, as messages write it: `B3`, or `B3 of micro-batch 2`.
    pub fn peak_at(&self) -> String {
        match self.peak_micro_batch {
            Some(m) => format!("{} of micro-batch {m}", self.peak_slot),
            None => self.peak_slot.to_string(),
        }
    }
}

/// One block in a slot's queue: its unit, op and op instance (what relaxed compute waits for),
/// its time and the compute it costs the slot (L, DESIGN §3.4).
#[derive(Debug, Clone, Copy)]
struct Entry {
    unit: usize,
    op: Op,
    instance: usize,
    /// The link whose queue it joins (DESIGN §3.11).
    link: Link,
    /// The op instance whose blocks must be done before it starts (relaxed semantics): a replica
    /// AllReduce's ReduceScatter, a shard group's forward gather's replica AllReduce (DESIGN
    /// §3.11); strict slots order them by themselves.
    after: Option<usize>,
    time_us: f64,
    load_us: f64,
}

/// The slots of one step with what both semantics need: compute, the queues of blocks, memory,
/// and for relaxed the op instance each slot's compute waits for. Built from the flat timeline at
/// K = 1 and from the unrolled micro-batches at K ≥ 2 (`steps`).
struct StepInputs {
    /// Per slot: its name, and its micro-batch (1-based) when the step has several.
    labels: Vec<(Slot, Option<u32>)>,
    compute_us: Vec<f64>,
    /// Per slot: its blocks in the canonical order (DESIGN §3.7).
    queue: Vec<Vec<Entry>>,
    /// Per slot: Q_s, the time of all its blocks.
    comm_us: Vec<f64>,
    /// Per slot and link: Q^ℓ_s, the time of its blocks on link ℓ (DESIGN §3.11).
    link_comm_us: Vec<[f64; 2]>,
    /// Per slot: the compute its communication-stream work costs, L_s (DESIGN §3.4).
    load_us: Vec<f64>,
    memory: Vec<MemoryBreakdown>,
    /// Per slot: the op instances whose blocks its compute waits for (relaxed semantics).
    needs: Vec<Vec<usize>>,
    /// Per slot: the op instances whose window opens there.
    opens: Vec<Vec<usize>>,
    instances: usize,
    /// The host's side where the schedule offloads (DESIGN §3.13; K = 1 only).
    host: Option<host::HostInputs>,
}

impl StepInputs {
    /// Sums each slot's queue into Q_s, Q^ℓ_s and L_s.
    fn with_totals(mut self) -> Self {
        self.link_comm_us = self
            .queue
            .iter()
            .map(|q| {
                let mut per_link = [0.0; 2];
                for e in q {
                    per_link[e.link.index()] += e.time_us;
                }
                per_link
            })
            .collect();
        self.comm_us = self.link_comm_us.iter().map(|q| q.iter().sum()).collect();
        self.load_us = self
            .queue
            .iter()
            .map(|q| q.iter().map(|e| e.load_us).sum())
            .collect();
        self
    }

    /// The event of `entry`, launched at slot `slot`, running from `start_us` to `end_us`.
    fn event(&self, slot: usize, entry: &Entry, start_us: f64, end_us: f64) -> BlockEvent {
        let (name, micro_batch) = self.labels[slot];
        BlockEvent {
            unit: entry.unit,
            op: entry.op,
            slot: name,
            micro_batch,
            start_us,
            end_us,
        }
    }

    /// The flat timeline of DESIGN §3 (K = 1): an op instance per unit and op.
    fn flat(profile: &Profile, schedule: &Schedule) -> Self {
        let timeline = schedule.timeline();
        let slots = timeline.slot_count();
        let instance = |unit: usize, op: Op| unit * Op::ALL.len() + op_index(op);
        let interference = Interference::of(profile);
        let queue: Vec<Vec<Entry>> = schedule
            .queues()
            .into_iter()
            .map(|q| {
                q.into_iter()
                    .flat_map(|e| {
                        let u = &schedule.units()[e.unit];
                        let among = among(profile, u, e.op);
                        let offload = schedule.offload(e.unit);
                        let block = offloaded_block_time(profile, e.unit, e.op, among, offload);
                        let after = match e.op {
                            Op::ReplicaAllReduce => Some(Op::ReduceScatter),
                            op if op.is_forward_gather() && u.shard_group.is_some() => {
                                Some(Op::ReplicaAllReduce)
                            }
                            _ => None,
                        };
                        let entry = Entry {
                            unit: e.unit,
                            op: e.op,
                            instance: instance(e.unit, e.op),
                            link: among.link(profile),
                            after: after.map(|op| instance(e.unit, op)),
                            time_us: block.total_us(),
                            load_us: interference.load_us(e.op, block),
                        };
                        std::iter::repeat_n(entry, e.blocks as usize)
                    })
                    .collect()
            })
            .collect();
        let units = schedule.units();
        let needs = (0..slots)
            .map(|s| {
                let unit = timeline.compute_unit(s)?;
                let op = match (units[unit].level, s == timeline.forward(unit)) {
                    (Level::None, true) => Op::AllReduce,
                    (Level::Sdp, true) => Op::Gather,
                    (Level::Fsdp, true) => Op::GatherForward,
                    (Level::Fsdp, false) => Op::GatherBackward,
                    (_, false) => return None,
                };
                Some(instance(unit, op))
            })
            .map(|need| need.into_iter().collect())
            .collect();
        let mut opens = vec![Vec::new(); slots];
        for unit in 0..units.len() {
            for op in Op::ALL {
                let w = timeline.window(unit, op.window_kind());
                if w.len > 0 {
                    opens[w.first].push(instance(unit, op));
                }
            }
        }
        StepInputs {
            host: host::HostInputs::of(profile, schedule, &queue),
            labels: (0..slots).map(|s| (timeline.slot(s), None)).collect(),
            compute_us: (0..slots)
                .map(|s| compute_us(profile, timeline, s, |u| units[u].recompute))
                .collect(),
            queue,
            comm_us: Vec::new(),
            link_comm_us: Vec::new(),
            load_us: Vec::new(),
            memory: memory_by_slot(profile, schedule),
            needs,
            opens,
            instances: units.len() * Op::ALL.len(),
        }
        .with_totals()
    }
}

/// The index of `op` in [`Op::ALL`].
fn op_index(op: Op) -> usize {
    Op::ALL
        .iter()
        .position(|&o| o == op)
        .expect("every op is in Op::ALL")
}

/// Slot timings produced by one semantics, from which the report is assembled.
struct Timing {
    start_us: Vec<f64>,
    compute_start_us: Vec<f64>,
    duration_us: Vec<f64>,
    iteration_time_us: f64,
    blocks: Vec<BlockEvent>,
    /// The host's copies and steps (DESIGN §3.13), empty without offload.
    host_events: Vec<HostEvent>,
}

/// Simulates a validated schedule: the flat timeline at K = 1, the unrolled micro-batches at
/// K ≥ 2 (DESIGN §3.10).
pub fn simulate(profile: &Profile, schedule: &Schedule, semantics: Semantics) -> Simulation {
    let inputs = if schedule.micro_batches() >= 2 {
        steps::unrolled(profile, schedule)
    } else {
        StepInputs::flat(profile, schedule)
    };
    simulate_inputs(profile, &inputs, semantics)
}

/// The simulation of a step's inputs under `semantics`.
fn simulate_inputs(profile: &Profile, inputs: &StepInputs, semantics: Semantics) -> Simulation {
    let interference = Interference::of(profile);
    let timing = match semantics {
        Semantics::Strict => strict::run(inputs, interference),
        Semantics::Relaxed => relaxed::run(inputs, interference),
    };
    let slot_count = inputs.labels.len();
    let totals = |v: &[f64]| v.iter().sum::<f64>();
    let compute = totals(&inputs.compute_us);
    let comm = totals(&inputs.comm_us);
    let load = totals(&inputs.load_us);
    let slots: Vec<SlotReport> = (0..slot_count)
        .map(|s| SlotReport {
            slot: inputs.labels[s].0,
            micro_batch: inputs.labels[s].1,
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
            * (0..slot_count)
                .filter(|&s| inputs.comm_us[s] > 0.0)
                .map(|s| inputs.compute_us[s])
                .sum::<f64>(),
        exposed_comm_us: (timing.iteration_time_us - compute - load).max(0.0),
        peak_memory_bytes: slots[peak].memory_bytes,
        peak_slot: slots[peak].slot,
        peak_micro_batch: slots[peak].micro_batch,
        slots,
        host: inputs.host.as_ref().map(host::HostInputs::report),
        blocks: timing.blocks,
        host_events: timing.host_events,
        peak_index: peak,
    }
}
