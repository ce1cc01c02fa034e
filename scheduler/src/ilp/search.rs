//! One search's state (DESIGN §4.5): the plans it has met (`Pool`), the HiGHS runs it has made
//! (their `PhaseReport`s, from which the claim is read) and the work it may still spend
//! (`Budget`). Every phase of a solve takes the search, runs HiGHS within a share of the budget
//! and records the run; two searches on two threads each own a copy and join in a fixed order.

use super::PhaseReport;
use super::bound::FullWindowBound;
use super::effort::Budget;
use super::pool::Pool;
use super::run::{Run, Stop};

/// The plans a search has met, its runs and what it may still spend.
#[derive(Clone)]
pub(super) struct Search<'a, 'c> {
    pub pool: Pool<'a>,
    pub phases: Vec<PhaseReport>,
    pub budget: Budget<'c>,
}

impl<'a, 'c> Search<'a, 'c> {
    /// A search that has met the plans of `pool` and made no run yet.
    pub fn new(pool: Pool<'a>, budget: Budget<'c>) -> Self {
        Search {
            pool,
            phases: Vec::new(),
            budget,
        }
    }

    /// A run's stop at `work` LP iterations and at `objective_target`, under the solve's clock.
    pub fn stop(&self, work: u64, objective_target: Option<f64>) -> Stop<'c> {
        Stop {
            work,
            objective_target,
            clock: self.budget.clock(),
        }
    }

    /// Records `run`: its work spent, its phase kept, its plan offered to the pool (which takes it
    /// where it fits the cap); the run handed back without its plan.
    pub fn record(&mut self, mut run: Run) -> Run {
        self.budget.spend(run.work);
        if let Some(schedule) = run.schedule.take() {
            self.pool.offer(schedule);
        }
        self.phases.push(run.phase.clone());
        run
    }

    /// Whether the runs prove the best plan within the solve's gap over every plan.
    pub fn proven(&self) -> bool {
        self.pool.proven(&self.phases)
    }

    /// Whether the runs and `bound` prove the best plan.
    pub fn proven_with(&self, bound: &FullWindowBound) -> bool {
        let with_bound: Vec<_> = self.phases.iter().cloned().chain(bound.phase()).collect();
        self.pool.proven(&with_bound)
    }

    /// Joins `other`, a search of the same solve copied from this one when this one had made
    /// `forked_at` runs: its plans this one lacks, and its runs since the copy, after this one's
    /// (a fixed order, whichever ended first).
    pub fn join(&mut self, mut other: Search<'a, '_>, forked_at: usize) {
        self.pool.absorb(other.pool);
        self.phases.extend(other.phases.drain(forked_at..));
    }
}
