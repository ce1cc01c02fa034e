//! Branch and price on levels and recompute (DESIGN §4.5, "branch and price on levels and
//! recompute"): a best-first tree whose nodes are sets of branching rows (`super::branch_rows`),
//! each node's bound the priced bound of column generation under its rows, each leaf (every unit's
//! level and recompute fixed) solved exactly by the placement MIP of its levels over full windows.
//! The bound over every plan is the least of the incumbent and the open nodes' bounds.

use super::bound::FullWindowBound;
use super::branch_rows::{BranchRow, Count};
use super::effort::{Budget, Clock};
use super::model::Form;
use super::pricing::UnitValues;
use super::run::{Stop, run_highs};
use super::variables::{Choice, ExtraPositions, UnitLevel};
use super::{Effort, SolveOptions, SolveStatus, WindowLimits};
use crate::Result;
use crate::profile::Profile;
use std::num::NonZeroUsize;
use std::time::Instant;

/// A value of y or r counts as integral within this.
const INTEGRAL: f64 = 1e-6;

/// The tree's answer.
#[derive(Debug, Clone)]
pub struct BranchedBound {
    /// The bound over every plan: min(the solved leaves' minima, the open nodes' bounds); ∞ when
    /// no plan exists.
    pub bound: f64,
    /// The fastest plan the leaves found (µs); ∞ when none.
    pub incumbent: f64,
    /// Whether every node was closed (then `bound` is the optimum over every plan, to the solve's
    /// relative gap).
    pub closed: bool,
    /// The bound after each node priced, in order.
    pub steps: Vec<TreeStep>,
}

/// The tree after one more node priced.
#[derive(Debug, Clone, Copy)]
pub struct TreeStep {
    pub nodes: usize,
    pub lp_iterations: u64,
    pub bound: f64,
    pub incumbent: f64,
}

/// A node: its rows, the bound it inherits, and its parent's restricted columns.
struct Node {
    rows: Vec<BranchRow>,
    bound: f64,
    extra: ExtraPositions,
}

/// What the rows of a node hold of one unit.
#[derive(Default, Clone)]
struct UnitHeld {
    recompute: Option<bool>,
    level: Option<Choice>,
    left_out: Vec<Choice>,
}

/// The bound over every plan of a branch-and-price tree on levels and recompute (time objective),
/// pricing from windows of depth `depth`, within `effort` LP iterations and
/// `options.time_limit_s`. None for the memory objective, at K ≥ 2 micro-batches, or where the
/// root gives no bound.
pub fn branched_bound(
    profile: &Profile,
    options: &SolveOptions,
    (depth, effort): (NonZeroUsize, Effort),
) -> Result<Option<BranchedBound>> {
    if profile.micro_batches >= 2 || options.objective != super::Objective::Time {
        return Ok(None);
    }
    let clock = Clock::new(Instant::now(), options.time_limit_s);
    let mut budget = Budget::new(effort, &clock);
    let total = budget.left();
    let mut open = vec![Node {
        rows: Vec::new(),
        bound: f64::NEG_INFINITY,
        extra: ExtraPositions::new(),
    }];
    let (mut incumbent, mut solved_floor) = (f64::INFINITY, f64::INFINITY);
    let mut steps = Vec::new();
    let mut priced_any = false;
    while budget.can_start() {
        // Best first; ties to the node opened first (the lowest index).
        let Some(next) = (0..open.len()).min_by(|&a, &b| open[a].bound.total_cmp(&open[b].bound))
        else {
            break;
        };
        if open[next].bound >= incumbent {
            break;
        }
        let node = open.remove(next);
        let restricted = (depth, node.rows.clone(), node.extra.clone());
        let mut priced = FullWindowBound::under(profile, options, restricted, &mut budget)?;
        if priced.is_infeasible() {
            priced_any = true;
            continue;
        }
        priced.generate(profile, options, incumbent, &mut budget)?;
        let (Some(own), Some(fractions)) = (priced.best_bound(), priced.fractions()) else {
            open.push(node);
            break;
        };
        priced_any = true;
        let bound = own.max(node.bound);
        if bound < incumbent {
            let held = held_by(&node.rows, fractions.len());
            match branching(fractions, &held) {
                Some((left, right)) => {
                    for row in [left, right] {
                        let mut rows = node.rows.clone();
                        rows.push(row);
                        let extra = priced.paying_positions().clone();
                        open.push(Node { rows, bound, extra });
                    }
                }
                None => {
                    let levels = leaf_levels(fractions, &held);
                    match place_leaf(profile, options, &levels, &mut budget)? {
                        Leaf::Solved(value) => {
                            incumbent = incumbent.min(value);
                            solved_floor = solved_floor.min(value * (1.0 - options.relative_gap));
                        }
                        Leaf::NoPlan => {}
                        Leaf::Stopped => open.push(Node { bound, ..node }),
                    }
                }
            }
        }
        steps.push(TreeStep {
            nodes: steps.len() + 1,
            lp_iterations: total - budget.left(),
            bound: least_bound(&open, incumbent, solved_floor),
            incumbent,
        });
    }
    if !priced_any {
        return Ok(None);
    }
    open.retain(|n| n.bound < incumbent);
    Ok(Some(BranchedBound {
        bound: least_bound(&open, incumbent, solved_floor),
        incumbent,
        closed: open.is_empty(),
        steps,
    }))
}

