//! Bounds over every plan without solving the full-window MIP (DESIGN §4.5): the full-window LP
//! relaxation solved outright, and the same bound obtained from a small window's LP by pricing
//! every launch position the small window leaves out.

use super::limits::PLACEMENT_DEPTH;
use super::model::{Built, Form, build, highs_model, memory_scale};
use super::variables::{Columns, ExtraPositions, OpVars, Shape, covers, declare_units};
use super::{Objective, PhaseReport, Relaxation, SolveOptions, SolveStatus, WindowLimits};
use crate::profile::{Link, Profile};
use crate::timeline::Timeline;
use crate::{Error, Result};
use good_lp::{IntoAffineExpression, ProblemVariables, Variable};
use highs::HighsModelStatus;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::Instant;

/// The LP relaxation of the model under `options`, solved by interior point from no start: its
/// optimum bounds every plan within the windows from below. None when HiGHS does not reach that
/// optimum within `time_limit` (or finds the relaxation infeasible).
pub(super) fn lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    time_limit: f64,
) -> Result<Option<PhaseReport>> {
    let started = Instant::now();
    let built = build(profile, options, (Form::Lp, &ExtraPositions::new()));
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
        relaxation: Some(Relaxation::Lp),
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

/// A bound over every plan from the LP relaxation of the windows `restricted` (time objective
/// only): None for the memory objective, or when that LP does not solve to optimality within
/// `time_limit`, or when its duals fail the check below.
pub fn priced_lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    restricted: WindowLimits,
) -> Result<Option<f64>> {
    let full = FullColumns::new(profile, options);
    let priced = priced_bound(profile, options, &full, restricted, options.time_limit_s)?;
    Ok(priced.map(|p| p.bound.best_bound))
}

/// The bound over every plan that a staged solve claims (DESIGN §4.5), refined as the solve goes.
/// Time objective: priced from the LP of windows of depth 4 first (cheap, before launches are
/// placed); then, while the best plan is not yet proven, from windows twice as deep, as long as
/// the restricted LP's optimum (which no bound from a wider window can exceed) could still prove
/// it. Memory objective: the full-window LP relaxation, solved outright.
pub(super) struct FullWindowBound {
    /// The full windows' launch structure, priced at every depth (time objective only).
    full: Option<FullColumns>,
    depth: NonZeroUsize,
    best: Option<PhaseReport>,
    /// The smallest restricted optimum met: every later priced bound is at most this.
    ceiling: f64,
    seconds: f64,
}

impl FullWindowBound {
    /// Prices the windows of depth 4 (time objective); nothing yet for the memory objective.
    pub fn start(profile: &Profile, options: &SolveOptions, time_limit: f64) -> Result<Self> {
        let started = Instant::now();
        let time = options.objective == Objective::Time;
        let mut bound = FullWindowBound {
            full: time.then(|| FullColumns::new(profile, options)),
            depth: PLACEMENT_DEPTH,
            best: None,
            ceiling: f64::INFINITY,
            seconds: 0.0,
        };
        if time {
            bound.price(
                profile,
                options,
                time_limit - started.elapsed().as_secs_f64(),
            )?;
            bound.seconds = started.elapsed().as_secs_f64();
        }
        Ok(bound)
    }

    /// The best bound so far, as a phase of the solve.
    pub fn phase(&self) -> Option<PhaseReport> {
        self.best.clone().map(|b| PhaseReport {
            seconds: self.seconds,
            ..b
        })
    }

    /// Whether the bound is within `relative_gap` of the restricted LP's optimum: the launches the
    /// restricted windows leave out (nearly) price out, so a plan within the target of the bound
    /// may exist, and searching the restricted windows past their own target can find it.
    pub fn is_tight(&self, relative_gap: f64) -> bool {
        self.best
            .as_ref()
            .is_some_and(|b| b.best_bound >= self.ceiling * (1.0 - relative_gap))
    }

