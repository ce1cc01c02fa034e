//! The staged solve of models above 3000 full-window integer columns (DESIGN §4.5): depth 1, the
//! priced bound, depth 4, deeper pricing, then the full-window MIP or (above 20,000 columns) the
//! far-band search — and, given two threads, the full-window MIP or depth 4 on one while the
//! far-band search runs on the other, each with its own budget of work, meeting when both are done.

use super::bound::FullWindowBound;
use super::effort::Budget;
use super::limits::PLACEMENT_DEPTH;
use super::model::Form;
use super::placement::place_each;
use super::pool::Pool;
use super::refine::far_band_search;
use super::run::{Run, Stop, run_highs};
use super::variables::{ExtraPositions, UnitLevel};
use super::{Objective, PhaseReport, SolveOptions, WindowLimits};
use crate::profile::Profile;
use crate::{Error, Result};
use std::num::NonZeroUsize;

/// The staged solve's phases before the full windows, with their share of the effort: D = 1
/// fixes every launch next to its consumer (only levels and recompute are chosen); D = 4 places
/// them. Each phase's plan is feasible for the next (the windows nest) and warm-starts it.
const LEVELS_SHARE: f64 = 0.1;
const PLACEMENT_SHARE: f64 = 0.6;
/// Depth 4's share where two searches follow it: the far-band search places launches within
/// depth 4 too, and the full-window MIP needs the time (Llama 3 8B at 59.82 GiB: depth 4 spent
/// its 6 s of 10 on a plan 1.9% slower than the pair's).
const TWO_SEARCHES_PLACEMENT_SHARE: f64 = 0.25;
/// On a profile with nodes, the share of depth 4's work its own MIP takes; the placements of
/// fixed levels (`super::placement`) take the rest.
const OWN_SEARCH_SHARE: f64 = 0.9;
/// Depth 4's gap target, relative to the solve's, when the bound over every plan is tight.
const TIGHT_BOUND_GAP_FACTOR: f64 = 0.25;
/// On a profile with nodes, the most of the effort that placing the depth-1 plan's levels over
/// depth 4 and the positions where launches pay may take (the demo: 5,546 ms in 3 s, which the
/// far-band search's restricted MIP then improves to 5,505 ms).
const FAR_PLACEMENT_SHARE: f64 = 0.15;
/// The effort share at most of the placement of the full-window LP's levels made whole (DESIGN
/// §4.5, "placing the LP's levels"), before the depth-1 plan's: on the demo each runs to its
/// own gap target past its share (29,703 and 28,436 LP iterations), so the first placed takes
/// the far-band search's effort, and the LP's levels place faster (5,369.6 ms against 5,398.9).
const SPREAD_PLACEMENT_SHARE: f64 = 0.3;
/// Integer columns (full windows) above which the staged strategy pays.
const STAGED_MIN_INTEGERS: usize = 3000;
/// Integer columns (full windows) above which a staged solve ends after depth 4 and the bound:
/// the full-window MIP then does not finish its root LP within the time (Llama-2 70B, 33,782
/// columns: its bound stays at the trivial one through 9 s, its plan is depth 4's), while at
/// 12,598 (GPT-2 XL) it proves caps that depth 4 and the LP bound do not.
const FULL_WINDOW_MIP_MAX_INTEGERS: usize = 20_000;

/// Integer columns of the full-window model (x only; the deciding size).
fn full_window_integers(profile: &Profile) -> usize {
    let l = profile.unit_count();
    (0..l).map(|i| 3 * (2 * i + 1) + 2 * (l - 1 - i)).sum()
}

/// Whether `options` asks for the staged solve: the full windows of a model large enough.
pub(super) fn is_staged(profile: &Profile, options: &SolveOptions) -> bool {
    options.two_phase
        && options.limits.is_full()
        && full_window_integers(profile) > STAGED_MIN_INTEGERS
}

/// What the staged phases leave to the full-window MIP.
pub(super) enum FullWindow {
    /// Not needed: the best plan is proven, or the model is too large for it.
    Skip,
    /// Still to run, for the time left.
    Run,
    /// Run already, beside the other search; whether it found the cap infeasible.
    Ran { infeasible: bool },
}

