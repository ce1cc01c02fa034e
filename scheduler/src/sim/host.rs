//! The host side of an offloading schedule (DESIGN §3.13), shared by both semantics: per unit its
//! chain (the gradient's D2H after its last RS block, or its replica AllReduce over a shard group,
//! the host step, with `optimizer` the parameter shard's H2D), the H2D of a `full` unit's gather
//! blocks, each on its own FIFO channel, and when each unit's next gather may start. Under `after-backward` the steps wait for every
//! gradient, and E ends when every step and copy is done.

use super::StepInputs;
use crate::offload::{HostStep, HostWork, shard_ranks};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::timeline::Op;
use serde::Serialize;

/// What one queue entry has to do with the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Hook {
    Nothing,
    /// The last reduction block of an offloaded unit in the iteration: its end starts the chain.
    EndsReduction(usize),
    /// A gather block of an offloaded unit: it waits for the unit's parameters (and, `full`, for
    /// its shard's H2D).
    Gather(usize),
}

/// What a host event is: a copy on one of the host link's channels or a host step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostTrack {
    DeviceToHost,
    Step,
    HostToDevice,
}

impl HostTrack {
    pub fn name(self) -> &'static str {
        match self {
            HostTrack::DeviceToHost => "D2H",
            HostTrack::Step => "host step",
            HostTrack::HostToDevice => "H2D",
        }
    }
}

/// One copy or host step of a unit as it ran, µs from the iteration's start (a chain issued in
/// one iteration may end in the next).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HostEvent {
    pub unit: usize,
    pub track: HostTrack,
    pub start_us: f64,
    pub end_us: f64,
}

/// The host's inputs of a step.
pub(super) struct HostInputs {
    /// Per unit: its host work, None when it stays on the device.
    work: Vec<Option<HostWork>>,
    /// Per slot, aligned with the slot's queue.
    pub(super) hooks: Vec<Vec<Hook>>,
    host_step: HostStep,
    report: HostReport,
}

/// What the host does in one iteration, as the simulation reports it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HostReport {
    /// The offloaded state of one node (all its ranks), bytes.
    pub memory_bytes: f64,
    /// A rank's device-to-host copies per iteration, µs.
    pub device_to_host_us: f64,
    /// A rank's host-to-device copies per iteration, µs.
    pub host_to_device_us: f64,
    /// A rank's host optimizer steps per iteration, µs.
    pub step_us: f64,
}

impl HostInputs {
    /// The host inputs of `schedule` whose slot queues are `queue` (flat timeline, K = 1); None
    /// when nothing is offloaded.
    pub(super) fn of(
        profile: &Profile,
        schedule: &Schedule,
        queue: &[Vec<super::Entry>],
    ) -> Option<HostInputs> {
        let host = profile.host.as_ref().filter(|_| schedule.offloads())?;
        let work: Vec<Option<HostWork>> = (schedule.units().iter().enumerate())
            .map(|(unit, u)| {
                let ranks = shard_ranks(profile, u.shard_group);
                HostWork::of(profile, host, (unit, ranks), schedule.offload(unit))
            })
            .collect();
        let mut hooks: Vec<Vec<Hook>> = queue
            .iter()
            .map(|q| {
                q.iter()
                    .map(|e| match e.op {
                        Op::Gather | Op::GatherForward | Op::GatherBackward
                            if work[e.unit].is_some() =>
                        {
                            Hook::Gather(e.unit)
                        }
                        _ => Hook::Nothing,
                    })
                    .collect()
            })
            .collect();
        let mut report = HostReport {
            memory_bytes: crate::offload::host_node_bytes(
                profile,
                schedule.units(),
                schedule.offload_modes(),
            ),
            device_to_host_us: 0.0,
            host_to_device_us: 0.0,
            step_us: 0.0,
        };
        for (unit, w) in work.iter().enumerate() {
            let Some(w) = w else { continue };
            // The gradient shard is final after the last RS block, over a shard group after its
            // replica AllReduce (DESIGN §3.13).
            let reduction = if schedule.units()[unit].shard_group.is_some() {
                Op::ReplicaAllReduce
            } else {
                Op::ReduceScatter
            };
            let last = schedule
                .launches(unit, reduction)
                .last()
                .expect("an offloaded unit is sharded, so it reduce-scatters");
            let position = queue[last.slot]
                .iter()
                .rposition(|e| e.unit == unit && e.op == reduction)
                .expect("the last launch's blocks are in its slot's queue");
            hooks[last.slot][position] = Hook::EndsReduction(unit);
            let gather_blocks: u32 = [Op::Gather, Op::GatherForward, Op::GatherBackward]
                .iter()
                .flat_map(|&op| schedule.launches(unit, op))
                .map(|l| l.blocks)
                .sum();
            report.device_to_host_us += w.d2h_us;
            report.step_us += w.step_us;
            report.host_to_device_us += w.h2d_after_step_us.unwrap_or(0.0)
                + w.h2d_per_gather_block_us.unwrap_or(0.0) * f64::from(gather_blocks);
        }
        Some(HostInputs {
            work,
            hooks,
            host_step: schedule.host_step(),
            report,
        })
    }