    /// Raises the bound toward one that proves `incumbent` within `options.relative_gap`, within
    /// `time_limit`: deeper windows while that is still possible (time objective), the full LP
    /// relaxation (memory objective).
    pub fn widen(
        &mut self,
        profile: &Profile,
        options: &SolveOptions,
        incumbent: f64,
        time_limit: f64,
    ) -> Result<()> {
        let started = Instant::now();
        if options.objective != Objective::Time {
            if let Some(lp) = lp_bound(profile, options, time_limit)? {
                self.seconds += lp.seconds;
                self.best = Some(lp);
            }
            return Ok(());
        }
        let needed = incumbent * (1.0 - options.relative_gap);
        let longest = Timeline::new(profile.unit_count()).slot_count();
        while self.best.as_ref().is_none_or(|b| b.best_bound < needed)
            && self.ceiling >= needed
            && self.depth.get() < longest
        {
            self.depth = self.depth.saturating_mul(TWO);
            let left = time_limit - started.elapsed().as_secs_f64();
            if !self.price(profile, options, left)? {
                break;
            }
        }
        Ok(())
    }

    /// Prices the windows of the current depth; false when their LP did not solve in time.
    fn price(
        &mut self,
        profile: &Profile,
        options: &SolveOptions,
        time_limit: f64,
    ) -> Result<bool> {
        let Some(full) = &self.full else {
            return Ok(false);
        };
        let limits = WindowLimits::depth(self.depth);
        let Some(priced) = priced_bound(profile, options, full, limits, time_limit)? else {
            return Ok(false);
        };
        self.seconds += priced.bound.seconds;
        self.ceiling = self.ceiling.min(priced.restricted_optimum);
        if self
            .best
            .as_ref()
            .is_none_or(|b| priced.bound.best_bound > b.best_bound)
        {
            self.best = Some(priced.bound);
        }
        Ok(true)
    }
}

/// The factor by which the priced depth grows (from `PLACEMENT_DEPTH`).
const TWO: NonZeroUsize = NonZeroUsize::new(2).unwrap();

/// A priced bound and the optimum of the restricted LP it came from.
struct Priced {
    bound: PhaseReport,
    restricted_optimum: f64,
}

/// Reduced costs that agree within this (µs, relative to the largest term) pass the check.
const PRICING_AGREEMENT: f64 = 1e-6;

