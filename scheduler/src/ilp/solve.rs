//! Driving HiGHS: build, warm-start, solve, read status, bound and gap, check the answer against
//! the strict simulator, and explain infeasible caps.

use super::constraints::{
    communication_per_slot, compute_per_slot, coverage, cumulative_counts, memory_cap, memory_peak,
    memory_per_slot, one_level_per_unit, reductions_before_gathers, slot_durations, time_ceiling,
};
use super::mapping::{schedule_from_values, schedule_values, slot_terms, tight_time};
use super::variables::{Columns, UnitVars, declare_units};
use super::{Objective, PhaseReport, SolveOptions, SolveReport, SolveStatus, Solved, WindowLimits};
use crate::baselines::{self, BaselineKind};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, memory_by_slot, simulate};
use crate::size::{format_bytes, whole_bytes};
use crate::timeline::Timeline;
use crate::{Error, Result};
use good_lp::{Constraint, Expression, ProblemVariables, SolverModel};
use highs::HighsModelStatus;
use std::num::NonZeroUsize;
use std::time::Instant;

/// HiGHS primal and integer feasibility tolerance.
const FEASIBILITY_TOLERANCE: f64 = 1e-9;
/// Window depths of the phases before the full windows, with their share of the time limit:
/// D = 1 fixes every launch next to its consumer (only levels and recompute are chosen), D = 4
/// places them; each phase's plan is feasible for the next (the windows nest) and warm-starts it.
const PHASES: [(NonZeroUsize, f64); 2] = [
    (NonZeroUsize::MIN, 0.1),
    (NonZeroUsize::new(4).unwrap(), 0.6),
];
/// HiGHS' share of effort for primal heuristics (default 0.05). The bound is tight early on these
/// models and finding the incumbent dominates: on Llama-2 70B at a 150 GiB cap (D = 4), 0.5
/// reached a 0.1% gap in 7 s where 0.05 took 17 s.
const HEURISTIC_EFFORT: f64 = 0.5;
/// Integer columns (full windows) above which the two-phase strategy pays.
const TWO_PHASE_MIN_INTEGERS: usize = 3000;
/// Relative agreement required between the ILP's objective and the strict simulation.
const CONSISTENCY: f64 = 1e-6;

/// The model of one phase, ready for HiGHS.
struct Built {
    columns: usize,
    integers: usize,
    units: Vec<UnitVars>,
    durations: Vec<super::variables::Col>,
    peak: Option<super::variables::Col>,
    problem: ProblemVariables,
    objective: Expression,
    constraints: Vec<Constraint>,
    memory_scale: f64,
}

/// The model under `options`; with `relaxed`, its LP relaxation (integrality dropped).
fn build(profile: &Profile, options: &SolveOptions, relaxed: bool) -> Built {
    let timeline = Timeline::new(profile.unit_count());
    let mut columns = Columns {
        problem: ProblemVariables::new(),
        count: 0,
        integer: 0,
        relaxed,
    };
    let cap = options.memory_cap_bytes.map(|c| c as f64);
    let units = declare_units(&mut columns, profile, options, cap);
    let durations: Vec<_> = (0..timeline.slot_count())
        .map(|_| columns.continuous())
        .collect();
    let memory_scale = cap.unwrap_or_else(|| memory_magnitude(profile));
    let mut constraints = one_level_per_unit(&units);
    constraints.extend(cumulative_counts(&units));
    constraints.extend(coverage(&units));
    constraints.extend(reductions_before_gathers(&units));
    let (comm, load) = communication_per_slot(&units, timeline.slot_count());
    let compute = compute_per_slot(profile, &units, timeline);
    constraints.extend(slot_durations(
        &durations,
        &compute,
        (&comm, &load),
        profile.interference(),
    ));
    let iteration_time: Expression = durations.iter().map(|d| d.var).sum();
    let memory = memory_per_slot(profile, &units, timeline, memory_scale);
    let (objective, peak) = match options.objective {
        Objective::Time => {
            if cap.is_some() {
                constraints.extend(memory_cap(memory));
            }
            (iteration_time, None)
        }
        Objective::Memory {
            max_iteration_time_us,
        } => {
            let peak = columns.continuous();
            if cap.is_some() {
                constraints.extend(memory_cap(memory.clone()));
            }
            constraints.extend(memory_peak(memory, peak));
            if let Some(ceiling) = max_iteration_time_us {
                constraints.push(time_ceiling(&durations, ceiling));
            }
            (Expression::from(peak.var), Some(peak))
        }
    };
    Built {
        columns: columns.count,
        integers: columns.integer,
        units,
        durations,
        peak,
        problem: columns.problem,
        objective,
        constraints,
        memory_scale,
    }
}

