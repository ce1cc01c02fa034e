//! The smallest cap `solve` names where nothing fits even with offload (DESIGN §4.10) is a cap a
//! plan fits exactly: solving again at it, to the byte, succeeds, and one byte less is refused.
//! GPT-2 small at N = 8 (analytic, with a host): its fsdp2-offload+ckpt baseline, `full` offload
//! outside the offload ILP's space, peaks below every plan of that space.

mod common;

use common::{assert_success, shardplan};

#[test]
fn the_named_minimum_cap_with_offload_fits_and_a_byte_less_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("gpt2-small-n8.toml").display().to_string();
    let out = dir.path().join("plan.toml").display().to_string();
    assert_success(&shardplan(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "h100-sxm",
        "--world-size",
        "8",
        "--out",
        &profile,
    ]));
    let solve = |cap: &str| {
        shardplan(&[
            "solve",
            "--profile",
            &profile,
            "--memory-cap",
            cap,
            "--out",
            &out,
        ])
    };
    let refused = solve("300MiB");
    assert_eq!(refused.status.code(), Some(3));
    let message = String::from_utf8(refused.stderr).unwrap();
    assert!(
        message.contains("offload to the host included"),
        "{message}"
    );
    let bytes: u64 = message
        .split(" bytes) with offload")
        .next()
        .and_then(|head| head.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minimum cap in: {message}"));
    assert_success(&solve(&bytes.to_string()));
    let plan = std::fs::read_to_string(&out).unwrap();
    assert!(plan.contains("offload"), "{plan}");
    assert_eq!(solve(&(bytes - 1).to_string()).status.code(), Some(3));
}
