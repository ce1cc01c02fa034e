//! One HiGHS run: the model of one phase built, warm-started, limited to its share of the effort
//! and the outer clock, its status, bound, gap and work read back, and its plan checked against
//! the strict simulator.

use super::callback::solve_metered;
use super::effort::{Budget, Clock};
use super::mapping::{
    levels_from_values, schedule_from_values, schedule_values, slot_terms, tight_time,
};
use super::model::{Form, build, highs_model};
use super::variables::{ExtraPositions, UnitLevel, UnitVars};
use super::{Objective, PhaseReport, Relaxation, SolveOptions, SolveStatus, Target, WindowLimits};
use crate::cost::Interference;
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, memory_by_slot, simulate};
use crate::{Error, Result};
use highs::HighsModelStatus;
use std::time::Instant;

/// Relative agreement required between the ILP's objective and the strict simulation.
const CONSISTENCY: f64 = 1e-6;

/// What one HiGHS run returned.
pub(super) struct Run {
    pub schedule: Option<Schedule>,
    /// The levels and recompute of the MIP's answer (`Form::Mip`).
    pub levels: Option<Vec<UnitLevel>>,
    /// The positions of the band columns its solution launches in (far-band relaxation).
    pub bands_used: ExtraPositions,
    pub phase: PhaseReport,
    pub infeasible: bool,
    /// The LP iterations it spent.
    pub work: u64,
}