/// A bound over every plan, priced from the LP relaxation of the windows `restricted`
/// (DESIGN §4.5, "pricing"). Let z, x*, π be that LP's optimum, solution and duals, and write the
/// full-window model with the running sums C eliminated (a block launched at k counts in every
/// memory row that reads C at a position ≥ k), so each launch column has a reduced cost
/// rc = c − πᵀA at every position of its full window. Keeping each unit's one-level and coverage
/// rows and dualising the rest with π (Lagrangian relaxation), every plan satisfies
///
/// ```text
/// T ≥ z − Σ_j rc_j·x*_j + Σ_i min_ℓ (rc_{y_iℓ} + Σ_{ops of ℓ} nb_i · min_k rc_{i,op,k})
///       + Σ_{r, Z} min(0, rc) + Σ_d min(0, rc)·∞
/// ```
///
/// (each unit picks one level and puts each of its ops' blocks at the cheapest position of the
/// full window). The rows priced are the restricted model's; the full model's RS→AG order rows at
/// positions the restricted windows leave out are dropped, which only enlarges the set of plans
/// bounded. When every left-out position prices out (rc ≥ 0) the bound is z, the full-window LP
/// relaxation's optimum, from an LP a fraction of its size. The reduced costs computed here are
/// checked against HiGHS' at the restricted positions; any disagreement (or a negative reduced
/// cost on a duration) gives no bound.
fn priced_bound(
    profile: &Profile,
    options: &SolveOptions,
    full: &FullColumns,
    restricted: WindowLimits,
    time_limit: f64,
) -> Result<Option<Priced>> {
    if options.objective != Objective::Time || time_limit <= 0.0 {
        return Ok(None);
    }
    let started = Instant::now();
    let limited = SolveOptions {
        limits: restricted,
        ..options.clone()
    };
    let Built {
        columns,
        integers,
        units,
        durations,
        problem,
        objective,
        constraints,
        rows,
        ..
    } = build(profile, &limited, (Form::Lp, &ExtraPositions::new()));
    let constraint_count = constraints.len();
    let model = highs_model(problem, objective, constraints, options, time_limit)?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    if solved.status() != HighsModelStatus::Optimal {
        return Ok(None);
    }
    let solution = solved.get_solution();
    let (values, reduced, duals) = (
        solution.columns(),
        solution.dual_columns(),
        solution.dual_rows(),
    );
    let memory_weights = full.memory_weights(|s| rows.memory_cap.map_or(0.0, |m| duals[m + s]));
    let mut lagrangian = solved.objective_value();
    let mut priced = vec![false; columns];
    let mut op_index = 0;
    for (restricted, whole) in units.iter().zip(&full.units) {
        let blocks = f64::from(whole.blocks);
        // The cheapest launch position of each op, over the full window.
        let mut cheapest = Vec::new();
        for (restricted_op, full_op) in restricted.ops().zip(whole.ops()) {
            let slots = durations.len();
            let prices = launch_prices(
                full_op,
                duals[rows.coverage + op_index],
                &memory_weights[op_index],
                |slot, link| {
                    let (compute_row, comm_row) = rows.duration_rows(slot % slots, link);
                    (duals[compute_row], duals[comm_row])
                },
            );
            op_index += 1;
            // HiGHS' reduced cost of x_k with C eliminated: its own plus those of C_k, C_k+1, ….
            let mut running_tail = 0.0;
            let mut tails: Vec<f64> = restricted_op
                .cumulative
                .iter()
                .rev()
                .map(|c| {
                    running_tail += reduced[c.index];
                    running_tail
                })
                .collect();
            tails.reverse();
            for (k, &position) in restricted_op.positions.iter().enumerate() {
                let q = full_op
                    .positions
                    .binary_search(&position)
                    .expect("the full window holds every restricted position");
                let launch = restricted_op.launches[k].index;
                let theirs = reduced[launch] + tails[k];
                let (rc, magnitude) = prices[q];
                if (rc - theirs).abs() > PRICING_AGREEMENT * magnitude.max(1.0) {
                    tracing::warn!(rc, theirs, "pricing disagrees with HiGHS; no bound");
                    return Ok(None);
                }
                lagrangian -= rc * values[launch];
            }
            for c in restricted_op
                .launches
                .iter()
                .chain(&restricted_op.cumulative)
            {
                priced[c.index] = true;
            }
            let lowest = prices.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            cheapest.push((full_op, blocks * lowest));
        }
        // The unit's subproblem: one level, each covering op's nb blocks at its cheapest position.
        let mut best_level = f64::INFINITY;
        for (choice, column) in restricted.choices() {
            let Some(y) = column else { continue };
            priced[y.index] = true;
            lagrangian -= reduced[y.index] * values[y.index];
            let launches: f64 = cheapest
                .iter()
                .filter(|(op, _)| covers(op, choice))
                .map(|(_, cost)| cost)
                .sum();
            best_level = best_level.min(reduced[y.index] + launches);
        }
        lagrangian += best_level;
    }
    // The other columns: r and Z in [0, 1], d ≥ 0 (a negative reduced cost on an unbounded
    // column would make the bound −∞: the duals are then not usable).
    let mut unbounded = vec![false; columns];
    for d in &durations {
        unbounded[d.index] = true;
    }
    for (index, &rc) in reduced.iter().enumerate() {
        if priced[index] {
            continue;
        }
        if unbounded[index] {
            if rc < -PRICING_AGREEMENT {
                return Ok(None);
            }
            lagrangian -= rc.max(0.0) * values[index];
        } else {
            lagrangian += rc.min(0.0) - rc * values[index];
        }
    }
    Ok(Some(Priced {
        bound: PhaseReport {
            window_depth: WindowLimits::FULL,
            relaxation: Some(Relaxation::Lp),
            status: SolveStatus::Optimal,
            objective: f64::NAN,
            best_bound: lagrangian,
            gap: f64::NAN,
            seconds: started.elapsed().as_secs_f64(),
            variables: columns,
            integer_variables: integers,
            constraints: constraint_count,
        },
        restricted_optimum: solved.objective_value(),
    }))
}

