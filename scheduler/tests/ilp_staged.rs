//! A staged solve (depth 1, depth 4, then full windows) of a model large enough to stage:
//! Llama-2 7B on 64 H100s. Its full-window bound comes from the LP relaxation too, which bounds
//! every plan it met from below; the claim it reports is one the phases prove.

mod common;

use shardplan_scheduler::ilp::{SolveOptions, lp_relaxation_bound, solve};
use shardplan_scheduler::profile::Profile;

#[test]
fn a_staged_solve_bounds_every_plan_with_the_lp_relaxation() {
    let path = common::repo_root().join("profiles/llama2-7b-h100-n64.toml");
    let profile = Profile::load(&path).unwrap();
    let options = SolveOptions {
        memory_cap_bytes: Some(20 << 30),
        relative_gap: 1e-3,
        ..SolveOptions::default()
    };
    let solved = solve(&profile, &options).unwrap();
    let report = &solved.report;
    let depths: Vec<String> = report
        .phases
        .iter()
        .map(|p| {
            format!(
                "{}{}",
                p.window_depth,
                if p.lp_relaxation { " (LP)" } else { "" }
            )
        })
        .collect();
    let lp = report
        .phases
        .iter()
        .find(|p| p.lp_relaxation)
        .unwrap_or_else(|| panic!("no LP phase in {depths:?}"));
    assert!(lp.window_depth.is_full(), "{depths:?}");
    // The relaxation is a lower bound on every plan found, in any window.
    for phase in report.phases.iter().filter(|p| p.objective.is_finite()) {
        assert!(
            lp.best_bound <= phase.objective * (1.0 + 1e-9),
            "{phase:?} vs {lp:?}"
        );
    }
    assert!(lp.best_bound <= report.objective);
    // The same bound, computed alone.
    let alone = lp_relaxation_bound(&profile, &options).unwrap().unwrap();
    assert!(
        (alone - lp.best_bound).abs() <= 1e-6 * alone,
        "{alone} vs {lp:?}"
    );
    // The claim: a full-window gap at most the target, proven by a full-window phase.
    assert!(report.window_depth.is_full(), "{depths:?}: {report:?}");
    assert!(report.gap <= options.relative_gap, "{report:?}");
    assert!(report.best_bound >= lp.best_bound * (1.0 - 1e-12));
    assert!(
        (report.objective - solved.simulation.iteration_time_us).abs() <= 1e-6 * report.objective
    );
}
