//! The staged phases of the micro-batch MIP on a profile with nodes (DESIGN §4.8, as §4.5 does
//! at K = 1): a depth-1 MIP (every launch next to its consumer; configurations and recompute
//! free) before the depth-4 MIP, whose plan warm-starts it, and after the bound over every plan,
//! placements at fixed configurations (`super::placement`) over depth 4 and the positions column
//! generation added: the LP's configurations made whole first, then the depth-1 plan's and the
//! depth-4 MIP's. Each phase's effort is a share of the budget in LP iterations (§4.6), so the
//! answer is the same on any machine.

use super::model::{Added, Space};
use super::placement::{Placed, held, place_each, spread};
use super::pricing::Generation;
use super::run::run_mip;
use crate::Result;
use crate::ilp::effort::{Budget, Clock};
use crate::ilp::{Objective, PhaseReport, SolveOptions, SolveStatus, WindowLimits};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::Simulation;
use std::num::NonZeroUsize;
use std::time::Instant;

/// The depth-1 MIP's share of the MIPs' effort (the depth-4 MIP takes the rest).
const DEPTH_ONE_SHARE: f64 = 0.1;
/// The placements' effort, a share of the whole effort on top of the MIPs' and the bound's
/// (HiGHS checks a MIP's work only at its own points, so the bound's budget may have nothing
/// left), split equally among the distinct configurations placed.
const PLACEMENT_SHARE: f64 = 0.5;

/// Whether the staged phases run: a profile with nodes, the time objective, and a MIP that
/// searches narrower windows than asked (the bound over every plan then follows it).
pub(super) fn applies(profile: &Profile, options: &SolveOptions, limits: WindowLimits) -> bool {
    profile.topology.is_some() && options.objective == Objective::Time && limits != options.limits
}

/// What the depth-1 MIP found: its plan and its run as a phase over the depth-1 plans.
pub(super) struct DepthOne {
    pub plan: (Schedule, Simulation),
    pub phase: PhaseReport,
}

/// The depth-1 MIP in its share of `budget`, warm-started from `baseline`; None where it found no
/// plan or could not start.
pub(super) fn depth_one(
    profile: &Profile,
    options: &SolveOptions,
    baseline: Option<&(Schedule, Simulation)>,
    budget: &mut Budget,
) -> Result<Option<DepthOne>> {
    if !budget.can_start() {
        return Ok(None);
    }
    let started = Instant::now();
    let none = Added::new();
    let limits = WindowLimits::depth(NonZeroUsize::MIN);
    let space = Space::within(limits, &none, options.target);
    let warm: Vec<&Schedule> = baseline.map(|(s, _)| s).into_iter().collect();
    let work = budget.share(DEPTH_ONE_SHARE);
    let run = run_mip(profile, options, (space, work), &warm, budget.clock())?;
    budget.spend(run.work);
    let Some((schedule, simulation)) = run.found else {
        return Ok(None);
    };
    let objective = options.objective.value_of(&simulation);
    let best_bound = run.dual_bound.min(objective);
    let gap = if best_bound > 0.0 {
        ((objective - best_bound) / objective).max(0.0)
    } else {
        f64::INFINITY
    };
    let status = if gap <= options.relative_gap.max(1e-9) {
        SolveStatus::Optimal
    } else {
        SolveStatus::GapLimit
    };
    let phase = PhaseReport {
        window_depth: limits,
        relaxation: None,
        status,
        objective,
        best_bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: run.work,
        variables: run.size.variables,
        integer_variables: run.size.integer_variables,
        constraints: run.size.constraints,
    };
    Ok(Some(DepthOne {
        plan: (schedule, simulation),
        phase,
    }))
}

/// The placements at fixed configurations over the windows `limits` and the positions column
/// generation added (`generation`): the last restricted LP's configurations made whole, then
/// those of the plans `met` (the depth-1 MIP's, the depth-4 MIP's), each distinct one once, in
/// [`PLACEMENT_SHARE`] of the effort.
pub(super) fn place(
    profile: &Profile,
    options: &SolveOptions,
    (limits, generation): (WindowLimits, Option<&Generation>),
    met: [Option<&(Schedule, Simulation)>; 2],
    clock: &Clock,
) -> Result<Placed> {
    let none = Added::new();
    let added = generation.map_or(&none, |g| &g.added);
    let mut candidates: Vec<_> = generation
        .map(|g| spread(&g.fractional))
        .into_iter()
        .collect();
    candidates.extend(met.iter().flatten().map(|(s, _)| held(s)));
    let mut warm: Vec<&(Schedule, Simulation)> = met.into_iter().flatten().collect();
    warm.sort_by(|a, b| {
        let value = |p: &(Schedule, Simulation)| options.objective.value_of(&p.1);
        value(a).total_cmp(&value(b))
    });
    let mut budget = Budget::new(options.effort, clock);
    let work = budget.share(PLACEMENT_SHARE);
    place_each(
        profile,
        options,
        (limits, added),
        (candidates, &warm),
        (work, &mut budget),
    )
}