/// The reduced cost of one block of `op` at each of its full-window positions, with C eliminated
/// (a block at k counts in every memory row that reads C at a position ≥ k), beside the largest
/// of its terms (the scale of the check against HiGHS). Rows, as HiGHS holds them: coverage
/// Σx − nb·y = 0 (dual `coverage`), d − c − L ≥ … and d − Q^ℓ − κ_q·c ≥ … (`durations(slot,
/// link)`) of the block's slot and of its follower's (the replica AllReduce, a slot later),
/// M_s ≤ 1 (`memory_weights`: Σ_s π_s·coefficient per position).
fn launch_prices(
    op: &OpVars,
    coverage: f64,
    memory_weights: &[f64],
    durations: impl Fn(usize, Link) -> (f64, f64),
) -> Vec<(f64, f64)> {
    let mut memory_suffix = 0.0;
    let mut prices = vec![(0.0, 0.0); op.positions.len()];
    for (q, &position) in op.positions.iter().enumerate().rev() {
        memory_suffix += memory_weights[q];
        let mut terms = vec![-coverage, -memory_suffix];
        for (offset, link, time, load) in op.parts() {
            let (compute_row, comm_row) = durations(op.window.slot_at(position) + offset, link);
            terms.extend([compute_row * load, comm_row * time]);
        }
        prices[q] = (
            terms.iter().sum(),
            terms.iter().map(|t| t.abs()).fold(0.0, f64::max),
        );
    }
    prices
}

/// The full-window model's launch structure, declared but never solved: each op's positions,
/// block costs and, per running sum C_{op,k}, its coefficient in each slot's memory row.
struct FullColumns {
    units: Vec<super::variables::UnitVars>,
    /// Per op (in `units`' op order), per position index: (slot, coefficient) of C in memory rows.
    memory: Vec<Vec<Vec<(usize, f64)>>>,
}

impl FullColumns {
    fn new(profile: &Profile, options: &SolveOptions) -> FullColumns {
        let mut columns = Columns {
            problem: ProblemVariables::new(),
            count: 0,
            integer: 0,
            relaxed: true,
        };
        let full = SolveOptions {
            limits: WindowLimits::FULL,
            ..options.clone()
        };
        let cap = options.memory_cap_bytes.map(|c| c as f64);
        let units = declare_units(
            &mut columns,
            profile,
            Shape {
                options: &full,
                extra: &ExtraPositions::new(),
                far_bands: false,
            },
            cap,
        );
        let ops: Vec<&OpVars> = units.iter().flat_map(|u| u.ops()).collect();
        let mut memory: Vec<Vec<Vec<(usize, f64)>>> = ops
            .iter()
            .map(|op| vec![Vec::new(); op.positions.len()])
            .collect();
        let running: HashMap<Variable, (usize, usize)> = ops
            .iter()
            .enumerate()
            .flat_map(|(j, op)| {
                op.cumulative
                    .iter()
                    .enumerate()
                    .map(move |(q, c)| (c.var, (j, q)))
            })
            .collect();
        let timeline = Timeline::new(profile.unit_count());
        let scale = memory_scale(profile, options);
        let rows = super::constraints::memory_per_slot(profile, &units, timeline, scale);
        for (slot, row) in rows.iter().enumerate() {
            for (var, coefficient) in row.linear_coefficients() {
                if let Some(&(j, q)) = running.get(&var) {
                    memory[j][q].push((slot, coefficient));
                }
            }
        }
        FullColumns { units, memory }
    }

    /// Per op and position index: Σ_s π_s · (coefficient of C_{op,k} in slot s's memory row).
    fn memory_weights(&self, dual: impl Fn(usize) -> f64) -> Vec<Vec<f64>> {
        self.memory
            .iter()
            .map(|op| {
                op.iter()
                    .map(|entries| entries.iter().map(|&(s, c)| dual(s) * c).sum())
                    .collect()
            })
            .collect()
    }
}
