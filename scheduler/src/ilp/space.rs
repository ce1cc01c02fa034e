//! The ILP's model restricted to FSDP2's space (DESIGN §4.9), beside what the variables take
//! from the target (`Target::allows`: the launch positions; `Target::blocks_per_launch`: whole
//! launches): a tied lender kept unsharded after its forward, and FSDP2's copies beside the
//! model's buffers in every memory row (DESIGN §3.12). The constraint families stay the runtime's.

use super::variables::{Choice, UnitVars};
use crate::fsdp2::{ExtraCopy, Reshard, Sharding, UnitSettings, copies, hooks};
use crate::profile::Profile;
use crate::schedule::Schedule;
use good_lp::{Constraint, Expression, constraint};

/// FSDP2 target: a tied lender is never freed after its forward (one FSDP2 group with its
/// borrower's module, DESIGN §3.12): y_{i,fsdp} = y_{i,hpz} = 0 in every group.
pub(super) fn tied_lenders_kept(profile: &Profile, units: &[UnitVars]) -> Vec<Constraint> {
    units
        .iter()
        .enumerate()
        .filter(|&(i, _)| profile.borrower(i).is_some())
        .flat_map(|(_, u)| u.groups.iter().flat_map(|g| [g.fsdp, g.hpz]).flatten())
        .map(|y| constraint!(y.var == 0.0))
        .collect()
}

/// FSDP2 target: adds to each slot's memory row (scaled by `scale`) FSDP2's copies beside the
/// model's buffers (`fsdp2::copies`), unit by unit and choice by choice: Σ_c copies(i, c, s)·y_{i,c}.
/// A unit's copies depend on its own settings only, so each is read from the hooks' walk of that
/// unit at that choice beside every other unit kept (sdp).
pub(super) fn add_copies(
    rows: &mut [Expression],
    profile: &Profile,
    units: &[UnitVars],
    scale: f64,
) {
    for (i, u) in units.iter().enumerate() {
        for (choice, column) in u.choices() {
            let Some(y) = column else {
                continue;
            };
            for copy in unit_copies(profile, i, UnitSettings::new(sharding(u, choice)), 1) {
                rows[copy.slot].add_mul(copy.bytes / scale, y.var);
            }
        }
    }
}

/// FSDP2's copies of unit `unit` at `settings` over `micro_batches` micro-batches (slots
/// unrolled, micro-batch m's from m·(2L + 1)): the hooks' walk of that unit beside every other
/// unit kept (sdp), its own copies only — they depend on its own settings alone (DESIGN §4.9).
pub(super) fn unit_copies(
    profile: &Profile,
    unit: usize,
    settings: UnitSettings,
    micro_batches: usize,
) -> Vec<ExtraCopy> {
    let l = profile.unit_count();
    let borrowers: Vec<Option<usize>> = (0..l).map(|i| profile.borrower(i)).collect();
    let kept = Sharding::Sharded {
        shard_group: None,
        reshard_after_forward: Reshard::Keep,
    };
    let mut all = vec![UnitSettings::new(kept); l];
    all[unit] = settings;
    let walk = hooks::walk(&all, micro_batches, &borrowers);
    copies(profile, &all, &walk)
        .into_iter()
        .filter(|c| c.unit == unit)
        .collect()
}

/// FSDP2's sharding of a unit at an ILP choice.
pub(super) fn sharding(u: &UnitVars, choice: Choice) -> Sharding {
    let sharded = |g: usize, reshard_after_forward| Sharding::Sharded {
        shard_group: u.groups[g].shard,
        reshard_after_forward,
    };
    match choice {
        Choice::None => Sharding::Replicated,
        Choice::Sdp(g) => sharded(g, Reshard::Keep),
        Choice::Fsdp(g) => sharded(g, Reshard::Free),
        Choice::Hpz(g) => match u.groups[g].secondary {
            Some(h) => sharded(g, Reshard::ToSecondary(h)),
            None => sharded(g, Reshard::Free),
        },
    }
}

