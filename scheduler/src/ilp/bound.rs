//! Bounds over every plan without solving the full-window MIP (DESIGN §4.5): the full-window LP
//! relaxation solved outright, and the same bound obtained from a small window's LP by pricing
//! every launch position the small window leaves out (`super::pricing`), raised by deeper windows
//! and column generation.

use super::branch_rows::BranchRow;
use super::effort::{Budget, Clock};
use super::limits::PLACEMENT_DEPTH;
use super::micro::{self, Added};
use super::model::{Form, build, highs_model};
use super::pricing::{FullColumns, Pricing, UnitValues, priced_bound, priced_node};
use super::run::spent;
use super::variables::{ExtraPositions, UnitLevel};
use super::{
    ModelSize, Objective, PhaseReport, Relaxation, SolveOptions, SolveStatus, WindowLimits,
};
use crate::profile::Profile;
use crate::timeline::Timeline;
use crate::{Error, Result};
use highs::HighsModelStatus;
use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::time::Instant;

/// A bound from an LP relaxation, solved outright or priced: no plan, only a bound over every plan
/// within its windows (DESIGN §4.5).
#[derive(Debug, Clone)]
pub(super) struct LpBound {
    /// The plans it holds over.
    pub window_depth: WindowLimits,
    pub best_bound: f64,
    pub seconds: f64,
    /// The LP iterations it spent (the effort's unit).
    pub lp_iterations: u64,
    /// The LP's size: the restricted model's, where priced.
    pub size: ModelSize,
}

impl LpBound {
    /// The bound as a phase of a solve: an LP relaxation solved to optimality.
    pub fn phase(&self) -> PhaseReport {
        PhaseReport {
            window_depth: self.window_depth,
            relaxation: Some(Relaxation::Lp),
            status: SolveStatus::Optimal,
            objective: f64::NAN,
            best_bound: self.best_bound,
            gap: f64::NAN,
            seconds: self.seconds,
            lp_iterations: self.lp_iterations,
            variables: self.size.variables,
            integer_variables: self.size.integer_variables,
            constraints: self.size.constraints,
        }
    }
}

/// The LP relaxation of the model under `options`, solved by interior point from no start: its
/// optimum bounds every plan within the windows from below. None when HiGHS does not reach that
/// optimum before the clock runs out (or finds the relaxation infeasible). Interior point ends in
/// a few hundred iterations whatever the model; its iterations and crossover's are spent from
/// `budget`.
pub(super) fn lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    budget: &mut Budget,
) -> Result<Option<LpBound>> {
    let started = Instant::now();
    let built = build(profile, options, (Form::Lp, &ExtraPositions::new()));
    let (variables, integer_variables) = (built.columns, built.integers);
    let (constraints, scale) = (built.constraints.len(), built.memory_scale);
    let mut model = highs_model(
        built.problem,
        built.objective,
        built.constraints,
        options,
        budget.clock().seconds_left(),
    )?;
    model
        .try_set_option("solver", "ipm")
        .map_err(|e| Error::Solver(format!("HiGHS option solver: {e:?}")))?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    let work = spent(&solved) + solved.crossover_iteration_count().max(0) as u64;
    budget.spend(work);
    if solved.status() == HighsModelStatus::ReachedTimeLimit {
        budget.clock().record_stop();
    }
    if solved.status() != HighsModelStatus::Optimal {
        return Ok(None);
    }
    let best_bound = match options.objective {
        Objective::Time => solved.objective_value(),
        Objective::Memory { .. } => solved.objective_value() * scale,
    };
    Ok(Some(LpBound {
        window_depth: options.limits,
        best_bound,
        seconds: started.elapsed().as_secs_f64(),
        lp_iterations: work,
        size: ModelSize {
            variables,
            integer_variables,
            constraints,
        },
    }))
}

/// A budget of `options.effort` under a clock of `options.time_limit_s` from now, for a bound
/// computed on its own.
fn budget_of(options: &SolveOptions) -> (Clock, crate::ilp::Effort) {
    (
        Clock::new(Instant::now(), options.time_limit_s),
        options.effort,
    )
}

/// The optimum of the LP relaxation under `options` (within `options.time_limit_s`): no plan
/// within the windows has a smaller objective. None when HiGHS does not reach it in the time
/// (and, at K ≥ 2 micro-batches, for the memory objective).
pub fn lp_relaxation_bound(profile: &Profile, options: &SolveOptions) -> Result<Option<f64>> {
    let (clock, effort) = budget_of(options);
    let mut budget = Budget::new(effort, &clock);
    if profile.micro_batches >= 2 {
        let priced = micro::priced(
            profile,
            options,
            (options.limits, &Added::new()),
            &mut budget,
        )?;
        return Ok(priced.map(|p| p.restricted_optimum));
    }
    Ok(lp_bound(profile, options, &mut budget)?.map(|lp| lp.best_bound))
}