/// Runs the staged phases within `budget`, adding their plans to `pool` and their reports to
/// `phases`.
pub(super) fn staged_phases(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    budget: &mut Budget,
) -> Result<FullWindow> {
    let stop = Stop {
        work: budget.share(LEVELS_SHARE),
        objective_target: None,
        clock: budget.clock(),
    };
    let levels = limited(options, NonZeroUsize::MIN);
    let run = run_highs(
        profile,
        (&levels, Form::Mip, &ExtraPositions::new()),
        pool.plans(),
        stop,
    )?;
    budget.spend(run.work);
    if let Some(schedule) = run.schedule {
        pool.offer(schedule);
    }
    phases.push(run.phase);
    let first_levels = run.levels;
    // A bound over every plan before placing launches, so that depth 4 stops at the first plan it
    // proves within the target.
    let bound = FullWindowBound::start(profile, options, budget)?;
    let too_large = full_window_integers(profile) > FULL_WINDOW_MIP_MAX_INTEGERS;
    let time_objective = options.objective == Objective::Time;
    if options.threads >= 2 && time_objective {
        let this_thread = if too_large {
            ThisThread::Placement
        } else {
            ThisThread::FullWindowMip
        };
        return two_searches(
            profile,
            options,
            (pool, phases, budget),
            (bound, first_levels),
            this_thread,
        );
    }
    place(
        profile,
        options,
        (pool, phases, budget),
        (&bound, PLACEMENT_SHARE),
        first_levels.clone(),
    )?;
    let then = if too_large {
        AfterTheBound::FarSearch(first_levels)
    } else {
        AfterTheBound::Nothing
    };
    widen_and_search(profile, options, (pool, phases, budget), bound, then)?;
    Ok(if !pool.is_empty() && (too_large || pool.proven(phases)) {
        FullWindow::Skip
    } else {
        FullWindow::Run
    })
}

/// What follows the widened bound in [`widen_and_search`].
enum AfterTheBound {
    /// Nothing: the full-window MIP (here or beside it) searches the plans.
    Nothing,
    /// The search of launches outside depth 4 (time objective), placing on a profile with nodes
    /// the depth-1 plan's levels (where it found a plan) among others.
    FarSearch(Option<Vec<UnitLevel>>),
}

/// One search's state: the plans it met, its phases and what it may still spend.
type Search<'p, 'a, 'c> = (
    &'p mut Pool<'a>,
    &'p mut Vec<PhaseReport>,
    &'p mut Budget<'c>,
);

/// Depth 4 for at most `share` of the effort, unless the bound proves the best plan already.
/// On a profile with nodes its own MIP takes 90% of that, and the placements at fixed levels of
/// the depth-1 plan and of its own answer the rest.
fn place(
    profile: &Profile,
    options: &SolveOptions,
    (pool, phases, budget): Search,
    (bound, share): (&FullWindowBound, f64),
    first_levels: Option<Vec<UnitLevel>>,
) -> Result<()> {
    if proven_with(pool, phases, bound) || !budget.can_start() {
        return Ok(());
    }
    // Where the bound is tight, depth 4 searches past its own target toward a plan the bound
    // proves (it stops at the first); elsewhere its own target is the claim.
    let placement = SolveOptions {
        relative_gap: if bound.is_tight(options.relative_gap) {
            options.relative_gap * TIGHT_BOUND_GAP_FACTOR
        } else {
            options.relative_gap
        },
        ..limited(options, PLACEMENT_DEPTH)
    };
    let work = budget.share(share);
    let nodes = profile.topology.is_some();
    let own = if nodes { OWN_SEARCH_SHARE } else { 1.0 };
    let before = budget.left();
    let own_work = (work as f64 * own) as u64;
    let own_levels = own_mip(
        profile,
        (options, &placement),
        (pool, phases, budget),
        (bound, own_work),
    )?;
    if !nodes || proven_with(pool, phases, bound) {
        return Ok(());
    }
    let rest = work.saturating_sub(before - budget.left());
    place_each(
        profile,
        &placement,
        (pool, phases, budget),
        ([first_levels, own_levels], rest, &ExtraPositions::new()),
    )
}