/// min(the solved leaves' floor, the open nodes' bounds below the incumbent): a node whose bound
/// is at least the incumbent holds no plan faster than it.
fn least_bound(open: &[Node], incumbent: f64, solved_floor: f64) -> f64 {
    open.iter()
        .map(|n| n.bound)
        .filter(|&b| b < incumbent)
        .fold(solved_floor, f64::min)
}

/// Each unit's recompute and level as the rows hold them.
fn held_by(rows: &[BranchRow], units: usize) -> Vec<UnitHeld> {
    let mut held = vec![UnitHeld::default(); units];
    for row in rows {
        match row {
            BranchRow::Recompute { unit, recomputes } => held[*unit].recompute = Some(*recomputes),
            BranchRow::Level {
                unit,
                choice,
                held: true,
            } => held[*unit].level = Some(*choice),
            BranchRow::Level {
                unit,
                choice,
                held: false,
            } => held[*unit].left_out.push(*choice),
            BranchRow::RecomputeCount { .. } => {}
        }
    }
    held
}

/// The unit's choices its rows leave open.
fn open_choices<'v>(
    values: &'v UnitValues,
    held: &'v UnitHeld,
) -> impl Iterator<Item = (Choice, f64)> + 'v {
    values
        .choices
        .iter()
        .copied()
        .filter(move |(c, _)| held.level.is_none_or(|l| l == *c) && !held.left_out.contains(c))
}

/// How far `v` is from the nearest integer.
fn fractionality(v: f64) -> f64 {
    (v - v.round()).abs()
}

