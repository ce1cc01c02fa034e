//! `shardplan comm import`: nccl-tests measurements into a profile.

use crate::cli::CommImportArgs;
use crate::output::print_json;
use serde_json::json;
use shardplan_scheduler::io::read_text;
use shardplan_scheduler::nccl_tests::parse;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::size::format_bytes;

pub fn import(args: CommImportArgs) -> anyhow::Result<()> {
    let files = [
        ("all_gather", &args.all_gather),
        ("reduce_scatter", &args.reduce_scatter),
        ("all_reduce", &args.all_reduce),
    ];
    anyhow::ensure!(
        files.iter().any(|(_, f)| f.is_some()),
        "give at least one of --all-gather, --reduce-scatter, --all-reduce"
    );
    let mut profile = Profile::load(&args.into)?;
    let mut imported = serde_json::Map::new();
    for (op, file) in files {
        let Some(path) = file else { continue };
        let curve = parse(&read_text(path)?, &path.display().to_string())?;
        imported.insert(op.to_string(), json!({"file": path, "points": curve.points.len(), "first": curve.points[0], "last": curve.points[curve.points.len() - 1]}));
        let slot = match op {
            "all_gather" => &mut profile.comm.all_gather,
            "reduce_scatter" => &mut profile.comm.reduce_scatter,
            _ => &mut profile.comm.all_reduce,
        };
        *slot = curve;
        profile.source.insert(
            format!("{op}_curve"),
            format!("nccl-tests: {}", path.display()),
        );
    }
    profile.block_size_bytes = args.block_size.unwrap_or_else(|| profile.comm.block_size());
    let out = args.out.as_ref().unwrap_or(&args.into);
    profile.validate(&out.display().to_string())?;
    profile.save(out)?;
    if args.json {
        print_json(
            &json!({"out": out, "block_size_bytes": profile.block_size_bytes, "imported": imported, "digest": profile.digest()}),
        );
    } else {
        for (op, info) in &imported {
            println!(
                "{op}: {} points from {}",
                info["points"],
                info["file"].as_str().unwrap_or_default()
            );
        }
        println!(
            "wrote {}: block size {}",
            out.display(),
            format_bytes(profile.block_size_bytes as f64)
        );
    }
    Ok(())
}
