//! Driving HiGHS: one run (warm start, shared progress, status, bound and gap), the solve around
//! the staged phases, the claim a plan carries, the check of every answer against the strict
//! simulator, and infeasible caps.

use super::callback::{PlanValues, Watch, solve_watched};
use super::mapping::{schedule_from_values, schedule_values, slot_terms, tight_time};
use super::model::{Form, build, highs_model};
use super::pool::Pool;
use super::race::Shared;
use super::staged::{FullWindow, full_window_mip, is_staged, staged_phases};
use super::variables::{ExtraPositions, UnitVars};
use super::{
    Objective, PhaseReport, Relaxation, SolveOptions, SolveReport, SolveStatus, Solved,
    WindowLimits,
};
use crate::baselines::{self, BaselineKind};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, memory_by_slot, simulate};
use crate::size::{format_bytes, whole_bytes};
use crate::{Error, Result};
use highs::HighsModelStatus;
use std::time::{Duration, Instant};

/// Relative agreement required between the ILP's objective and the strict simulation.
const CONSISTENCY: f64 = 1e-6;

/// What one HiGHS run returned.
pub(super) struct Run {
    pub schedule: Option<Schedule>,
    /// The positions of the band columns its solution launches in (far-band relaxation).
    pub bands_used: ExtraPositions,
    pub phase: PhaseReport,
    pub infeasible: bool,
}

/// When HiGHS stops: its time limit, optionally an objective target (HiGHS'
/// `objective_target`: it stops at the first plan below it, e.g. one that a bound already proves),
/// and the progress it shares with a search on another thread (it stops once the pair proves the
/// target, and a MIP of plans takes the other's better plans).
pub(super) struct Stop<'a> {
    pub time_limit: f64,
    pub objective_target: Option<f64>,
    pub shared: Option<&'a Shared>,
}

