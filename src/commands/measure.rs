//! `shardplan profile measure`: parses the options, starts the backend, prints what the runtime
//! measured and saves the profile (rank 0).

use super::end_job_on_failure;
use crate::cli::MeasureArgs;
use crate::output::{outln, print_json};
use serde_json::json;
use shardplan_runtime::dispatch::start;
use shardplan_runtime::measure::{MeasureOptions, Measured, measure_model};
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
    };
    let (universe, backend) = start(args.backend.kind()?)?;
    let result = measure_model(backend, model, &origin, &options);
    let measured = end_job_on_failure(universe.as_ref(), result.map_err(Into::into), args.json)?;
    let Measured {
        profile,
        rank,
        details,
    } = measured;
    if rank == 0 {
        save(&profile, &args, details)?;
    }
    Ok(())
}

fn save(profile: &Profile, args: &MeasureArgs, details: serde_json::Value) -> anyhow::Result<()> {
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
    }
    Ok(())
}
