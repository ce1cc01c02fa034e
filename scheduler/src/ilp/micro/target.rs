//! The micro-batch MIP restricted to FSDP2's space (DESIGN §4.9, "The fsdp2 space at K ≥ 2"):
//! the configurations FSDP2 expresses ([`offers`]), FSDP2's copies in every class slot's memory
//! row ([`add_copies`]), each inner forward gather issued where the step's is
//! ([`inner_gathers_as_step`]), and one HiGHS run of that model for `ilp::fsdp2_solve` ([`run`]).
//! The positions and whole launches are `Target::allows` and `Target::blocks_per_launch`, read
//! where the columns are declared (`super::model`).

use super::columns::{Boundary, Config, SetKey, UnitCols, Unrolled};
use super::linear::Linear;
use super::model::{Added, Space};
use super::run::run_mip;
use crate::Result;
use crate::fsdp2::{Reshard, Sharding, UnitSettings};
use crate::ilp::run::{Run, Stop};
use crate::ilp::space::{fsdp2_peak, unit_copies};
use crate::ilp::variables::ExtraPositions;
use crate::ilp::{Objective, PhaseReport, SolveOptions, SolveStatus};
use crate::profile::Profile;
use crate::schedule::{ReplicaReduce, Schedule};
use crate::target::Target;
use crate::timeline::{Level, Op};
use good_lp::{Constraint, constraint};
use highs::HighsModelStatus;
use std::time::Instant;

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

/// One HiGHS run of the micro-batch MIP over FSDP2's space within `options.limits`
/// (`super::run::run_mip`), warm-started from the first of `warm` it can express, stopped as
/// `stop` says; its plan checked against the simulator. The objective is the step time, or FSDP2's
/// peak (the memory rows hold FSDP2's copies) under the iteration-time ceiling.
pub(in crate::ilp) fn run(
    profile: &Profile,
    options: &SolveOptions,
    warm: &[(Schedule, f64)],
    stop: Stop,
) -> Result<Run> {
    let started = Instant::now();
    let added = Added::new();
    let space = Space::within(options.limits, &added, Target::Fsdp2);
    let warm: Vec<&Schedule> = warm.iter().map(|(schedule, _)| schedule).collect();
    let mip = run_mip(profile, options, (space, stop.work), &warm, stop.clock)?;
    let infeasible = matches!(
        mip.status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    );
    let schedule = mip.found.filter(|_| !infeasible);
    let objective = match (&schedule, options.objective) {
        (Some((_, simulation)), Objective::Time) => simulation.iteration_time_us,
        (Some((s, _)), Objective::Memory { .. }) => fsdp2_peak(profile, s).unwrap_or(f64::NAN),
        (None, _) => f64::NAN,
    };
    let bound = mip.dual_bound;
    let gap = if objective.is_finite() && bound.is_finite() {
        ((objective - bound) / objective.abs().max(1e-12)).max(0.0)
    } else {
        f64::INFINITY
    };
    let phase = PhaseReport {
        window_depth: options.limits,
        relaxation: None,
        status: match mip.status {
            HighsModelStatus::Optimal => SolveStatus::Optimal,
            HighsModelStatus::ReachedTimeLimit => SolveStatus::TimeLimit,
            // Its share of the effort spent.
            _ => SolveStatus::GapLimit,
        },
        objective,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: mip.work,
        variables: mip.size.variables,
        integer_variables: mip.size.integer_variables,
        constraints: mip.size.constraints,
    };
    Ok(Run {
        schedule: schedule.map(|(s, _)| s),
        levels: None,
        bands_used: ExtraPositions::new(),
        phase,
        infeasible,
        work: mip.work,
    })
}