/// A bound over every plan from the LP relaxation of the windows `restricted` (time objective
/// only): None for the memory objective, or when that LP does not solve to optimality within
/// `options.effort` and `options.time_limit_s`, or when its duals fail the check below.
pub fn priced_lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    restricted: WindowLimits,
) -> Result<Option<f64>> {
    if profile.micro_batches >= 2 {
        let (clock, effort) = budget_of(options);
        let mut budget = Budget::new(effort, &clock);
        let priced = micro::priced(profile, options, (restricted, &Added::new()), &mut budget)?;
        return Ok(priced.map(|p| p.bound));
    }
    let full = FullColumns::new(profile, options);
    let no_extra = ExtraPositions::new();
    let (clock, effort) = budget_of(options);
    let mut budget = Budget::new(effort, &clock);
    let priced = priced_bound(
        profile,
        options,
        &full,
        (restricted, &no_extra, &[]),
        &mut budget,
    )?;
    Ok(priced.map(|p| p.bound))
}

/// Column generation from the LP of windows of depth `depth` (DESIGN §4.5, time objective only):
/// the best bound over every plan its rounds priced within `options.effort` and
/// `options.time_limit_s`, and whether it ended at the full-window LP relaxation's optimum (no
/// left-out position priced negative). None where the first pricing gives no bound.
pub fn generated_lp_bound(
    profile: &Profile,
    options: &SolveOptions,
    depth: NonZeroUsize,
) -> Result<Option<(f64, bool)>> {
    let (clock, effort) = budget_of(options);
    let mut budget = Budget::new(effort, &clock);
    if profile.micro_batches >= 2 {
        let limits = WindowLimits::depth(depth);
        let generated = micro::generated(profile, options, limits, f64::INFINITY, &mut budget)?;
        return Ok(generated.map(|(phase, full_lp)| (phase.best_bound, full_lp)));
    }
    let mut bound = FullWindowBound::at_depth(profile, options, (depth, None), &mut budget)?;
    bound.generate(profile, options, f64::INFINITY, &mut budget)?;
    let full_lp = bound.is_full_lp();
    Ok(bound.best.map(|b| (b.best_bound, full_lp)))
}

/// The bound over every plan that a staged solve claims (DESIGN §4.5), refined as the solve goes.
/// Time objective: priced from the LP of windows of depth 4 first (cheap, before launches are
/// placed); then, while the best plan is not yet proven, from windows twice as deep, as long as
/// the restricted LP's optimum (which no bound from a wider window can exceed) could still prove
/// it, and then by column generation toward the full-window LP's optimum. Memory objective: the
/// full-window LP relaxation, solved outright.
pub(super) struct FullWindowBound {
    /// The full windows' launch structure, priced at every depth (time objective only).
    full: Option<FullColumns>,
    depth: NonZeroUsize,
    best: Option<LpBound>,
    /// The smallest restricted optimum met: every later priced bound is at most this.
    ceiling: f64,
    /// Positions outside the windows of `depth` that column generation has added.
    extra: ExtraPositions,
    /// Rows on levels and recompute the LP holds (`super::branch_rows`: levels held by
    /// `super::anatomy`, a node's rows by `super::branch`); empty: free.
    held: Vec<BranchRow>,
    /// Whether the last restricted LP was infeasible: no plan satisfies `held`.
    infeasible: bool,
    /// The last restricted LP's levels and recompute as it holds them.
    fractions: Option<Vec<UnitValues>>,
    /// The last restricted LP's levels made whole (`super::rounding`): at the full-window LP's
    /// optimum, its proportions of each level spread over the units.
    spread: Option<Vec<UnitLevel>>,
    /// The left-out positions of most negative reduced cost at the last pricing that solved.
    entering: ExtraPositions,
    seconds: f64,
}

impl FullWindowBound {
    /// Prices the windows of depth 4 (time objective); nothing yet for the memory objective.
    pub fn start(profile: &Profile, options: &SolveOptions, budget: &mut Budget) -> Result<Self> {
        Self::at_depth(profile, options, (PLACEMENT_DEPTH, None), budget)
    }

    /// Prices the windows of depth `depth` (time objective), over the plans of `levels` where
    /// given; nothing for the memory objective.
    pub(super) fn at_depth(
        profile: &Profile,
        options: &SolveOptions,
        (depth, levels): (NonZeroUsize, Option<Vec<UnitLevel>>),
        budget: &mut Budget,
    ) -> Result<Self> {
        let held = levels.map_or_else(Vec::new, |l| BranchRow::holding(&l));
        let restricted = (depth, held, ExtraPositions::new());
        Self::under(profile, options, restricted, budget)
    }

    /// Prices the windows of depth `depth` and the positions `extra` (time objective), over the
    /// plans that satisfy the rows `held`; nothing for the memory objective.
    pub(super) fn under(
        profile: &Profile,
        options: &SolveOptions,
        (depth, held, extra): (NonZeroUsize, Vec<BranchRow>, ExtraPositions),
        budget: &mut Budget,
    ) -> Result<Self> {
        let started = Instant::now();
        let time = options.objective == Objective::Time;
        let mut bound = FullWindowBound {
            full: time.then(|| FullColumns::new(profile, options)),
            depth,
            best: None,
            ceiling: f64::INFINITY,
            extra,
            entering: ExtraPositions::new(),
            held,
            infeasible: false,
            fractions: None,
            spread: None,
            seconds: 0.0,
        };
        if time {
            bound.price(profile, options, budget)?;
            bound.seconds = started.elapsed().as_secs_f64();
        }
        Ok(bound)
    }

