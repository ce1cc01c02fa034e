//! The staged solve of models above 3000 full-window integer columns (DESIGN §4.5): depth 1, the
//! priced bound, depth 4, deeper pricing, then the full-window MIP or (above 20,000 columns) the
//! far-band search — and, given two threads, the full-window MIP or depth 4 on one while the
//! far-band search runs on the other, each with its own budget of work, meeting when both are done.

use super::bound::FullWindowBound;
use super::limits::PLACEMENT_DEPTH;
use super::model::Form;
use super::placement::{FixedLevels, Placements, place_each, place_recompute_free};
use super::refine::{FarBandStart, far_band_search};
use super::run::{Run, Stop, run_highs};
use super::search::Search;
use super::variables::{ExtraPositions, UnitLevel};
use super::{Objective, SolveOptions, WindowLimits};
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
/// The effort share at most of the placement of the full-window LP's levels made whole, recompute
/// free (DESIGN §4.5, "placing the LP's levels"), before the depth-1 plan's: on the demo it runs
/// past its share (32,500 LP iterations where the share is 18,000: the meter stops HiGHS only
/// between its checks), so it takes the far-band search's effort, and it places faster than the
/// same levels with recompute fixed (5,353.8 ms against 5,369.6) or the depth-1 plan's (5,398.9).
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

/// Runs the staged phases within the search's budget, adding their plans and runs to it.
pub(super) fn staged_phases(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
) -> Result<FullWindow> {
    let stop = search.stop(search.budget.share(LEVELS_SHARE), None);
    let levels = limited(options, NonZeroUsize::MIN);
    let run = run_highs(
        profile,
        (&levels, Form::Mip, &ExtraPositions::new()),
        search.pool.plans(),
        stop,
    )?;
    let first_levels = search.record(run).levels;
    // A bound over every plan before placing launches, so that depth 4 stops at the first plan it
    // proves within the target.
    let bound = FullWindowBound::start(profile, options, &mut search.budget)?;
    let too_large = full_window_integers(profile) > FULL_WINDOW_MIP_MAX_INTEGERS;
    let time_objective = options.objective == Objective::Time;
    let start = Start {
        bound,
        first_levels,
    };
    if options.threads >= 2 && time_objective {
        let this_thread = if too_large {
            ThisThread::Placement
        } else {
            ThisThread::FullWindowMip
        };
        return two_searches(profile, options, search, start, this_thread);
    }
    let placement = Placement {
        bound: &start.bound,
        share: PLACEMENT_SHARE,
        first_levels: start.first_levels.clone(),
    };
    place(profile, options, search, placement)?;
    let then = if too_large {
        AfterTheBound::FarSearch(start.first_levels)
    } else {
        AfterTheBound::Nothing
    };
    widen_and_search(profile, options, search, start.bound, then)?;
    Ok(
        if !search.pool.is_empty() && (too_large || search.proven()) {
            FullWindow::Skip
        } else {
            FullWindow::Run
        },
    )
}

/// What the phases after depth 1 start from: the bound over every plan priced from depth 4, and
/// the depth-1 plan's levels (where it found a plan).
struct Start {
    bound: FullWindowBound,
    first_levels: Option<Vec<UnitLevel>>,
}

/// What follows the widened bound in [`widen_and_search`].
enum AfterTheBound {
    /// Nothing: the full-window MIP (here or beside it) searches the plans.
    Nothing,
    /// The search of launches outside depth 4 (time objective), placing on a profile with nodes
    /// the depth-1 plan's levels (where it found a plan) among others.
    FarSearch(Option<Vec<UnitLevel>>),
}

/// Depth 4's search: for at most `share` of the effort, stopping at the first plan `bound` proves.
struct Placement<'b> {
    bound: &'b FullWindowBound,
    share: f64,
    /// On a profile with nodes, placed at fixed levels beside depth 4's own answer's.
    first_levels: Option<Vec<UnitLevel>>,
}

