//! `profile analytic`'s node layout (DESIGN §3.11, issue 63): the device's nodes by default once
//! the world spans more than one, one link under `--flat` (exactly the library's flat profile),
//! and the summary line (text and JSON) saying which; a world that does not fill the nodes and
//! `--flat` beside `--gpus-per-node` are refused.

mod common;

use common::{assert_success, shardplan};
use serde_json::Value;
use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::profile::{Link, Profile};
use std::path::Path;

const MODEL: &str = "models/llama2-7b.toml";

/// `profile analytic` of llama2-7b on `world` H100 SXMs with `extra` flags, under `--json`: the
/// process's output and the profile's path.
fn analytic(dir: &Path, world: &str, extra: &[&str]) -> (std::process::Output, String) {
    let out = dir.join(format!("n{world}.toml")).display().to_string();
    let mut args = vec![
        "profile",
        "analytic",
        "--model",
        MODEL,
        "--device",
        "h100-sxm",
        "--world-size",
        world,
        "--out",
        &out,
        "--json",
    ];
    args.extend_from_slice(extra);
    (shardplan(&args), out)
}

/// The library's profile of llama2-7b on `world` H100 SXMs, flat (`topology` None) or on nodes.
fn library(world: u32, topology: Option<Option<u32>>) -> Profile {
    let model = ModelSpec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL)).unwrap();
    let options = AnalyticOptions {
        topology,
        ..AnalyticOptions::new("h100-sxm", world)
    };
    analytic_profile(&model, &Catalog::bundled().unwrap(), &options).unwrap()
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn sixty_four_ranks_default_to_eight_nodes_of_eight() {
    let dir = tempfile::tempdir().unwrap();
    let (out, path) = analytic(dir.path(), "64", &[]);
    assert_success(&out);
    let profile = Profile::load(Path::new(&path)).unwrap();
    let topology = profile.topology.as_ref().expect("a topology by default");
    assert_eq!(topology.gpus_per_node, 8);
    // DESIGN §3.11, by hand: shard groups of 8 (the node) and 16, 32 (whole nodes), the replica
    // groups of 64/8 = 8, 4 and 2 ranks across nodes, and the hpZ group of 8 inside a node.
    let mut groups: Vec<(u32, Link)> = topology.groups.iter().map(|g| (g.ranks, g.link)).collect();
    groups.sort_by_key(|&(ranks, link)| (ranks, link == Link::Inter));
    let expected = [
        (2, Link::Inter),
        (4, Link::Inter),
        (8, Link::Intra),
        (8, Link::Inter),
        (16, Link::Inter),
        (32, Link::Inter),
    ];
    assert_eq!(groups, expected);
    assert_eq!(profile.digest(), library(64, Some(Some(8))).digest());
    let summary = json(&out);
    assert_eq!(
        summary["layout_summary"],
        "64 ranks on 8 nodes of 8 (intra: nvlink4, inter: ib-ndr400)"
    );
    assert_eq!(summary["layout"]["kind"], "nodes");
    assert_eq!(summary["layout"]["nodes"], 8);
    assert_eq!(summary["gpus_per_node"], 8);
    // The text line says the same.
    let text = shardplan(&[
        "profile",
        "analytic",
        "--model",
        MODEL,
        "--device",
        "h100-sxm",
        "--world-size",
        "64",
        "--out",
        &path,
    ]);
    assert_success(&text);
    let line = String::from_utf8_lossy(&text.stdout);
    assert!(
        line.contains(", 64 ranks on 8 nodes of 8 (intra: nvlink4, inter: ib-ndr400), "),
        "{line}"
    );
}

