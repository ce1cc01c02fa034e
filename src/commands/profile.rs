//! `shardplan profile analytic`.

use crate::cli::{AnalyticArgs, AttentionArg};
use crate::output::{ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::hf_config::load_model;
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::model::Attention;
use shardplan_scheduler::profile::BytesPerParam;
use shardplan_scheduler::size::format_bytes;

pub fn analytic(args: AnalyticArgs) -> anyhow::Result<()> {
    let mut inputs = vec![("--model", args.model.as_path())];
    inputs.extend(args.catalog.as_deref().map(|c| ("--catalog", c)));
    check_outputs_distinct(&[("--out", &args.out)], &inputs)?;
    let model = load_model(&args.model)?;
    let catalog = match &args.catalog {
        Some(path) => Catalog::load(path)?,
        None => Catalog::bundled()?,
    };
    let options = AnalyticOptions {
        seq_len: args.seq_len,
        micro_batch: args.micro_batch,
        micro_batches: args.micro_batches,
        mfu: args.mfu,
        attention: match args.attention {
            AttentionArg::Flash => Attention::Flash,
            AttentionArg::Eager => Attention::Eager,
        },
        bytes_per_param: BytesPerParam {
            param: args.param_bytes,
            grad: args.grad_bytes,
            optimizer: args.optimizer_bytes,
        },
        block_size_bytes: args.block_size,
        overlap_slowdown: args.overlap_slowdown,
        comm_slowdown: args.comm_slowdown,
        topology: args.gpus_per_node.map(|g| g.ranks()),
        ..AnalyticOptions::new(&args.device, args.world_size)
    };
    let profile = analytic_profile(&model, &catalog, &options)?;
    profile.save(&args.out)?;
    let total_params: u64 = profile.units.iter().map(|u| u.params).sum();
    let compute_us: f64 = profile
        .units
        .iter()
        .map(|u| u.forward_us + u.backward_us)
        .sum();
    if args.json {
        print_json(&json!({
            "out": args.out,
            "name": profile.name,
            "digest": profile.digest(),
            "units": profile.unit_count(),
            "total_params": total_params,
            "block_size_bytes": profile.block_size_bytes,
            "compute_us": compute_us,
        }));
    } else {
        outln!(
            "wrote {}: {} units, {:.3} B parameters, block size {}, compute {} per iteration",
            args.out.display(),
            profile.unit_count(),
            total_params as f64 / 1e9,
            format_bytes(profile.block_size_bytes as f64),
            ms(compute_us)
        );
    }
    Ok(())
}