/// A rough size of a plan's peak (all state sharded plus the largest activation), the unit of
/// the memory rows when no cap sets it, so that the memory objective is of order one.
fn memory_magnitude(profile: &Profile) -> f64 {
    let sharded: f64 = (0..profile.unit_count())
        .map(|i| crate::cost::persistent_bytes(profile, i, crate::timeline::Level::Sdp))
        .sum();
    let activation = profile
        .units
        .iter()
        .map(|u| u.activation_bytes)
        .max()
        .unwrap_or(0) as f64;
    (sharded + activation).max(1.0)
}

/// What one HiGHS run returned.
struct Run {
    schedule: Option<Schedule>,
    phase: PhaseReport,
    infeasible: bool,
}

/// A HiGHS model of the problem with this crate's settings: quiet (HiGHS' log under
/// `SHARDPLAN_HIGHS_LOG`), the time limit, the gap target, the heuristics' effort, the
/// feasibility tolerances and the threads.
fn highs_model(
    problem: ProblemVariables,
    objective: Expression,
    constraints: Vec<Constraint>,
    options: &SolveOptions,
    time_limit: f64,
) -> Result<highs::Model> {
    let mut problem = problem.minimise(objective).using(good_lp::highs);
    for c in constraints {
        problem.add_constraint(c);
    }
    let mut model = problem.into_inner();
    if std::env::var_os("SHARDPLAN_HIGHS_LOG").is_some() {
        model.set_option("output_flag", true);
        model.set_option("log_to_console", true);
    } else {
        model.make_quiet();
    }
    let set = |model: &mut highs::Model, name: &str, value: f64| {
        model
            .try_set_option(name, value)
            .map_err(|e| Error::Solver(format!("HiGHS option {name}: {e:?}")))
    };
    set(&mut model, "time_limit", time_limit.max(0.01))?;
    set(&mut model, "mip_rel_gap", options.relative_gap)?;
    set(&mut model, "mip_abs_gap", 0.0)?;
    set(&mut model, "mip_heuristic_effort", HEURISTIC_EFFORT)?;
    set(
        &mut model,
        "primal_feasibility_tolerance",
        FEASIBILITY_TOLERANCE,
    )?;
    set(
        &mut model,
        "mip_feasibility_tolerance",
        FEASIBILITY_TOLERANCE,
    )?;
    model
        .try_set_option("threads", options.threads.max(1) as i32)
        .map_err(|e| Error::Solver(format!("HiGHS option threads: {e:?}")))?;
    Ok(model)
}

/// The LP relaxation of the model under `options`, solved by interior point from no start: its
/// optimum bounds every plan within the windows from below (DESIGN §4.5). None when HiGHS does
/// not reach that optimum within `time_limit` (or finds the relaxation infeasible).
fn lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    time_limit: f64,
) -> Result<Option<PhaseReport>> {
    let started = Instant::now();
    let built = build(profile, options, true);
    let (variables, integer_variables) = (built.columns, built.integers);
    let (constraints, scale) = (built.constraints.len(), built.memory_scale);
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        time_limit,
    )?;
    model
        .try_set_option("solver", "ipm")
        .map_err(|e| Error::Solver(format!("HiGHS option solver: {e:?}")))?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    if solved.status() != HighsModelStatus::Optimal {
        return Ok(None);
    }
    let best_bound = match options.objective {
        Objective::Time => solved.objective_value(),
        Objective::Memory { .. } => solved.objective_value() * scale,
    };
    Ok(Some(PhaseReport {
        window_depth: options.limits,
        lp_relaxation: true,
        status: SolveStatus::Optimal,
        objective: f64::NAN,
        best_bound,
        gap: f64::NAN,
        seconds: started.elapsed().as_secs_f64(),
        variables,
        integer_variables,
        constraints,
    }))
}