/// FSDP2's peak of `schedule` where its export exists (the memory objective's warm value).
pub(super) fn fsdp2_peak(profile: &Profile, schedule: &Schedule) -> Option<f64> {
    Some(
        crate::export::fsdp2(profile, schedule)
            .ok()?
            .fsdp2_peak_memory_bytes as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::{BaselineKind, baseline};
    use crate::export::fsdp2 as export;
    use crate::ilp::SolveOptions;
    use crate::ilp::constraints::memory_per_slot;
    use crate::ilp::mapping::schedule_values;
    use crate::ilp::model::{Form, build};
    use crate::ilp::variables::ExtraPositions;
    use crate::schedule::{Recompute, Schedule};
    use crate::sim::{Semantics, simulate};
    use crate::target::Target;
    use crate::timeline::Timeline;
    use good_lp::Variable;
    use std::collections::HashMap;

    /// On the demo profile (Llama-2 70B, 8 × 8, untied) every baseline FSDP2 runs exactly puts
    /// the fsdp2 target's memory rows, at its columns, at FSDP2's peak (`export fsdp2`'s,
    /// `fsdp2::evaluate`'s) to a byte: the MIP holds FSDP2's memory, not the model's.
    #[test]
    fn the_memory_rows_peak_at_fsdp2s_peak_for_every_exact_baseline() {
        let text = include_str!("../../../profiles/llama2-70b-h100-8x8.toml");
        let profile = Profile::from_toml(text, "llama2-70b-h100-8x8.toml").unwrap();
        let options = SolveOptions {
            memory_cap_bytes: None,
            target: Target::Fsdp2,
            ..SolveOptions::default()
        };
        let built = build(&profile, &options, (Form::Mip, &ExtraPositions::new()));
        let scale = built.memory_scale;
        let mut rows = memory_per_slot(
            &profile,
            &built.units,
            Timeline::new(profile.unit_count()),
            scale,
        );
        add_copies(&mut rows, &profile, &built.units, scale);
        let mut checked = 0;
        let mut above_the_model = 0;
        for kind in BaselineKind::of(&profile) {
            for checkpoint in [Recompute::Off, Recompute::On] {
                let Ok(plan) = baseline(&profile, kind, checkpoint, None) else {
                    continue;
                };
                // The embedding and head save nothing by recompute and have no column for it.
                let units = plan.schedule.into_units().into_iter().zip(&built.units);
                let units = units
                    .map(|(mut u, vars)| {
                        u.recompute &= vars.recompute.is_some();
                        u
                    })
                    .collect();
                let schedule = Schedule::new(&profile, units).unwrap();
                let exported = export(&profile, &schedule).unwrap();
                assert!(exported.exact, "{kind:?}: {:?}", exported.approximations);
                let values = schedule_values(&built.units, &schedule, built.columns)
                    .unwrap_or_else(|| panic!("{kind:?} {checkpoint:?} outside the fsdp2 space"));
                let mut at: HashMap<Variable, f64> = HashMap::new();
                for u in &built.units {
                    let columns = u.choices().into_iter().filter_map(|(_, c)| c);
                    let columns = columns
                        .chain(u.recompute)
                        .chain(u.secondary_communicator)
                        .chain(u.groups.iter().filter_map(|g| g.communicator))
                        .chain(
                            u.ops()
                                .flat_map(|op| op.launches.iter().chain(&op.cumulative).copied()),
                        );
                    for c in columns {
                        at.insert(c.var, values[c.index]);
                    }
                }
                let peak = rows
                    .iter()
                    .map(|m| m.eval_with(&at) * scale)
                    .fold(0.0, f64::max);
                let fsdp2 = exported.fsdp2_peak_memory_bytes as f64;
                assert!(
                    (peak - fsdp2).abs() <= 1.0 + 1e-12 * fsdp2,
                    "{kind:?} {checkpoint:?}: rows {peak}, FSDP2 {fsdp2}"
                );
                let model = simulate(&profile, &schedule, Semantics::Strict).peak_memory_bytes;
                above_the_model += usize::from(fsdp2 > model + 1.0);
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked} baselines");
        assert_eq!(above_the_model, checked);
    }
}
