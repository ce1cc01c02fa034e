//! Pricing (DESIGN §4.5): a bound over every plan from the LP relaxation of a restricted model —
//! limited windows and extra positions — by the reduced cost of every launch position of the full
//! windows, and the left-out positions of most negative reduced cost, which column generation adds
//! next.

use super::branch_rows::{BranchRow, branch_rows};
use super::effort::Budget;
use super::model::{Built, Form, build, memory_scale};
use super::rounding::Spread;
use super::run::{LpSolved, lp_solve};
use super::variables::{
    Choice, Col, Columns, ExtraPositions, OpVars, Shape, UnitLevel, covers, declare_units,
};
use super::{ModelSize, Objective, SolveOptions, WindowLimits};
use crate::Result;
use crate::profile::{Link, Profile};
use crate::timeline::Timeline;
use good_lp::{IntoAffineExpression, ProblemVariables, Variable};
use std::collections::HashMap;
use std::time::Instant;

/// A priced bound and the optimum of the restricted LP it came from.
pub(super) struct Priced {
    /// The bound over every plan (the Lagrangian at the restricted LP's duals).
    pub bound: f64,
    /// The restricted LP's size.
    pub size: ModelSize,
    /// The LP iterations it spent (the effort's unit), and its seconds.
    pub lp_iterations: u64,
    pub seconds: f64,
    pub restricted_optimum: f64,
    /// Per op, its left-out positions of most negative reduced cost (column generation's next).
    pub entering: ExtraPositions,
    /// The restricted LP's levels and recompute made whole (`super::rounding`).
    pub spread: Vec<UnitLevel>,
    /// The restricted LP's levels and recompute as it holds them (`super::branch` branches on
    /// them).
    pub fractions: Vec<UnitValues>,
}

/// One unit's level and recompute columns' values in an LP solution.
#[derive(Debug, Clone)]
pub(super) struct UnitValues {
    /// y_{i,c} of each choice the unit has.
    pub choices: Vec<(Choice, f64)>,
    /// r_i, where the unit has the column.
    pub recompute: Option<f64>,
}

impl UnitValues {
    fn read(choices: Vec<(Choice, Option<Col>)>, recompute: Option<Col>, values: &[f64]) -> Self {
        UnitValues {
            choices: choices
                .into_iter()
                .filter_map(|(choice, column)| column.map(|c| (choice, values[c.index])))
                .collect(),
            recompute: recompute.map(|r| values[r.index]),
        }
    }
}

/// How pricing a restricted LP ended.
pub(super) enum Pricing {
    Bound(Priced),
    /// The restricted LP is infeasible: no plan satisfies its rows (with `held`, no plan of the
    /// node).
    Infeasible,
    /// No bound: the LP stopped short of its optimum, or its duals failed the check.
    None,
}

/// Reduced costs that agree within this (µs, relative to the largest term) pass the check.
const PRICING_AGREEMENT: f64 = 1e-6;
/// Left-out positions of one op that enter the restricted LP per round of column generation.
const ENTERING_PER_OP: usize = 2;

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
/// full window). The restricted model is that of the windows `restricted` and the positions
/// `extra` (column generation's). The rows priced are its rows (a launch at one of its positions
/// carries the dual of its RS→AG order row); the full model's order rows at positions it leaves
/// out are dropped, which only enlarges the set of plans bounded. When every left-out position prices out (rc ≥ 0) the bound is z, the full-window LP
/// relaxation's optimum, from an LP a fraction of its size. With rows `held` (`super::branch_rows`: r_i = ρ,
/// y_{i,c} = υ, Σ_{i∈U} r_i ≤ k or ≥ k; y_{i,ĉ_i} = 1 and r_i = r̂_i hold levels) the restricted LP
/// also holds them; they touch no launch, so they enter only through HiGHS' reduced costs of y
/// and r, and the bound holds over every plan satisfying them (the full-window LP under them once
/// no position prices negative). The reduced costs computed here are
/// checked against HiGHS' at the restricted positions; any disagreement (or a negative reduced
/// cost on a duration) gives no bound.
pub(super) fn priced_bound(
    profile: &Profile,
    options: &SolveOptions,
    full: &FullColumns,
    restricted: (WindowLimits, &ExtraPositions, &[BranchRow]),
    budget: &mut Budget,
) -> Result<Option<Priced>> {
    Ok(
        match priced_node(profile, options, full, restricted, budget)? {
            Pricing::Bound(priced) => Some(priced),
            Pricing::Infeasible | Pricing::None => None,
        },
    )
}