/// The optimum of the LP relaxation under `options` (within `options.time_limit_s`): no plan
/// within the windows has a smaller objective. None when HiGHS does not reach it in the time.
pub fn lp_relaxation_bound(profile: &Profile, options: &SolveOptions) -> Result<Option<f64>> {
    Ok(lp_bound(profile, options, options.time_limit_s)?.map(|phase| phase.best_bound))
}

fn run_highs(
    profile: &Profile,
    options: &SolveOptions,
    warm: &[(Schedule, f64)],
    time_limit: f64,
) -> Result<Run> {
    let started = Instant::now();
    let built = build(profile, options, false);
    let rows = built.constraints.len();
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        time_limit,
    )?;
    if let Some((schedule, mut values)) = warm
        .iter()
        .find_map(|(s, _)| schedule_values(&built.units, s, built.columns).map(|v| (s, v)))
    {
        let terms = slot_terms(profile, &built.units, &values);
        for (d, (c, q, l)) in built.durations.iter().zip(terms) {
            values[d.index] = profile.interference().slot_duration(c, q, l);
        }
        if let Some(peak) = built.peak {
            let worst = memory_by_slot(profile, schedule)
                .iter()
                .map(|m| m.total())
                .fold(0.0, f64::max);
            values[peak.index] = worst / built.memory_scale * (1.0 + 1e-12);
        }
        model
            .try_set_solution(Some(&values), None, None, None)
            .map_err(|e| Error::Solver(format!("HiGHS warm start: {e:?}")))?;
    }
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
    let infeasible = matches!(
        status,
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible
    );
    let values = solved.get_solution().columns().to_vec();
    let gap = solved.mip_gap();
    let bound = solved
        .double_info_value(c"mip_dual_bound")
        .unwrap_or(f64::NEG_INFINITY);
    let schedule = (has_solution && !infeasible)
        .then(|| schedule_from_values(profile, &built.units, &values))
        .transpose()?;
    let ilp_time = tight_time(
        &slot_terms(profile, &built.units, &values),
        profile.interference(),
    );
    let ilp_peak = built.peak.map(|p| values[p.index] * built.memory_scale);
    if let Some(schedule) = &schedule {
        check_consistency(profile, schedule, ilp_time, ilp_peak)?;
    }
    let objective = match (&schedule, options.objective) {
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
        HighsModelStatus::Optimal => SolveStatus::GapLimit,
        _ => SolveStatus::TimeLimit,
    };
    let gap = if objective.is_finite() && bound.is_finite() {
        ((objective - bound) / objective.abs().max(1e-12)).max(0.0)
    } else {
        gap
    };
    let phase = PhaseReport {
        window_depth: options.limits,
        lp_relaxation: false,
        status,
        objective,
        best_bound: bound,
        gap,
        seconds: started.elapsed().as_secs_f64(),
        variables: built.columns,
        integer_variables: built.integers,
        constraints: rows,
    };
    tracing::debug!(?phase, "HiGHS phase done");
    Ok(Run {
        schedule,
        phase,
        infeasible,
    })
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
    let score = |schedule: &Schedule| objective_of(profile, options.objective, schedule);
    let warm = best_baseline(profile, options);
    // Every feasible plan met so far, best first: each phase warm-starts from the best one its
    // window limit can represent (a neighbour's plan outside D = 4 must not leave D = 4 cold).
    // The cap is inclusive and judged on the simulator's exact peak: the memory rows hold at
    // M_s ≤ cap, so a plan peaking at the cap to the byte is feasible, and a HiGHS answer that
    // fits only within its feasibility tolerance is never taken.
    let mut pool: Vec<(Schedule, f64)> = Vec::new();
    let fits = |schedule: &Schedule| {
        options.memory_cap_bytes.is_none_or(|cap| {
            simulate(profile, schedule, Semantics::Strict).peak_memory_bytes <= cap as f64
        })
    };
    let offer = |pool: &mut Vec<(Schedule, f64)>, schedule: Schedule| {
        if !fits(&schedule) {
            return;
        }
        let value = score(&schedule);
        let at = pool.partition_point(|(_, v)| *v <= value);
        pool.insert(at, (schedule, value));
    };
    if let Some((_, schedule, _)) = &warm {
        offer(&mut pool, schedule.clone());
    }
    if let Some(hint) = &options.hint
        && hint.fits(profile)
    {
        offer(&mut pool, hint.clone());
    }
    let mut phases = Vec::new();
    let user_limited = !options.limits.is_full();
    let staged = options.two_phase
        && !user_limited
        && full_window_integers(profile) > TWO_PHASE_MIN_INTEGERS;
    let stages = if staged { PHASES.to_vec() } else { Vec::new() };
    for (depth, share) in stages {
        let limited = SolveOptions {
            limits: WindowLimits::depth(depth),
            ..options.clone()
        };
        let run = run_highs(profile, &limited, &pool, options.time_limit_s * share)?;
        if let Some(schedule) = run.schedule {
            offer(&mut pool, schedule);
        }
        phases.push(run.phase);
    }
    let remaining = || options.time_limit_s - started.elapsed().as_secs_f64();
    if staged && let Some(bound) = lp_bound(profile, options, remaining())? {
        phases.push(bound);
    }
    // The full-window MIP of a large model rarely finishes its root LP in its time; where the LP
    // relaxation already proves the best plan met within the gap over every plan, it is skipped.
    let proven = staged
        && pool.first().is_some_and(|(schedule, value)| {
            let c = claim(&phases, schedule, *value, options.relative_gap);
            c.window_depth.is_full() && c.gap <= options.relative_gap
        });
    let mut infeasible = false;
    if !proven {
        let run = run_highs(profile, options, &pool, remaining())?;
        infeasible = run.infeasible;
        phases.push(run.phase);
        if let Some(schedule) = run.schedule {
            offer(&mut pool, schedule);
        }
    }
    if user_limited {
        // A warm start outside the windows asked for is not an answer to the limited search.
        pool.retain(|(schedule, _)| options.limits.admit(schedule));
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
    let Some((schedule, objective)) = pool.into_iter().next() else {
        return Err(Error::Infeasible(
            "the time limit ended before any feasible plan was found".into(),
        ));
    };
    let claim = claim(&phases, &schedule, objective, options.relative_gap);
    let simulation = simulate(profile, &schedule, Semantics::Strict);
    let last = phases.last().expect("a full-window phase ran");
    let report = SolveReport {
        status: claim.status,
        objective,
        best_bound: claim.best_bound,
        gap: claim.gap,
        solve_seconds: started.elapsed().as_secs_f64(),
        variables: last.variables,
        integer_variables: last.integer_variables,
        constraints: last.constraints,
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

/// The value of the objective for a schedule: strict iteration time, or peak bytes.
fn objective_of(profile: &Profile, objective: Objective, schedule: &Schedule) -> f64 {
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
fn claim(phases: &[PhaseReport], schedule: &Schedule, value: f64, target: f64) -> PhaseReport {
    let gap_of = |p: &PhaseReport| ((value - p.best_bound) / value.abs().max(1e-12)).max(0.0);
    let widest_first = || {
        phases
            .iter()
            .rev()
            .filter(|p| p.window_depth.admit(schedule))
    };
    let best = widest_first()
        .find(|p| gap_of(p) <= target.max(1e-9))
        .or_else(|| widest_first().min_by(|a, b| gap_of(a).total_cmp(&gap_of(b))))
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

/// Integer columns of the full-window model (x only; the deciding size).
fn full_window_integers(profile: &Profile) -> usize {
    let l = profile.unit_count();
    (0..l).map(|i| 3 * (2 * i + 1) + 2 * (l - 1 - i)).sum()
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
    match run_highs(profile, &relaxed, &[], options.time_limit_s)
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
