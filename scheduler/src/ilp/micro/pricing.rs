//! A bound over every plan of K ≥ 2 micro-batches (DESIGN §4.8, by §4.5's pricing and column
//! generation) from the LP relaxation of the micro-batch model restricted to limited windows.
//!
//! The restricted LP is built as the full-window model whose left-out launch columns are fixed
//! at 0, so HiGHS reports the reduced cost of every launch position itself: with the running
//! sums C eliminated (a block launched at k counts in every row that reads C at a position
//! ≥ k), x_k's reduced cost is HiGHS' reduced cost of x_k plus those of C_k, C_k+1, … (the
//! running-sum rows' duals telescope away); a left-out position pays where it is negative.
//! Keeping each unit's one-configuration row and its
//! column sets' coverage rows and dualising every other row with the LP's duals π (a Lagrangian
//! relaxation), every plan satisfies
//!
//! ```text
//! T ≥ z − Σ_j rc'_j·x*_j + Σ_i min_c (rc'_{y_ic} + Σ_{sets o run by c} nb_i · min_k rc'_{i,o,k})
//!       + Σ_{r, Z, u} min(0, rc)          (d: rc ≥ 0, else no bound)
//! ```
//!
//! with rc' the reduced cost without the kept rows' duals (their duals added back). When no
//! left-out position prices negative the bound is z, the full-window LP's optimum; column
//! generation adds the left-out positions of most negative reduced cost and prices again.

use super::model::{Added, Built, Space, build};
use super::placement::Fractional;
use crate::Result;
use crate::ilp::effort::Budget;
use crate::ilp::run::lp_optimum;
use crate::ilp::{Objective, PhaseReport, Relaxation, SolveOptions, SolveStatus, WindowLimits};
use crate::profile::Profile;
use std::collections::BTreeSet;
use std::time::Instant;

/// Reduced costs below −this (µs) price a left-out position as paying.
const PAYING: f64 = 1e-6;
/// Left-out positions of one column set that enter the restricted LP per round.
const ENTERING_PER_SET: usize = 2;

/// A priced bound, the restricted LP's optimum it came from and the positions to add next.
pub(in crate::ilp) struct Priced {
    pub bound: f64,
    pub restricted_optimum: f64,
    pub entering: Added,
    /// Per unit, the restricted LP's configurations and recompute (`super::placement` rounds
    /// them).
    pub(super) fractional: Vec<Fractional>,
    /// The restricted LP's size and work.
    pub phase: PhaseReport,
}

/// The bound over every plan priced from the LP of the windows `limits` and the positions
/// `added` (time objective only): None for the memory objective, or when that LP does not solve
/// to optimality within `budget`, or a duration prices negative.
pub(in crate::ilp) fn priced(
    profile: &Profile,
    options: &SolveOptions,
    (limits, added): (WindowLimits, &Added),
    budget: &mut Budget,
) -> Result<Option<Priced>> {
    if options.objective != Objective::Time || !budget.can_start() {
        return Ok(None);
    }
    let started = Instant::now();
    let space = Space {
        limits,
        added,
        left_out: true,
        target: options.target,
        fixed: None,
    };
    let built = build(
        profile,
        space,
        options.recompute_choice(),
        (options.memory_cap_bytes, None),
    );
    let step_time = built.step_time();
    let Built {
        columns,
        units,
        durations,
        constraints,
        kept,
        ..
    } = built;
    let (count, integers, rows) = (columns.count, columns.integer, constraints.len());
    let Some(optimum) = lp_optimum(columns.problem, step_time, constraints, options, budget)?
    else {
        return Ok(None);
    };
    let (values, reduced, duals) = (&optimum.values, &optimum.reduced, &optimum.duals);
    let work = optimum.work;
    let z = optimum.objective;
    let mut lagrangian = z;
    let mut priced = vec![false; count];
    let mut entering = Added::new();
    let fractional = units
        .iter()
        .map(|u| Fractional {
            configs: u
                .configs
                .iter()
                .map(|&(c, y)| (c, values[y.index]))
                .collect(),
            recompute: u.recompute.map_or(0.0, |r| values[r.index]),
        })
        .collect();
    for (i, (u, kept)) in units.iter().zip(&kept).enumerate() {
        let nb = f64::from(profile.blocks(i) / u.blocks_per_launch);
        // Per column set, nb blocks at its cheapest position of the full window.
        let mut cheapest = Vec::new();
        for (set, (l, &coverage)) in u.launches.iter().zip(&kept.coverage).enumerate() {
            // rc of x_k with C eliminated: its own, C_k's and every later C's; rc' adds the
            // coverage row's dual back (C_last − nb·Σy = 0: coefficient 1 on C_last).
            let mut tail = 0.0;
            let mut full = vec![0.0; l.x.len()];
            for q in (0..l.x.len()).rev() {
                tail += reduced[l.running[q].index];
                full[q] = reduced[l.x[q].index] + tail;
            }
            let prices: Vec<f64> = full.iter().map(|rc| rc + duals[coverage]).collect();
            for (q, x) in l.x.iter().enumerate() {
                lagrangian -= prices[q] * values[x.index];
                priced[x.index] = true;
                priced[l.running[q].index] = true;
            }
            let mut paying: Vec<(usize, f64)> = l
                .positions
                .iter()
                .zip(&l.restricted)
                .zip(&full)
                .filter(|((_, restricted), rc)| !**restricted && **rc < -PAYING)
                .map(|((&p, _), &rc)| (p, rc))
                .collect();
            paying.sort_by(|a, b| a.1.total_cmp(&b.1));
            if !paying.is_empty() {
                entering
                    .entry((i, set))
                    .or_default()
                    .extend(paying.iter().take(ENTERING_PER_SET).map(|(p, _)| *p));
            }
            cheapest.push(nb * prices.iter().copied().fold(f64::INFINITY, f64::min));
        }
        // The unit's subproblem: one configuration, each set it runs at its cheapest position.
        let mut best = f64::INFINITY;
        for &(c, y) in &u.configs {
            priced[y.index] = true;
            let runs: Vec<usize> = (0..u.launches.len())
                .filter(|&set| u.launches[set].key.runs(c))
                .collect();
            let rc = reduced[y.index] + duals[kept.one]
                - nb * runs
                    .iter()
                    .map(|&set| duals[kept.coverage[set]])
                    .sum::<f64>();
            lagrangian -= rc * values[y.index];
            best = best.min(rc + runs.iter().map(|&set| cheapest[set]).sum::<f64>());
        }
        lagrangian += best;
    }
    // The other columns: r, Z and u in [0, 1]; d ≥ 0 (a negative reduced cost on it would make
    // the bound −∞: the duals are then not usable).
    let mut unbounded = vec![false; count];
    for d in &durations {
        unbounded[d.index] = true;
    }
    let Some(lagrangian) = optimum.with_unpriced_columns(lagrangian, &priced, &unbounded, PAYING)
    else {
        return Ok(None);
    };
    Ok(Some(Priced {
        bound: lagrangian,
        restricted_optimum: z,
        entering,
        fractional,
        phase: PhaseReport {
            window_depth: WindowLimits::FULL,
            relaxation: Some(Relaxation::Lp),
            status: SolveStatus::Optimal,
            objective: f64::NAN,
            best_bound: lagrangian,
            gap: f64::NAN,
            seconds: started.elapsed().as_secs_f64(),
            lp_iterations: work,
            variables: count,
            integer_variables: integers,
            constraints: rows,
        },
    }))
}