/// `priced_bound`, telling an infeasible restricted LP (no plan satisfies the rows `held`) from
/// one that gave no bound.
pub(super) fn priced_node(
    profile: &Profile,
    options: &SolveOptions,
    full: &FullColumns,
    (restricted, extra, held): (WindowLimits, &ExtraPositions, &[BranchRow]),
    budget: &mut Budget,
) -> Result<Pricing> {
    if options.objective != Objective::Time || !budget.can_start() {
        return Ok(Pricing::None);
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
        mut constraints,
        rows,
        ..
    } = build(profile, &limited, (Form::Lp, extra));
    // Appended after every family `rows` indexes, so those indices stand.
    constraints.extend(branch_rows(&units, held));
    let constraint_count = constraints.len();
    let optimum = match lp_solve(problem, objective, constraints, options, budget)? {
        LpSolved::Optimal(optimum) => optimum,
        LpSolved::Infeasible => return Ok(Pricing::Infeasible),
        LpSolved::Stopped => return Ok(Pricing::None),
    };
    let (values, reduced, duals) = (&optimum.values, &optimum.reduced, &optimum.duals);
    let work = optimum.work;
    let memory_weights = full.memory_weights(|s| rows.memory_cap.map_or(0.0, |m| duals[m + s]));
    let mut lagrangian = optimum.objective;
    let mut priced = vec![false; columns];
    let mut op_index = 0;
    let mut entering = ExtraPositions::new();
    let mut spread = Spread::default();
    let mut fractions = Vec::new();
    for (unit, (restricted, whole)) in units.iter().zip(&full.units).enumerate() {
        spread.take(restricted.choices(), restricted.recompute, values);
        fractions.push(UnitValues::read(
            restricted.choices(),
            restricted.recompute,
            values,
        ));
        let blocks = f64::from(whole.blocks);
        // The cheapest launch position of each op, over the full window.
        let mut cheapest = Vec::new();
        for (restricted_op, full_op) in restricted.ops().zip(whole.ops()) {
            let slots = durations.len();
            let mut prices = launch_prices(
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
                // The launch's RS→AG order row, where the restricted model has one.
                if let Some(&row) = rows.order_rows.get(&launch) {
                    let order = duals[row];
                    prices[q] = (prices[q].0 - order, prices[q].1.max(order.abs()));
                }
                let (rc, magnitude) = prices[q];
                if (rc - theirs).abs() > PRICING_AGREEMENT * magnitude.max(1.0) {
                    tracing::warn!(rc, theirs, "pricing disagrees with HiGHS; no bound");
                    return Ok(Pricing::None);
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
            let left_out = full_op
                .positions
                .iter()
                .zip(&prices)
                .filter(|(k, _)| restricted_op.positions.binary_search(k).is_err())
                .filter(|(_, (rc, magnitude))| *rc < -PRICING_AGREEMENT * magnitude.max(1.0));
            let mut paying: Vec<(usize, f64)> = left_out.map(|(&k, &(rc, _))| (k, rc)).collect();
            paying.sort_by(|a, b| a.1.total_cmp(&b.1));
            entering
                .entry((unit, full_op.op))
                .or_default()
                .extend(paying.iter().take(ENTERING_PER_OP).map(|(k, _)| *k));
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
    let Some(lagrangian) =
        optimum.with_unpriced_columns(lagrangian, &priced, &unbounded, PRICING_AGREEMENT)
    else {
        return Ok(Pricing::None);
    };
    Ok(Pricing::Bound(Priced {
        bound: lagrangian,
        size: ModelSize {
            variables: columns,
            integer_variables: integers,
            constraints: constraint_count,
        },
        lp_iterations: work,
        seconds: started.elapsed().as_secs_f64(),
        restricted_optimum: optimum.objective,
        entering: entering
            .into_iter()
            .filter(|(_, p)| !p.is_empty())
            .collect(),
        spread: spread.levels(),
        fractions,
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
pub(super) struct FullColumns {
    units: Vec<super::variables::UnitVars>,
    /// Per op (in `units`' op order), per position index: (slot, coefficient) of C in memory rows.
    memory: Vec<Vec<Vec<(usize, f64)>>>,
}

impl FullColumns {
    pub fn new(profile: &Profile, options: &SolveOptions) -> FullColumns {
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
