//! The `shardplan` binary's refusals: usage errors and bad inputs exit 2 with one line naming
//! the file and field, plans bound to their profile and checked against the rules, and an
//! impossible cap exits 3. (Its outputs: `tests/cli.rs`.)

mod common;

use common::cli::{analytic, fails, ok_json, path};
use std::path::{Path, PathBuf};

#[test]
fn usage_errors_exit_2() {
    assert_eq!(
        fails(&[
            "baseline",
            "--profile",
            "x",
            "--kind",
            "ddp",
            "--memory-cap",
            "0GiB",
            "--out",
            "y"
        ])
        .0,
        2
    );
    assert_eq!(
        fails(&[
            "baseline",
            "--profile",
            "x",
            "--kind",
            "ddp",
            "--memory-cap",
            "-5GiB",
            "--out",
            "y"
        ])
        .0,
        2
    );
    assert_eq!(
        fails(&[
            "profile",
            "analytic",
            "--model",
            "m",
            "--device",
            "d",
            "--world-size",
            "0",
            "--out",
            "o"
        ])
        .0,
        2
    );
    assert_eq!(fails(&["simulate", "--profile", "x"]).0, 2);
}

#[test]
fn bad_inputs_exit_2_with_one_line_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "8");
    let out = path(dir.path(), "never.toml");
    let ddp_baseline = |profile: &str| {
        fails(&[
            "baseline",
            "--profile",
            profile,
            "--kind",
            "ddp",
            "--out",
            &out,
        ])
    };

    let (code, msg) = ddp_baseline("missing.toml");
    assert_eq!((code, msg.lines().count()), (2, 1), "{msg}");
    assert!(msg.contains("missing.toml: cannot read"), "{msg}");

    let (code, msg) = fails(&[
        "profile",
        "analytic",
        "--model",
        "models/gpt2-small.toml",
        "--device",
        "tpu-v9",
        "--world-size",
        "8",
        "--out",
        &out,
    ]);
    assert_eq!(code, 2);
    assert!(msg.contains("h100-sxm") && msg.contains("tpu-v9"), "{msg}");

    let text = std::fs::read_to_string(&profile).unwrap();
    let broken = path(dir.path(), "broken.toml");
    std::fs::write(&broken, text.replacen("forward_us = ", "forward_us = -", 2)).unwrap();
    let (code, msg) = ddp_baseline(&broken);
    assert_eq!(code, 2);
    assert!(
        msg.contains("broken.toml") && msg.contains("units[1].forward_us"),
        "{msg}"
    );

    std::fs::write(
        &broken,
        text.replacen("block_size_bytes = 67108864", "block_size_bytes = 1", 1),
    )
    .unwrap();
    let (code, msg) = ddp_baseline(&broken);
    assert_eq!(code, 2);
    assert!(
        msg.contains("field `block_size_bytes`") && msg.contains("at most 100000 blocks"),
        "{msg}"
    );

    std::fs::write(&broken, text.replacen("params = ", "parameters = ", 1)).unwrap();
    let (code, msg) = ddp_baseline(&broken);
    assert_eq!(code, 2);
    assert!(
        msg.contains("broken.toml:") && msg.contains("parameters"),
        "{msg}"
    );

    let (code, msg) = fails(&[
        "baseline",
        "--profile",
        &profile,
        "--kind",
        "zero4",
        "--out",
        &out,
    ]);
    assert_eq!(code, 2);
    assert!(msg.contains("zero4") && msg.contains("best-grid"), "{msg}");
    assert!(!Path::new(&out).exists(), "a failed command left an output");
}

#[test]
fn plans_are_bound_to_their_profile_and_checked_against_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let small = analytic(dir.path(), "gpt2-small", "8");
    let other = analytic(dir.path(), "gpt2-xl", "8");
    let plan = path(dir.path(), "p.toml");
    ok_json(&[
        "baseline",
        "--profile",
        &small,
        "--kind",
        "zero2",
        "--out",
        &plan,
        "--json",
    ]);

    let (code, msg) = fails(&["simulate", "--profile", &other, "--plan", &plan]);
    assert_eq!(code, 2);
    assert!(msg.contains("made for profile sha256:"), "{msg}");

    // Move block.3's gather onto its own forward slot: outside its window.
    let text = std::fs::read_to_string(&plan).unwrap();
    let start = text.find("name = \"block.3\"").unwrap();
    let ag = start + text[start..].find("ag = [[\"").unwrap();
    let end = ag + text[ag..].find('\n').unwrap();
    let bad = format!("{}ag = [[\"F4\", 1]]{}", &text[..ag], &text[end..]);
    let bad_path = path(dir.path(), "bad.toml");
    std::fs::write(&bad_path, bad).unwrap();
    let (code, msg) = fails(&["simulate", "--profile", &small, "--plan", &bad_path]);
    assert_eq!(code, 2);
    assert!(
        msg.contains("unit 4 `block.3`")
            && msg.contains("AG at F4")
            && msg.contains("outside its window"),
        "{msg}"
    );

    let unknown_slot = text.replacen("[[\"", "[[\"Q", 1);
    std::fs::write(&bad_path, unknown_slot).unwrap();
    let (code, msg) = fails(&["simulate", "--profile", &small, "--plan", &bad_path]);
    assert_eq!(code, 2);
    assert!(
        msg.contains("bad.toml:") && msg.contains("F<i>, B<i>, E or I"),
        "{msg}"
    );
}

#[test]
fn best_grid_with_an_impossible_cap_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let profile = analytic(dir.path(), "gpt2-small", "8");
    let out = PathBuf::from(path(dir.path(), "p.toml"));
    let (code, msg) = fails(&[
        "baseline",
        "--profile",
        &profile,
        "--kind",
        "best-grid",
        "--memory-cap",
        "1MiB",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{msg}");
    assert!(msg.contains("smallest grid peak"), "{msg}");
    assert!(!out.exists());
}
