//! The offload baselines (DESIGN §3.13): `fsdp2-offload` (FSDP2's `CPUOffloadPolicy`) and
//! `zero3-offload` (ZeRO-3 with `offload_optimizer`), their schedules' offload, when a profile
//! has none, and the fastest that fits where no plan fits on the device alone.

use super::{BaselineKind, ChosenBaseline, Preference, best_baseline};
use crate::offload::{HostStep, Offload, host_node_bytes};
use crate::profile::Profile;
use crate::schedule::{RecomputeChoice, Schedule};
use crate::size::format_bytes;
use crate::{Error, Result};
use std::fmt;

/// Why the offload baseline `name` has no plan on `profile`: no host link, or micro-batches.
pub(super) fn unavailable_on(name: &str, profile: &Profile) -> Option<String> {
    if profile.host.is_none() {
        return Some(format!(
            "{name} needs a profile with a host link, a [host] as `profile analytic` writes it \
             for a device whose catalog entry has a host, and the profile has none"
        ));
    }
    (profile.micro_batches != 1).then(|| {
        format!(
            "{name} is modelled at one micro-batch per step, and the profile has \
             micro_batches = {}",
            profile.micro_batches
        )
    })
}

/// Gather depths (forward, backward) whose forward prefetch reaches back at most to E: with the
/// steps after the whole backward, a forward gather may not launch during the backward.
pub(super) fn forward_prefetch_to_e(depths: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    depths
        .into_iter()
        .enumerate()
        .map(|(unit, (forward, backward))| (forward.min(unit + 1), backward))
        .collect()
}

/// `schedule` with every unit offloaded as `mode` and the steps after the backward, as the
/// frameworks run them (DESIGN §3.13); an error naming the host's memory where the offloaded
/// state exceeds it.
pub(super) fn every_unit(
    profile: &Profile,
    schedule: Schedule,
    mode: Offload,
    name: &str,
) -> Result<Schedule> {
    let modes = vec![mode; schedule.units().len()];
    let needed = host_node_bytes(profile, schedule.units(), &modes);
    if let Some(host) = &profile.host
        && needed > host.memory_bytes as f64
    {
        return Err(Error::Infeasible(format!(
            "{name}: the offloaded state needs {} per node ({} ranks), over the host's memory of \
             {} (the profile's host.memory_bytes)",
            format_bytes(needed),
            host.ranks_per_node,
            format_bytes(host.memory_bytes as f64)
        )));
    }
    schedule.offloaded(profile, modes, HostStep::AfterBackward, name)
}

/// The offload baselines' answer where no plan fits the cap on the device alone (DESIGN §3.13),
/// which a solve's infeasibility names where the ILP's offload choices do not cover the profile
/// (DESIGN §4.10: K ≥ 2, groups of ranks, several links).
#[derive(Debug, Clone)]
pub enum OffloadFallback {
    /// The profile offers no offload baseline (no host link, or micro-batches).
    NotOffered,
    /// None of them fits the cap.
    NoneFits,
    /// The fastest that fits, with checkpointing off or on.
    Fastest(Box<ChosenBaseline>),
}

impl OffloadFallback {
    /// The fastest offload baseline of `profile` that fits `cap`.
    pub fn at(profile: &Profile, cap: Option<u64>) -> OffloadFallback {
        let offload = BaselineKind::offload_of(profile);
        if offload.is_empty() {
            return OffloadFallback::NotOffered;
        }
        best_baseline(
            profile,
            &offload,
            RecomputeChoice::Allowed,
            cap,
            Preference::Fastest,
        )
        .map_or(OffloadFallback::NoneFits, |best| {
            OffloadFallback::Fastest(Box::new(best))
        })
    }
}

/// The note that follows the infeasibility ("; …"), empty where no offload baseline is offered.
impl fmt::Display for OffloadFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadFallback::NotOffered => Ok(()),
            OffloadFallback::NoneFits => write!(f, "; no offload baseline fits either"),
            OffloadFallback::Fastest(best) => {
                let sim = &best.plan.simulation;
                write!(
                    f,
                    "; the ILP's offload choices do not cover this profile (DESIGN §4.10), and the \
                     fastest offload baseline that fits is {}: iteration {:.3} ms, device peak {}, host {} per node (`shardplan \
                     baseline --kind {}{}`)",
                    best.label(),
                    sim.iteration_time_us / 1e3,
                    format_bytes(sim.peak_memory_bytes),
                    format_bytes(sim.host.as_ref().map_or(0.0, |h| h.memory_bytes)),
                    best.kind.name(),
                    if best.checkpoint.is_on() {
                        " --checkpoint"
                    } else {
                        ""
                    }
                )
            }
        }
    }
}
