//! What a solve may spend (DESIGN §4.6): its effort, a budget of LP iterations that each phase
//! turns into deterministic HiGHS limits, and the clock of the outer time limit, which, when it
//! stops a run or skips a phase, makes the solve's status `time_limit`.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The solver work one search of a solve may spend, in thousands of LP iterations (`--effort`).
/// HiGHS counts every simplex iteration of a MIP's LPs (root, cuts, nodes, heuristics) in one
/// total, the same on any machine and under any load, so a solve that spends a share of it per
/// phase returns the same plan wherever it runs (for the same `--threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effort(NonZeroU64);

impl Effort {
    /// The default: on the demo (Llama-2 70B on 8 nodes of 8, 79.65 GiB, two searches) about
    /// the CPU time its former 20 s limit gave on 2 cores (DESIGN §4.6: 100 took 61 CPU-seconds).
    pub const DEFAULT: Effort = Effort(NonZeroU64::new(60).unwrap());

    pub fn new(thousands: NonZeroU64) -> Self {
        Effort(thousands)
    }

    /// The effort in thousands of LP iterations.
    pub fn thousands(self) -> u64 {
        self.0.get()
    }

    /// The effort in LP iterations.
    pub(super) fn iterations(self) -> u64 {
        self.0.get().saturating_mul(1000)
    }
}

/// LP iterations below which no phase starts: it could not finish a root LP.
const LEAST_WORK: u64 = 1000;

/// What one search of a solve may still spend: LP iterations (each search starts from the whole
/// effort and spends what its HiGHS runs report), under the solve's outer clock.
#[derive(Debug, Clone)]
pub(super) struct Budget<'c> {
    total: u64,
    spent: u64,
    clock: &'c Clock,
}

impl<'c> Budget<'c> {
    pub fn new(effort: Effort, clock: &'c Clock) -> Self {
        Budget {
            total: effort.iterations(),
            spent: 0,
            clock,
        }
    }

    pub fn clock(&self) -> &'c Clock {
        self.clock
    }

    /// `share` of the whole effort, at most what is left.
    pub fn share(&self, share: f64) -> u64 {
        ((self.total as f64 * share) as u64).min(self.left())
    }

    /// What is left.
    pub fn left(&self) -> u64 {
        self.total.saturating_sub(self.spent)
    }

    /// What is left, at least what a phase needs to start (for the full-window MIP, which runs
    /// even without work left when no plan was found, to tell an infeasible cap).
    pub fn rest(&self) -> u64 {
        self.left().max(LEAST_WORK)
    }

    pub fn spend(&mut self, iterations: u64) {
        self.spent = self.spent.saturating_add(iterations);
    }

    /// Whether a phase may start: enough work is left and the clock has not run out (which, if
    /// it has, it records).
    pub fn can_start(&self) -> bool {
        self.left() >= LEAST_WORK && !self.clock.expired()
    }
}

/// The outer time limit of a solve (`--time-limit`): a guard, not the budget. It records whether
/// it stopped a HiGHS run or kept a phase from starting: then the plan may differ from run to run,
/// and the solve says so (`time_limit`).
#[derive(Debug)]
pub(super) struct Clock {
    deadline: Instant,
    fired: AtomicBool,
}

/// The share of a time limit kept for what follows its deadline, at most [`WRAP_UP_MAX`]: a phase
/// that started just before builds its model before HiGHS can stop it, and the solve then counts
/// the model's size and simulates its plan (on the demo under `--time-limit 1` these took 0.3 s
/// past a deadline at the limit).
const WRAP_UP_SHARE: f64 = 0.1;
const WRAP_UP_MAX: Duration = Duration::from_secs(2);

impl Clock {
    /// A clock that stops the solve's runs `seconds` after `start`, less the wrap-up's share, so
    /// that the solve ends within the limit; a limit past what a clock can hold (`unlimited`,
    /// 1e12 s) is a century.
    pub fn new(start: Instant, seconds: f64) -> Self {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
        let limit = Duration::try_from_secs_f64(seconds).map_or(CENTURY, |d| d.min(CENTURY));
        let wrap_up = limit.mul_f64(WRAP_UP_SHARE).min(WRAP_UP_MAX);
        Clock {
            deadline: start + (limit - wrap_up),
            fired: AtomicBool::new(false),
        }
    }

    /// Seconds left (0 once the limit has passed).
    pub fn seconds_left(&self) -> f64 {
        self.deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    }

    /// Whether the limit has passed; if so, it has kept something from running.
    pub fn expired(&self) -> bool {
        let expired = Instant::now() >= self.deadline;
        if expired {
            self.record_stop();
        }
        expired
    }

    /// Records that the limit stopped a run.
    pub fn record_stop(&self) {
        self.fired.store(true, Ordering::Release);
    }

    /// Whether the limit stopped a run or kept one from starting.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit past what the clock holds is a century from now less the wrap-up's 2 s, never a
    /// panic; one within it is itself less a tenth, at most 2 s.
    #[test]
    fn deadlines_are_the_limit_less_its_wrap_up() {
        let start = Instant::now();
        let century = Duration::from_secs(100 * 365 * 86_400);
        for seconds in [1e12, f64::INFINITY, f64::MAX] {
            assert_eq!(
                Clock::new(start, seconds).deadline - start,
                century - Duration::from_secs(2)
            );
        }
        let deadline = |seconds| Clock::new(start, seconds).deadline - start;
        assert_eq!(deadline(2.5), Duration::from_millis(2250));
        assert_eq!(deadline(1.0), Duration::from_millis(900));
        assert_eq!(deadline(60.0), Duration::from_secs(58));
        assert_eq!(deadline(0.0), Duration::ZERO);
    }

    #[test]
    fn a_clock_fires_only_once_past() {
        let clock = Clock::new(Instant::now(), 3600.0);
        assert!(!clock.expired());
        assert!(!clock.fired());
        let passed = Clock::new(Instant::now(), 0.0);
        assert!(passed.expired());
        assert!(passed.fired());
    }

    #[test]
    fn shares_are_of_the_whole_and_at_most_what_is_left() {
        let clock = Clock::new(Instant::now(), 3600.0);
        let mut budget = Budget::new(Effort::new(NonZeroU64::new(10).unwrap()), &clock);
        assert_eq!(budget.share(0.25), 2500);
        budget.spend(9000);
        assert_eq!(budget.share(0.25), 1000);
        assert!(budget.can_start());
        budget.spend(1);
        assert!(!budget.can_start());
        budget.spend(u64::MAX);
        assert_eq!(budget.left(), 0);
        assert!(!clock.fired());
    }
}
