//! Branching rows (DESIGN §4.5, "branch and price on levels and recompute"): rows on level and
//! recompute columns only, so pricing stays valid with them. A node of `super::branch`'s tree is a
//! set of them.

use super::variables::{Choice, UnitLevel, UnitVars};
use good_lp::{Constraint, Expression, constraint};

/// One branching row.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum BranchRow {
    /// Unit `unit` recomputes (`true`) or not.
    Recompute { unit: usize, recomputes: bool },
    /// Unit `unit` is at `choice` (`true`) or not.
    Level {
        unit: usize,
        choice: Choice,
        held: bool,
    },
    /// The number of `units` that recompute, bounded.
    RecomputeCount { units: Vec<usize>, count: Count },
}

/// A bound on a count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Count {
    AtMost(u32),
    AtLeast(u32),
}

impl BranchRow {
    /// The rows that hold every unit to `levels` (a fully fixed node: `fixed_levels`' rows).
    pub fn holding(levels: &[UnitLevel]) -> Vec<BranchRow> {
        levels
            .iter()
            .enumerate()
            .flat_map(|(unit, level)| {
                [
                    BranchRow::Level {
                        unit,
                        choice: level.choice,
                        held: true,
                    },
                    BranchRow::Recompute {
                        unit,
                        recomputes: level.recompute,
                    },
                ]
            })
            .collect()
    }
}

/// The model's rows of `branch` over the units' columns.
pub(super) fn branch_rows(units: &[UnitVars], branch: &[BranchRow]) -> Vec<Constraint> {
    branch
        .iter()
        .filter_map(|row| match row {
            BranchRow::Recompute { unit, recomputes } => recompute_row(&units[*unit], *recomputes),
            BranchRow::Level { unit, choice, held } => {
                Some(level_row(&units[*unit], *choice, *held))
            }
            BranchRow::RecomputeCount { units: set, count } => {
                Some(recompute_count_row(units, set, *count))
            }
        })
        .collect()
}

/// Recompute held:
///
/// ```text
/// r_i = ρ          (ρ ∈ {0, 1})
/// ```
///
/// None where the unit has no recompute column and ρ = 0 (the row holds already); where ρ = 1 it
/// has none, the row 0 = 1 (no plan).
fn recompute_row(unit: &UnitVars, recomputes: bool) -> Option<Constraint> {
    let value = f64::from(u8::from(recomputes));
    match unit.recompute {
        Some(r) => Some(constraint!(r.var == value)),
        None if recomputes => Some(constraint!(Expression::default() == value)),
        None => None,
    }
}

/// A level held or left out:
///
/// ```text
/// y_{i,c} = υ      (υ ∈ {0, 1}; y_{i,c} ≡ 0 where the unit has no such choice)
/// ```
fn level_row(unit: &UnitVars, choice: Choice, held: bool) -> Constraint {
    let value = f64::from(u8::from(held));
    constraint!(unit.choice(choice) == value)
}

/// The number of units of a set U that recompute, bounded:
///
/// ```text
/// Σ_{i ∈ U} r_i ≤ k     or     Σ_{i ∈ U} r_i ≥ k
/// ```
///
/// (units without a recompute column count 0).
fn recompute_count_row(units: &[UnitVars], set: &[usize], count: Count) -> Constraint {
    let sum: Expression = set
        .iter()
        .filter_map(|&i| units[i].recompute)
        .map(|r| Expression::from(r.var))
        .sum();
    match count {
        Count::AtMost(k) => constraint!(sum <= f64::from(k)),
        Count::AtLeast(k) => constraint!(sum >= f64::from(k)),
    }
}
