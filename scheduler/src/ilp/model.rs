//! The model of DESIGN §4 built for HiGHS: the variables and constraint families of one phase
//! (full, limited or relaxed windows), and HiGHS with this crate's settings.

use super::constraints::link_position;
use super::constraints::{
    communication_per_slot, communicator_in_use, compute_per_slot, coverage, cumulative_counts,
    fixed_levels, levels_among, links_in_use, longer_blocks, memory_cap, memory_peak,
    memory_per_slot, one_level_per_unit, reductions_before_gathers, slot_durations, time_ceiling,
    whole_blocks,
};
use super::far::{Slack, pooled_bands, slack_running_sums};
use super::offload::OffloadVars;
use super::space::{add_copies, tied_lenders_kept};
use super::variables::{
    Choice, Col, Columns, ExtraPositions, Shape, UnitLevel, UnitVars, declare_units,
};
use super::{Objective, SolveOptions};
use crate::cost::Interference;
use crate::profile::{Link, Profile};
use crate::target::Target;
use crate::timeline::Timeline;
use crate::{Error, Result};
use good_lp::{Constraint, Expression, ProblemVariables, SolverModel};
use std::collections::HashMap;

/// HiGHS primal and integer feasibility tolerance.
const FEASIBILITY_TOLERANCE: f64 = 1e-9;
/// HiGHS' share of effort for primal heuristics (default 0.05). The bound is tight early on these
/// models and finding the incumbent dominates: on Llama-2 70B at a 150 GiB cap (D = 4), 0.5
/// reached a 0.1% gap in 7 s where 0.05 took 17 s.
const HEURISTIC_EFFORT: f64 = 0.5;

/// The model of one phase, ready for HiGHS.
pub(super) struct Built {
    pub columns: usize,
    pub integers: usize,
    pub units: Vec<UnitVars>,
    pub durations: Vec<Col>,
    pub peak: Option<Col>,
    pub problem: ProblemVariables,
    pub objective: Expression,
    pub constraints: Vec<Constraint>,
    pub memory_scale: f64,
    pub rows: RowStarts,
    /// The offload columns (`Form::Offload` on a profile that offers them).
    pub offload: Option<OffloadVars>,
}

/// Where the row families that a bound's pricing reads start (`constraints` indices): one
/// coverage row per op (in `units`' op order), 1 + |links| duration rows per slot (d ≥ c + L,
/// then d ≥ Q^ℓ + κ_q·c per link in use), one memory-cap row per slot (time objective under a
/// cap only); and the RS→AG order row of each launch column that has one.
pub(super) struct RowStarts {
    pub coverage: usize,
    pub durations: usize,
    /// The links in use, in the order of their duration rows.
    pub links: Vec<Link>,
    pub memory_cap: Option<usize>,
    /// Launch column index → its RS→AG order row (coefficient 1 on the launch).
    pub order_rows: HashMap<usize, usize>,
}

impl RowStarts {
    /// The rows d_s ≥ c_s + L_s and d_s ≥ Q^ℓ_s + κ_q·c_s of slot `slot` and link `link`.
    pub fn duration_rows(&self, slot: usize, link: Link) -> (usize, usize) {
        let first = self.durations + slot * (1 + self.links.len());
        (first, first + 1 + link_position(&self.links, link))
    }
}