/// Depth 4 for at most `request.share` of the effort, unless the bound proves the best plan
/// already. On a profile with nodes its own MIP takes 90% of that, and the placements at fixed
/// levels of the depth-1 plan and of its own answer the rest.
fn place(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    request: Placement,
) -> Result<()> {
    let Placement {
        bound,
        share,
        first_levels,
    } = request;
    if search.proven_with(bound) || !search.budget.can_start() {
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
    let work = search.budget.share(share);
    let nodes = profile.topology.is_some();
    let own = if nodes { OWN_SEARCH_SHARE } else { 1.0 };
    let before = search.budget.left();
    let own_work = (work as f64 * own) as u64;
    // Stops at the first plan the bound proves within the solve's gap.
    let target = bound
        .phase()
        .map(|b| b.best_bound / (1.0 - options.relative_gap));
    let stop = search.stop(own_work, target);
    let own_levels = own_mip(profile, &placement, search, stop)?;
    if !nodes || search.proven_with(bound) {
        return Ok(());
    }
    let rest = work.saturating_sub(before - search.budget.left());
    let placements = Placements {
        candidates: vec![first_levels, own_levels],
        work: rest,
        extra: &ExtraPositions::new(),
    };
    place_each(profile, &placement, search, placements)
}

/// Depth 4's own MIP (`placement`'s windows) from the best plan, until `stop`; the levels of its
/// answer.
fn own_mip(
    profile: &Profile,
    placement: &SolveOptions,
    search: &mut Search,
    stop: Stop,
) -> Result<Option<Vec<UnitLevel>>> {
    // The best plan's launches outside depth 4 join its windows, so that it starts the search.
    let extra = search.pool.best_outside(placement.limits);
    let warm = search.pool.within(placement.limits, &extra);
    let run = run_highs(profile, (placement, Form::Mip, &extra), &warm, stop)?;
    Ok(search.record(run).levels)
}

/// The bound priced from deeper windows and by column generation, and, where `then` asks for the
/// far search (time objective), the search of launches outside depth 4 with the work left: on a
/// profile with nodes the placements of the full-window LP's levels made whole
/// (`super::rounding`, recompute free: `SPREAD_PLACEMENT_SHARE` of the effort at most) and of the
/// depth-1 plan's levels (`FAR_PLACEMENT_SHARE`) over depth 4 and the positions where launches pay
/// in the full-window LP, then the far-band search.
fn widen_and_search(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    mut bound: FullWindowBound,
    then: AfterTheBound,
) -> Result<()> {
    if let Some(incumbent) = search.pool.best_value() {
        bound.widen(profile, options, incumbent, &mut search.budget)?;
    }
    if let Some(phase) = bound.phase() {
        search.phases.push(phase);
    }
    // The memory objective keeps the full-window LP bound.
    let time_objective = options.objective == Objective::Time;
    let AfterTheBound::FarSearch(levels) = then else {
        return Ok(());
    };
    if !time_objective || search.pool.is_empty() {
        return Ok(());
    }
    let none = ExtraPositions::new();
    let paying = if bound.is_full_lp() {
        bound.paying_positions()
    } else {
        &none
    };
    let nodes = profile.topology.is_some();
    if nodes && !paying.is_empty() && !search.proven() {
        let placement = limited(options, PLACEMENT_DEPTH);
        let spread = bound.spread_levels().filter(|s| levels.as_ref() != Some(s));
        if let Some(spread) = &spread {
            let fixed = FixedLevels {
                levels: spread,
                work: search.budget.share(SPREAD_PLACEMENT_SHARE),
                extra: paying,
            };
            place_recompute_free(profile, &placement, search, fixed)?;
        }
        let placements = Placements {
            candidates: vec![levels],
            work: search.budget.share(FAR_PLACEMENT_SHARE),
            extra: paying,
        };
        place_each(profile, &placement, search, placements)?;
    }
    // On a profile with nodes the far-band relaxation's LP is too large for the time (the demo's:
    // 30,893 columns, unsolved after 6 s); the positions where launches pay stand for its bands.
    let start = if !nodes || paying.is_empty() {
        FarBandStart::BandsLpAnd(paying)
    } else {
        FarBandStart::Paying(paying)
    };
    if !search.proven() {
        far_band_search(profile, options, search, start)?;
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
/// generation and the far-band search on another (the bound widened, then the search of launches
/// outside depth 4), each HiGHS run on one thread and each search on its own copy of the search
/// with the work left to it, so that neither's timing changes the other's answer; when both are
/// done the other's plans and runs join these (after them: a fixed order).
fn two_searches(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
    start: Start,
    this_thread: ThisThread,
) -> Result<FullWindow> {
    let single = SolveOptions {
        threads: 1,
        ..options.clone()
    };
    let Start {
        bound,
        first_levels,
    } = start;
    // The bound as it stands, for depth 4 to read while the other thread widens it.
    let as_it_stands = bound.without_pricing();
    let placement = |share| Placement {
        bound: &as_it_stands,
        share,
        first_levels: first_levels.clone(),
    };
    if this_thread == ThisThread::FullWindowMip {
        place(
            profile,
            &single,
            search,
            placement(TWO_SEARCHES_PLACEMENT_SHARE),
        )?;
    }
    let forked_at = search.phases.len();
    let mut other = search.clone();
    let (here, there) = std::thread::scope(|scope| {
        let there = scope.spawn(|| {
            let then = AfterTheBound::FarSearch(first_levels.clone());
            widen_and_search(profile, &single, &mut other, bound, then)
        });
        let here = match this_thread {
            ThisThread::FullWindowMip => {
                full_window_mip(profile, &single, search).map(|mut run| {
                    if let Some(schedule) = run.schedule.take() {
                        search.pool.offer(schedule);
                    }
                    Some(run)
                })
            }
            ThisThread::Placement => place(profile, &single, search, placement(1.0)).map(|()| None),
        };
        (here, there.join())
    });
    there.map_err(|_| Error::Solver("the far-band search's thread panicked".into()))??;
    search.join(other, forked_at);
    Ok(match here? {
        Some(run) => {
            search.phases.push(run.phase);
            FullWindow::Ran {
                infeasible: run.infeasible,
            }
        }
        // As alone: without a plan, the full-window MIP still runs to tell an infeasible cap.
        None if search.pool.is_empty() => FullWindow::Run,
        None => FullWindow::Skip,
    })
}

/// The full-window MIP with the work left (at least enough for its root), warm-started from the
/// best plan it can represent; its work spent, its plan and phase left to the caller.
pub(super) fn full_window_mip(
    profile: &Profile,
    options: &SolveOptions,
    search: &mut Search,
) -> Result<Run> {
    let stop = search.stop(search.budget.rest(), None);
    let run = run_highs(
        profile,
        (options, Form::Mip, &ExtraPositions::new()),
        search.pool.plans(),
        stop,
    )?;
    search.budget.spend(run.work);
    Ok(run)
}

fn limited(options: &SolveOptions, depth: NonZeroUsize) -> SolveOptions {
    SolveOptions {
        limits: WindowLimits::depth(depth),
        ..options.clone()
    }
}