/// Runs HiGHS on the MIP of `options` with launch columns also at `extra` (`Form::Mip`: its
/// answer is a plan), or on its far-band relaxation (`Form::FarBands`, `Form::FarBandsLp`: its
/// bound holds over every plan; the MIP's answer, launched at its bands' own positions, is a plan
/// too, though not at the relaxation's time).
pub(super) fn run_highs(
    profile: &Profile,
    (options, form, extra): (&SolveOptions, Form, &ExtraPositions),
    warm: &[(Schedule, f64)],
    stop: Stop,
) -> Result<Run> {
    let started = Instant::now();
    let built = build(profile, options, (form, extra));
    let plans = form == Form::Mip;
    let rows = built.constraints.len();
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        stop.time_limit,
    )?;
    if let Some(target) = stop.objective_target {
        model
            .try_set_option("objective_target", target)
            .map_err(|e| Error::Solver(format!("HiGHS option objective_target: {e:?}")))?;
    }
    let (units, durations, columns) = (&built.units, &built.durations, built.columns);
    let (peak, memory_scale) = (built.peak, built.memory_scale);
    // A plan's values in this model: its launches, levels and recompute, each slot's duration and
    // the peak column (a hair above the peak, so that the start is not cut off by rounding).
    let values_of = |schedule: &Schedule| {
        let mut values = schedule_values(units, schedule, columns)?;
        let terms = slot_terms(profile, units, &values);
        for (d, (c, q, l)) in durations.iter().zip(terms) {
            values[d.index] = profile.interference().slot_duration(c, q, l);
        }
        if let Some(peak) = peak {
            let worst = memory_by_slot(profile, schedule)
                .iter()
                .map(|m| m.total())
                .fold(0.0, f64::max);
            values[peak.index] = worst / memory_scale * (1.0 + 1e-12);
        }
        Some(values)
    };
    if let Some(values) = warm.iter().find_map(|(s, _)| values_of(s)) {
        model
            .try_set_solution(Some(&values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    let bounds_every_plan = form != Form::Mip || options.limits.is_full() && extra.is_empty();
    let watch = stop.shared.map(|shared| Watch {
        shared,
        bounds_every_plan,
        values_of: plans.then_some(&values_of as &PlanValues),
    });
    let solved = solve_watched(model, watch.as_ref())
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
    let infeasible = matches!(
        status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    );
    let values = solved.get_solution().columns().to_vec();
    let gap = solved.mip_gap();
    let bound = if form == Form::FarBandsLp {
        // An LP's value bounds only at its optimum.
        if status == HighsModelStatus::Optimal {
            solved.objective_value()
        } else {
            f64::NEG_INFINITY
        }
    } else {
        solved
            .double_info_value(c"mip_dual_bound")
            .unwrap_or(f64::NEG_INFINITY)
    };
    let answered = has_solution && !infeasible && form != Form::FarBandsLp;
    let schedule = answered
        .then(|| schedule_from_values(profile, &built.units, &values))
        .transpose();
    // A relaxation's answer is a plan only if it reads as one; the MIP's must.
    let schedule = if plans {
        schedule?
    } else {
        schedule.ok().flatten()
    };
    let ilp_time = tight_time(
        &slot_terms(profile, &built.units, &values),
        profile.interference(),
    );
    let ilp_peak = built.peak.map(|p| values[p.index] * built.memory_scale);
    if let Some(schedule) = schedule.as_ref().filter(|_| plans) {
        check_consistency(profile, schedule, ilp_time, ilp_peak)?;
    }
    let objective = match (&schedule, options.objective) {
        (_, Objective::Time) if !plans && has_solution => solved.objective_value(),
        (Some(_), Objective::Time) => ilp_time,
        (Some(s), Objective::Memory { .. }) => objective_of(profile, options.objective, s),
        (None, _) => f64::NAN,
    };
    let bound = match options.objective {
        Objective::Time => bound,
        Objective::Memory { .. } => bound * built.memory_scale,
    };
    let status = match status {
        HighsModelStatus::Optimal if gap <= 1e-9 || !gap.is_finite() => SolveStatus::Optimal,
        // Stopped at the first plan the bound over every plan proves within the target, or
        // because the search beside it proved the target (§4.5, "two searches").
        HighsModelStatus::Optimal
        | HighsModelStatus::ObjectiveTarget
        | HighsModelStatus::ReachedInterrupt => SolveStatus::GapLimit,
        _ => SolveStatus::TimeLimit,
    };
    let gap = if objective.is_finite() && bound.is_finite() {
        ((objective - bound) / objective.abs().max(1e-12)).max(0.0)
    } else {
        gap
    };
    let phase = PhaseReport {
        window_depth: if plans {
            options.limits
        } else {
            WindowLimits::FULL
        },
        relaxation: (!plans).then_some(Relaxation::FarBands),
        status,
        objective,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        variables: built.columns,
        integer_variables: built.integers,
        constraints: rows,
    };
    if let Some(shared) = stop.shared
        && bounds_every_plan
        && options.objective == Objective::Time
    {
        shared.offer_bound(phase.best_bound);
    }
    tracing::debug!(?phase, "HiGHS phase done");
    Ok(Run {
        schedule,
        // The LP's fractional launches count wherever they are above rounding noise.
        bands_used: bands_used(
            &built.units,
            &values,
            if form == Form::FarBandsLp { 1e-6 } else { 0.5 },
        ),
        phase,
        infeasible,
    })
}

/// Per (unit, op), the positions of the band columns in which `values` launches more than
/// `least` blocks.
fn bands_used(units: &[UnitVars], values: &[f64], least: f64) -> ExtraPositions {
    let mut used = ExtraPositions::new();
    for (i, u) in units.iter().enumerate() {
        for op in u.ops() {
            for (positions, x) in op.band_launches() {
                if values[x.index] > least {
                    used.entry((i, op.op))
                        .or_default()
                        .extend(positions.clone());
                }
            }
        }
    }
    used
}

/// The best baseline for the objective (checkpointing on or off) that fits the cap and the time
/// ceiling, as a warm start: the fastest for the time objective, the smallest peak for memory.
fn best_baseline(profile: &Profile, options: &SolveOptions) -> Option<(String, Schedule, f64)> {
    let preference = options.objective.preference();
    let chosen = baselines::best_baseline(
        profile,
        &BaselineKind::ALL,
        options.allow_recompute,
        options.memory_cap_bytes,
        preference,
    )?;
    let time = chosen.plan.simulation.iteration_time_us;
    Some((chosen.label(), chosen.plan.schedule, time))
}

/// Solves for the plan that minimises the chosen objective. Errors with [`Error::Infeasible`]
/// (naming the smallest feasible cap and what dominates it) when nothing fits the cap.
pub fn solve(profile: &Profile, options: &SolveOptions) -> Result<Solved> {
    let started = Instant::now();
    let warm = best_baseline(profile, options);
    // Every feasible plan met so far, best first: each phase warm-starts from the best one its
    // window limit can represent (a neighbour's plan outside D = 4 must not leave D = 4 cold).
    let mut pool = Pool::new(profile, options);
    if let Some((_, schedule, _)) = &warm {
        pool.offer(schedule.clone());
    }
    if let Some(hint) = &options.hint
        && hint.fits(profile)
    {
        pool.offer(hint.clone());
    }
    let mut phases = Vec::new();
    let user_limited = !options.limits.is_full();
    let deadline = started + Duration::from_secs_f64(options.time_limit_s);
    let full_window = if is_staged(profile, options) {
        staged_phases(profile, options, &mut pool, &mut phases, deadline)?
    } else {
        FullWindow::Run
    };
    // The full-window MIP runs unless the staged phases ran it or proved it unneeded: the best
    // plan proven within the gap over every plan, or the model too large for it to finish its
    // root LP (it still runs when no plan was found, to tell an infeasible cap).
    let infeasible = match full_window {
        FullWindow::Ran { infeasible } => infeasible,
        FullWindow::Skip => false,
        FullWindow::Run => {
            let run = full_window_mip(profile, options, &pool, deadline)?;
            phases.push(run.phase);
            if let Some(schedule) = run.schedule {
                pool.offer(schedule);
            }
            run.infeasible
        }
    };
    if user_limited {
        // A warm start outside the windows asked for is not an answer to the limited search.
        pool.retain_within(options.limits);
    }
    if infeasible && pool.is_empty() {
        if let Objective::Memory {
            max_iteration_time_us: Some(ceiling),
        } = options.objective
        {
            return Err(Error::Infeasible(format!(
                "no plan meets the iteration-time ceiling of {:.3} ms{}",
                ceiling / 1e3,
                options.memory_cap_bytes.map_or(String::new(), |c| format!(
                    " within {}",
                    format_bytes(c as f64)
                ))
            )));
        }
        return Err(explain_infeasible(profile, options));
    }
    let Some((schedule, objective)) = pool.into_best() else {
        return Err(Error::Infeasible(
            "the time limit ended before any feasible plan was found".into(),
        ));
    };
    let claim = claim(&phases, &schedule, objective, options.relative_gap);
    let simulation = simulate(profile, &schedule, Semantics::Strict);
    let size = model_size(profile, options, &phases);
    let report = SolveReport {
        status: claim.status,
        objective,
        best_bound: claim.best_bound,
        gap: claim.gap,
        solve_seconds: started.elapsed().as_secs_f64(),
        variables: size.variables,
        integer_variables: size.integer_variables,
        constraints: size.constraints,
        warm_start: warm.map(|(name, _, time)| (name, time)),
        window_depth: claim.window_depth,
        phases,
    };
    Ok(Solved {
        schedule,
        simulation,
        report,
    })
}

/// The size of the model of the plans asked for (the full windows unless the user limited them):
/// the MIP phase that solved it, or, where a staged solve skipped that phase, the model built
/// and counted.
fn model_size(profile: &Profile, options: &SolveOptions, phases: &[PhaseReport]) -> PhaseReport {
    if let Some(phase) = phases
        .iter()
        .find(|p| p.relaxation.is_none() && p.window_depth == options.limits)
    {
        return phase.clone();
    }
    let built = build(profile, options, (Form::Mip, &ExtraPositions::new()));
    PhaseReport {
        variables: built.columns,
        integer_variables: built.integers,
        constraints: built.constraints.len(),
        ..phases.last().expect("a phase ran").clone()
    }
}

/// The value of the objective for a schedule: strict iteration time, or peak bytes.
pub(super) fn objective_of(profile: &Profile, objective: Objective, schedule: &Schedule) -> f64 {
    match objective {
        Objective::Time => simulate(profile, schedule, Semantics::Strict).iteration_time_us,
        Objective::Memory { .. } => memory_by_slot(profile, schedule)
            .iter()
            .map(|m| m.total())
            .fold(0.0, f64::max),
    }
}

impl SolveReport {
    /// What this solve's bounds claim for another plan (`schedule`, objective `value`) that meets
    /// the same cap: `solve --model` returns a plan that packs within the cap, solved under a
    /// lower one or a baseline (DESIGN §6.5), and its gap is against the bounds proven under the
    /// cap the user asked for, not under the lower one.
    pub fn claim_for(&self, schedule: &Schedule, value: f64, target: f64) -> SolveReport {
        let claim = claim(&self.phases, schedule, value, target);
        SolveReport {
            status: claim.status,
            objective: value,
            best_bound: claim.best_bound,
            gap: claim.gap,
            window_depth: claim.window_depth,
            ..self.clone()
        }
    }
}

/// The claim the returned plan (`schedule`, objective `value`) carries: each phase whose window
/// limit contains the plan proves that no plan within that limit beats `value` by more than
/// (value − bound)/value. The widest window whose gap meets `target` wins ("within 0.1% of every
/// plan" says more than "optimal among depth-1 plans"); when none meets it, the smallest gap. The
/// status is optimal when the gap is ≤ 1e-9.
pub(super) fn claim(
    phases: &[PhaseReport],
    schedule: &Schedule,
    value: f64,
    target: f64,
) -> PhaseReport {
    let gap_of = |p: &PhaseReport| ((value - p.best_bound) / value.abs().max(1e-12)).max(0.0);
    let mut admitted: Vec<&PhaseReport> = phases
        .iter()
        .filter(|p| p.window_depth.admit(schedule))
        .collect();
    admitted.sort_by(|a, b| {
        b.window_depth
            .breadth()
            .cmp(&a.window_depth.breadth())
            .then(gap_of(a).total_cmp(&gap_of(b)))
    });
    let best = admitted
        .iter()
        .find(|p| gap_of(p) <= target.max(1e-9))
        .or_else(|| {
            admitted
                .iter()
                .min_by(|a, b| gap_of(a).total_cmp(&gap_of(b)))
        })
        .copied()
        .unwrap_or_else(|| phases.last().expect("at least one phase ran"));
    let gap = gap_of(best);
    let status = if gap <= 1e-9 {
        SolveStatus::Optimal
    } else if best.status == SolveStatus::TimeLimit {
        SolveStatus::TimeLimit
    } else {
        SolveStatus::GapLimit
    };
    PhaseReport {
        status,
        objective: value,
        gap,
        ..best.clone()
    }
}

/// Every plan HiGHS returns is checked against the strict simulator: the ILP's own evaluation of
/// its integer solution (Σ_s max(c_s + L_s, Q_s + κ_q·c_s) from its coefficients, or its peak variable)
/// must match the simulation; otherwise the plan is refused. Whether it fits the cap is judged
/// where plans enter the pool (`solve`'s `offer`): a plan over the cap by HiGHS' tolerance is
/// dropped there, not an error.
fn check_consistency(
    profile: &Profile,
    schedule: &Schedule,
    ilp_time: f64,
    ilp_peak: Option<f64>,
) -> Result<()> {
    let sim = simulate(profile, schedule, Semantics::Strict);
    let error = (sim.iteration_time_us - ilp_time).abs() / ilp_time.max(1e-12);
    if error > CONSISTENCY {
        return Err(Error::Solver(format!(
            "internal check failed: the ILP's objective {ilp_time} µs differs from the simulated {} µs",
            sim.iteration_time_us
        )));
    }
    if let Some(peak) = ilp_peak
        && sim.peak_memory_bytes > peak * (1.0 + CONSISTENCY)
    {
        return Err(Error::Solver(format!(
            "internal check failed: the ILP's peak {peak} bytes is below the simulated {}",
            sim.peak_memory_bytes
        )));
    }
    Ok(())
}

/// The smallest feasible cap (memory objective, no cap) and what dominates its peak slot.
fn explain_infeasible(profile: &Profile, options: &SolveOptions) -> Error {
    let cap = options
        .memory_cap_bytes
        .map_or("the memory cap".to_string(), |c| {
            format!("the memory cap of {}", format_bytes(c as f64))
        });
    let plan = if options.limits.is_full() {
        "plan".to_string()
    } else {
        format!("plan within {}", options.limits)
    };
    let relaxed = SolveOptions {
        objective: Objective::Memory {
            max_iteration_time_us: None,
        },
        memory_cap_bytes: None,
        two_phase: false,
        ..options.clone()
    };
    let stop = Stop {
        time_limit: options.time_limit_s,
        objective_target: None,
        shared: None,
    };
    match run_highs(
        profile,
        (&relaxed, Form::Mip, &ExtraPositions::new()),
        &[],
        stop,
    )
    .ok()
    .and_then(|r| r.schedule)
    {
        Some(schedule) => {
            let sim = simulate(profile, &schedule, Semantics::Strict);
            let peak = sim
                .slots
                .iter()
                .find(|s| s.slot == sim.peak_slot)
                .expect("peak slot exists");
            let (what, bytes) = peak.memory.dominant();
            Error::Infeasible(format!(
                "no {plan} fits {cap}: the smallest feasible cap is {} ({} bytes), peaking at slot {} where the largest part is {}, {}",
                format_bytes(sim.peak_memory_bytes),
                whole_bytes(sim.peak_memory_bytes),
                sim.peak_slot,
                what,
                format_bytes(bytes)
            ))
        }
        None => Error::Infeasible(format!("no {plan} fits {cap}")),
    }
}