/// Whether `phases` and `bound` prove the pool's best plan.
fn proven_with(pool: &Pool, phases: &[PhaseReport], bound: &FullWindowBound) -> bool {
    let with_bound: Vec<_> = phases.iter().cloned().chain(bound.phase()).collect();
    pool.proven(&with_bound)
}

/// Depth 4's own MIP from the best plan for `work` LP iterations, stopping at the first plan
/// `bound` proves; the levels of its answer.
fn own_mip(
    profile: &Profile,
    (options, placement): (&SolveOptions, &SolveOptions),
    (pool, phases, budget): Search,
    (bound, work): (&FullWindowBound, u64),
) -> Result<Option<Vec<UnitLevel>>> {
    let stop = Stop {
        work,
        objective_target: bound
            .phase()
            .map(|b| b.best_bound / (1.0 - options.relative_gap)),
        clock: budget.clock(),
    };
    // The best plan's launches outside depth 4 join its windows, so that it starts the search.
    let extra = pool.best_outside(placement.limits);
    let warm = pool.within(placement.limits, &extra);
    let run = run_highs(profile, (placement, Form::Mip, &extra), &warm, stop)?;
    budget.spend(run.work);
    if let Some(schedule) = run.schedule {
        pool.offer(schedule);
    }
    phases.push(run.phase);
    Ok(run.levels)
}

/// The bound priced from deeper windows and by column generation, and, where `then` asks for the
/// far search (time objective), the search of launches outside depth 4 with the work left: on a
/// profile with nodes the placements of the full-window LP's levels made whole
/// (`super::rounding`, `SPREAD_PLACEMENT_SHARE` of the effort at most) and of the depth-1 plan's
/// levels (`FAR_PLACEMENT_SHARE`) over depth 4 and the positions where launches pay in the
/// full-window LP, then the far-band search.
fn widen_and_search(
    profile: &Profile,
    options: &SolveOptions,
    (pool, phases, budget): Search,
    mut bound: FullWindowBound,
    then: AfterTheBound,
) -> Result<()> {
    if let Some(incumbent) = pool.best_value() {
        bound.widen(profile, options, incumbent, budget)?;
    }
    if let Some(phase) = bound.phase() {
        phases.push(phase);
    }
    // The memory objective keeps the full-window LP bound.
    let time_objective = options.objective == Objective::Time;
    let AfterTheBound::FarSearch(levels) = then else {
        return Ok(());
    };
    if !time_objective || pool.is_empty() {
        return Ok(());
    }
    let none = ExtraPositions::new();
    let paying = if bound.is_full_lp() {
        bound.paying_positions()
    } else {
        &none
    };
    let nodes = profile.topology.is_some();
    if nodes && !paying.is_empty() && !pool.proven(phases) {
        let placement = limited(options, PLACEMENT_DEPTH);
        let spread = bound.spread_levels().filter(|s| levels.as_ref() != Some(s));
        for (candidate, share) in [
            (spread, SPREAD_PLACEMENT_SHARE),
            (levels, FAR_PLACEMENT_SHARE),
        ] {
            let work = budget.share(share);
            place_each(
                profile,
                &placement,
                (&mut *pool, &mut *phases, &mut *budget),
                ([candidate], work, paying),
            )?;
        }
    }
    // On a profile with nodes the far-band relaxation's LP is too large for the time (the demo's:
    // 30,893 columns, unsolved after 6 s); the positions where launches pay stand for its bands.
    let bands_lp = !nodes || paying.is_empty();
    if !pool.proven(phases) {
        far_band_search(profile, options, (pool, phases, budget), (paying, bands_lp))?;
    }
    Ok(())
}

/// What a search does on this thread beside the far-band search ([`two_searches`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ThisThread {
    /// Depth 4 first (a quarter of the effort at most), then the full-window MIP beside the far
    /// search: the far-band search finds plans that launch far ahead, which the full MIP's
    /// heuristics miss; the full MIP proves the bound.
    FullWindowMip,
    /// Above 20,000 full-window columns: depth 4 (its own MIP and, on a profile with nodes, the
    /// placements at fixed levels) beside the far search, with the work left. On the demo column
    /// generation reaches the full-window LP's optimum, 5% under depth 4's, and the restricted MIP
    /// over depth 4 and its paying positions finds plans depth 4 cannot.
    Placement,
}