    pub(super) fn report(&self) -> HostReport {
        self.report
    }

    /// Units whose gradient goes to the host each iteration.
    fn offloaded(&self) -> usize {
        self.work.iter().filter(|w| w.is_some()).count()
    }
}

/// The host's channels and each unit's readiness while a step is simulated, carried from one
/// iteration to the next.
pub(super) struct HostState {
    d2h_free: f64,
    h2d_free: f64,
    step_free: f64,
    /// Per unit: when its parameters are ready for its next gather (on the device for
    /// `optimizer`, updated on the host for `full`).
    ready: Vec<f64>,
    /// `after-backward`: the units whose gradient reached the host this iteration, and when.
    arrived: Vec<(usize, f64)>,
    /// `after-backward`: when this iteration's steps and copies are done (E ends no earlier).
    pub(super) barrier: f64,
    /// The events issued since [`HostState::begin`], in absolute µs.
    events: Vec<HostEvent>,
}

impl HostState {
    pub(super) fn new(inputs: &HostInputs) -> HostState {
        HostState {
            d2h_free: f64::NEG_INFINITY,
            h2d_free: f64::NEG_INFINITY,
            step_free: f64::NEG_INFINITY,
            ready: vec![f64::NEG_INFINITY; inputs.work.len()],
            arrived: Vec::new(),
            barrier: f64::NEG_INFINITY,
            events: Vec::new(),
        }
    }

    /// An iteration starts: its events are recorded afresh.
    pub(super) fn begin(&mut self) {
        self.events.clear();
    }

    /// The events issued since [`HostState::begin`], from the iteration's start at `start`.
    pub(super) fn events_from(&self, start: f64) -> Vec<HostEvent> {
        self.events
            .iter()
            .map(|e| HostEvent {
                start_us: e.start_us - start,
                end_us: e.end_us - start,
                ..*e
            })
            .collect()
    }

    /// Records `track`'s work of `unit` from `start_us` for `us`; returns its end.
    fn record(&mut self, unit: usize, track: HostTrack, start_us: f64, us: f64) -> f64 {
        let end_us = start_us + us;
        self.events.push(HostEvent {
            unit,
            track,
            start_us,
            end_us,
        });
        end_us
    }

    /// When a gather block of `unit` launched at `launch` may start: its parameters ready and,
    /// for `full`, its shard's H2D (issued now on the H2D channel) done.
    pub(super) fn gather_start(&mut self, inputs: &HostInputs, unit: usize, launch: f64) -> f64 {
        let ready = self.ready[unit];
        match inputs.work[unit].and_then(|w| w.h2d_per_gather_block_us) {
            Some(copy) => {
                let from = self.h2d_free.max(launch).max(ready);
                self.h2d_free = self.record(unit, HostTrack::HostToDevice, from, copy);
                self.h2d_free
            }
            None => ready,
        }
    }

    /// `unit`'s last reduction block ended at `end`: its gradient's D2H, then (overlapped) its
    /// step and copy back, or (after-backward) every step once every gradient has arrived.
    pub(super) fn reduction_done(&mut self, inputs: &HostInputs, unit: usize, end: f64) {
        let Some(work) = inputs.work[unit] else {
            return;
        };
        let from = self.d2h_free.max(end);
        let arrived = self.record(unit, HostTrack::DeviceToHost, from, work.d2h_us);
        self.d2h_free = arrived;
        match inputs.host_step {
            HostStep::Overlapped => self.step(inputs, unit, arrived),
            HostStep::AfterBackward => {
                self.arrived.push((unit, arrived));
                if self.arrived.len() == inputs.offloaded() {
                    let all = self.arrived.iter().map(|a| a.1).fold(end, f64::max);
                    let units: Vec<usize> = self.arrived.drain(..).map(|a| a.0).collect();
                    for unit in units {
                        self.step(inputs, unit, all);
                    }
                    self.barrier = self.step_free.max(self.h2d_free);
                }
            }
        }
    }

    /// `unit`'s host step, from `from` on, and its copy back with `optimizer`.
    fn step(&mut self, inputs: &HostInputs, unit: usize, from: f64) {
        let Some(work) = inputs.work[unit] else {
            return;
        };
        let start = self.step_free.max(from);
        let stepped = self.record(unit, HostTrack::Step, start, work.step_us);
        self.step_free = stepped;
        self.ready[unit] = match work.h2d_after_step_us {
            Some(copy) => {
                let start = self.h2d_free.max(stepped);
                self.h2d_free = self.record(unit, HostTrack::HostToDevice, start, copy);
                self.h2d_free
            }
            None => stepped,
        };
    }
}

impl StepInputs {
    /// The host hook of entry `k` of slot `slot` (Nothing without offload).
    pub(super) fn hook(&self, slot: usize, k: usize) -> Hook {
        self.host
            .as_ref()
            .map_or(Hook::Nothing, |h| h.hooks[slot][k])
    }
}