    /// The bound as it stands, to read beside a search that widens it: without the full windows'
    /// structure, so it widens no further.
    pub fn without_pricing(&self) -> FullWindowBound {
        FullWindowBound {
            full: None,
            best: self.best.clone(),
            extra: self.extra.clone(),
            entering: self.entering.clone(),
            held: self.held.clone(),
            fractions: self.fractions.clone(),
            spread: self.spread.clone(),
            ..*self
        }
    }

    /// The best bound so far, as a phase of the solve.
    pub fn phase(&self) -> Option<PhaseReport> {
        self.best.as_ref().map(|b| PhaseReport {
            seconds: self.seconds,
            ..b.phase()
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
    /// `budget`: deeper windows while that is still possible, then column generation (time
    /// objective); the full LP relaxation (memory objective).
    pub fn widen(
        &mut self,
        profile: &Profile,
        options: &SolveOptions,
        incumbent: f64,
        budget: &mut Budget,
    ) -> Result<()> {
        if options.objective != Objective::Time {
            if let Some(lp) = lp_bound(profile, options, budget)? {
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
            if !self.price(profile, options, budget)? {
                break;
            }
        }
        self.generate(profile, options, needed, budget)
    }

    /// Column generation (DESIGN §4.5, "column generation"): while the bound is short of `needed`
    /// and some left-out position prices negative, the positions of most negative reduced cost
    /// (`ENTERING_PER_OP` per op) join the restricted LP and it is priced again, within
    /// `budget`. Every round's bound holds over every plan; once no position prices negative, the
    /// bound is the full-window LP's optimum.
    pub(super) fn generate(
        &mut self,
        profile: &Profile,
        options: &SolveOptions,
        needed: f64,
        budget: &mut Budget,
    ) -> Result<()> {
        while self.best.as_ref().is_none_or(|b| b.best_bound < needed) && !self.entering.is_empty()
        {
            for (key, positions) in &self.entering {
                self.extra.entry(*key).or_default().extend(positions);
            }
            if !self.price(profile, options, budget)? {
                break;
            }
            tracing::debug!(
                bound = self.best.as_ref().map(|b| b.best_bound),
                restricted = self.ceiling,
                positions = self.extra.values().map(BTreeSet::len).sum::<usize>(),
                "column generation"
            );
        }
        Ok(())
    }

    /// Whether the bound is the full-window LP's optimum: the last pricing found no left-out
    /// position of negative reduced cost.
    pub fn is_full_lp(&self) -> bool {
        self.best.is_some() && self.entering.is_empty()
    }

    /// The positions column generation added (outside the windows last priced): where launches
    /// pay in the full-window LP.
    pub fn paying_positions(&self) -> &ExtraPositions {
        &self.extra
    }

    /// The best bound so far over the plans of `held`.
    pub fn best_bound(&self) -> Option<f64> {
        self.best.as_ref().map(|b| b.best_bound)
    }

    /// Whether the restricted LP was infeasible: no plan satisfies the rows held.
    pub fn is_infeasible(&self) -> bool {
        self.infeasible
    }

    /// The last restricted LP's levels and recompute as it holds them, where it solved.
    pub fn fractions(&self) -> Option<&[UnitValues]> {
        self.fractions.as_deref()
    }

    /// The last restricted LP's levels made whole, where it solved (`super::rounding`).
    pub fn spread_levels(&self) -> Option<Vec<UnitLevel>> {
        self.spread.clone()
    }

    /// Prices the windows of the current depth; false when their LP did not solve within
    /// `budget`.
    fn price(
        &mut self,
        profile: &Profile,
        options: &SolveOptions,
        budget: &mut Budget,
    ) -> Result<bool> {
        let Some(full) = &self.full else {
            return Ok(false);
        };
        let limits = WindowLimits::depth(self.depth);
        let restricted = (limits, &self.extra, self.held.as_slice());
        let priced = match priced_node(profile, options, full, restricted, budget)? {
            Pricing::Bound(priced) => priced,
            Pricing::Infeasible => {
                self.infeasible = true;
                return Ok(false);
            }
            Pricing::None => return Ok(false),
        };
        self.entering = priced.entering;
        self.fractions = Some(priced.fractions);
        self.spread = Some(priced.spread);
        self.seconds += priced.seconds;
        self.ceiling = self.ceiling.min(priced.restricted_optimum);
        if self
            .best
            .as_ref()
            .is_none_or(|b| priced.bound > b.best_bound)
        {
            self.best = Some(LpBound {
                window_depth: WindowLimits::FULL,
                best_bound: priced.bound,
                seconds: priced.seconds,
                lp_iterations: priced.lp_iterations,
                size: priced.size,
            });
        }
        Ok(true)
    }
}

/// The factor by which the priced depth grows (from `PLACEMENT_DEPTH`).
const TWO: NonZeroUsize = NonZeroUsize::new(2).unwrap();
