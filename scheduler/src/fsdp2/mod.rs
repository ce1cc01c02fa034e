//! FSDP2's execution semantics (DESIGN §3.12): per-module `fully_shard` settings as a typed value
//! ([`Settings`], valid when it exists), the order in which FSDP2's hooks issue and free what they
//! do ([`hooks`]), the settings as the simulator's schedule ([`translate`]) and their time, memory
//! and timeline ([`evaluate`]).

pub mod evaluate;
pub mod hooks;
pub mod translate;

pub use evaluate::{Evaluation, ExtraCopy, copies, evaluate};
pub use hooks::{Boundary, Pass};

use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::{Error, Result};

/// What a sharded module does with its parameters after its forward: FSDP2's
/// `reshard_after_forward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reshard {
    /// `False`: kept until after the backward (the model's sdp).
    Keep,
    /// `True`: freed, gathered again in the backward (fsdp).
    Free,
    /// An int H: a 1/H shard kept, the backward gathering inside H ranks (hpZ).
    ToSecondary(u32),
}

/// How `fully_shard` places a module's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Over the (N, 1) replicate × shard mesh: full parameters on every rank, gradients
    /// all-reduced (the model's none).
    Replicated,
    /// Over the world (`shard_group` None) or a 2-D (N/S, S) mesh (HSDP, S = `shard_group`).
    Sharded {
        shard_group: Option<u32>,
        reshard_after_forward: Reshard,
    },
}

/// One module's FSDP2 settings. Units are named by index (0-based, forward order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSettings {
    pub sharding: Sharding,
    /// Activation checkpointing of the module's compute.
    pub recompute: bool,
    /// `set_modules_to_forward_prefetch`: later units whose all-gather this one's pre-forward issues.
    pub forward_prefetch: Vec<usize>,
    /// `set_modules_to_backward_prefetch`: earlier units whose all-gather this one's pre-backward
    /// issues; a non-empty list switches off FSDP2's default prefetch of the previous unit.
    pub backward_prefetch: Vec<usize>,
    /// `set_requires_gradient_sync(False)` on micro-batches 1 … K−1 when false.
    pub requires_gradient_sync: bool,
    /// `set_reshard_after_backward(False)` on micro-batches 1 … K−1 when false.
    pub reshard_after_backward: bool,
    /// `set_requires_all_reduce(False)` on micro-batches 1 … K−1 when false: an HSDP module
    /// reduce-scatters every micro-batch into `_partial_reduce_output` and all-reduces the sum
    /// once, after the last (DESIGN §3.11.1).
    pub requires_all_reduce: bool,
}

impl UnitSettings {
    /// FSDP2's defaults for a module placed as `sharding`: no lists, no switches, no recompute.
    pub fn new(sharding: Sharding) -> Self {
        UnitSettings {
            sharding,
            recompute: false,
            forward_prefetch: Vec::new(),
            backward_prefetch: Vec::new(),
            requires_gradient_sync: true,
            reshard_after_backward: true,
            requires_all_reduce: true,
        }
    }
}

/// Every module's settings, checked against a profile: the prefetch lists name units in the
/// direction their pass runs, each once; the switches need micro-batches; every gather FSDP2
/// issues has a slot in the timeline. It carries the schedule the simulator runs (its
/// [`translate`]ion) and the hooks' walk.
#[derive(Debug, Clone)]
pub struct Settings {
    units: Vec<UnitSettings>,
    walk: hooks::Walk,
    schedule: Schedule,
}

impl Settings {
    /// The settings of `units` for `profile`; the error names the unit, the field and what was
    /// expected.
    pub fn new(profile: &Profile, units: Vec<UnitSettings>) -> Result<Self> {
        let l = profile.unit_count();
        if units.len() != l {
            return Err(Error::Mismatch(format!(
                "FSDP2 settings for {} units, the profile has {l}",
                units.len()
            )));
        }
        let invalid = |unit: usize, field: &str, expected: String| {
            Err(Error::invalid(
                "FSDP2 settings",
                format!("{}.{field}", profile.units[unit].name),
                expected,
            ))
        };
        for (j, u) in units.iter().enumerate() {
            for (field, list, later) in [
                ("forward_prefetch", &u.forward_prefetch, true),
                ("backward_prefetch", &u.backward_prefetch, false),
            ] {
                for (k, &t) in list.iter().enumerate() {
                    let in_order = if later { t > j && t < l } else { t < j };
                    if !in_order || list[..k].contains(&t) {
                        let direction = if later { "after" } else { "before" };
                        return invalid(
                            j,
                            field,
                            format!(
                                "distinct units {direction} it in forward order, got unit {}",
                                t + 1
                            ),
                        );
                    }
                }
            }
            let switched =
                !u.requires_gradient_sync || !u.reshard_after_backward || !u.requires_all_reduce;
            if switched && profile.micro_batches < 2 {
                return invalid(
                    j,
                    "requires_gradient_sync",
                    "every switch true with one micro-batch per step".into(),
                );
            }
            let meshed = matches!(
                u.sharding,
                Sharding::Sharded {
                    shard_group: Some(_),
                    ..
                }
            );
            if !u.requires_all_reduce && (!meshed || !u.requires_gradient_sync) {
                return invalid(
                    j,
                    "requires_all_reduce",
                    "true unless the module is over a 2-D (replicate, shard) mesh and syncs \
                     gradients every micro-batch (there is no replica all-reduce to defer)"
                        .into(),
                );
            }
            if u.sharding == Sharding::Replicated && !u.reshard_after_backward {
                return invalid(
                    j,
                    "reshard_after_backward",
                    "true for a replicated module (its parameters are whole at rest)".into(),
                );
            }
        }
        let borrowers: Vec<Option<usize>> = (0..l).map(|i| profile.borrower(i)).collect();
        for (i, j) in borrowers
            .iter()
            .enumerate()
            .filter_map(|(i, j)| Some((i, (*j)?)))
        {
            let freed = matches!(
                units[i].sharding,
                Sharding::Sharded {
                    reshard_after_forward: Reshard::Free | Reshard::ToSecondary(_),
                    ..
                }
            );
            if freed {
                let borrower = &profile.units[j].name;
                return invalid(
                    i,
                    "reshard_after_forward",
                    format!(
                        "false for a module tied to {borrower}'s (one FSDP2 group, DESIGN \
                         §3.12): the group stays unsharded until {borrower}'s forward ends, and \
                         freed there it is gathered again, exposed, at its pre-backward just \
                         before {borrower}'s backward, which the slot model cannot place"
                    ),
                );
            }
        }
        let walk = hooks::walk(&units, profile.micro_batches as usize, &borrowers);
        let schedule = translate::schedule(profile, &units, &walk)?;
        Ok(Settings {
            units,
            walk,
            schedule,
        })
    }

    pub fn units(&self) -> &[UnitSettings] {
        &self.units
    }

    /// The schedule the simulator runs for these settings (DESIGN §3.12).
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// What the hooks do, module boundary by module boundary.
    pub fn walk(&self) -> &hooks::Walk {
        &self.walk
    }
}
