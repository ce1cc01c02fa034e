//! What the full-window LP relaxation's optimum is made of (DESIGN §4.5, "what the gap is made
//! of"): column generation to the full LP's optimum (`super::bound`), free or with every unit's
//! level and recompute held to a plan's or to the LP's own rounded choice, and the restricted LP
//! it ended at read back: which levels, recompute flags and launches are fractional and which
//! memory rows bind.

use super::bound::FullWindowBound;
use super::constraints::fixed_levels;
use super::effort::{Budget, Clock};
use super::limits::PLACEMENT_DEPTH;
use super::mapping::schedule_values;
use super::model::{Built, Form, build, highs_model};
use super::placement::held_choices;
use super::rounding::Spread;
use super::run::{Stop, run_highs};
use super::variables::{Choice, Columns, ExtraPositions, Shape, UnitLevel, declare_units};
use super::{SolveOptions, WindowLimits};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::{Error, Result};
use good_lp::ProblemVariables;
use highs::HighsModelStatus;
use std::collections::BTreeMap;
use std::time::Instant;

/// A value counts as fractional when it is this far from the nearest integer.
const FRACTIONAL: f64 = 1e-6;
/// A memory row binds when its dual (µs per whole cap) is larger than this in size.
const BINDING: f64 = 1e-7;

/// Which levels the LP is held to.
#[derive(Debug, Clone, Copy)]
pub enum HeldLevels<'a> {
    /// None: the full-window LP relaxation itself.
    Free,
    /// Every unit's level (over its group of ranks) and recompute as in this plan.
    OfPlan(&'a Schedule),
    /// Every unit at the level of largest value in the free LP's optimum, recomputing where its
    /// r exceeds 1/2.
    RoundedLp,
    /// The free LP's proportions made whole by systematic rounding over the units in order: unit
    /// i takes the level whose running sum Σ_{j ≤ i} y_{j,ℓ} most exceeds the units given it so
    /// far — about Σ_i y_{i,ℓ} units at level ℓ, spread evenly — and recomputes wherever r_i > 0
    /// (recompute only trades time for memory, so rounding it up keeps what fits).
    SpreadLp,
}

/// The full-window LP's optimum (or, held to levels, the full-window LP of those levels),
/// read back.
#[derive(Debug, Clone)]
pub struct LpAnatomy {
    /// The best priced bound column generation reached (over the plans of the held levels).
    pub bound_us: f64,
    /// Whether it is the full-window LP's optimum (no left-out position priced negative).
    pub full_lp: bool,
    /// The optimum of the restricted LP read back (equal to `bound_us` when `full_lp`).
    pub restricted_us: f64,
    /// Per unit, its level columns with a nonzero value (`Choice`'s debug form, value).
    pub levels: Vec<Vec<(String, f64)>>,
    /// Per unit, r_i (0 where the unit has no recompute column).
    pub recompute: Vec<f64>,
    /// Launch columns with a nonzero value, and those of them not integral.
    pub launches: (usize, usize),
    /// Per slot whose memory row binds (a nonzero dual): the row's activity (M_s/M less its
    /// constant part) and dual (µs per whole cap).
    pub binding_memory: Vec<(usize, f64, f64)>,
    /// Per slot, d_s.
    pub durations: Vec<f64>,
    /// Held to levels: the time of the plan the placement MIP of those levels finds over depth 4
    /// and the positions column generation added, within `options.effort` (None: free, or no
    /// plan found).
    pub placed_us: Option<f64>,
    /// Held to levels: the time of the plan the placement MIP of those levels with recompute
    /// free finds (`Form::PlacementAmong`, warm-started from the placement's plan), within
    /// `options.effort` again (None: free, or no plan found).
    pub placed_recompute_free_us: Option<f64>,
    /// Held to the LP's spread levels: the time of the plan the placement MIP finds with each
    /// unit's level among the choices its LP value is nonzero on and recompute free
    /// (`Form::PlacementAmong`, warm-started from the recompute-free plan), within
    /// `options.effort` again (None: other levels held, or no plan found).
    pub placed_among_lp_us: Option<f64>,
    /// The LP iterations of each placement run: fixed, recompute free, among the LP's choices.
    pub placement_iterations: Vec<u64>,
    /// Seconds, column generation, the read-back and the placement together.
    pub seconds: f64,
}

impl LpAnatomy {
    /// Units whose level columns are not all 0 or 1.
    pub fn fractional_levels(&self) -> usize {
        self.levels
            .iter()
            .filter(|l| l.iter().any(|(_, v)| fractional(*v)))
            .count()
    }

    /// Units whose r_i is strictly between 0 and 1.
    pub fn fractional_recompute(&self) -> usize {
        self.recompute.iter().filter(|&&r| fractional(r)).count()
    }
}

