//! The far-band search of large models (DESIGN §4.5, "far bands"): where depth 4 leaves the best
//! plan unproven over every plan, the far-band relaxation both bounds every plan and shows which
//! launches outside depth 4 pay, and a MIP over depth 4 and those positions finds the plan.
//!
//! 1. The LP of the far-band relaxation of depth 4: a bound over every plan (its optimum is at most
//!    the relaxation's, which is at most every plan's time), and the bands its solution launches in,
//!    beside the positions where launches pay in the full-window LP (column generation's); on a
//!    profile with nodes, where this LP is too large for the time, those positions alone.
//! 2. The MIP of depth 4 and every position of those bands (a restriction: its answers are plans),
//!    warm-started from the best plan it can represent, stopping at the first plan the bound
//!    proves within the target.
//! 3. Unless proven: the far-band relaxation's MIP over those positions (exact) and bands over the
//!    rest, for the time left: its dual bound holds over every plan; its incumbent, launched at its
//!    bands' own positions, is a plan too; the bands it launches in join the positions, and 2 runs
//!    again.

use super::effort::Clock;
use super::limits::PLACEMENT_DEPTH;
use super::model::Form;
use super::run::{Stop, run_highs};
use super::search::Search;
use super::variables::ExtraPositions;
use super::{SolveOptions, WindowLimits};
use crate::Result;
use crate::profile::Profile;
use std::time::Instant;

/// The restricted MIP's own gap target, relative to the solve's: it searches on toward a plan the
/// bound over every plan proves, and stops at the first.
const RESTRICTED_GAP_FACTOR: f64 = 0.25;

/// Where the far-band search starts: the positions where launches pay in the full-window LP
/// (column generation's), with or without the bands of the far-band relaxation's LP (step 1).
#[derive(Clone, Copy)]
pub(super) enum FarBandStart<'e> {
    /// Step 1 runs, and the bands its solution launches in join these positions.
    BandsLpAnd(&'e ExtraPositions),
    /// These positions alone (on a profile with nodes, where that LP is too large for the time).
    Paying(&'e ExtraPositions),
}

/// Runs the search until the search's budget is spent, the best plan proven within the solve's
/// gap over every plan, or the relaxation's answer launching in no band beyond the positions
/// searched (its answer is then a plan of them).
pub(super) fn far_band_search(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    start: FarBandStart,
) -> Result<()> {
    let limits = WindowLimits::depth(PLACEMENT_DEPTH);
    let depth_options = SolveOptions {
        limits,
        ..options.clone()
    };
    let restricted_options = SolveOptions {
        relative_gap: options.relative_gap * RESTRICTED_GAP_FACTOR,
        ..depth_options.clone()
    };
    let (paying, bands_lp) = match start {
        FarBandStart::BandsLpAnd(paying) => (paying, true),
        FarBandStart::Paying(paying) => (paying, false),
    };
    let mut extra = paying.clone();
    if bands_lp && search.budget.can_start() {
        let stop = search.stop(search.budget.left(), None);
        let lp = run_highs(
            profile,
            (&depth_options, Form::FarBandsLp, &ExtraPositions::new()),
            &[],
            stop,
        )?;
        add(&mut extra, search.record(lp).bands_used);
    }
    while !search.proven() && search.budget.can_start() {
        let bound = search
            .phases
            .iter()
            .filter(|p| p.window_depth.is_full())
            .map(|p| p.best_bound)
            .fold(f64::NEG_INFINITY, f64::max);
        let target = bound
            .is_finite()
            .then(|| bound / (1.0 - options.relative_gap));
        let warm = search.pool.within(limits, &extra);
        let stop = search.stop(search.budget.left(), target);
        let restricted = run_highs(
            profile,
            (&restricted_options, Form::Mip, &extra),
            &warm,
            stop,
        )?;
        search.record(restricted);
        if search.proven() || !search.budget.can_start() {
            break;
        }
        let warm = search.pool.within(limits, &extra);
        let stop = search.stop(search.budget.left(), None);
        let relaxed = run_highs(
            profile,
            (&depth_options, Form::FarBands, &extra),
            &warm,
            stop,
        )?;
        if !add(&mut extra, search.record(relaxed).bands_used) {
            break;
        }
    }
    Ok(())
}

/// Adds `more` to `extra`; whether any position was new.
fn add(extra: &mut ExtraPositions, more: ExtraPositions) -> bool {
    let mut grew = false;
    for (key, positions) in more {
        let known = extra.entry(key).or_default();
        for position in positions {
            grew |= known.insert(position);
        }
    }
    grew
}

/// The far-band relaxation of the windows `restricted`, solved as a MIP within `options.effort`
/// and `options.time_limit_s`: HiGHS' dual bound on it, which no plan is below (time objective).
/// None when HiGHS proves no bound (the relaxation infeasible: then no plan fits).
pub fn far_band_bound(
    profile: &Profile,
    options: &SolveOptions,
    restricted: WindowLimits,
) -> Result<Option<f64>> {
    let limited = SolveOptions {
        limits: restricted,
        ..options.clone()
    };
    let clock = Clock::new(Instant::now(), options.time_limit_s);
    let stop = Stop {
        work: options.effort.iterations(),
        objective_target: None,
        clock: &clock,
    };
    let run = run_highs(
        profile,
        (&limited, Form::FarBands, &ExtraPositions::new()),
        &[],
        stop,
    )?;
    Ok(run
        .phase
        .best_bound
        .is_finite()
        .then_some(run.phase.best_bound))
}