/// Given two threads (time objective): `this_thread`'s search here beside deeper pricing, column
/// generation and the far-band search on another, each HiGHS run on one thread and each search
/// with the work left to it, meeting when both are done.
fn two_searches(
    profile: &Profile,
    options: &SolveOptions,
    (pool, phases, budget): Search,
    (bound, first_levels): (FullWindowBound, Option<Vec<UnitLevel>>),
    this_thread: ThisThread,
) -> Result<FullWindow> {
    let single = one_thread(options);
    // The bound as it stands, for depth 4 to read while the other thread widens it.
    let as_it_stands = bound.without_pricing();
    if this_thread == ThisThread::FullWindowMip {
        place(
            profile,
            &single,
            (&mut *pool, &mut *phases, &mut *budget),
            (&as_it_stands, TWO_SEARCHES_PLACEMENT_SHARE),
            first_levels.clone(),
        )?;
    }
    let levels = first_levels.clone();
    let far = (bound, first_levels);
    let full = beside_far_search(
        profile,
        &single,
        (&mut *pool, phases, budget),
        far,
        |(pool, phases, budget)| match this_thread {
            ThisThread::FullWindowMip => {
                full_window_mip(profile, &single, pool, budget).map(|mut run| {
                    if let Some(schedule) = run.schedule.take() {
                        pool.offer(schedule);
                    }
                    Some(run)
                })
            }
            ThisThread::Placement => place(
                profile,
                &single,
                (pool, phases, budget),
                (&as_it_stands, 1.0),
                levels,
            )
            .map(|()| None),
        },
    )??;
    Ok(match full {
        Some(run) => {
            phases.push(run.phase);
            FullWindow::Ran {
                infeasible: run.infeasible,
            }
        }
        // As alone: without a plan, the full-window MIP still runs to tell an infeasible cap.
        None if pool.is_empty() => FullWindow::Run,
        None => FullWindow::Skip,
    })
}

/// The options of a search on one thread of two.
fn one_thread(options: &SolveOptions) -> SolveOptions {
    SolveOptions {
        threads: 1,
        ..options.clone()
    }
}

/// `here` on this thread beside [`widen_and_search`] on another (the bound widened, then the
/// search of launches outside depth 4), each on its own copy of the pool, phases and budget, so
/// that neither's timing changes the other's answer; when both are done the other's plans and
/// phases join these (after them: a fixed order).
fn beside_far_search<'a, 'c, T>(
    profile: &Profile,
    single: &SolveOptions,
    (pool, phases, budget): (&mut Pool<'a>, &mut Vec<PhaseReport>, &mut Budget<'c>),
    (bound, first_levels): (FullWindowBound, Option<Vec<UnitLevel>>),
    here: impl FnOnce(Search<'_, 'a, 'c>) -> T,
) -> Result<T> {
    let mut other_pool = pool.clone();
    let mut other_phases = phases.clone();
    let mut other_budget = budget.clone();
    let before = phases.len();
    let (here, other) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            widen_and_search(
                profile,
                single,
                (&mut other_pool, &mut other_phases, &mut other_budget),
                bound,
                AfterTheBound::FarSearch(first_levels),
            )
        });
        let here = here((&mut *pool, &mut *phases, &mut *budget));
        (here, other.join())
    });
    other.map_err(|_| Error::Solver("the far-band search's thread panicked".into()))??;
    pool.absorb(other_pool);
    phases.extend(other_phases.drain(before..));
    Ok(here)
}

/// The full-window MIP with the work left (at least enough for its root), warm-started from the
/// best plan it can represent.
pub(super) fn full_window_mip(
    profile: &Profile,
    options: &SolveOptions,
    pool: &Pool,
    budget: &mut Budget,
) -> Result<Run> {
    let stop = Stop {
        work: budget.rest(),
        objective_target: None,
        clock: budget.clock(),
    };
    let run = run_highs(
        profile,
        (options, Form::Mip, &ExtraPositions::new()),
        pool.plans(),
        stop,
    )?;
    budget.spend(run.work);
    Ok(run)
}

fn limited(options: &SolveOptions, depth: NonZeroUsize) -> SolveOptions {
    SolveOptions {
        limits: WindowLimits::depth(depth),
        ..options.clone()
    }
}
