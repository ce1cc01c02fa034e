//! The ILP's model restricted to FSDP2's space (DESIGN §4.9), beside what the variables take
//! from the target (`Target::allows`: the launch positions; `Target::blocks_per_launch`: whole
//! launches): a tied lender kept unsharded after its forward, and FSDP2's copies beside the
//! model's buffers in every memory row (DESIGN §3.12). The constraint families stay the runtime's.

use super::variables::{Choice, UnitVars};
use crate::fsdp2::{Reshard, Sharding, UnitSettings, copies, hooks};
use crate::profile::Profile;
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
    let borrowers: Vec<Option<usize>> = (0..units.len()).map(|i| profile.borrower(i)).collect();
    let kept = Sharding::Sharded {
        shard_group: None,
        reshard_after_forward: Reshard::Keep,
    };
    for (i, u) in units.iter().enumerate() {
        for (choice, column) in u.choices() {
            let Some(y) = column else {
                continue;
            };
            let mut settings = vec![UnitSettings::new(kept); units.len()];
            settings[i] = UnitSettings::new(sharding(u, choice));
            let walk = hooks::walk(&settings, 1, &borrowers);
            for copy in copies(profile, &settings, &walk)
                .into_iter()
                .filter(|c| c.unit == i)
            {
                rows[copy.slot].add_mul(copy.bytes / scale, y.var);
            }
        }
    }
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
