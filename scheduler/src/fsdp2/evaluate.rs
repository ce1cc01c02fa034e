//! The time, memory and timeline of FSDP2 settings (DESIGN §3.12): the simulator runs their
//! schedule ([`super::translate`]), and each slot's memory adds the copies FSDP2 makes beside the
//! model's buffers: a gathered unit's all-gather output beside its unsharded parameters in the
//! slot of its copy-out (a replicated unit's unsharded copy beside its parameters, in every slot
//! it is unsharded), and in the slot of a reducing backward the reduce-scatter input beside the
//! unsharded gradient (a replicated unit's gradient copies too, its reduce-scatter input held
//! into the next slot).

use super::hooks::{Boundary, Pass, Walk};
use super::{Settings, UnitSettings};
use crate::profile::Profile;
use crate::sim::{Semantics, Simulation, simulate};
use crate::size::whole_bytes;
use crate::timeline::Timeline;
use serde::Serialize;

/// One module boundary of the timeline, as exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEntry {
    /// `F:<unit>` or `B:<unit>`.
    pub at: String,
    /// The micro-batch (1-based) when the step has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// Units whose gathered parameters exist when that unit's compute starts.
    pub unsharded: Vec<String>,
    /// The all-gathers its pre-hook issues, in issue order.
    pub issued: Vec<String>,
    /// The bytes of those units' unsharded parameters, Σ Ψ_u·p (FSDP2's unsharded parameters,
    /// in the gathered precision; its all-gather output for a unit still in flight).
    pub unsharded_bytes: u64,
    /// Units whose unsharded parameters FSDP2 frees after this pre-hook and before the next
    /// boundary's (post-forward, post-backward), in order.
    pub resharded: Vec<String>,
    /// Units whose gradients FSDP2 reduces after this pre-hook and before the next boundary's
    /// (post-backward), in order.
    pub reduced: Vec<String>,
}

/// FSDP2's time and memory for a set of settings.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// The strict simulation of the settings' schedule (slots, model memory).
    pub strict: Simulation,
    /// Its relaxed iteration time.
    pub relaxed_iteration_time_us: f64,
    /// Per slot (unrolled), the model's memory plus FSDP2's copies.
    pub memory_bytes: Vec<f64>,
    /// The largest of `memory_bytes`, whole bytes.
    pub peak_memory_bytes: u64,
    /// Where it peaks: `B3`, `B3 [2]`.
    pub peak_slot: String,
    pub timeline: Vec<TimelineEntry>,
}

impl Evaluation {
    pub fn iteration_time_us(&self) -> f64 {
        self.strict.iteration_time_us
    }
}

/// Evaluates `settings` against the profile they were checked for.
pub fn evaluate(profile: &Profile, settings: &Settings) -> Evaluation {
    let schedule = settings.schedule();
    let strict = simulate(profile, schedule, Semantics::Strict);
    let relaxed = simulate(profile, schedule, Semantics::Relaxed);
    let mut memory_bytes: Vec<f64> = strict.slots.iter().map(|s| s.memory_bytes).collect();
    for copy in copies(profile, settings.units(), settings.walk()) {
        memory_bytes[copy.slot] += copy.bytes;
    }
    let peak = (0..memory_bytes.len()).fold(0, |best, s| {
        if memory_bytes[s] > memory_bytes[best] {
            s
        } else {
            best
        }
    });
    let names = |units: &[usize]| -> Vec<String> {
        units
            .iter()
            .map(|&u| profile.units[u].name.clone())
            .collect()
    };
    let bytes = profile.bytes_per_param;
    let several = profile.micro_batches >= 2;
    let entry = |b: &Boundary| TimelineEntry {
        at: format!(
            "{}:{}",
            match b.pass {
                Pass::Forward => "F",
                Pass::Backward => "B",
            },
            profile.units[b.unit].name
        ),
        micro_batch: several.then_some(b.micro_batch as u32 + 1),
        unsharded: names(&b.unsharded),
        issued: names(&b.issued),
        unsharded_bytes: b
            .unsharded
            .iter()
            .map(|&u| profile.units[u].params * bytes.param)
            .sum(),
        resharded: names(&b.resharded),
        reduced: names(&b.reduced),
    };
    Evaluation {
        peak_memory_bytes: whole_bytes(memory_bytes[peak]),
        peak_slot: strict.slots[peak].label(),
        relaxed_iteration_time_us: relaxed.iteration_time_us,
        timeline: settings.walk().boundaries.iter().map(entry).collect(),
        memory_bytes,
        strict,
    }
}

/// One of FSDP2's copies beside the model's buffers: `bytes` of unit `unit`'s in (unrolled) slot
/// `slot`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExtraCopy {
    pub slot: usize,
    pub unit: usize,
    pub bytes: f64,
}

/// The copies FSDP2 makes beside the model's buffers for `units` whose hooks ran as `walk`, in
/// the order [`evaluate`] adds them: per boundary a gathered unit's all-gather output at its
/// copy-out and a reduction's reduce-scatter input, then each replicated unit's unsharded copy
/// per slot it is unsharded. Each unit's copies depend on its own settings only, which the ILP's
/// FSDP2 target reads unit by unit (`ilp::target`).
pub fn copies(profile: &Profile, units: &[UnitSettings], walk: &Walk) -> Vec<ExtraCopy> {
    let timeline = Timeline::new(profile.unit_count());
    let width = timeline.slot_count();
    let bytes = profile.bytes_per_param;
    let is_replicated = |u: usize| units[u].sharding == super::Sharding::Replicated;
    let mut list = Vec::new();
    // A replicated unit's unsharded copy, beside its parameters, in every slot whose compute
    // finds it unsharded: its own F and B, a tied lender's from its forward to its post-backward.
    let mut replicated_copies = std::collections::BTreeSet::new();
    for b in &walk.boundaries {
        let replicated = is_replicated(b.unit);
        let slot = |unit: usize| {
            b.micro_batch * width
                + match b.pass {
                    Pass::Forward => timeline.forward(unit),
                    Pass::Backward => timeline.backward(unit),
                }
        };
        let full = profile.laid_out_params(b.unit) as f64;
        if b.copied_out && !replicated {
            // In the slot of the compute the pre-hook precedes.
            list.push(ExtraCopy {
                slot: slot(b.computes),
                unit: b.unit,
                bytes: full * bytes.param as f64,
            });
        }
        let copied = b.unsharded.iter().filter(|&&u| is_replicated(u));
        replicated_copies.extend(copied.map(|&u| (slot(b.computes), u)));
        if b.unit != b.computes && replicated {
            // A tied lender's pre-backward: its copy stays past its own backward (no boundary of
            // its own), to its post-backward.
            replicated_copies.extend((slot(b.computes)..=slot(b.unit)).map(|s| (s, b.unit)));
        }
        // The reduction follows the unit's own backward.
        let slot = slot(b.unit);
        if b.reduces {
            let grad = full * bytes.grad as f64;
            list.push(ExtraCopy {
                slot,
                unit: b.unit,
                bytes: if replicated { 2.0 * grad } else { grad },
            });
            if replicated {
                list.push(ExtraCopy {
                    slot: slot + 1,
                    unit: b.unit,
                    bytes: grad,
                });
            }
        }
    }
    list.extend(replicated_copies.into_iter().map(|(slot, unit)| ExtraCopy {
        slot,
        unit,
        bytes: (profile.laid_out_params(unit) * bytes.param) as f64,
    }));
    list
}
