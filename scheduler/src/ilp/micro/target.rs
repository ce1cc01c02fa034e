//! The micro-batch MIP restricted to FSDP2's space (DESIGN §4.9, "The fsdp2 space at K ≥ 2"):
//! the configurations FSDP2 expresses ([`offers`]), FSDP2's copies in every class slot's memory
//! row ([`add_copies`]), each inner forward gather issued where the step's is
//! ([`inner_gathers_as_step`]); `super::run::run_fsdp2` runs that model for `ilp::fsdp2_solve`.
//! The positions and whole launches are `Target::allows` and `Target::blocks_per_launch`, read
//! where the columns are declared (`super::model`).

use super::columns::{Boundary, Config, SetKey, UnitCols, Unrolled};
use super::linear::Linear;
use crate::fsdp2::{Reshard, Sharding, UnitSettings};
use crate::ilp::space::unit_copies;
use crate::profile::Profile;
use crate::schedule::ReplicaReduce;
use crate::target::Target;
use crate::timeline::{Level, Op};
use good_lp::{Constraint, constraint};

/// Whether `target` offers configuration `c` to unit `unit`: the runtime every one; FSDP2 every
/// one but fsdp and hpz for a tied lender, which one FSDP2 group holds with its borrower's module
/// and which it cannot free after the forward (DESIGN §3.12).
pub(super) fn offers(profile: &Profile, target: Target, unit: usize, c: Config) -> bool {
    target == Target::Runtime || profile.borrower(unit).is_none() || c.level != Level::Fsdp
}

/// FSDP2's settings of a unit at configuration `c`: its sharding and the three micro-batch
/// switches (DESIGN §3.12: a = 1 is `requires_gradient_sync` false, k = 1
/// `reshard_after_backward` false, ρ = last `requires_all_reduce` false); no prefetch lists, which
/// its copies do not read.
fn settings(c: Config) -> UnitSettings {
    let sharding = match (c.level, c.secondary) {
        (Level::None, _) => Sharding::Replicated,
        (level, secondary) => Sharding::Sharded {
            shard_group: c.group,
            reshard_after_forward: match (level, secondary) {
                (Level::Sdp, _) => Reshard::Keep,
                (_, Some(h)) => Reshard::ToSecondary(h),
                _ => Reshard::Free,
            },
        },
    };
    UnitSettings {
        requires_gradient_sync: !c.accumulate,
        reshard_after_backward: !c.keep,
        requires_all_reduce: c.replica_reduce == ReplicaReduce::Every,
        ..UnitSettings::new(sharding)
    }
}

/// FSDP2's copies beside the model's buffers in every class slot σ of the K' micro-batches:
///
/// ```text
/// M_σ += Σ_i Σ_c copies(i, c, σ)·y_{i,c}
/// ```
///
/// copies(i, c, ·) from the hooks' walk over K' micro-batches of unit i at c, switches included
/// (`ilp::space::unit_copies`, `fsdp2::copies`): an all-gather output at each copy-out (none in
/// a later micro-batch's forward of a k = 1 unit), the reduce-scatter input in each reducing
/// backward (every micro-batch at a = 0, the last at a = 1), a replicated unit's copies. The
/// switches tell only the last micro-batch from the others, so the walk's middle micro-batch is
/// every steady one's.
pub(super) fn add_copies(
    memory: &mut [Linear],
    profile: &Profile,
    step: Unrolled,
    units: &[UnitCols],
) {
    for (i, u) in units.iter().enumerate() {
        for &(c, y) in &u.configs {
            for copy in unit_copies(profile, i, settings(c), step.micro_batches) {
                memory[copy.slot].add(y, copy.bytes);
            }
        }
    }
}

/// FSDP2's prefetch lists are module attributes, the same in every micro-batch, so an inner
/// forward gather is issued where the step's is:
///
/// ```text
/// x^{FG,inner}_{i,g,q} ≤ x^{FG,step}_{i,g,q}      at every position q of the window
/// ```
///
/// Launches are whole (each set launches once where its configurations run, the inner set only
/// at k = 0), so the inner launch sits at the step's position. The reductions (one position each)
/// and the backward gather (one set for every micro-batch) need no such row.
pub(super) fn inner_gathers_as_step(u: &UnitCols) -> Vec<Constraint> {
    let mut rows = Vec::new();
    let inner = u
        .launches
        .iter()
        .filter(|l| l.key.op == Op::Gather && l.key.boundary == Boundary::Inner);
    for l in inner {
        let step = u.set(SetKey {
            boundary: Boundary::Step,
            ..l.key
        });
        for (&q, x) in l.positions.iter().zip(&l.x) {
            match step.and_then(|s| s.x_at(q)) {
                Some(s) => rows.push(constraint!(x.var <= s.var)),
                None => rows.push(constraint!(x.var == 0.0)),
            }
        }
    }
    rows
}