#[test]
fn one_node_stays_flat_on_its_intra_link() {
    let dir = tempfile::tempdir().unwrap();
    for (world, n) in [("8", 8), ("1", 1)] {
        let (out, path) = analytic(dir.path(), world, &[]);
        assert_success(&out);
        let profile = Profile::load(Path::new(&path)).unwrap();
        assert!(profile.topology.is_none(), "N = {world}");
        assert_eq!(profile.digest(), library(n, None).digest());
        let summary = json(&out);
        let expected = format!("{world} ranks on one link (flat: nvlink4)");
        assert_eq!(summary["layout_summary"], expected.as_str());
        assert_eq!(summary["layout"]["kind"], "flat");
        assert_eq!(summary["gpus_per_node"], Value::Null);
    }
}

#[test]
fn flat_writes_exactly_the_library_flat_profile() {
    let dir = tempfile::tempdir().unwrap();
    let (out, path) = analytic(dir.path(), "64", &["--flat"]);
    assert_success(&out);
    let profile = Profile::load(Path::new(&path)).unwrap();
    let flat = library(64, None);
    assert!(profile.topology.is_none());
    assert_eq!(profile, flat);
    assert_eq!(profile.digest(), flat.digest());
    assert_eq!(json(&out)["digest"], flat.digest().as_str());
    assert_eq!(
        json(&out)["layout_summary"],
        "64 ranks on one link (flat: ib-ndr400)"
    );
    // Negative control: the default at 64 is another profile.
    assert_ne!(flat.digest(), library(64, Some(Some(8))).digest());
}

#[test]
fn flat_beside_a_node_size_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    for node in ["8", "catalog"] {
        let (out, path) = analytic(dir.path(), "64", &["--flat", "--gpus-per-node", node]);
        assert_eq!(out.status.code(), Some(2));
        let error = json(&out)["error"].as_str().unwrap().to_string();
        assert!(
            error.contains("--flat") && error.contains("--gpus-per-node"),
            "{error}"
        );
        assert!(!Path::new(&path).exists(), "nothing is written");
    }
}

#[test]
fn a_world_that_does_not_fill_the_nodes_is_refused_naming_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let (out, path) = analytic(dir.path(), "12", &[]);
    assert_eq!(out.status.code(), Some(2));
    let refused = json(&out);
    assert_eq!(refused["file"], "--world-size");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("a multiple of h100-sxm's 8 GPUs a node") && error.contains("got 12"),
        "{error}"
    );
    assert!(!Path::new(&path).exists(), "nothing is written");
    // Either explicit layout takes it: one link, or nodes of 4 (3 of them).
    let (flat, path) = analytic(dir.path(), "12", &["--flat"]);
    assert_success(&flat);
    assert_eq!(
        Profile::load(Path::new(&path)).unwrap().digest(),
        library(12, None).digest()
    );
    let (fours, _) = analytic(dir.path(), "12", &["--gpus-per-node", "4"]);
    assert_success(&fours);
    assert_eq!(
        json(&fours)["layout_summary"],
        "12 ranks on 3 nodes of 4 (intra: nvlink4, inter: ib-ndr400)"
    );
}

/// The demo's bundled profiles (README's first command) are `profile analytic`'s default and
/// `--flat` profiles of Llama-2 70B on 64 H100 SXMs, and its default on one node of 8 (the
/// one-node part).
#[test]
fn the_demo_profiles_are_the_default_and_the_flat_profile() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (bundled, world, extra) in [
        ("profiles/llama2-70b-h100-8x8.toml", "64", &[][..]),
        ("profiles/llama2-70b-h100-n64.toml", "64", &["--flat"][..]),
        ("profiles/llama2-70b-h100-n8.toml", "8", &[][..]),
    ] {
        let out = dir.path().join("70b.toml").display().to_string();
        let mut args = vec![
            "profile",
            "analytic",
            "--model",
            "models/llama2-70b.toml",
            "--device",
            "h100-sxm",
            "--world-size",
            world,
            "--out",
            &out,
        ];
        args.extend_from_slice(extra);
        assert_success(&shardplan(&args));
        let written = Profile::load(Path::new(&out)).unwrap();
        let bundled = Profile::load(&root.join(bundled)).unwrap();
        assert_eq!(written.digest(), bundled.digest(), "{world} {extra:?}");
    }
}
