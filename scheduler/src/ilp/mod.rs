//! The ILP scheduler (DESIGN §4): every unit's level and recompute flag and the launch slot of
//! every block, jointly, under a memory cap, solved by HiGHS with a proven gap.
//!
//! The spine, four steps a newcomer can follow file by file:
//!
//! 1. **model** — `variables` declares y, r, x, C, Z and d (`variables::declare` over the window
//!    positions allowed, `variables::columns` indexing them); `constraints` holds one function
//!    per constraint family; `model` builds one phase's model (`Form`: the MIP, the MIP at fixed
//!    levels, the LP relaxation, the far-band relaxation) for HiGHS, and `run` solves it once
//!    (`run_highs`), re-simulating every plan it returns.
//! 2. **bound** — `bound` proves bounds over every plan: the full-window LP relaxation, or the same
//!    priced from a small window's LP (`pricing`) and raised by column generation
//!    (`FullWindowBound`); `far` builds the far-band relaxation, a MIP whose bound holds over every
//!    plan.
//! 3. **search** — `search::Search` is one search's state: the plans met (`pool`, each fitting the
//!    cap by the simulator), its runs and its work budget (`effort`; `callback` meters a MIP's
//!    work). `solve` warm-starts it from the best baseline (`warm`) and the hint; `staged` runs the
//!    staged phases of large models (depth 1, depth 4, `placement` at fixed levels on nodes, and,
//!    on two threads, the full-window MIP or depth 4 beside `refine`'s far-band search).
//! 4. **claim** — `claim` reads what the runs prove about the best plan (`Claim`: status, bound,
//!    gap, window) and writes it into the plan file (`SolveDetails`, through [`Solved::plan`]).
//!
//! Beside the spine: `mapping` moves between schedules and column values; `limits`, `bands` and
//! `rounding` are the window limits, the far-band positions and the LP's levels made whole;
//! `anatomy` diagnoses the full-window LP; `space` and `fsdp2_solve` restrict the ILP to FSDP2's
//! plans; `offload` and `offload_solve` add host offload; a profile of K ≥ 2 micro-batches is
//! solved by `micro`'s MIP instead.

mod anatomy;
mod bands;
mod bound;
mod branch;
mod branch_rows;
mod callback;
mod claim;
mod constraints;
mod effort;
mod far;
mod fsdp2_solve;
mod limits;
mod mapping;
mod micro;
mod model;
mod offload;
mod offload_solve;
mod placement;
mod pool;
mod pricing;
mod refine;
mod rounding;
mod run;
mod search;
mod solve;
mod space;
mod staged;
mod variables;
mod warm;

pub use crate::target::Target;
pub use anatomy::{HeldLevels, LpAnatomy, describe_levels, full_lp_anatomy};
pub use bound::{generated_lp_bound, lp_relaxation_bound, priced_lp_bound};
pub use branch::{BranchedBound, TreeStep, branched_bound};
pub use claim::SolveDetails;
pub use effort::Effort;
pub use limits::WindowLimits;
pub use micro::rows_at as micro_rows_at;
pub use refine::far_band_bound;
pub use solve::{solve, solve_naming_offload};

use crate::baselines::Preference;
use crate::plan::{Plan, Predicted, Producer};
use crate::profile::Profile;
use crate::schedule::{RecomputeChoice, Schedule};
use crate::sim::Simulation;
use serde::Serialize;

/// What the solver minimises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// Iteration time under the memory cap.
    Time,
    /// Peak memory, optionally under an iteration-time ceiling (µs).
    Memory { max_iteration_time_us: Option<f64> },
}

impl Objective {
    /// How a baseline is chosen for this objective: the fastest, or the smallest peak under the
    /// time ceiling.
    pub fn preference(self) -> Preference {
        match self {
            Objective::Time => Preference::Fastest,
            Objective::Memory {
                max_iteration_time_us,
            } => Preference::Smallest {
                max_iteration_time_us,
            },
        }
    }

    /// The objective's value for a plan: its strict iteration time (µs), or its peak bytes.
    pub fn value_of(self, simulation: &Simulation) -> f64 {
        match self {
            Objective::Time => simulation.iteration_time_us,
            Objective::Memory { .. } => simulation.peak_memory_bytes,
        }
    }
}

/// Solver settings.
#[derive(Debug, Clone)]
pub struct SolveOptions {
    pub objective: Objective,
    /// The per-rank cap (peak ≤ cap); None: no cap (the fastest plan, memory unbounded).
    pub memory_cap_bytes: Option<u64>,
    /// The outer guard, seconds for the whole solve; `f64::INFINITY` (or any limit past a
    /// century): none. When it stops a run the solve's status is `time_limit`.
    pub time_limit_s: f64,
    /// The solver work each search may spend (DESIGN §4.6): the budget, where the time limit is
    /// only the guard.
    pub effort: Effort,
    pub relative_gap: f64,
    pub threads: u32,
    /// The plans searched: gathers only in the last D slots of their window, reductions only in
    /// the first R slots after B_i.
    pub limits: WindowLimits,
    pub allow_recompute: bool,
    /// Solve with D = 1 and D = 4 first and warm-start the full windows, when the model is large;
    /// off: the full windows directly (with micro-batches, not within depth 4 however large).
    pub two_phase: bool,
    /// A plan to start from when it fits and beats the best baseline (e.g. the plan of a
    /// neighbouring cap in a sweep): the answer is never worse than it.
    pub hint: Option<Schedule>,
    /// The plans searched: the runtime's, or exactly what FSDP2 executes (DESIGN §4.9).
    pub target: Target,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            objective: Objective::Time,
            memory_cap_bytes: None,
            time_limit_s: 60.0,
            effort: Effort::DEFAULT,
            relative_gap: 1e-4,
            threads: 2,
            limits: WindowLimits::FULL,
            allow_recompute: true,
            two_phase: true,
            hint: None,
            target: Target::Runtime,
        }
    }
}