/// Which model of the plans within the windows is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form<'a> {
    /// The MIP: its integer solutions are the plans.
    Mip,
    /// The MIP with every unit's level and recompute fixed: its solutions are plans, its dual
    /// bound holds only over plans of those levels (`super::placement`).
    Placement(&'a [UnitLevel]),
    /// The MIP with every unit's level among its given choices (one: held) and its recompute
    /// free: its solutions are plans, HiGHS choosing which units recompute together with the
    /// launches; its dual bound holds only over plans of those choices (`super::placement`).
    PlacementAmong(&'a [Vec<Choice>]),
    /// The LP relaxation (integrality dropped).
    Lp,
    /// The far-band relaxation of the plans outside the window limits (`super::far`): a MIP
    /// whose optimum bounds every plan.
    FarBands,
    /// The LP relaxation of the far-band relaxation: where it launches shows where far launches
    /// may pay.
    FarBandsLp,
    /// The MIP with each unit's offload to the host a choice too (`super::offload`, DESIGN §4.10).
    Offload,
    /// The offload MIP over the plans no slower than the given µs (a met plan's time, rounded
    /// up): Σ_s d_s ≤ it, and each gated row's big M from it (`super::offload`, DESIGN §4.10).
    OffloadWithin(u64),
    /// Its LP relaxation: with every integer fixed by rows, a plan's time in the offload model.
    OffloadLp,
}

/// The model under `options` in the given form, with launch columns also at `extra`.
pub(super) fn build(
    profile: &Profile,
    options: &SolveOptions,
    (form, extra): (Form, &ExtraPositions),
) -> Built {
    let timeline = Timeline::new(profile.unit_count());
    let mut columns = Columns {
        problem: ProblemVariables::new(),
        count: 0,
        integer: 0,
        relaxed: matches!(form, Form::Lp | Form::FarBandsLp | Form::OffloadLp),
    };
    let cap = options.memory_cap_bytes.map(|c| c as f64);
    let far_bands = matches!(form, Form::FarBands | Form::FarBandsLp);
    let shape = Shape {
        options,
        extra,
        far_bands,
    };
    let offloads = matches!(
        form,
        Form::Offload | Form::OffloadWithin(_) | Form::OffloadLp
    );
    let ceiling = match form {
        Form::OffloadWithin(us) => Some(us as f64),
        _ => None,
    };
    // §4.3's presolve of `none` assumes every other unit's state on the device.
    let units = declare_units(&mut columns, profile, shape, cap.filter(|_| !offloads));
    let durations: Vec<_> = (0..timeline.slot_count())
        .map(|_| columns.continuous())
        .collect();
    let offload = offloads
        .then(|| OffloadVars::declare(&mut columns, profile, &units, ceiling))
        .flatten();
    let links = links_in_use(&units);
    let slack = far_bands.then(|| Slack::declare(&mut columns, timeline.slot_count(), links.len()));
    let memory_scale = memory_scale(profile, options);
    let mut constraints = one_level_per_unit(&units);
    constraints.extend(cumulative_counts(&units));
    let coverage_start = constraints.len();
    constraints.extend(coverage(&units));
    let mut order_rows = HashMap::new();
    for (row, launch) in reductions_before_gathers(&units) {
        if let Some(x) = launch {
            order_rows.insert(x.index, constraints.len());
        }
        constraints.push(row);
    }
    constraints.extend(communicator_in_use(&units));
    let (mut comm, mut load) = communication_per_slot(&units, timeline.slot_count(), &links);
    if let Some(slack) = &slack {
        for (q, sigma) in comm.iter_mut().zip(&slack.comm) {
            for (q, sigma) in q.iter_mut().zip(sigma) {
                *q += sigma.var;
            }
        }
        for (l, lambda) in load.iter_mut().zip(&slack.compute) {
            *l += lambda.var;
        }
    }
    let compute = compute_per_slot(profile, &units, timeline);
    let durations_start = constraints.len();
    constraints.extend(slot_durations(
        &durations,
        &compute,
        (&comm, &load),
        Interference::of(profile),
    ));
    if options.target == Target::Fsdp2 {
        constraints.extend(tied_lenders_kept(profile, &units));
    }
    match form {
        Form::Placement(levels) => constraints.extend(fixed_levels(&units, levels)),
        Form::PlacementAmong(among) => constraints.extend(levels_among(&units, among)),
        _ => {}
    }
    if !matches!(form, Form::Lp | Form::FarBandsLp) {
        // Valid for integer launches only; the LP forms stay as the pricing reads them.
        let longer = longer_blocks(profile, &units, timeline);
        constraints.extend(whole_blocks(&longer, &durations, &compute));
    }
    if let Some(slack) = &slack {
        constraints.extend(slack_running_sums(slack));
        constraints.extend(pooled_bands(&units, slack, (timeline.slot_count(), &links)));
    }
    let iteration_time: Expression = durations.iter().map(|d| d.var).sum();
    let mut memory = memory_per_slot(profile, &units, timeline, memory_scale);
    if options.target == Target::Fsdp2 {
        add_copies(&mut memory, profile, &units, memory_scale);
    }
    if let Some(offload) = &offload {
        offload.shift_memory(profile, &units, &mut memory, memory_scale);
        constraints.extend(offload.rows(profile, &units, &durations));
        if let Some(ceiling) = ceiling {
            constraints.push(time_ceiling(&durations, ceiling));
        }
    }
    let mut memory_cap_start = None;
    let (objective, peak) = match options.objective {
        Objective::Time => {
            if cap.is_some() {
                memory_cap_start = Some(constraints.len());
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
        rows: RowStarts {
            coverage: coverage_start,
            durations: durations_start,
            links,
            memory_cap: memory_cap_start,
            order_rows,
        },
        offload,
    }
}

/// The unit of the memory rows: the cap, or without one [`memory_magnitude`].
pub(super) fn memory_scale(profile: &Profile, options: &SolveOptions) -> f64 {
    options
        .memory_cap_bytes
        .map_or_else(|| memory_magnitude(profile), |c| c as f64)
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

/// HiGHS' random seed, fixed (its default, written out so that no change of default moves plans).
const RANDOM_SEED: i32 = 0;

/// A HiGHS model of the problem with this crate's settings: quiet (HiGHS' log under
/// `SHARDPLAN_HIGHS_LOG`), the time limit (the outer clock's), the gap target, the heuristics'
/// effort, the feasibility tolerances, a fixed random seed and one thread (DESIGN §4.6: HiGHS'
/// MIP search runs on one thread whatever its option; fixed, a run does the same work anywhere).
pub(super) fn highs_model(
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
    for (name, value) in [("threads", 1), ("random_seed", RANDOM_SEED)] {
        model
            .try_set_option(name, value)
            .map_err(|e| Error::Solver(format!("HiGHS option {name}: {e:?}")))?;
    }
    Ok(model)
}