/// The two children's rows of a node whose LP holds `fractions`, or None where every unit's level
/// and recompute is fixed (a leaf). In order: the count of units of free recompute where its sum
/// is fractional; the most fractional r; the most fractional y; a unit not yet fixed (its r, then
/// its level at its LP value).
fn branching(fractions: &[UnitValues], held: &[UnitHeld]) -> Option<(BranchRow, BranchRow)> {
    let free_r: Vec<(usize, f64)> = fractions
        .iter()
        .zip(held)
        .enumerate()
        .filter(|(_, (_, h))| h.recompute.is_none())
        .filter_map(|(i, (v, _))| v.recompute.map(|r| (i, r)))
        .collect();
    let sum: f64 = free_r.iter().map(|(_, r)| r).sum();
    if free_r.len() >= 2 && fractionality(sum) > INTEGRAL {
        let units: Vec<usize> = free_r.iter().map(|(i, _)| *i).collect();
        let floor = sum.floor() as u32;
        return Some((
            BranchRow::RecomputeCount {
                units: units.clone(),
                count: Count::AtMost(floor),
            },
            BranchRow::RecomputeCount {
                units,
                count: Count::AtLeast(floor + 1),
            },
        ));
    }
    let recompute = |unit| {
        (
            BranchRow::Recompute {
                unit,
                recomputes: false,
            },
            BranchRow::Recompute {
                unit,
                recomputes: true,
            },
        )
    };
    let level = |unit, choice| {
        (
            BranchRow::Level {
                unit,
                choice,
                held: true,
            },
            BranchRow::Level {
                unit,
                choice,
                held: false,
            },
        )
    };
    let most_fractional_r = free_r
        .iter()
        .filter(|(_, r)| fractionality(*r) > INTEGRAL)
        .max_by(|a, b| {
            fractionality(a.1)
                .total_cmp(&fractionality(b.1))
                .then(b.0.cmp(&a.0))
        });
    if let Some(&(unit, _)) = most_fractional_r {
        return Some(recompute(unit));
    }
    let mut most_fractional_y: Option<(usize, Choice, f64)> = None;
    for (unit, (values, h)) in fractions.iter().zip(held).enumerate() {
        for (choice, y) in open_choices(values, h) {
            let f = fractionality(y);
            if f > INTEGRAL && most_fractional_y.is_none_or(|(_, _, best)| f > best) {
                most_fractional_y = Some((unit, choice, f));
            }
        }
    }
    if let Some((unit, choice, _)) = most_fractional_y {
        return Some(level(unit, choice));
    }
    for (unit, (values, h)) in fractions.iter().zip(held).enumerate() {
        if values.recompute.is_some() && h.recompute.is_none() {
            return Some(recompute(unit));
        }
        let choices: Vec<(Choice, f64)> = open_choices(values, h).collect();
        if h.level.is_none() && choices.len() >= 2 {
            let (choice, _) = choices
                .iter()
                .copied()
                .fold(choices[0], |best, c| if c.1 > best.1 { c } else { best });
            return Some(level(unit, choice));
        }
    }
    None
}

/// The levels of a leaf: each unit's held (or only open) choice, and its recompute.
fn leaf_levels(fractions: &[UnitValues], held: &[UnitHeld]) -> Vec<UnitLevel> {
    fractions
        .iter()
        .zip(held)
        .map(|(values, h)| UnitLevel {
            choice: h
                .level
                .or_else(|| open_choices(values, h).next().map(|(c, _)| c))
                .unwrap_or(Choice::Sdp(0)),
            recompute: h.recompute.unwrap_or(false),
        })
        .collect()
}

/// A leaf's placement MIP's outcome.
enum Leaf {
    /// Its optimum (µs), to the solve's relative gap.
    Solved(f64),
    /// No plan of those levels fits.
    NoPlan,
    /// Stopped by the budget or the clock.
    Stopped,
}

/// The placement MIP of `levels` over full windows, within what is left of `budget`: the least
/// time of any plan of those levels.
fn place_leaf(
    profile: &Profile,
    options: &SolveOptions,
    levels: &[UnitLevel],
    budget: &mut Budget,
) -> Result<Leaf> {
    let full = SolveOptions {
        limits: WindowLimits::FULL,
        ..options.clone()
    };
    let stop = Stop {
        work: budget.left(),
        objective_target: None,
        clock: budget.clock(),
    };
    let none = ExtraPositions::new();
    let run = run_highs(profile, (&full, Form::Placement(levels), &none), &[], stop)?;
    budget.spend(run.work);
    Ok(if run.infeasible {
        Leaf::NoPlan
    } else if run.phase.status == SolveStatus::Optimal {
        Leaf::Solved(run.phase.objective)
    } else {
        Leaf::Stopped
    })
}
