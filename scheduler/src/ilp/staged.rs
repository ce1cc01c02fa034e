//! The staged solve of models above 3000 full-window integer columns (DESIGN §4.5): depth 1, the
//! priced bound, depth 4, deeper pricing, then the full-window MIP or (above 20,000 columns) the
//! far-band search — and, given two threads, the full-window MIP on one while depth 4 and the
//! far-band search run on the other, sharing their best plan and bound ([`Shared`]).

use super::bound::FullWindowBound;
use super::limits::PLACEMENT_DEPTH;
use super::model::Form;
use super::placement::place_each;
use super::pool::Pool;
use super::race::Shared;
use super::refine::{LEAST_PHASE, far_band_search};
use super::run::{Run, Stop, run_highs, seconds_until};
use super::variables::{ExtraPositions, UnitLevel};
use super::{Objective, PhaseReport, SolveOptions, WindowLimits};
use crate::profile::Profile;
use crate::{Error, Result};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The staged solve's phases before the full windows, with their share of the time limit: D = 1
/// fixes every launch next to its consumer (only levels and recompute are chosen); D = 4 places
/// them. Each phase's plan is feasible for the next (the windows nest) and warm-starts it.
const LEVELS_SHARE: f64 = 0.1;
const PLACEMENT_SHARE: f64 = 0.6;
/// Depth 4's share where two searches follow it: the far-band search places launches within
/// depth 4 too, and the full-window MIP needs the time (Llama 3 8B at 59.82 GiB: depth 4 spent
/// its 6 s of 10 on a plan 1.9% slower than the pair's).
const TWO_SEARCHES_PLACEMENT_SHARE: f64 = 0.25;
/// On a profile with nodes, the share of depth 4's time its own MIP takes; the placements of
/// fixed levels (`super::placement`) take the rest.
const OWN_SEARCH_SHARE: f64 = 0.9;
/// Depth 4's gap target, relative to the solve's, when the bound over every plan is tight.
const TIGHT_BOUND_GAP_FACTOR: f64 = 0.25;
/// On a profile with nodes, the most of the time limit that placing the depth-1 plan's levels over
/// depth 4 and the positions where launches pay may take (the demo: 5,546 ms in 3 s, which the
/// far-band search's restricted MIP then improves to 5,505 ms).
const FAR_PLACEMENT_SHARE: f64 = 0.15;
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

/// Runs the staged phases until `deadline`, adding their plans to `pool` and their reports to
/// `phases`.
pub(super) fn staged_phases(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    deadline: Instant,
) -> Result<FullWindow> {
    let stop = Stop {
        time_limit: seconds_until(deadline).min(options.time_limit_s * LEVELS_SHARE),
        objective_target: None,
        shared: None,
    };
    let levels = limited(options, NonZeroUsize::MIN);
    let run = run_highs(
        profile,
        (&levels, Form::Mip, &ExtraPositions::new()),
        pool.plans(),
        stop,
    )?;
    if let Some(schedule) = run.schedule {
        pool.offer(schedule);
    }
    phases.push(run.phase);
    let first_levels = run.levels;
    // A bound over every plan before placing launches, so that depth 4 stops at the first plan it
    // proves within the target.
    let bound = FullWindowBound::start(profile, options, seconds_until(deadline))?;
    let too_large = full_window_integers(profile) > FULL_WINDOW_MIP_MAX_INTEGERS;
    let time_objective = options.objective == Objective::Time;
    if options.threads >= 2 && time_objective && too_large {
        return far_launches_beside(
            profile,
            options,
            pool,
            phases,
            (bound, first_levels),
            deadline,
        );
    }
    if options.threads >= 2 && time_objective && !too_large {
        return two_searches(
            profile,
            options,
            pool,
            phases,
            (bound, first_levels),
            deadline,
        );
    }
    place(
        profile,
        options,
        pool,
        phases,
        (&bound, PLACEMENT_SHARE),
        (first_levels.clone(), deadline),
    )?;
    let far = too_large.then_some(first_levels);
    widen_and_search(profile, options, pool, phases, (bound, deadline), far)?;
    Ok(if !pool.is_empty() && (too_large || pool.proven(phases)) {
        FullWindow::Skip
    } else {
        FullWindow::Run
    })
}

