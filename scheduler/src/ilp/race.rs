//! What a solve's two searches share while they run on two threads (DESIGN §4.5, "two
//! searches"): the best plan either has met (exact: it fits the cap by the simulator's peak) and
//! the best bound over every plan either has proven. Each HiGHS run reads them through its
//! callback ([`super::callback`]): it stops as soon as the pair proves the target, and a MIP of
//! plans takes the other search's better plan as its incumbent.

use crate::schedule::Schedule;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The best plan and bound met by the searches of one solve.
pub(super) struct Shared {
    relative_gap: f64,
    /// The largest bound over every plan, as f64 bits.
    bound: AtomicU64,
    /// The best plan met, with its objective and its generation (bumped at each improvement).
    best: Mutex<Best>,
}

struct Best {
    plan: Option<(Schedule, f64)>,
    generation: u64,
}

impl Shared {
    pub fn new(relative_gap: f64) -> Self {
        Shared {
            relative_gap,
            bound: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
            best: Mutex::new(Best {
                plan: None,
                generation: 0,
            }),
        }
    }

    /// Records a bound that holds over every plan.
    pub fn offer_bound(&self, bound: f64) {
        if bound.is_nan() {
            return;
        }
        let _ = self
            .bound
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                (bound > f64::from_bits(bits)).then_some(bound.to_bits())
            });
    }

    /// The largest bound over every plan recorded.
    pub fn bound(&self) -> f64 {
        f64::from_bits(self.bound.load(Ordering::Acquire))
    }

    /// Records a plan that fits the cap, with its objective (kept when it is the best).
    pub fn offer_plan(&self, schedule: &Schedule, value: f64) {
        let Ok(mut best) = self.best.lock() else {
            return;
        };
        if best.plan.as_ref().is_none_or(|(_, v)| value < *v) {
            best.plan = Some((schedule.clone(), value));
            best.generation += 1;
        }
    }

    /// The best plan's objective (+∞ when none).
    pub fn best_value(&self) -> f64 {
        self.best
            .lock()
            .ok()
            .and_then(|b| b.plan.as_ref().map(|(_, v)| *v))
            .unwrap_or(f64::INFINITY)
    }

    /// The best plan if it is newer than `generation`, with its generation.
    pub fn best_since(&self, generation: u64) -> Option<(Schedule, f64, u64)> {
        let best = self.best.lock().ok()?;
        let (schedule, value) = best.plan.as_ref()?;
        (best.generation > generation).then(|| (schedule.clone(), *value, best.generation))
    }

    /// Whether the best plan, or `incumbent` where it is better, is within the solve's gap of the
    /// recorded bound or `own_bound` (a bound over every plan), whichever is larger.
    pub fn proves(&self, incumbent: f64, own_bound: f64) -> bool {
        let plan = self.best_value().min(incumbent);
        let bound = self.bound().max(own_bound);
        plan.is_finite()
            && bound.is_finite()
            && (plan - bound) / plan.abs().max(1e-12) <= self.relative_gap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::zoo_profile;
    use crate::baselines::{BaselineKind, baseline};
    use crate::schedule::Recompute;

    /// A plan to share (GPT-2 small's DDP on 8 H100s).
    fn a_plan() -> Schedule {
        let profile = zoo_profile("gpt2-small", 8);
        baseline(&profile, BaselineKind::Ddp, Recompute::Off, None)
            .unwrap()
            .schedule
    }

    #[test]
    fn bound_keeps_the_largest_and_plan_the_smallest() {
        let shared = Shared::new(1e-3);
        assert_eq!(shared.bound(), f64::NEG_INFINITY);
        shared.offer_bound(-5.0);
        shared.offer_bound(f64::NAN);
        assert_eq!(shared.bound(), -5.0);
        shared.offer_bound(990.0);
        shared.offer_bound(980.0);
        assert_eq!(shared.bound(), 990.0);
        let plan = a_plan();
        assert!(shared.best_since(0).is_none());
        shared.offer_plan(&plan, 1000.0);
        shared.offer_plan(&plan, 1001.0);
        assert_eq!(shared.best_value(), 1000.0);
        let (_, value, generation) = shared.best_since(0).expect("a plan");
        assert_eq!((value, generation), (1000.0, 1));
        assert!(shared.best_since(generation).is_none());
    }

    #[test]
    fn proves_at_the_gap_and_not_beyond() {
        let shared = Shared::new(1e-3);
        assert!(!shared.proves(f64::INFINITY, f64::NEG_INFINITY));
        shared.offer_bound(999.0);
        // 1000 against 999 is exactly the gap; 1000.5 is beyond it.
        assert!(shared.proves(1000.0, f64::NEG_INFINITY));
        assert!(!shared.proves(1000.5, f64::NEG_INFINITY));
        assert!(shared.proves(1000.5, 999.6));
        shared.offer_plan(&a_plan(), 999.5);
        assert!(shared.proves(f64::INFINITY, f64::NEG_INFINITY));
    }
}
