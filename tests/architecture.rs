//! docs/ARCHITECTURE.md's module tables against the tree: every module a table names is a file of
//! its crate, and every file of the crate is named, so the code map cannot drift from the code.
//! A row's first cell names modules in backticks: `a::b` (a path), or `a` followed by its parts
//! in parentheses (`backend` (`mod`) is backend/mod.rs; `measure` (`mod`, `timing`) also
//! measure/timing.rs). runtime/src/lib.rs's module list is checked against its `mod` declarations
//! and the tree, and every source file holding `unsafe` must be named in the page's `unsafe`
//! paragraph.

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

/// The modules a crate root's leading `//!` comment lists: each a backticked name followed by
/// its description in parentheses (`event` (monotonic counters)).
fn listed_in_doc(root_source: &str) -> BTreeSet<String> {
    let doc: String = root_source
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .collect::<Vec<_>>()
        .join(" ");
    let pieces: Vec<&str> = doc.split('`').collect();
    pieces
        .iter()
        .enumerate()
        .skip(1)
        .step_by(2)
        .filter(|(i, _)| {
            pieces
                .get(i + 1)
                .is_some_and(|after| after.starts_with(" ("))
        })
        .map(|(_, name)| name.to_string())
        .collect()
}

/// The modules a crate root declares (`pub mod a;`, `mod b;`, attributes on lines of their own).
fn declared(root_source: &str) -> BTreeSet<String> {
    root_source
        .lines()
        .filter_map(|l| {
            let l = l
                .trim()
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn the_runtime_crate_doc_lists_every_module_and_only_those() {
    let source = std::fs::read_to_string(root().join("runtime/src/lib.rs")).unwrap();
    let listed = listed_in_doc(&source);
    let declared = declared(&source);
    let src = root().join("runtime/src");
    let top_level: BTreeSet<String> = modules(&src, "rs")
        .into_iter()
        .filter(|m| !m.contains("::"))
        .collect();
    let unlisted: Vec<_> = declared.difference(&listed).collect();
    let undeclared: Vec<_> = listed.difference(&declared).collect();
    let not_in_tree: Vec<_> = declared.difference(&top_level).collect();
    let not_declared: Vec<_> = top_level.difference(&declared).collect();
    assert!(
        unlisted.is_empty()
            && undeclared.is_empty()
            && not_in_tree.is_empty()
            && not_declared.is_empty(),
        "runtime/src/lib.rs: declared but not in its doc list: {unlisted:?}; listed but not \
         declared: {undeclared:?}; declared without a file: {not_in_tree:?}; a file not \
         declared: {not_declared:?}"
    );
}

/// The bullet of docs/ARCHITECTURE.md that starts with `` `unsafe` lives in ``.
fn unsafe_paragraph(doc: &str) -> String {
    let start = doc
        .find("- `unsafe` lives in")
        .expect("ARCHITECTURE.md has no `unsafe` paragraph");
    doc[start..]
        .lines()
        .enumerate()
        .take_while(|(i, l)| *i == 0 || l.starts_with("  "))
        .map(|(_, l)| l.trim())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `source` holds the keyword `unsafe` outside `//` comments.
fn holds_unsafe(source: &str) -> bool {
    source.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == "unsafe")
    })
}

/// Whether a backticked word of the paragraph names module `path`: the path itself, an item in
/// it (`cuda::nccl::DeviceBuffer`) or a glob over its parent (`cuda::*`).
fn names_module(words: &[&str], path: &str) -> bool {
    words.iter().any(|w| {
        *w == path
            || w.strip_prefix(path)
                .is_some_and(|rest| rest.starts_with("::"))
            || w.strip_suffix("::*")
                .is_some_and(|parent| path.starts_with(&format!("{parent}::")))
    })
}

/// The source file of module `path` under `src`.
fn module_file(src: &Path, path: &str) -> PathBuf {
    let relative = path.replace("::", "/");
    let file = src.join(format!("{relative}.rs"));
    if file.exists() {
        file
    } else {
        src.join(relative).join("mod.rs")
    }
}

#[test]
fn every_file_holding_unsafe_is_named_in_the_unsafe_paragraph() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let paragraph = unsafe_paragraph(&doc);
    let words = ticked(&paragraph);
    let mut unnamed = Vec::new();
    for src in ["src", "runtime/src", "scheduler/src"] {
        let src = root().join(src);
        for path in modules(&src, "rs") {
            let file = module_file(&src, &path);
            let source = std::fs::read_to_string(&file).unwrap();
            if holds_unsafe(&source) && !names_module(&words, &path) {
                let relative = file.strip_prefix(root()).unwrap_or(&file);
                unnamed.push(relative.display().to_string());
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "docs/ARCHITECTURE.md's `unsafe` paragraph does not name these files' modules: {unnamed:?}"
    );
}

#[test]
fn crate_docs_and_unsafe_readers_take_the_forms_they_are_given() {
    let root_source = "//! `a` (one), `b_c` (two), not `d`, nor `e`.\n\npub mod a;\nmod b_c;\n";
    assert_eq!(
        listed_in_doc(root_source),
        BTreeSet::from(["a".into(), "b_c".into()])
    );
    assert_eq!(
        declared(root_source),
        BTreeSet::from(["a".into(), "b_c".into()])
    );
    assert!(holds_unsafe("    let x = unsafe { f() };"));
    assert!(!holds_unsafe("    // SAFETY: nothing unsafe here"));
    assert!(!holds_unsafe("    let unsafe_count = 1;"));
    let words = ["cuda::*", "cuda::nccl::DeviceBuffer", "gemm"];
    assert!(names_module(&words, "cuda::work"));
    assert!(names_module(&words, "gemm"));
    assert!(!names_module(&words, "gemmx"));
    assert!(!names_module(&words, "launch"));
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
