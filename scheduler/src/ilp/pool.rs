//! The plans a solve has met, best first: every candidate (HiGHS' answers, baselines, hints, the
//! far-band search's plans) enters only if it fits the cap by the simulator's exact peak, so a
//! plan peaking at the cap to the byte is feasible and one that fits only within HiGHS'
//! feasibility tolerance is never taken (DESIGN §4.4).

use super::claim::{claim, objective_of};
use super::variables::ExtraPositions;
use super::{PhaseReport, SolveOptions, WindowLimits};
use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::sim::{Semantics, simulate};
use crate::timeline::Op;

#[derive(Clone)]
pub(super) struct Pool<'a> {
    profile: &'a Profile,
    options: &'a SolveOptions,
    /// (plan, objective), best first; plans of equal objective in the order met.
    plans: Vec<(Schedule, f64)>,
}

impl<'a> Pool<'a> {
    pub fn new(profile: &'a Profile, options: &'a SolveOptions) -> Self {
        Pool {
            profile,
            options,
            plans: Vec::new(),
        }
    }

    /// Takes the plans of another pool of the same solve that this one lacks (they fit the cap
    /// already).
    pub fn absorb(&mut self, other: Pool) {
        for (schedule, value) in other.plans {
            if self.plans.iter().any(|(s, _)| *s == schedule) {
                continue;
            }
            self.insert(schedule, value);
        }
    }

    /// Inserts a plan that fits the cap, keeping the plans best first.
    fn insert(&mut self, schedule: Schedule, value: f64) {
        let at = self.plans.partition_point(|(_, v)| *v <= value);
        self.plans.insert(at, (schedule, value));
    }

    /// Adds `schedule` when it fits the cap.
    pub fn offer(&mut self, schedule: Schedule) {
        let fits = self.options.memory_cap_bytes.is_none_or(|cap| {
            simulate(self.profile, &schedule, Semantics::Strict).peak_memory_bytes <= cap as f64
        });
        if fits {
            let value = objective_of(self.profile, self.options.objective, &schedule);
            self.insert(schedule, value);
        }
    }

    /// Every plan, best first.
    pub fn plans(&self) -> &[(Schedule, f64)] {
        &self.plans
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// The best plan's objective.
    pub fn best_value(&self) -> Option<f64> {
        self.plans.first().map(|(_, v)| *v)
    }

    /// The plans whose every launch lies within `limits` or at a position of `extra`, best first
    /// (the warm starts a model of those positions can represent).
    pub fn within(&self, limits: WindowLimits, extra: &ExtraPositions) -> Vec<(Schedule, f64)> {
        self.plans
            .iter()
            .filter(|(schedule, _)| launches_within(schedule, limits, extra))
            .cloned()
            .collect()
    }

    /// The positions of the best plan's launches that `limits` leaves out, so that a model of
    /// `limits` with them as extra positions holds it (a sweep's hint, the plan of a smaller cap,
    /// may launch far ahead).
    pub fn best_outside(&self, limits: WindowLimits) -> ExtraPositions {
        let mut outside = ExtraPositions::new();
        if let Some((schedule, _)) = self.plans.first() {
            limits.admit_or(schedule, |unit, op, position| {
                outside
                    .entry((unit, ilp_op(op)))
                    .or_default()
                    .insert(position);
                true
            });
        }
        outside
    }

    /// Keeps only the plans within `limits` (a limited solve answers within its limits only).
    pub fn retain_within(&mut self, limits: WindowLimits) {
        self.plans.retain(|(schedule, _)| limits.admit(schedule));
    }

    /// Whether `phases` prove the best plan within the solve's gap over every plan.
    pub fn proven(&self, phases: &[PhaseReport]) -> bool {
        self.plans.first().is_some_and(|(schedule, value)| {
            let c = claim(phases, schedule, *value, self.options.relative_gap);
            c.window_depth.is_full() && c.gap <= self.options.relative_gap
        })
    }

    /// The best plan and its objective.
    pub fn into_best(self) -> Option<(Schedule, f64)> {
        self.plans.into_iter().next()
    }
}

/// Whether every launch of `schedule` is at a position `limits` allows or one of `extra` (keyed
/// by the ILP's op).
fn launches_within(schedule: &Schedule, limits: WindowLimits, extra: &ExtraPositions) -> bool {
    limits.admit_or(schedule, |unit, op, position| {
        extra
            .get(&(unit, ilp_op(op)))
            .is_some_and(|e| e.contains(&position))
    })
}

/// The ILP's op of a plan's op: the forward gather of both sharded levels is `GatherForward`.
fn ilp_op(op: Op) -> Op {
    if op == Op::Gather {
        Op::GatherForward
    } else {
        op
    }
}
