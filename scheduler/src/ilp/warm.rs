//! A solve's warm start: the best baseline for the objective (checkpointing on or off) that fits
//! the cap and the time ceiling — the fastest for the time objective, the smallest peak for
//! memory — among the baselines built before the solve's deadline, so that the time limit holds
//! for them too (the baselines of the first kind are always built).

use super::SolveOptions;
use super::effort::Clock;
use crate::baselines::{BaselineKind, ChosenBaseline, baselines_at};
use crate::profile::Profile;

/// The best baseline built before `clock` runs out (which then records that it stopped the
/// solve's search: the warm start depends on the time).
pub(super) fn best_baseline(
    profile: &Profile,
    options: &SolveOptions,
    clock: &Clock,
) -> Option<ChosenBaseline> {
    let kinds = BaselineKind::of(profile);
    let cap = options.memory_cap_bytes;
    let candidates = kinds
        .iter()
        .enumerate()
        .take_while(|&(k, _)| k == 0 || !clock.expired())
        .flat_map(|(_, kind)| {
            baselines_at(
                profile,
                std::slice::from_ref(kind),
                options.recompute_choice(),
                cap,
            )
        });
    options.objective.preference().choose(candidates, cap, |c| {
        (
            c.plan.simulation.iteration_time_us,
            c.plan.simulation.peak_memory_bytes,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ilp::Objective;
    use crate::schedule::RecomputeChoice;
    use std::time::Instant;

    /// The smallest peak among every baseline is not ddp's; with the deadline already passed only
    /// the first kind, ddp, is built; with time left, the answer is the one over every baseline.
    #[test]
    fn baselines_past_the_deadline_are_not_built() {
        let text = include_str!("../../../profiles/llama2-70b-h100-n64.toml");
        let profile = Profile::from_toml(text, "llama2-70b-h100-n64.toml").unwrap();
        let options = SolveOptions {
            objective: Objective::Memory {
                max_iteration_time_us: None,
            },
            ..SolveOptions::default()
        };
        let passed_clock = Clock::new(Instant::now(), 0.0);
        let passed = best_baseline(&profile, &options, &passed_clock).unwrap();
        assert_eq!(passed.kind, BaselineKind::Ddp);
        assert!(passed_clock.fired());
        let later = Clock::new(Instant::now(), 3600.0);
        let every = crate::baselines::best_baseline(
            &profile,
            &BaselineKind::of(&profile),
            RecomputeChoice::Allowed,
            None,
            options.objective.preference(),
        )
        .unwrap();
        assert_ne!(every.kind, BaselineKind::Ddp);
        let in_time = best_baseline(&profile, &options, &later).unwrap();
        assert_eq!(in_time.label(), every.label());
        assert!(!later.fired());
    }
}
