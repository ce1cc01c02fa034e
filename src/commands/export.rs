//! `shardplan export fsdp2`.

use crate::cli::ExportFsdp2Args;
use crate::output::{outln, print_json};
use serde_json::json;
use shardplan_scheduler::export::fsdp2 as export;
use shardplan_scheduler::io::{check_outputs_distinct, write_atomic};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::format_bytes;

pub fn fsdp2(args: ExportFsdp2Args) -> anyhow::Result<()> {
    check_outputs_distinct(
        &[("--out", &args.out)],
        &[("--profile", &args.profile), ("--plan", &args.plan)],
    )?;
    let (profile, plan, schedule) = super::load_plan(&args.profile, &args.plan)?;
    if let Some(cap) = plan.memory_cap_bytes {
        let peak = simulate(&profile, &schedule, Semantics::Strict).peak_memory_bytes;
        if peak > cap as f64 && !args.force {
            return Err(shardplan_scheduler::Error::Infeasible(format!(
                "{}: the plan peaks at {} ({peak:.0} bytes), above its own memory_cap_bytes {} ({cap} bytes): \
                 it would not fit where it was planned for; --force exports it anyway",
                args.plan.display(),
                format_bytes(peak),
                format_bytes(cap as f64),
            ))
            .into());
        }
    }
    let exported = export(&profile, &schedule);
    write_atomic(
        &args.out,
        serde_json::to_string_pretty(&exported)?.as_bytes(),
    )?;
    if args.json {
        print_json(
            &json!({"out": args.out, "exact": exported.exact, "approximations": exported.approximations,
                    "mixed_precision": exported.mixed_precision}),
        );
    } else {
        let precision = match exported.mixed_precision {
            Some(p) => format!(
                "parameters {}, reductions {}",
                p.param_dtype, p.reduce_dtype
            ),
            None => "float32".to_string(),
        };
        outln!(
            "wrote {}: {} units, {precision}, {}",
            args.out.display(),
            exported.units.len(),
            if exported.exact {
                "exact".to_string()
            } else {
                format!("{} approximations", exported.approximations.len())
            }
        );
        for note in &exported.approximations {
            outln!("  ~ {note}");
        }
    }
    Ok(())
}