/// When HiGHS stops: at its share of the effort (`work`, LP iterations: deterministic),
/// optionally at an objective target (HiGHS' `objective_target`: it stops at the first plan below
/// it, e.g. one that a bound already proves), or when the outer clock runs out (then the clock
/// records it).
pub(super) struct Stop<'a> {
    pub work: u64,
    pub objective_target: Option<f64>,
    pub clock: &'a Clock,
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
    let plans = matches!(
        form,
        Form::Mip | Form::Placement(_) | Form::PlacementAmong(_)
    );
    let placement = matches!(form, Form::Placement(_) | Form::PlacementAmong(_));
    let rows = built.constraints.len();
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        stop.clock.seconds_left(),
    )?;
    if form == Form::FarBandsLp {
        model
            .try_set_option("simplex_iteration_limit", work_option(stop.work))
            .map_err(|e| Error::Solver(format!("HiGHS option simplex_iteration_limit: {e:?}")))?;
    }
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
            values[d.index] = Interference::of(profile).slot_duration(c, q, l);
        }
        if let Some(peak) = peak {
            // The fsdp2 target's rows hold FSDP2's copies beside the model's buffers.
            let worst = match options.target {
                Target::Fsdp2 => super::space::fsdp2_peak(profile, schedule)?,
                Target::Runtime => memory_by_slot(profile, schedule)
                    .iter()
                    .map(|m| m.total())
                    .fold(0.0, f64::max),
            };
            values[peak.index] = worst / memory_scale * (1.0 + 1e-12);
        }
        Some(values)
    };
    // A placement starts only from a plan of its own levels (and recompute, where it holds it).
    let of_form = |values: &Vec<f64>| match form {
        Form::Placement(levels) => levels_from_values(units, values) == levels,
        Form::PlacementAmong(among) => levels_from_values(units, values)
            .iter()
            .zip(among)
            .all(|(level, choices)| choices.contains(&level.choice)),
        _ => true,
    };
    if let Some(values) = warm.iter().filter_map(|(s, _)| values_of(s)).find(of_form) {
        model
            .try_set_solution(Some(&values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    let solved = match form {
        Form::FarBandsLp | Form::Lp => model.try_solve(),
        _ => solve_metered(model, stop.work),
    }
    .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    if status == HighsModelStatus::ReachedTimeLimit {
        stop.clock.record_stop();
    }
    let work = spent(&solved);
    let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
    let infeasible = matches!(
        status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    );
    let values = solved.get_solution().columns().to_vec();
    let gap = solved.mip_gap();
    let bound = match form {
        // An LP's value bounds only at its optimum.
        Form::FarBandsLp if status == HighsModelStatus::Optimal => solved.objective_value(),
        // A placement's bound holds only over the plans of its levels.
        Form::FarBandsLp => f64::NEG_INFINITY,
        _ if placement => f64::NEG_INFINITY,
        _ => solved
            .double_info_value(c"mip_dual_bound")
            .unwrap_or(f64::NEG_INFINITY),
    };
    let answered = has_solution && !infeasible && form != Form::FarBandsLp;
    let levels = (answered && form == Form::Mip).then(|| levels_from_values(&built.units, &values));
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
        Interference::of(profile),
    );
    let ilp_peak = built.peak.map(|p| values[p.index] * built.memory_scale);
    if let Some(schedule) = schedule.as_ref().filter(|_| plans) {
        check_consistency(profile, schedule, ilp_time, ilp_peak)?;
    }
    let objective = match (&schedule, options.objective) {
        (_, Objective::Time) if !plans && has_solution => solved.objective_value(),
        (Some(_), Objective::Time) => ilp_time,
        (Some(s), Objective::Memory { .. }) => match options.target {
            Target::Fsdp2 => super::space::fsdp2_peak(profile, s).unwrap_or(f64::NAN),
            Target::Runtime => super::claim::objective_of(profile, options.objective, s),
        },
        (None, _) => f64::NAN,
    };
    let bound = match options.objective {
        Objective::Time => bound,
        Objective::Memory { .. } => bound * built.memory_scale,
    };
    let status = match status {
        // Proven within its gap, or stopped at the first plan the bound over every plan proves.
        HighsModelStatus::Optimal | HighsModelStatus::ObjectiveTarget => SolveStatus::Optimal,
        HighsModelStatus::ReachedTimeLimit => SolveStatus::TimeLimit,
        // Its share of the effort spent.
        _ => SolveStatus::GapLimit,
    };
    let gap = if objective.is_finite() && bound.is_finite() {
        ((objective - bound) / objective.abs().max(1e-12)).max(0.0)
    } else if placement {
        f64::INFINITY
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
        lp_iterations: work,
        variables: built.columns,
        integer_variables: built.integers,
        constraints: rows,
    };
    tracing::debug!(?phase, "HiGHS phase done");
    Ok(Run {
        schedule,
        levels,
        // The LP's fractional launches count wherever they are above rounding noise.
        bands_used: bands_used(
            &built.units,
            &values,
            if form == Form::FarBandsLp { 1e-6 } else { 0.5 },
        ),
        phase,
        infeasible,
        work,
    })
}

/// An LP's optimum as pricing reads it (DESIGN §4.5).
pub(super) struct LpOptimum {
    /// Each column's value.
    pub values: Vec<f64>,
    /// Each column's reduced cost.
    pub reduced: Vec<f64>,
    /// Each row's dual.
    pub duals: Vec<f64>,
    pub objective: f64,
    /// The LP iterations it took.
    pub work: u64,
}

impl LpOptimum {
    /// `lagrangian` with the terms of the columns pricing did not price (DESIGN §4.5): a column in
    /// [0, 1] at its better bound, `rc·min(0, 1) − rc·x*`; a column without an upper bound
    /// (`unbounded`, the durations d ≥ 0) at zero, `−max(0, rc)·x*`. `None` where such a column's
    /// reduced cost is below −`tolerance`: the bound would be −∞, and the duals are not usable.
    pub fn with_unpriced_columns(
        &self,
        mut lagrangian: f64,
        priced: &[bool],
        unbounded: &[bool],
        tolerance: f64,
    ) -> Option<f64> {
        for (index, &rc) in self.reduced.iter().enumerate() {
            if priced[index] {
                continue;
            }
            if unbounded[index] {
                if rc < -tolerance {
                    return None;
                }
                lagrangian -= rc.max(0.0) * self.values[index];
            } else {
                lagrangian += rc.min(0.0) - rc * self.values[index];
            }
        }
        Some(lagrangian)
    }
}

/// Solves `problem` as an LP within the budget's work and clock (a stop at the clock recorded):
/// its optimum, or `None` where HiGHS did not reach one.
pub(super) fn lp_optimum(
    problem: good_lp::ProblemVariables,
    objective: good_lp::Expression,
    constraints: Vec<good_lp::Constraint>,
    options: &SolveOptions,
    budget: &mut Budget,
) -> Result<Option<LpOptimum>> {
    Ok(
        match lp_solve(problem, objective, constraints, options, budget)? {
            LpSolved::Optimal(optimum) => Some(optimum),
            LpSolved::Infeasible | LpSolved::Stopped => None,
        },
    )
}

/// How an LP ended.
pub(super) enum LpSolved {
    Optimal(LpOptimum),
    /// HiGHS proved it has no solution.
    Infeasible,
    /// Stopped (work, clock) or ended otherwise short of an optimum.
    Stopped,
}

/// Solves `problem` as an LP within the budget's work and clock (a stop at the clock recorded):
/// its optimum, its infeasibility, or neither.
pub(super) fn lp_solve(
    problem: good_lp::ProblemVariables,
    objective: good_lp::Expression,
    constraints: Vec<good_lp::Constraint>,
    options: &SolveOptions,
    budget: &mut Budget,
) -> Result<LpSolved> {
    let clock = budget.clock();
    let mut model = highs_model(
        problem,
        objective,
        constraints,
        options,
        clock.seconds_left(),
    )?;
    model
        .try_set_option("simplex_iteration_limit", work_option(budget.left()))
        .map_err(|e| Error::Solver(format!("HiGHS option simplex_iteration_limit: {e:?}")))?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let work = spent(&solved);
    budget.spend(work);
    if solved.status() == HighsModelStatus::ReachedTimeLimit {
        clock.record_stop();
    }
    match solved.status() {
        HighsModelStatus::Optimal => {}
        // The objective (time) is bounded below: unbounded-or-infeasible is infeasible.
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible => {
            return Ok(LpSolved::Infeasible);
        }
        _ => return Ok(LpSolved::Stopped),
    }
    let solution = solved.get_solution();
    Ok(LpSolved::Optimal(LpOptimum {
        values: solution.columns().to_vec(),
        reduced: solution.dual_columns().to_vec(),
        duals: solution.dual_rows().to_vec(),
        objective: solved.objective_value(),
        work,
    }))
}

/// The LP iterations a solved run spent (a MIP's: every LP of its search, HiGHS' total).
pub(super) fn spent(solved: &highs::SolvedModel) -> u64 {
    let iterations = solved.simplex_iteration_count() + solved.ipm_iteration_count();
    u64::try_from(iterations).unwrap_or(0)
}

/// An iteration limit as HiGHS' integer option.
pub(super) fn work_option(iterations: u64) -> i32 {
    i32::try_from(iterations).unwrap_or(i32::MAX)
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
