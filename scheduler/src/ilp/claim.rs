//! What a plan's value is, and what the phases of a solve prove about it: the objective of a
//! schedule and the claim (status, bound, gap, window) the returned plan carries.

use super::{Objective, OutsideTheSpace, PhaseReport, SolveReport, SolveStatus, WindowLimits};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, memory_by_slot, simulate};
use serde::{Serialize, Serializer};

/// The value of the objective for a schedule: strict iteration time, or peak bytes.
pub(super) fn objective_of(profile: &Profile, objective: Objective, schedule: &Schedule) -> f64 {
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
    pub fn claim_for(
        &self,
        schedule: &Schedule,
        (objective, value): (Objective, f64),
        target: f64,
    ) -> SolveReport {
        let claim = claim(&self.phases, schedule, value, target);
        SolveReport {
            // The clock that stopped this solve stopped it for any plan.
            status: if self.status == SolveStatus::TimeLimit {
                SolveStatus::TimeLimit
            } else {
                claim.status
            },
            objective: value,
            best_bound: claim.best_bound,
            gap: claim.gap,
            window_depth: claim.window_depth,
            outside_the_space: OutsideTheSpace::of(objective, value, claim.best_bound),
            ..self.clone()
        }
    }
}

/// What the phases of a solve prove about one plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Claim {
    /// Optimal when the gap meets the target, else `gap_limit`.
    pub status: SolveStatus,
    /// The bound of the phase that proves the most.
    pub best_bound: f64,
    /// The plan's gap over that bound, relative to its objective.
    pub gap: f64,
    /// The plans that bound holds over.
    pub window_depth: WindowLimits,
}

/// The claim the returned plan (`schedule`, objective `value`) carries: each phase whose window
/// limit contains the plan proves that no plan within that limit beats `value` by more than
/// (value − bound)/value. The widest window whose gap meets `target` wins ("within 0.1% of every
/// plan" says more than "optimal among depth-1 plans"); when none meets it, the smallest gap. The
/// status is optimal when the gap meets `target` (or is ≤ 1e-9), else the effort ended the search
/// short of it (`gap_limit`); whether the clock stopped the solve is the solve's to say.
pub(super) fn claim(phases: &[PhaseReport], schedule: &Schedule, value: f64, target: f64) -> Claim {
    let gap_of = |p: &PhaseReport| ((value - p.best_bound) / value.abs().max(1e-12)).max(0.0);
    let mut admitted: Vec<&PhaseReport> = phases
        .iter()
        .filter(|p| p.window_depth.admit(schedule))
        .collect();
    admitted.sort_by(|a, b| {
        b.window_depth
            .breadth()
            .cmp(&a.window_depth.breadth())
            .then(gap_of(a).total_cmp(&gap_of(b)))
    });
    let best = admitted
        .iter()
        .find(|p| gap_of(p) <= target.max(1e-9))
        .or_else(|| {
            admitted
                .iter()
                .min_by(|a, b| gap_of(a).total_cmp(&gap_of(b)))
        })
        .copied()
        .unwrap_or_else(|| phases.last().expect("at least one phase ran"));
    let gap = gap_of(best);
    let status = if gap <= target.max(1e-9) {
        SolveStatus::Optimal
    } else {
        SolveStatus::GapLimit
    };
    Claim {
        status,
        best_bound: best.best_bound,
        gap,
        window_depth: best.window_depth,
    }
}

/// The claim as a plan file writes it, the `[producer.details]` of a solved plan: status,
/// objective, bound, gap, the plans the bound holds over and the warm start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SolveDetails {
    pub status: SolveStatus,
    pub objective: f64,
    pub best_bound: f64,
    pub gap: f64,
    /// As text ("full windows", "window depth 4").
    #[serde(serialize_with = "as_text")]
    pub window_depth: WindowLimits,
    /// The baseline the solve started from, with its iteration time ("fsdp2 (1234.5 us)").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<String>,
}

impl SolveDetails {
    /// What `report` claims, as written in a plan file.
    pub fn of(report: &SolveReport) -> SolveDetails {
        SolveDetails {
            status: report.status,
            objective: report.objective,
            best_bound: report.best_bound,
            gap: report.gap,
            window_depth: report.window_depth,
            warm_start: report
                .warm_start
                .as_ref()
                .map(|(name, time)| format!("{name} ({time:.1} us)")),
        }
    }
}

fn as_text<S: Serializer>(limits: &WindowLimits, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::zoo_profile;
    use crate::baselines::{BaselineKind, baseline};
    use crate::ilp::{OutsideTheSpace, WindowLimits};
    use crate::schedule::Recompute;

    /// A phase over every plan with `bound`, ended with `status`.
    fn over_every_plan(bound: f64, status: SolveStatus) -> PhaseReport {
        PhaseReport {
            window_depth: WindowLimits::FULL,
            relaxation: None,
            status,
            objective: f64::NAN,
            best_bound: bound,
            gap: f64::NAN,
            seconds: 0.0,
            lp_iterations: 0,
            variables: 0,
            integer_variables: 0,
            constraints: 0,
        }
    }

    /// Optimal when the gap meets the target, whatever the phase's own status; gap_limit above
    /// it (the effort ran out), even where the phase that proves the most was stopped by the
    /// clock: that is the solve's to say.
    #[test]
    fn the_status_is_whether_the_gap_meets_the_target() {
        let plan = baseline(
            &zoo_profile("gpt2-small", 8),
            BaselineKind::Ddp,
            Recompute::Off,
            None,
        )
        .unwrap()
        .schedule;
        let target = 1e-3;
        let met = claim(
            &[over_every_plan(999.5, SolveStatus::GapLimit)],
            &plan,
            1000.0,
            target,
        );
        assert_eq!((met.status, met.gap), (SolveStatus::Optimal, 5e-4));
        let short = claim(
            &[over_every_plan(990.0, SolveStatus::TimeLimit)],
            &plan,
            1000.0,
            target,
        );
        assert_eq!(short.status, SolveStatus::GapLimit);
        assert!((short.gap - 0.01).abs() < 1e-12);
        let exact = claim(
            &[over_every_plan(1000.0, SolveStatus::GapLimit)],
            &plan,
            1000.0,
            0.0,
        );
        assert_eq!((exact.status, exact.gap), (SolveStatus::Optimal, 0.0));
    }

    /// A plan faster than the bound of the time objective beyond its tolerance (1e-9 relative)
    /// lies outside the space; at the bound, within the tolerance or above it, inside; the memory
    /// objective's bound excludes nothing here.
    #[test]
    fn a_plan_beyond_the_bound_lies_outside_the_space() {
        let of = |objective, bound| OutsideTheSpace::of(objective, 1000.0, bound);
        assert_eq!(of(Objective::Time, 1000.0), None);
        assert_eq!(of(Objective::Time, 1000.0 + 1e-7), None);
        assert_eq!(of(Objective::Time, 999.0), None);
        assert_eq!(
            of(Objective::Time, 1000.01),
            Some(OutsideTheSpace::BeyondTheBound)
        );
        let memory = Objective::Memory {
            max_iteration_time_us: None,
        };
        assert_eq!(of(memory, 1000.01), None);
    }
}