impl SolveOptions {
    /// [`Self::allow_recompute`] as the ILP's columns and the baselines' variants take it.
    pub fn recompute_choice(&self) -> RecomputeChoice {
        if self.allow_recompute {
            RecomputeChoice::Allowed
        } else {
            RecomputeChoice::Forbidden
        }
    }
}

/// How a solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SolveStatus {
    /// Proven within the requested relative gap (exactly optimal where the gap is ≤ 1e-9).
    Optimal,
    /// The effort was spent with the gap above the requested one.
    GapLimit,
    /// The outer time limit stopped a run or kept a phase from starting: the plan may differ from
    /// run to run.
    TimeLimit,
}

impl SolveStatus {
    /// The name written in plan files and JSON.
    pub fn name(self) -> &'static str {
        match self {
            SolveStatus::Optimal => "optimal",
            SolveStatus::GapLimit => "gap_limit",
            SolveStatus::TimeLimit => "time_limit",
        }
    }
}

/// The relaxation a bound-only run solved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Relaxation {
    /// The LP relaxation (integrality dropped), solved outright or priced (DESIGN §4.5).
    Lp,
    /// The far-band relaxation, a MIP (DESIGN §4.5, "far bands").
    FarBands,
}

/// One HiGHS run.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// The plans this run searched.
    pub window_depth: WindowLimits,
    /// The run solved a relaxation: no plan, only a bound over every plan within its windows
    /// (DESIGN §4.5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relaxation: Option<Relaxation>,
    pub status: SolveStatus,
    pub objective: f64,
    pub best_bound: f64,
    pub gap: f64,
    pub seconds: f64,
    /// The LP iterations it spent (the effort's unit).
    pub lp_iterations: u64,
    pub variables: usize,
    pub integer_variables: usize,
    pub constraints: usize,
}

impl PhaseReport {
    /// The size of the model this run solved.
    pub fn size(&self) -> ModelSize {
        ModelSize {
            variables: self.variables,
            integer_variables: self.integer_variables,
            constraints: self.constraints,
        }
    }
}

/// The size of a model: its columns, integer columns and rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    pub variables: usize,
    pub integer_variables: usize,
    pub constraints: usize,
}

/// The solver's account of a solve.
#[derive(Debug, Clone, Serialize)]
pub struct SolveReport {
    pub status: SolveStatus,
    /// Iteration time (time objective) or peak bytes (memory objective) of the returned plan.
    pub objective: f64,
    pub best_bound: f64,
    pub gap: f64,
    pub solve_seconds: f64,
    pub variables: usize,
    pub integer_variables: usize,
    pub constraints: usize,
    /// The baseline the solve was warm-started from and its iteration time.
    pub warm_start: Option<(String, f64)>,
    /// The window limit under which the optimality claim holds.
    pub window_depth: WindowLimits,
    pub phases: Vec<PhaseReport>,
    /// Where the returned plan lies outside the plan space the bound holds over, and why: the
    /// bound and gap are then over that space, not over this plan. None: the plan lies inside.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside_the_space: Option<OutsideTheSpace>,
}

/// Why a solve's plan lies outside the ILP's plan space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutsideTheSpace {
    /// A warm start or hint faster than the bound beyond its tolerance: a plan the ILP's columns
    /// cannot express (launches outside its windows, DESIGN §4.5).
    BeyondTheBound,
    /// An offloading warm start the offload MIP does not model (`full` offload, host steps after
    /// the backward, a reduction later than right after its backward: DESIGN §4.10), which is
    /// claimed no bound.
    OffloadBeyondTheMip,
}

/// Bound over objective, relative, beyond which the plan cannot lie in the space the bound holds
/// over: HiGHS' dual bound meets an optimum up to its tolerances (1e-9 µs apart on an optimum).
const OUTSIDE_TOLERANCE: f64 = 1e-9;

impl OutsideTheSpace {
    /// Whether and why a plan of objective `value` lies outside the space over which `bound` was
    /// proven (the bound of the time objective excludes a plan faster than it; every plan over
    /// groups of ranks, at any K, is in the space since the ILPs offer every group, DESIGN §3.11).
    pub fn of(objective: Objective, value: f64, bound: f64) -> Option<OutsideTheSpace> {
        (matches!(objective, Objective::Time) && bound - value > OUTSIDE_TOLERANCE * value.abs())
            .then_some(OutsideTheSpace::BeyondTheBound)
    }
}

/// A solved plan: the schedule, its strict simulation and the report.
#[derive(Debug, Clone)]
pub struct Solved {
    pub schedule: Schedule,
    pub simulation: Simulation,
    pub report: SolveReport,
}

impl Solved {
    /// The plan file of this solve: the solver's figures go into the producer's details
    /// ([`SolveDetails`]), the strict simulation into the prediction. No wall-clock time: a solve
    /// the clock did not stop writes the same file on any machine (DESIGN §4.6).
    pub fn plan(&self, profile: &Profile, memory_cap_bytes: Option<u64>) -> Plan {
        Plan::from_schedule(
            profile,
            &self.schedule,
            Producer::with_details("ilp", &SolveDetails::of(&self.report)),
            memory_cap_bytes,
            Predicted::of(&self.simulation),
        )
    }
}