/// Depth 4 for at most `share` of the time limit, unless the bound proves the best plan already.
/// On a profile with nodes its own MIP takes 90% of that, and the placements at fixed levels of
/// the depth-1 plan and of its own answer the rest.
fn place(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    (bound, share): (&FullWindowBound, f64),
    (first_levels, deadline): (Option<Vec<UnitLevel>>, Instant),
) -> Result<()> {
    if proven_with(pool, phases, bound) || seconds_until(deadline) <= LEAST_PHASE {
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
    let budget = seconds_until(deadline).min(options.time_limit_s * share);
    let started = Instant::now();
    let at = |fraction: f64| started + Duration::from_secs_f64(budget * fraction);
    let nodes = profile.topology.is_some();
    let own = if nodes { OWN_SEARCH_SHARE } else { 1.0 };
    let own_levels = own_mip(
        profile,
        (options, &placement),
        pool,
        phases,
        (bound, at(own)),
    )?;
    if !nodes || proven_with(pool, phases, bound) {
        return Ok(());
    }
    place_each(
        profile,
        &placement,
        pool,
        phases,
        ([first_levels, own_levels], at(1.0), &ExtraPositions::new()),
    )
}

/// Whether `phases` and `bound` prove the pool's best plan.
fn proven_with(pool: &Pool, phases: &[PhaseReport], bound: &FullWindowBound) -> bool {
    let with_bound: Vec<_> = phases.iter().cloned().chain(bound.phase()).collect();
    pool.proven(&with_bound)
}

/// Depth 4's own MIP from the best plan until `deadline`, stopping at the first plan `bound`
/// proves; the levels of its answer.
fn own_mip(
    profile: &Profile,
    (options, placement): (&SolveOptions, &SolveOptions),
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    (bound, deadline): (&FullWindowBound, Instant),
) -> Result<Option<Vec<UnitLevel>>> {
    let shared = pool.shared();
    let stop = Stop {
        time_limit: seconds_until(deadline),
        objective_target: bound
            .phase()
            .map(|b| b.best_bound / (1.0 - options.relative_gap)),
        shared: shared.as_deref(),
    };
    // The best plan's launches outside depth 4 join its windows, so that it starts the search.
    let extra = pool.best_outside(placement.limits);
    let warm = pool.within(placement.limits, &extra);
    let run = run_highs(profile, (placement, Form::Mip, &extra), &warm, stop)?;
    if let Some(schedule) = run.schedule {
        pool.offer(schedule);
    }
    phases.push(run.phase);
    Ok(run.levels)
}

/// The bound priced from deeper windows and by column generation, and, given `far` (time
/// objective), the search of launches outside depth 4 for the time left: on a profile with nodes
/// the placement of `far`'s levels (the depth-1 plan's) over depth 4 and the positions where
/// launches pay in the full-window LP (for `FAR_PLACEMENT_SHARE` of the time limit at most), then
/// the far-band search.
fn widen_and_search(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    (mut bound, deadline): (FullWindowBound, Instant),
    far: Option<Option<Vec<UnitLevel>>>,
) -> Result<()> {
    if let Some(incumbent) = pool.best_value() {
        bound.widen(profile, options, incumbent, seconds_until(deadline))?;
    }
    if let Some(phase) = bound.phase() {
        pool.offer_bound(&phase);
        phases.push(phase);
    }
    // The memory objective keeps the full-window LP bound.
    let time_objective = options.objective == Objective::Time;
    let Some(levels) = far.filter(|_| time_objective && !pool.is_empty()) else {
        return Ok(());
    };
    let none = ExtraPositions::new();
    let paying = if bound.is_full_lp() {
        bound.paying_positions()
    } else {
        &none
    };
    let nodes = profile.topology.is_some();
    if nodes && !paying.is_empty() && !pool.proven(phases) {
        let share = Duration::from_secs_f64(options.time_limit_s * FAR_PLACEMENT_SHARE);
        let until = deadline.min(Instant::now() + share);
        let placement = limited(options, PLACEMENT_DEPTH);
        place_each(profile, &placement, pool, phases, ([levels], until, paying))?;
    }
    // On a profile with nodes the far-band relaxation's LP is too large for the time (the demo's:
    // 30,893 columns, unsolved after 6 s); the positions where launches pay stand for its bands.
    let bands_lp = !nodes || paying.is_empty();
    if !pool.proven(phases) {
        far_band_search(profile, options, pool, phases, (deadline, paying, bands_lp))?;
    }
    Ok(())
}

/// Depth 4 (a quarter of the time at most), then the full-window MIP on this thread beside the
/// deeper pricing and the far-band search on another, each HiGHS run on one thread, until the
/// pair proves the best plan or `deadline`. The far-band search finds plans that launch far
/// ahead, which the full MIP's heuristics miss in the time, and hands them to it; the full MIP
/// proves the bound.
fn two_searches(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    (bound, first_levels): (FullWindowBound, Option<Vec<UnitLevel>>),
    deadline: Instant,
) -> Result<FullWindow> {
    let single = one_thread_shared(options, pool);
    place(
        profile,
        &single,
        pool,
        phases,
        (&bound, TWO_SEARCHES_PLACEMENT_SHARE),
        (first_levels.clone(), deadline),
    )?;
    let far = (bound, first_levels, deadline);
    let full = beside_far_search(profile, &single, (pool, phases), far, |pool, _| {
        // Its plan, shared at once, tells the other search whether it can stop.
        full_window_mip(profile, &single, pool, deadline).map(|mut run| {
            if let Some(schedule) = run.schedule.take() {
                pool.offer(schedule);
            }
            run
        })
    })??;
    phases.push(full.phase);
    Ok(FullWindow::Ran {
        infeasible: full.infeasible,
    })
}

/// Above 20,000 full-window columns, given two threads (time objective): depth 4 (its own MIP and,
/// on a profile with nodes, the placements at fixed levels) on this thread until `deadline`,
/// beside deeper pricing, column generation and the far-band search over the positions where
/// launches pay on another, each HiGHS run on one thread, sharing their best plan and bound. On
/// the demo column generation reaches the full-window LP's optimum in about 2.5 s, 5% under depth
/// 4's, and the restricted MIP over depth 4 and its paying positions finds plans depth 4 cannot.
fn far_launches_beside(
    profile: &Profile,
    options: &SolveOptions,
    pool: &mut Pool,
    phases: &mut Vec<PhaseReport>,
    (bound, first_levels): (FullWindowBound, Option<Vec<UnitLevel>>),
    deadline: Instant,
) -> Result<FullWindow> {
    let single = one_thread_shared(options, pool);
    let start = bound.without_pricing();
    let levels = first_levels.clone();
    let far = (bound, first_levels, deadline);
    beside_far_search(profile, &single, (pool, phases), far, |pool, phases| {
        place(
            profile,
            &single,
            pool,
            phases,
            (&start, 1.0),
            (levels, deadline),
        )
    })??;
    // As alone: without a plan, the full-window MIP still runs to tell an infeasible cap.
    Ok(if pool.is_empty() {
        FullWindow::Run
    } else {
        FullWindow::Skip
    })
}

/// The options of a search on one thread of two, `pool` sharing its plans and bounds with the
/// other from now on.
fn one_thread_shared(options: &SolveOptions, pool: &mut Pool) -> SolveOptions {
    pool.share(Arc::new(Shared::new(options.relative_gap)));
    SolveOptions {
        threads: 1,
        ..options.clone()
    }
}

/// `here` on this thread beside [`widen_and_search`] on another (the bound widened, then the
/// search of launches outside depth 4 until the deadline), each on its own copy of the pool and
/// phases, sharing their best plan and bound; the other's plans and phases then join these.
fn beside_far_search<'a, T>(
    profile: &Profile,
    single: &SolveOptions,
    (pool, phases): (&mut Pool<'a>, &mut Vec<PhaseReport>),
    (bound, first_levels, deadline): (FullWindowBound, Option<Vec<UnitLevel>>, Instant),
    here: impl FnOnce(&mut Pool<'a>, &mut Vec<PhaseReport>) -> T,
) -> Result<T> {
    let mut other_pool = pool.clone();
    let mut other_phases = phases.clone();
    let before = phases.len();
    let (here, other) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            widen_and_search(
                profile,
                single,
                &mut other_pool,
                &mut other_phases,
                (bound, deadline),
                Some(first_levels),
            )
        });
        let here = here(pool, phases);
        (here, other.join())
    });
    other.map_err(|_| Error::Solver("the far-band search's thread panicked".into()))??;
    pool.absorb(other_pool);
    phases.extend(other_phases.drain(before..));
    Ok(here)
}

/// The full-window MIP for the time left, warm-started from the best plan it can represent.
pub(super) fn full_window_mip(
    profile: &Profile,
    options: &SolveOptions,
    pool: &Pool,
    deadline: Instant,
) -> Result<Run> {
    let shared = pool.shared();
    let stop = Stop {
        time_limit: seconds_until(deadline),
        objective_target: None,
        shared: shared.as_deref(),
    };
    run_highs(
        profile,
        (options, Form::Mip, &ExtraPositions::new()),
        pool.plans(),
        stop,
    )
}

fn limited(options: &SolveOptions, depth: NonZeroUsize) -> SolveOptions {
    SolveOptions {
        limits: WindowLimits::depth(depth),
        ..options.clone()
    }
}
