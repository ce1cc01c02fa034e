//! nccl-tests import: real outputs of each layout parse to their (bytes, µs) points; failed
//! validations and malformed files are refused with a clear error; `comm import` updates a
//! profile.

use shardplan_scheduler::nccl_tests::{Imported, parse};
use shardplan_scheduler::profile::{Link, Profile};
use shardplan_scheduler::timeline::Collective;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> (String, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nccl-tests")
        .join(name);
    (
        std::fs::read_to_string(&path).unwrap(),
        path.display().to_string(),
    )
}

fn import(name: &str, collective: Collective) -> Imported {
    let (text, origin) = fixture(name);
    parse(&text, &origin, collective).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn points(name: &str, collective: Collective) -> Vec<(u64, f64)> {
    import(name, collective).curve.points
}

/// The error of importing fixture `name` as `collective`.
fn refusal(name: &str, collective: Collective) -> String {
    let (text, origin) = fixture(name);
    match parse(&text, &origin, collective) {
        Ok(_) => panic!("{name} imported as {collective:?}"),
        Err(e) => e.to_string(),
    }
}

use Collective::{AllGather, AllReduce, ReduceScatter};

#[test]
fn current_layout_with_root_and_wrong_counts() {
    let p = points("current-layout.txt", AllReduce);
    assert_eq!(p.len(), 10);
    assert_eq!(p[0], (4, 12.49));
    assert_eq!(
        p[3],
        (32, 24.63),
        "the out-of-place time, not the in-place 13.10"
    );
    assert_eq!(p[9], (2048, 16.49));
}

#[test]
fn header_without_hash_marks_and_interleaved_logs_and_na() {
    let p = points("current-layout-no-hash.txt", AllGather);
    assert_eq!(
        (p.len(), p[0], p[5]),
        (6, (8388608, 784.9), (268435456, 5066.8))
    );
    let p = points("current-layout-na-and-logs.txt", AllGather);
    assert_eq!(
        (p.len(), p[0], p[5]),
        (6, (1048576, 52.94), (33554432, 538.8))
    );
}

#[test]
fn older_layout_without_root_and_with_error_deviation_or_na() {
    let p = points("older-layout-error.txt", AllReduce);
    assert_eq!((p.len(), p[0], p[5]), (6, (8, 22.54), (256, 24.35)));
    let p = points("older-layout-na.txt", AllReduce);
    assert_eq!((p.len(), p[0], p[2]), (6, (8, 4849.2), (32, 113.5)));
}

#[test]
fn mpirun_tagged_output_and_json() {
    assert_eq!(
        points("mpirun-tagged.txt", AllReduce),
        points("current-layout.txt", AllReduce)
    );
    assert_eq!(
        points("json-output.json", AllReduce),
        vec![(4, 12.49), (1024, 16.38), (2048, 16.49)]
    );
}

#[test]
fn failed_validation_and_malformed_files_are_refused() {
    let (text, _) = fixture("current-layout.txt");
    let wrong = text.replacen(
        "16.26    0.03    0.06      0",
        "16.26    0.03    0.06      3",
        1,
    );
    let e = parse(&wrong, "ag.txt", AllReduce).unwrap_err().to_string();
    assert!(
        e.contains("ag.txt:")
            && e.contains("#wrong")
            && e.contains("got 3 out-of-place at size 512"),
        "{e}"
    );
    let footer = text.replace(
        "Out of bounds values : 0 OK",
        "Out of bounds values : 2 FAILED",
    );
    assert!(
        parse(&footer, "ag.txt", AllReduce)
            .unwrap_err()
            .to_string()
            .contains("got 2: the run failed validation")
    );
    let (json, _) = fixture("json-output.json");
    let e = parse(
        &json.replacen("\"nwrong\":0.000000", "\"nwrong\":5.000000", 1),
        "ar.json",
        AllReduce,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("results[0].out_of_place.nwrong"), "{e}");
    assert!(
        parse("{\"results\": 3}", "x.json", AllReduce)
            .unwrap_err()
            .to_string()
            .contains("field `results`")
    );
    assert!(
        parse("{not json", "x.json", AllReduce)
            .unwrap_err()
            .to_string()
            .starts_with("x.json:1:")
    );
    let e = parse("hello\nworld\n", "empty.txt", AllReduce)
        .unwrap_err()
        .to_string();
    assert!(e.contains("found none"), "{e}");
    let bad_time = text.replacen("16.26", "fast", 1);
    assert!(
        parse(&bad_time, "ag.txt", AllReduce)
            .unwrap_err()
            .to_string()
            .contains("out-of-place time")
    );
    let twice = format!(
        "{text}{}",
        text.lines()
            .filter(|l| l.contains(" 2048 "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        parse(&twice, "ag.txt", AllReduce)
            .unwrap_err()
            .to_string()
            .contains("2048 appears twice")
    );
}

#[test]
fn comm_import_replaces_curves_and_recomputes_the_block_size() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_shardplan");
    let profile = dir.path().join("p.toml");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        Command::new(bin)
            .current_dir(root)
            .args([
                "profile",
                "analytic",
                "--model",
                "models/llama2-7b.toml",
                "--device",
                "h100-sxm",
                "--world-size",
                "8",
                "--out",
                profile.to_str().unwrap()
            ])
            .status()
            .unwrap()
            .success()
    );
    let fixtures = root.join("tests/fixtures/nccl-tests");
    let out = dir.path().join("measured.toml");
    let output = Command::new(bin)
        .args([
            "comm",
            "import",
            "--all-gather",
            fixtures
                .join("current-layout-no-hash.txt")
                .to_str()
                .unwrap(),
        ])
        .args([
            "--reduce-scatter",
            fixtures
                .join("reduce-scatter-size0-8ranks.txt")
                .to_str()
                .unwrap(),
        ])
        .args([
            "--all-reduce",
            fixtures.join("json-output.json").to_str().unwrap(),
        ])
        .args([
            "--into",
            profile.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let p = shardplan_scheduler::profile::Profile::load(&out).unwrap();
    assert_eq!(p.comm.all_gather.points[0], (8388608, 784.9));
    assert_eq!(p.comm.all_reduce.points.len(), 3);
    // Algorithmic bandwidth of the all-gather rows: 64 MiB / 1432.6 µs = 46.8 GB/s, 88% of the best
    // (128 MiB / 2516.9 µs = 53.3 GB/s), so 128 MiB is the first power of two at 90%; the
    // reduce-scatter's two rows (128 and 256 B) give 256 B and the all-reduce rows 2 KiB: the
    // block is 128 MiB.
    assert_eq!(p.block_size_bytes, 134217728);
    let refused = Command::new(bin)
        .args(["comm", "import", "--into", profile.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let notes = &report["imported"]["reduce_scatter"]["notes"];
    assert_eq!(report["imported"]["reduce_scatter"]["ranks"], 8);
    assert!(
        notes[0]
            .as_str()
            .unwrap()
            .contains("skipped 5 rows of size 0"),
        "{notes}"
    );
    assert!(
        report["imported"]["all_gather"]["notes"][0]
            .as_str()
            .unwrap()
            .contains("measured on 16 ranks, the profile is for 8"),
        "{report}"
    );
    // A curve file given as the output is refused before anything is read or written.
    let before = std::fs::read(fixtures.join("all-reduce-8ranks.txt")).unwrap();
    let clobber = Command::new(bin)
        .args(["comm", "import", "--all-reduce"])
        .arg(fixtures.join("all-reduce-8ranks.txt"))
        .args(["--into", profile.to_str().unwrap(), "--out"])
        .arg(fixtures.join("all-reduce-8ranks.txt"))
        .output()
        .unwrap();
    assert_eq!(clobber.status.code(), Some(2));
    assert_eq!(
        std::fs::read(fixtures.join("all-reduce-8ranks.txt")).unwrap(),
        before
    );
}

/// `--link`: a 4-rank all_gather_perf run becomes the curves of the topology's group of 4 ranks
/// across nodes (32 ranks as 4 nodes of 8: the replica groups of the 8-rank shard groups); the
/// world's curves and the block size stay. Refused naming `--link`: a profile without a topology,
/// a group it does not have (4 ranks inside a node), a file that does not say its rank count.
#[test]
fn comm_import_into_a_topology_group() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_shardplan");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let analytic = |name: &str, extra: &[&str]| {
        let path = dir.path().join(name);
        let status = Command::new(bin)
            .current_dir(root)
            .args(["profile", "analytic", "--model", "models/llama2-7b.toml"])
            .args(["--device", "h100-sxm", "--world-size", "32", "--out"])
            .arg(&path)
            .args(extra)
            .status()
            .unwrap();
        assert!(status.success());
        path
    };
    let nodes = analytic("nodes.toml", &["--gpus-per-node", "catalog"]);
    let flat = analytic("flat.toml", &["--flat"]);
    let fixtures = root.join("tests/fixtures/nccl-tests");
    let out = dir.path().join("out.toml");
    let import = |into: &Path, (flag, file): (&str, &str), link: &str| {
        Command::new(bin)
            .args(["comm", "import", flag])
            .arg(fixtures.join(file))
            .arg("--into")
            .arg(into)
            .arg("--out")
            .arg(&out)
            .args(["--link", link])
            .output()
            .unwrap()
    };
    let four = ("--all-gather", "current-layout-na-and-logs.txt");
    let done = import(&nodes, four, "inter");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let before = Profile::load(&nodes).unwrap();
    let after = Profile::load(&out).unwrap();
    let expected = import_curve(four.1, AllGather);
    let group = |p: &Profile| {
        p.topology
            .as_ref()
            .unwrap()
            .curves(4, Link::Inter)
            .unwrap()
            .clone()
    };
    assert_eq!(group(&after).all_gather, expected);
    assert_ne!(group(&before).all_gather, expected);
    assert_eq!(group(&after).all_reduce, group(&before).all_reduce);
    assert_eq!(
        (&after.comm, after.block_size_bytes),
        (&before.comm, before.block_size_bytes)
    );
    let refused = |out: std::process::Output, fragment: &str| {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("--link") && err.contains(fragment), "{err}");
    };
    refused(import(&flat, four, "inter"), "a profile with a topology");
    refused(import(&nodes, four, "intra"), "got 4 ranks intra");
    refused(
        import(&nodes, ("--all-reduce", "all-reduce-8ranks.txt"), "intra"),
        "says its rank count",
    );
}

fn import_curve(name: &str, collective: Collective) -> shardplan_scheduler::curve::CommCurve {
    import(name, collective).curve
}

#[test]
fn size_zero_rows_are_skipped_and_counted() {
    let rs = import("reduce-scatter-size0-8ranks.txt", ReduceScatter);
    assert_eq!(rs.curve.points, vec![(128, 32.31), (256, 24.01)]);
    assert_eq!(rs.ranks, Some(8));
    assert_eq!(
        rs.notes,
        vec!["skipped 5 rows of size 0 (requested sizes below one element per rank)"]
    );
    let ag = import("all-gather-size0-2ranks.txt", AllGather);
    assert_eq!(
        (ag.curve.points.len(), ag.curve.points[0], ag.ranks),
        (7, (32, 11.70), Some(2))
    );
    assert!(ag.notes[0].contains("skipped 2 rows"), "{:?}", ag.notes);
}

#[test]
fn ranks_come_from_the_count_column() {
    assert_eq!(import("all-reduce-8ranks.txt", AllReduce).ranks, None);
    assert_eq!(
        import("current-layout-no-hash.txt", AllGather).ranks,
        Some(16)
    );
    assert_eq!(
        import("current-layout-na-and-logs.txt", AllGather).ranks,
        Some(4)
    );
    assert_eq!(points("all-reduce-8ranks.txt", AllReduce).len(), 11);
}

#[test]
fn another_collectives_output_is_refused() {
    let cases: [(&str, Collective, &[&str]); 8] = [
        // redop: an all_reduce (sum) as the all_gather curve, an all_gather (none) as
        // reduce_scatter.
        (
            "all-reduce-8ranks.txt",
            AllGather,
            &["all-reduce-8ranks.txt:1: field `redop`", "got `sum`"],
        ),
        (
            "current-layout-no-hash.txt",
            ReduceScatter,
            &["field `redop`", "got `none`"],
        ),
        // count: an all_reduce (count = size / 4) as reduce_scatter, and the reverse.
        (
            "current-layout.txt",
            ReduceScatter,
            &["field `count`", "an all_reduce_perf output"],
        ),
        (
            "reduce-scatter-size0-8ranks.txt",
            AllReduce,
            &["field `count`", "size is 8 × count"],
        ),
        // The test's own name: the footer of an alltoall run, the program in a -J file.
        (
            "alltoall-named-footer.txt",
            AllGather,
            &["field `test`", "got one of alltoall_perf"],
        ),
        (
            "json-output.json",
            AllGather,
            &["got one of all_reduce_perf"],
        ),
        // Several types and ops in one table: refused whichever op it is imported as.
        ("many-types-and-ops.txt", AllGather, &["field `redop`"]),
        ("many-types-and-ops.txt", AllReduce, &["appears twice"]),
    ];
    for (name, collective, fragments) in cases {
        let e = refusal(name, collective);
        for fragment in fragments {
            assert!(e.contains(fragment), "{name} as {collective:?}: {e}");
        }
    }
}

#[test]
fn result_rows_with_sizes_that_are_not_byte_counts_are_refused() {
    let (text, _) = fixture("current-layout.txt");
    for (bad, shown) in [("-2048", "-2048"), ("2048.5", "2048.5")] {
        let edited = text.replacen("        2048 ", &format!("{bad:>12} "), 1);
        let e = parse(&edited, "ar.txt", AllReduce).unwrap_err().to_string();
        assert!(
            e.contains("ar.txt:15: field `size`") && e.contains(shown),
            "{e}"
        );
    }
    // A count whose bytes overflow u64 is a wrong count, not an arithmetic wrap.
    let huge = text.replacen(
        "           512     float",
        " 4611686018427387904     float",
        1,
    );
    let e = parse(&huge, "ar.txt", AllReduce).unwrap_err().to_string();
    assert!(e.contains("ar.txt:15: field `count`"), "{e}");
}
