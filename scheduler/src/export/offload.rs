//! Offload in the FSDP2 export (DESIGN §3.13): an offloaded unit's `fully_shard` gets
//! `offload_policy=CPUOffloadPolicy(pin_memory=True)`, the choices FSDP2 cannot express are
//! listed, and the settings' FSDP2 time and peak are those of their schedule with FSDP2's
//! offload: every offloaded unit `full`, the host's steps after the backward.
//!
//! FSDP2's `CPUOffloadPolicy` moves a module's sharded parameters, gradients and optimizer state
//! to the host together and `optimizer.step()` runs after `backward()` returns, so an
//! `optimizer` unit is exported as `full` and an overlapped `host_step` as `after-backward`.

use crate::Result;
use crate::fsdp2::Settings;
use crate::fsdp2::evaluate::Evaluation;
use crate::offload::{HostStep, Offload};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, simulate};
use crate::size::whole_bytes;
use serde::Serialize;

/// FSDP2's `CPUOffloadPolicy` of a unit, as `shardplan_torch.apply_plan` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OffloadPolicy {
    /// Pinned host memory (FSDP2's default; `apply_plan` passes False where the process group
    /// is gloo: there is no pinned memory without a GPU).
    pub pin_memory: bool,
}

/// A unit's policy under `mode`: FSDP2's `CPUOffloadPolicy` for either offload.
pub fn policy(mode: Offload) -> Option<OffloadPolicy> {
    (!mode.is_none()).then_some(OffloadPolicy { pin_memory: true })
}

/// What the export rounds of `schedule`'s offload, one note each.
pub fn notes(profile: &Profile, schedule: &Schedule) -> Vec<String> {
    let mut notes = Vec::new();
    for (unit, mode) in schedule.offload_modes().iter().enumerate() {
        if *mode == Offload::Optimizer {
            notes.push(format!(
                "{}: offload = optimizer (its optimizer state, fp32 master and gradients on the \
                 host); FSDP2's CPUOffloadPolicy offloads the parameters with them, so it is \
                 exported as full (its parameter shard on the host, copied to the device \
                 before each all-gather)",
                profile.units[unit].name
            ));
        }
    }
    if schedule.offloads() && schedule.host_step() == HostStep::Overlapped {
        notes.push(
            "host_step = overlapped; FSDP2's optimizer.step() runs on the host after backward() \
             returns, so the steps are exported after the backward (after-backward)"
                .into(),
        );
    }
    if schedule.offloads() && profile.bytes_per_param.param == 2 {
        notes.push(
            "FSDP2 copies the fp32 parameter shard to the device and casts it there; the FSDP2 \
             time counts 2 bytes per parameter (a cast on the host), so it under-counts those \
             copies by half (DESIGN §3.13)"
                .into(),
        );
    }
    notes
}

/// FSDP2's time and peak for offloading settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadedFsdp2 {
    pub iteration_time_us: f64,
    pub relaxed_iteration_time_us: f64,
    pub peak_memory_bytes: u64,
    pub peak_slot: String,
    /// One node's offloaded state, bytes.
    pub host_memory_bytes: u64,
}

/// FSDP2's time and peak of `settings` (evaluated as `eval`) where `schedule` offloads: their
/// schedule with every offloaded unit `full` and the steps after the backward, simulated
/// (DESIGN §3.13), each slot's memory plus the copies FSDP2 makes beside the model's buffers
/// (what `eval` adds to its own simulation's); None where nothing is offloaded.
pub fn evaluate(
    profile: &Profile,
    schedule: &Schedule,
    settings: &Settings,
    eval: &Evaluation,
) -> Result<Option<OffloadedFsdp2>> {
    if !schedule.offloads() {
        return Ok(None);
    }
    let modes = (schedule.offload_modes().iter())
        .map(|m| {
            if m.is_none() {
                Offload::None
            } else {
                Offload::Full
            }
        })
        .collect();
    let origin = "export fsdp2 (the FSDP2 settings' schedule)";
    let offloaded =
        (settings.schedule().clone()).offloaded(profile, modes, HostStep::AfterBackward, origin)?;
    let strict = simulate(profile, &offloaded, Semantics::Strict);
    let relaxed = simulate(profile, &offloaded, Semantics::Relaxed);
    let memory: Vec<f64> = (strict.slots.iter().zip(&eval.strict.slots))
        .zip(&eval.memory_bytes)
        .map(|((slot, model), fsdp2)| slot.memory_bytes + (fsdp2 - model.memory_bytes))
        .collect();
    let peak = (0..memory.len()).fold(0, |best, s| if memory[s] > memory[best] { s } else { best });
    let host = strict.host.map_or(0.0, |h| h.memory_bytes);
    Ok(Some(OffloadedFsdp2 {
        iteration_time_us: strict.iteration_time_us,
        relaxed_iteration_time_us: relaxed.iteration_time_us,
        peak_memory_bytes: whole_bytes(memory[peak]),
        peak_slot: strict.slots[peak].label(),
        host_memory_bytes: whole_bytes(host),
    }))
}
