//! FSDP2 export: levels become fully_shard settings, gather slots become prefetch lists, and
//! every rounding is listed.

mod common;

use common::{affine, profile, schedule};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::export::fsdp2;
use shardplan_scheduler::schedule::Recompute;

/// Four units of one block each (B = 10 kB).
fn four_units() -> shardplan_scheduler::profile::Profile {
    let unit = (1000, 10.0, 20.0, 100, 10, 0, 0);
    profile(
        4,
        10_000,
        0.0,
        0.0,
        (2, 2, 12),
        &[unit; 4],
        affine(1.0, 10.0),
        affine(1.0, 10.0),
        affine(1.0, 10.0),
    )
}

#[test]
fn fsdp1_is_exact_and_keeps_fsdp2_defaults() {
    let p = four_units();
    let e = fsdp2(
        &p,
        &baseline(&p, BaselineKind::Fsdp1, Recompute::Off, None)
            .unwrap()
            .schedule,
    )
    .unwrap();
    assert!(e.exact, "{:?}", e.approximations);
    let levels: Vec<_> = e
        .units
        .iter()
        .map(|u| (u.level, u.reshard_after_forward))
        .collect();
    assert_eq!(
        levels,
        [
            ("fsdp", Some(true)),
            ("fsdp", Some(true)),
            ("fsdp", Some(true)),
            ("sdp", Some(false))
        ]
    );
    // FSDP2 issues a module's own gather at its own pre-forward, exposed: each unit's forward
    // prefetches the next. Backward: FSDP2's default prefetch of the previous unit is fsdp1's.
    let lists: Vec<_> = e
        .units
        .iter()
        .map(|u| (u.forward_prefetch.clone(), u.backward_prefetch.is_empty()))
        .collect();
    let next = |n: &str| (vec![n.to_string()], true);
    assert_eq!(lists, [next("u2"), next("u3"), next("u4"), (vec![], true)]);
    assert_eq!(e.changes.len(), 3, "{:?}", e.changes);
    // Exact: the settings run the plan's schedule, so FSDP2's time is the plan's; its peak adds
    // FSDP2's copies (all-gather output, reduce-scatter input).
    assert_eq!(e.fsdp2_iteration_time_us, e.plan_iteration_time_us);
    assert!(e.fsdp2_peak_memory_bytes > e.plan_peak_memory_bytes);
    assert_eq!(e.fsdp2_timeline.len(), 8);
    assert_eq!(e.fsdp2_timeline[0].at, "F:u1");
    assert_eq!(e.fsdp2_timeline[4].at, "B:u4");
}

#[test]
fn deeper_gathers_become_prefetch_lists_and_the_rest_is_rounded() {
    let p = four_units();
    let s = schedule(
        &p,
        r#"
        [[units]]
        name = "u1"
        level = "none"
        ar = [["E", 1]]
        [[units]]
        name = "u2"
        level = "fsdp"
        recompute = true
        rs = [["B1", 1]]
        agf = [["E", 1]]
        agb = [["B4", 1]]
        [[units]]
        name = "u3"
        level = "fsdp"
        rs = [["B2", 1]]
        agf = [["F1", 1]]
        agb = [["F4", 1]]
        [[units]]
        name = "u4"
        level = "sdp"
        rs = [["E", 1]]
        ag = [["F2", 1]]
    "#,
    )
    .unwrap();
    let e = fsdp2(&p, &s).unwrap();
    let u = &e.units;
    assert_eq!(
        (u[0].sharded, u[0].reshard_after_forward),
        (false, None),
        "none: replicated"
    );
    assert!(u[1].recompute);
    // u3's forward gather at F1 (depth 2) and u2's gather at E (rounded to F1): unit 1 prefetches both.
    assert_eq!(u[0].forward_prefetch, ["u2", "u3"]);
    // u4's gather at F2 is depth 2: unit 2 prefetches it.
    assert_eq!(u[1].forward_prefetch, ["u4"]);
    // u2's backward gather at B4 (depth 2): unit 4's backward prefetches it; u3's at F4 is rounded to B4.
    assert_eq!(u[3].backward_prefetch.len(), 2);
    assert!(!e.exact);
    let notes = e.approximations.join("\n");
    for expected in [
        "u2: AGF planned at E",
        "u3: AGB planned at F4",
        "u4: RS planned at E",
    ] {
        assert!(notes.contains(expected), "missing `{expected}` in\n{notes}");
    }
    // u4's explicit list switches off its default prefetch of u3 (which the list then names).
    let changes = e.changes.join("\n");
    assert!(
        changes.contains(
            "u4.backward_prefetch = [u3, u2]; switches off FSDP2's default prefetch of u3"
        ),
        "{changes}"
    );
}
