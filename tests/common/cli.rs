//! Helpers of the binary's end-to-end tests (`tests/cli.rs`, `tests/cli_errors.rs`): a command's
//! JSON output, a failure's exit code and line, and analytic profiles written to a folder.

use super::shardplan;
use serde_json::Value;
use std::path::Path;

/// The JSON object a successful command prints (`--json`).
pub fn ok_json(args: &[&str]) -> Value {
    let out = shardplan(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON object ({e})"))
}

/// Exit code and the single stderr line of a failing command.
pub fn fails(args: &[&str]) -> (i32, String) {
    let out = shardplan(args);
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    (out.status.code().unwrap(), stderr)
}

pub fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `model`'s analytic profile on `n` H100 SXMs on one link (`--flat`: the solves and claims these
/// tests check are the flat model's; the node layout's are tests/hierarchical.rs').
pub fn analytic(dir: &Path, model: &str, n: &str) -> String {
    let out = path(dir, &format!("{model}.toml"));
    ok_json(&[
        "profile",
        "analytic",
        "--model",
        &format!("models/{model}.toml"),
        "--device",
        "h100-sxm",
        "--world-size",
        n,
        "--flat",
        "--out",
        &out,
        "--json",
    ]);
    out
}