fn fractional(value: f64) -> bool {
    (value - value.round()).abs() > FRACTIONAL
}

/// Column generation from depth 4 to the full-window LP's optimum under `options` (time objective,
/// within `options.effort` and `options.time_limit_s`) with every unit held to `held`, and its
/// last restricted LP read back. None when no bound was priced, when the plan of `held` has a
/// level or position the model lacks, or when the levels held to do not fit.
pub fn full_lp_anatomy(
    profile: &Profile,
    options: &SolveOptions,
    held: HeldLevels,
) -> Result<Option<LpAnatomy>> {
    let levels = match held {
        HeldLevels::Free => None,
        HeldLevels::OfPlan(plan) => match plan_levels(profile, options, plan) {
            Some(levels) => Some(levels),
            None => return Ok(None),
        },
        HeldLevels::RoundedLp | HeldLevels::SpreadLp => {
            match anatomy_at(profile, options, Held::Free)? {
                Some(read) if matches!(held, HeldLevels::RoundedLp) => Some(read.rounded),
                Some(read) => {
                    let held = (read.spread, read.support);
                    return Ok(anatomy_at(profile, options, Held::Among(held))?.map(|r| r.anatomy));
                }
                None => return Ok(None),
            }
        }
    };
    let held = levels.map_or(Held::Free, Held::Levels);
    Ok(anatomy_at(profile, options, held)?.map(|read| read.anatomy))
}

/// Each unit's level and recompute in `plan`, as the full-window model's choices.
fn plan_levels(
    profile: &Profile,
    options: &SolveOptions,
    plan: &Schedule,
) -> Option<Vec<UnitLevel>> {
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
    let shape = Shape {
        options: &full,
        extra: &ExtraPositions::new(),
        far_bands: false,
    };
    let cap = options.memory_cap_bytes.map(|c| c as f64);
    let units = declare_units(&mut columns, profile, shape, cap);
    let values = schedule_values(&units, plan, columns.count)?;
    Some(super::mapping::levels_from_values(&units, &values))
}

/// An anatomy beside its LP optimum's levels made whole two ways (`HeldLevels`) and the choices
/// each unit's LP value is nonzero on.
struct ReadBack {
    anatomy: LpAnatomy,
    rounded: Vec<UnitLevel>,
    spread: Vec<UnitLevel>,
    support: Vec<Vec<Choice>>,
}

/// What an anatomy holds the LP to.
enum Held {
    Free,
    Levels(Vec<UnitLevel>),
    /// These levels, and for the last placement each unit's level among these choices.
    Among((Vec<UnitLevel>, Vec<Vec<Choice>>)),
}

/// The anatomy at `held`'s levels, beside the rounded and the spread choice of its LP's optimum.
fn anatomy_at(profile: &Profile, options: &SolveOptions, held: Held) -> Result<Option<ReadBack>> {
    let (levels, among) = match held {
        Held::Free => (None, None),
        Held::Levels(levels) => (Some(levels), None),
        Held::Among((levels, among)) => (Some(levels), Some(among)),
    };
    let started = Instant::now();
    let clock = Clock::new(started, options.time_limit_s);
    let mut budget = Budget::new(options.effort, &clock);
    let depth = (PLACEMENT_DEPTH, levels.clone());
    let mut bound = FullWindowBound::at_depth(profile, options, depth, &mut budget)?;
    bound.generate(profile, options, f64::INFINITY, &mut budget)?;
    let Some(best) = bound.phase() else {
        return Ok(None);
    };
    let limited = SolveOptions {
        limits: WindowLimits::depth(PLACEMENT_DEPTH),
        ..options.clone()
    };
    let Built {
        units,
        durations,
        problem,
        objective,
        mut constraints,
        rows,
        ..
    } = build(profile, &limited, (Form::Lp, bound.paying_positions()));
    if let Some(levels) = &levels {
        constraints.extend(fixed_levels(&units, levels));
    }
    let model = highs_model(
        problem,
        objective,
        constraints,
        options,
        clock.seconds_left(),
    )?;
    let solved = model
        .try_solve()
        .map_err(|e| Error::Solver(format!("HiGHS failed: {e:?}")))?;
    if solved.status() != HighsModelStatus::Optimal {
        return Ok(None);
    }
    let solution = solved.get_solution();
    let (values, activity, duals) = (solution.columns(), solution.rows(), solution.dual_rows());
    let mut unit_levels = Vec::new();
    let mut rounded = Vec::new();
    let mut spread = Spread::default();
    let mut launches = (0, 0);
    let mut support = Vec::new();
    for u in &units {
        spread.take(u.choices(), u.recompute, values);
        let chosen: Vec<(Choice, f64)> = u
            .choices()
            .into_iter()
            .filter_map(|(choice, column)| Some((choice, values[column?.index])))
            .filter(|(_, v)| *v > FRACTIONAL)
            .collect();
        let largest = chosen
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Choice::Sdp(0), |c| c.0);
        support.push(chosen.iter().map(|c| c.0).collect());
        let r = u.recompute.map_or(0.0, |r| values[r.index]);
        rounded.push(UnitLevel {
            choice: largest,
            recompute: r > 0.5,
        });
        unit_levels.push(
            chosen
                .into_iter()
                .map(|(choice, v)| (format!("{choice:?}"), v))
                .collect(),
        );
        for op in u.ops() {
            for x in &op.launches {
                let v = values[x.index];
                if v > FRACTIONAL {
                    launches.0 += 1;
                    launches.1 += usize::from(fractional(v));
                }
            }
        }
    }
    let recompute = units
        .iter()
        .map(|u| u.recompute.map_or(0.0, |r| values[r.index]))
        .collect();
    let binding_memory = rows.memory_cap.map_or_else(Vec::new, |first| {
        (0..durations.len())
            .map(|s| (s, activity[first + s], duals[first + s]))
            .filter(|&(_, _, dual)| dual.abs() > BINDING)
            .collect()
    });
    let placed = match &levels {
        Some(levels) => {
            let held = (levels.as_slice(), among.as_deref());
            place(profile, options, held, bound.paying_positions(), &clock)?
        }
        None => Placed::default(),
    };
    let anatomy = LpAnatomy {
        bound_us: best.best_bound,
        full_lp: bound.is_full_lp(),
        restricted_us: solved.objective_value(),
        levels: unit_levels,
        recompute,
        launches,
        binding_memory,
        durations: durations.iter().map(|d| values[d.index]).collect(),
        placed_us: placed.fixed,
        placed_recompute_free_us: placed.recompute_free,
        placed_among_lp_us: placed.among,
        placement_iterations: placed.iterations,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Some(ReadBack {
        anatomy,
        rounded,
        spread: spread.levels(),
        support,
    }))
}

