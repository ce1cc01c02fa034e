//! `shardplan comm import`: nccl-tests measurements into a profile.

use crate::cli::{CommImportArgs, LinkArg};
use crate::failure::flag_error;
use crate::output::{outln, print_json};
use serde_json::json;
use shardplan_scheduler::io::{check_outputs_distinct, read_text};
use shardplan_scheduler::nccl_tests::{Imported, parse};
use shardplan_scheduler::profile::{CommCurves, Link, Profile};
use shardplan_scheduler::size::format_bytes;
use shardplan_scheduler::timeline::Collective;
use std::path::Path;

pub fn import(args: CommImportArgs) -> anyhow::Result<()> {
    let files: Vec<(Collective, &str, &Path)> = [
        (Collective::AllGather, "--all-gather", &args.all_gather),
        (
            Collective::ReduceScatter,
            "--reduce-scatter",
            &args.reduce_scatter,
        ),
        (Collective::AllReduce, "--all-reduce", &args.all_reduce),
    ]
    .into_iter()
    .filter_map(|(op, flag, file)| file.as_deref().map(|f| (op, flag, f)))
    .collect();
    if files.is_empty() {
        return Err(flag_error(
            "--all-gather",
            "at least one of --all-gather, --reduce-scatter, --all-reduce",
        ));
    }
    let (out_flag, out) = match &args.out {
        Some(out) => ("--out", out),
        None => ("--into", &args.into),
    };
    let inputs: Vec<(&str, &Path)> = files.iter().map(|&(_, flag, f)| (flag, f)).collect();
    check_outputs_distinct(&[(out_flag, out)], &inputs)?;
    let mut profile = Profile::load(&args.into)?;
    let link = args.link.map(|l| match l {
        LinkArg::Intra => Link::Intra,
        LinkArg::Inter => Link::Inter,
    });
    let mut imported = serde_json::Map::new();
    for (op, _, path) in files {
        let Imported {
            curve,
            ranks,
            mut notes,
        } = parse(&read_text(path)?, &path.display().to_string(), op)?;
        let into = match link {
            None => {
                if let Some(ranks) = ranks.filter(|&r| r != u64::from(profile.world_size)) {
                    notes.push(format!(
                        "measured on {ranks} ranks, the profile is for {}: its times stand for that world size",
                        profile.world_size
                    ));
                }
                &mut profile.comm
            }
            Some(link) => group_curves(&mut profile, ranks, link, path)?,
        };
        let name = op.test_name();
        imported.insert(
            name.to_string(),
            json!({
                "file": path,
                "points": curve.points.len(),
                "first": curve.points[0],
                "last": curve.points[curve.points.len() - 1],
                "ranks": ranks,
                "notes": notes,
            }),
        );
        let slot = match op {
            Collective::AllGather => &mut into.all_gather,
            Collective::ReduceScatter => &mut into.reduce_scatter,
            Collective::AllReduce => &mut into.all_reduce,
        };
        *slot = curve;
        let key = match link {
            None => format!("{name}_curve"),
            Some(link) => format!("{name}_curve_{}", link.name()),
        };
        profile
            .source
            .insert(key, format!("nccl-tests: {}", path.display()));
    }
    profile.block_size_bytes = args.block_size.unwrap_or_else(|| profile.comm.block_size());
    profile.validate(&out.display().to_string())?;
    profile.save(out)?;
    if args.json {
        print_json(
            &json!({"out": out, "block_size_bytes": profile.block_size_bytes, "imported": imported, "digest": profile.digest()}),
        );
    } else {
        for (op, info) in &imported {
            outln!(
                "{op}: {} points from {}",
                info["points"],
                info["file"].as_str().unwrap_or_default()
            );
            for note in info["notes"].as_array().into_iter().flatten() {
                outln!("  note: {}", note.as_str().unwrap_or_default());
            }
        }
        outln!(
            "wrote {}: block size {}",
            out.display(),
            format_bytes(profile.block_size_bytes as f64)
        );
    }
    Ok(())
}

/// The curves of the topology's group of the file's `ranks` ranks on `link`; the error names
/// `--link` and what the profile offers.
fn group_curves<'a>(
    profile: &'a mut Profile,
    ranks: Option<u64>,
    link: Link,
    path: &Path,
) -> anyhow::Result<&'a mut CommCurves> {
    let Some(topology) = profile.topology.as_mut() else {
        return Err(flag_error(
            "--link",
            "a profile with a topology (profile analytic --gpus-per-node); this one has a single link",
        ));
    };
    let Some(ranks) = ranks else {
        return Err(flag_error(
            "--link",
            format!(
                "a file that says its rank count (nccl-tests' `nranks`); {} does not",
                path.display()
            ),
        ));
    };
    let groups = &mut topology.groups;
    match groups
        .iter()
        .position(|g| u64::from(g.ranks) == ranks && g.link == link)
    {
        Some(k) => Ok(&mut groups[k].comm),
        None => {
            let offered: Vec<String> = groups
                .iter()
                .map(|g| format!("{} ranks {}", g.ranks, g.link.name()))
                .collect();
            Err(flag_error(
                "--link",
                format!(
                    "a group of the profile's topology ({}), got {ranks} ranks {} (from {})",
                    offered.join(", "),
                    link.name(),
                    path.display()
                ),
            ))
        }
    }
}
