//! docs/ARCHITECTURE.md's module tables against the tree: every module a table names is a file of
//! its crate, and every file of the crate is named, so the code map cannot drift from the code.
//! A row's first cell names modules in backticks: `a::b` (a path), or `a` followed by its parts
//! in parentheses (`backend` (`mod`) is backend/mod.rs; `measure` (`mod`, `timing`) also
//! measure/timing.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rows' first cells of the table under the heading `heading`.
fn first_cells(doc: &str, heading: &str) -> Vec<String> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no `{heading}`"));
    doc[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.split('|').nth(1).unwrap_or("").trim().to_string())
        .collect()
}

/// The backticked words of `cell`, in order.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The module paths a first cell names (`::`-separated).
fn named(cell: &str) -> Vec<String> {
    let words = ticked(cell);
    let Some((first, parts)) = words.split_first() else {
        return Vec::new();
    };
    let in_parentheses = cell.contains('(');
    let mut paths = Vec::new();
    if !in_parentheses {
        paths.extend(words.iter().map(|w| w.to_string()));
        return paths;
    }
    for part in parts {
        paths.push(if *part == "mod" {
            first.to_string()
        } else {
            format!("{first}::{part}")
        });
    }
    paths
}

/// Every module of the crate whose sources are under `src`, as a `::` path (a folder's mod.rs is
/// the folder's path; lib.rs is none).
fn modules(src: &Path, extension: &str) -> BTreeSet<String> {
    fn walk(dir: &Path, prefix: &str, extension: &str, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let joined = |name: &str| {
                if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}::{name}")
                }
            };
            if path.is_dir() {
                walk(&path, &joined(&name), extension, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some(extension) {
                match name.as_str() {
                    "lib" | "__init__" => {}
                    "mod" => {
                        out.insert(prefix.to_string());
                    }
                    _ => {
                        out.insert(joined(&name));
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(src, "", extension, &mut out);
    out
}

fn check(heading: &str, src: &str, extension: &str) {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let in_table: BTreeSet<String> = first_cells(&doc, heading)
        .iter()
        .flat_map(|cell| named(cell))
        .collect();
    let in_tree = modules(&root().join(src), extension);
    let unknown: Vec<_> = in_table.difference(&in_tree).collect();
    let unnamed: Vec<_> = in_tree.difference(&in_table).collect();
    assert!(
        unknown.is_empty() && unnamed.is_empty(),
        "{heading}: named but not in {src}: {unknown:?}; in {src} but not named: {unnamed:?}"
    );
}

#[test]
fn the_scheduler_table_names_every_module_and_only_those() {
    check("## `shardplan-scheduler` modules", "scheduler/src", "rs");
}

#[test]
fn the_runtime_table_names_every_module_and_only_those() {
    check("## `shardplan-runtime` modules", "runtime/src", "rs");
}

#[test]
fn the_python_table_names_every_module_and_only_those() {
    check(
        "## `python/shardplan_torch`",
        "python/shardplan_torch",
        "py",
    );
}

/// The reader itself: the forms the tables use.
#[test]
fn first_cells_name_paths_and_parenthesised_parts() {
    assert_eq!(named("`ilp::far`"), ["ilp::far"]);
    assert_eq!(named("`backend` (`mod`)"), ["backend"]);
    assert_eq!(
        named("`measure` (`mod`, `timing`)"),
        ["measure", "measure::timing"]
    );
    assert_eq!(
        named("`gpt2::tensors`, `gpt2::weights`"),
        ["gpt2::tensors", "gpt2::weights"]
    );
}