/// The times of the plans the placements of a level choice find.
#[derive(Default)]
struct Placed {
    /// Levels and recompute fixed (`Form::Placement`).
    fixed: Option<f64>,
    /// Levels fixed, recompute free (`Form::PlacementAmong` of one choice each), from the first's
    /// plan.
    recompute_free: Option<f64>,
    /// Levels among given choices, recompute free, from the second's plan.
    among: Option<f64>,
    /// The LP iterations of each placement run, in this order.
    iterations: Vec<u64>,
}

/// The placement MIP of `levels` over depth 4 and `extra` (`Form::Placement`) within
/// `options.effort`, then the same with recompute free warm-started from its plan, then, given
/// `among`, each unit's level among its choices warm-started from that, each within
/// `options.effort`: the times of their plans, checked against the strict simulator by
/// `run_highs`.
fn place(
    profile: &Profile,
    options: &SolveOptions,
    (levels, among): (&[UnitLevel], Option<&[Vec<Choice>]>),
    extra: &ExtraPositions,
    clock: &Clock,
) -> Result<Placed> {
    let limited = SolveOptions {
        limits: WindowLimits::depth(PLACEMENT_DEPTH),
        ..options.clone()
    };
    let run = |form, warm: &Option<Schedule>| {
        let stop = Stop {
            work: options.effort.iterations(),
            objective_target: None,
            clock,
        };
        let warm: Vec<_> = warm.iter().map(|s| (s.clone(), 0.0)).collect();
        let run = run_highs(profile, (&limited, form, extra), &warm, stop)?;
        Ok::<_, Error>(run)
    };
    let fixed = run(Form::Placement(levels), &None)?;
    let held = held_choices(levels);
    let free = run(Form::PlacementAmong(&held), &fixed.schedule)?;
    let time = |run: &super::run::Run| run.schedule.as_ref().map(|_| run.phase.objective);
    let mut iterations = vec![fixed.work, free.work];
    let among_time = match among {
        Some(among) => {
            let start = free.schedule.clone().or(fixed.schedule.clone());
            let placed = run(Form::PlacementAmong(among), &start)?;
            iterations.push(placed.work);
            time(&placed)
        }
        None => None,
    };
    Ok(Placed {
        fixed: time(&fixed),
        recompute_free: time(&free),
        among: among_time,
        iterations,
    })
}

/// Level names of a unit's fractional choice, for a table: `Fsdp(1) 0.200 + Hpz(0) 0.800`.
pub fn describe_levels(levels: &[(String, f64)]) -> String {
    let mut parts: BTreeMap<&str, f64> = BTreeMap::new();
    for (name, v) in levels {
        *parts.entry(name).or_default() += v;
    }
    parts
        .iter()
        .map(|(name, v)| format!("{name} {v:.3}"))
        .collect::<Vec<_>>()
        .join(" + ")
}