/// What column generation ends with: the best bound as a phase over every plan, whether it is
/// the full-window LP's optimum (the last pricing found no paying position), the positions it
/// added and the last restricted LP's configurations and recompute.
pub(super) struct Generation {
    pub phase: PhaseReport,
    pub full_lp: bool,
    pub added: Added,
    pub fractional: Vec<Fractional>,
}

/// Column generation from the LP of the windows `limits` (DESIGN §4.5): the best bound as a
/// phase over every plan, and whether it is the full-window LP's optimum ([`generation`]).
pub(in crate::ilp) fn generated(
    profile: &Profile,
    options: &SolveOptions,
    limits: WindowLimits,
    needed: f64,
    budget: &mut Budget,
) -> Result<Option<(PhaseReport, bool)>> {
    let generation = generation(profile, options, limits, needed, budget)?;
    Ok(generation.map(|g| (g.phase, g.full_lp)))
}

/// Column generation from the LP of the windows `limits` (DESIGN §4.5): prices, adds each column
/// set's left-out positions of most negative reduced cost, and prices again, while the bound is
/// short of `needed` and some position pays, within `budget`. None where the first pricing gives
/// no bound.
pub(super) fn generation(
    profile: &Profile,
    options: &SolveOptions,
    limits: WindowLimits,
    needed: f64,
    budget: &mut Budget,
) -> Result<Option<Generation>> {
    let started = Instant::now();
    let mut added = Added::new();
    let mut best: Option<PhaseReport> = None;
    let mut fractional = Vec::new();
    let mut work = 0;
    let full_lp = loop {
        let Some(round) = priced(profile, options, (limits, &added), budget)? else {
            break false;
        };
        work += round.phase.lp_iterations;
        tracing::debug!(
            bound = round.bound,
            restricted = round.restricted_optimum,
            entering = round.entering.values().map(BTreeSet::len).sum::<usize>(),
            "micro-batch column generation"
        );
        if best.as_ref().is_none_or(|b| round.bound > b.best_bound) {
            best = Some(round.phase);
        }
        fractional = round.fractional;
        if round.entering.is_empty() {
            break true;
        }
        if best.as_ref().is_some_and(|b| b.best_bound >= needed) {
            break false;
        }
        for (key, positions) in round.entering {
            added.entry(key).or_default().extend(positions);
        }
    };
    Ok(best.map(|b| Generation {
        phase: PhaseReport {
            seconds: started.elapsed().as_secs_f64(),
            lp_iterations: work,
            ..b
        },
        full_lp,
        added,
        fractional,
    }))
}
