//! `shardplan profile measure`: parses the options, starts the backend, prints what the runtime
//! measured and saves the profile (rank 0).

use super::end_job_on_failure;
use crate::cli::MeasureArgs;
use crate::output::{Output, outln, print_json};
use serde_json::json;
use shardplan_runtime::dispatch::start;
use shardplan_runtime::measure::{LaunchRow, MeasureOptions, Measured, by_category, measure_model};
use shardplan_runtime::model_file::ModelFile;
use shardplan_scheduler::cost::Interference;
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::size::format_bytes;

pub fn measure(args: MeasureArgs) -> anyhow::Result<()> {
    check_outputs_distinct(&[("--out", &args.out)], &[("--model", &args.model)])?;
    let model = ModelFile::load(&args.model)?;
    let origin = args.model.display().to_string();
    let options = MeasureOptions {
        world_size: args.world_size,
        device: args.device.clone(),
        micro_batch: args.micro_batch,
        seq_len: args.seq_len,
        max_message: args.max_message,
        repeats: args.repeats as usize,
        block_size: args.block_size,
        gpus_per_node: args.gpus_per_node,
        launch_times: args.launch_times,
        host_link: args.host_link,
    };
    let (universe, backend) = start(args.backend.kind()?)?;
    let result = measure_model(backend, model, &origin, &options);
    let measured = end_job_on_failure(
        universe.as_ref(),
        result.map_err(Into::into),
        Output::of_json_flag(args.json),
    )?;
    let Measured {
        profile,
        rank,
        details,
        launches,
    } = measured;
    if rank == 0 {
        save(&profile, &args, details, &launches)?;
    }
    Ok(())
}

fn save(
    profile: &Profile,
    args: &MeasureArgs,
    details: serde_json::Value,
    launches: &[LaunchRow],
) -> anyhow::Result<()> {
    profile.save(&args.out)?;
    if args.json {
        print_json(&json!({"out": args.out, "units": profile.unit_count(),
                           "block_size_bytes": profile.block_size_bytes, "details": details}));
    } else {
        let interference = Interference::of(profile);
        outln!(
            "wrote {}: {} units, block size {}, compute slowed {:.3} / {:.3} / {:.3} µs per µs of AllReduce / ReduceScatter / AllGather and {:.3} per µs of optimizer steps beside it, communication {:.3} µs per µs of compute",
            args.out.display(),
            profile.unit_count(),
            format_bytes(profile.block_size_bytes as f64),
            interference.compute,
            interference.reduce_scatter,
            interference.all_gather,
            interference.update,
            interference.comm
        );
        if let Some(host) = profile.source.get("host") {
            outln!("  host: {host}");
        }
        if !launches.is_empty() {
            print_launches(launches);
        }
    }
    Ok(())
}

/// Where a step's device time goes: the longest launch rows, and the step's total.
fn print_launches(rows: &[LaunchRow]) {
    const SHOWN: usize = 20;
    let total: f64 = rows.iter().map(|r| r.us).sum();
    outln!(
        "  launches of one step, one by one: {:.3} ms in all",
        total / 1e3
    );
    let categories: Vec<String> = by_category(rows)
        .iter()
        .map(|(category, us)| {
            let name = category.name();
            format!("{name} {:.3} ms ({:.1}%)", us / 1e3, 100.0 * us / total)
        })
        .collect();
    outln!("  by kind: {}", categories.join(", "));
    outln!(
        "  {:<10} {:<9} {:<32} {:>6} {:>10} {:>6} {:>8}",
        "unit",
        "pass",
        "launch",
        "count",
        "ms",
        "share",
        "TFLOP/s"
    );
    for row in rows.iter().take(SHOWN) {
        let rate = match row.flops > 0.0 && row.us > 0.0 {
            true => format!("{:.1}", row.flops / row.us / 1e6),
            false => String::new(),
        };
        outln!(
            "  {:<10} {:<9} {:<32} {:>6} {:>10.3} {:>5.1}% {:>8}",
            row.unit,
            row.pass,
            row.name,
            row.launches,
            row.us / 1e3,
            100.0 * row.us / total,
            rate
        );
    }
    if rows.len() > SHOWN {
        outln!("  … {} more rows under --json", rows.len() - SHOWN);
    }
}
