//! Placement at fixed levels (DESIGN §4.5, "placement at fixed levels"): on a profile with nodes,
//! the depth-4 MIP with every unit's level and recompute fixed to a plan's. With several groups
//! of ranks per unit, HiGHS' own search of the depth-4 MIP changes levels and launches together
//! and stays near its warm start; with the levels fixed the MIP is a placement problem it solves
//! in a fraction of a second, and the depth-1 plan's levels (chosen with every launch next to its
//! consumer) placed at depth 4 give a plan its own search does not reach. The recompute-free form
//! (`Form::PlacementAmong`) holds the levels only and lets HiGHS choose which units recompute with
//! the launches: the full-window LP's levels made whole recompute wherever its r > 0, more than
//! the cap needs. Its answers are plans; its bound holds only over plans of those levels, so its
//! phase claims none.

use super::SolveOptions;
use super::model::Form;
use super::run::run_highs;
use super::search::Search;
use super::variables::{Choice, ExtraPositions, UnitLevel};
use crate::Result;
use crate::profile::Profile;

/// Levels to place, in order, within `work` LP iterations, with launch columns also at `extra`.
pub(super) struct Placements<'e> {
    /// Levels and recompute of every unit; those absent and repeats are passed over.
    pub candidates: Vec<Option<Vec<UnitLevel>>>,
    pub work: u64,
    pub extra: &'e ExtraPositions,
}

/// The placement of each distinct levels of `request.candidates` (in order, those present), each
/// in an equal share of the work left.
pub(super) fn place_each(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    request: Placements,
) -> Result<()> {
    let mut distinct: Vec<Vec<UnitLevel>> = Vec::new();
    for levels in request.candidates.into_iter().flatten() {
        if !distinct.contains(&levels) {
            distinct.push(levels);
        }
    }
    let count = distinct.len() as u64;
    let mut left = request.work;
    for (k, levels) in (0..).zip(&distinct) {
        if !search.budget.can_start() {
            break;
        }
        let share = (left / (count - k)).min(search.budget.left());
        let before = search.budget.left();
        let fixed = FixedLevels {
            levels,
            work: share,
            extra: request.extra,
        };
        place_levels(profile, options, search, fixed)?;
        left = left.saturating_sub(before - search.budget.left());
    }
    Ok(())
}

/// One placement: every unit held to `levels`, for `work` LP iterations, with launch columns also
/// at `extra`.
pub(super) struct FixedLevels<'l> {
    pub levels: &'l [UnitLevel],
    pub work: u64,
    pub extra: &'l ExtraPositions,
}

/// The placement MIP of `request.levels`, warm-started from the best plan of those levels the
/// search has met: its plan and run join the search.
fn place_levels(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    request: FixedLevels,
) -> Result<()> {
    let form = Form::Placement(request.levels);
    place_form(profile, options, search, form, request)
}

/// The placement MIP of `request.levels` with every unit's recompute free
/// (`Form::PlacementAmong`, each unit's one choice its level), warm-started from the best plan of
/// those levels the search has met (whatever its recompute): HiGHS chooses which units recompute
/// together with the launches, so that whole recomputes meet the cap where the plan's recompute,
/// rounded up from the LP's, overshoots it. Its plan and run join the search.
pub(super) fn place_recompute_free(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    request: FixedLevels,
) -> Result<()> {
    let held = held_choices(request.levels);
    let form = Form::PlacementAmong(&held);
    place_form(profile, options, search, form, request)
}

/// Each unit's level as its one choice (`Form::PlacementAmong`: the level held, recompute free).
pub(super) fn held_choices(levels: &[UnitLevel]) -> Vec<Vec<Choice>> {
    levels.iter().map(|l| vec![l.choice]).collect()
}

/// The placement MIP `form` of `request.levels`, warm-started from the best plan of those levels
/// the search has met: its plan and run join the search.
fn place_form(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    form: Form,
    request: FixedLevels,
) -> Result<()> {
    if !search.budget.can_start() {
        return Ok(());
    }
    let stop = search.stop(request.work, None);
    let warm = search.pool.within(options.limits, request.extra);
    let placement = run_highs(profile, (options, form, request.extra), &warm, stop)?;
    search.record(placement);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::{AnalyticOptions, analytic_profile, zoo};
    use crate::baselines::{BaselineKind, baseline};
    use crate::hardware::Catalog;
    use crate::ilp::WindowLimits;
    use crate::ilp::run::Stop;
    use crate::ilp::variables::Choice;
    use crate::schedule::Recompute;
    use crate::sim::{Semantics, simulate};
    use std::num::NonZeroUsize;

    /// Llama-2 7B on 2 nodes of 8 H100s, at a cap halfway between fsdp2+ckpt's peak and
    /// hsdp+ckpt's: the depth-1 MIP's optimum mixes levels over the world and the node. Placing its
    /// own levels gives a plan of those levels at its value, and claims no bound.
    #[test]
    fn placing_the_optimums_levels_gives_it_back_and_claims_no_bound() {
        let options = AnalyticOptions {
            topology: Some(Some(8)),
            ..AnalyticOptions::new("h100-sxm", 16)
        };
        let catalog = Catalog::bundled().unwrap();
        let profile = analytic_profile(&zoo("llama2-7b"), &catalog, &options).unwrap();
        let peak = |kind| {
            let plan = baseline(&profile, kind, Recompute::On, None).unwrap();
            plan.simulation.peak_memory_bytes
        };
        let cap = (peak(BaselineKind::Fsdp2) + peak(BaselineKind::Hsdp)) / 2.0;
        let options = SolveOptions {
            memory_cap_bytes: Some(cap as u64),
            relative_gap: 0.0,
            limits: WindowLimits::depth(NonZeroUsize::MIN),
            ..SolveOptions::default()
        };
        let none = ExtraPositions::new();
        let clock = crate::ilp::effort::Clock::new(std::time::Instant::now(), 60.0);
        let stop = || Stop {
            work: u64::MAX,
            objective_target: None,
            clock: &clock,
        };
        let run = |form| run_highs(&profile, (&options, form, &none), &[], stop()).unwrap();
        let optimum = run(Form::Mip);
        assert_eq!(optimum.phase.status, crate::ilp::SolveStatus::Optimal);
        let value = optimum.phase.objective;
        let levels = optimum.levels.unwrap();
        let groups: std::collections::BTreeSet<_> =
            levels.iter().filter_map(|l| l.choice.group()).collect();
        assert!(groups.len() > 1, "levels over one group only: {levels:?}");
        assert!(levels.iter().any(|l| l.choice != Choice::Sdp(0)));

        let placed = run(Form::Placement(&levels));
        let schedule = placed.schedule.unwrap();
        assert!((placed.phase.objective - value).abs() <= 1e-9 * value);
        assert_eq!(placed.phase.best_bound, f64::NEG_INFINITY);
        assert!(placed.phase.gap.is_infinite());
        for (unit, fixed) in schedule.units().iter().zip(&levels) {
            assert_eq!(unit.level, fixed.choice.level());
            assert_eq!(unit.recompute, fixed.recompute);
        }
        let sim = simulate(&profile, &schedule, Semantics::Strict);
        assert!((sim.iteration_time_us - value).abs() <= 1e-6 * value);
    }
}
