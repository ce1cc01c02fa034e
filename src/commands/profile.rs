//! `shardplan profile analytic`.

use crate::cli::{AnalyticArgs, AttentionArg};
use crate::output::{ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::analytic::{AnalyticOptions, RankLayout, analytic_profile};
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
        ..AnalyticOptions::new(&args.device, args.world_size)
    }
    .laid_out(&catalog, args.node_layout())?;
    let profile = analytic_profile(&model, &catalog, &options)?;
    profile.save(&args.out)?;
    let total_params: u64 = profile.units.iter().map(|u| u.params).sum();
    let compute_us: f64 = profile
        .units
        .iter()
        .map(|u| u.forward_us + u.backward_us)
        .sum();
    let seq_len = options.seq_len.unwrap_or(model.seq_len);
    let gpus_per_node = profile.topology.as_ref().map(|t| t.gpus_per_node);
    let layout = RankLayout::of(&profile, catalog.device(&options.device)?);
    if args.json {
        print_json(&json!({
            "out": args.out,
            "name": profile.name,
            "digest": profile.digest(),
            "units": profile.unit_count(),
            "total_params": total_params,
            "seq_len": seq_len,
            "micro_batch": options.micro_batch,
            "micro_batches": profile.micro_batches,
            "world_size": profile.world_size,
            "gpus_per_node": gpus_per_node,
            "layout": layout,
            "layout_summary": layout.to_string(),
            "block_size_bytes": profile.block_size_bytes,
            "compute_us": compute_us,
        }));
    } else {
        outln!(
            "wrote {}: {} units, {} parameters, seq_len {seq_len}, micro-batch {}, K = {}, {layout}, \
             block size {}, compute {} per iteration",
            args.out.display(),
            profile.unit_count(),
            parameters(total_params),
            options.micro_batch,
            profile.micro_batches,
            format_bytes(profile.block_size_bytes as f64),
            duration(compute_us)
        );
    }
    Ok(())
}

/// A parameter count as it reads best: `8.03 B`, `124.4 M`, or whole below a million
/// (`127,488`).
fn parameters(count: u64) -> String {
    let n = count as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else {
        let digits = count.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    }
}

/// A time as it reads best: µs below a millisecond, s from a second, else [`ms`].
fn duration(us: f64) -> String {
    if us < 1e3 {
        format!("{us:.1} µs")
    } else if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else {
        ms(us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_read_in_m_or_b() {
        assert_eq!(parameters(8_030_261_248), "8.03 B");
        assert_eq!(parameters(124_439_808), "124.4 M");
        assert_eq!(parameters(127_488), "127,488");
        assert_eq!(parameters(999), "999");
        assert_eq!(duration(12.34), "12.3 µs");
        assert_eq!(duration(3_253_926.0), "3.254 s");
    }
}
