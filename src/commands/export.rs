//! `shardplan export fsdp2`.

use crate::cli::ExportFsdp2Args;
use crate::output::{outln, print_json};
use shardplan_scheduler::export::fsdp2 as export;
use shardplan_scheduler::io::{check_outputs_distinct, write_atomic};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::format_bytes;
use shardplan_scheduler::target::Target;

pub fn fsdp2(args: ExportFsdp2Args) -> anyhow::Result<()> {
    check_outputs_distinct(
        &[("--out", &args.out)],
        &[("--profile", &args.profile), ("--plan", &args.plan)],
    )?;
    let (profile, plan, schedule) = super::load_plan(&args.profile, &args.plan)?;
    let over = |what: &str, peak: f64, at: &str, cap: u64| {
        shardplan_scheduler::Error::Infeasible(format!(
            "{}: {what} peaks at {} ({peak:.0} bytes) at {at}, {} ({:.0} bytes) above its own \
             memory_cap_bytes {} ({cap} bytes): it would not fit where it was planned for; \
             --force exports it anyway",
            args.plan.display(),
            format_bytes(peak),
            format_bytes(peak - cap as f64),
            peak - cap as f64,
            format_bytes(cap as f64),
        ))
    };
    if let Some(cap) = plan.memory_cap_bytes {
        let sim = simulate(&profile, &schedule, Semantics::Strict);
        if sim.peak_memory_bytes > cap as f64 && !args.force {
            return Err(over("the plan", sim.peak_memory_bytes, &sim.peak_at(), cap).into());
        }
    }
    let exported = export(&profile, &schedule)?;
    if plan.target == Some(Target::Fsdp2) && !exported.exact {
        // Made for FSDP2 (DESIGN §4.9), it must export as planned: an edited plan that does not
        // is refused rather than rounded.
        return Err(shardplan_scheduler::Error::invalid(
            args.plan.display().to_string(),
            "target",
            format!(
                "\"runtime\" (or no target) for a plan FSDP2 cannot run as written: {} \
                 approximations, the first: {}",
                exported.approximations.len(),
                exported.approximations[0]
            ),
        )
        .into());
    }
    if let Some(cap) = plan.memory_cap_bytes {
        let peak = exported.fsdp2_peak_memory_bytes;
        if peak > cap && !args.force {
            let what = "its FSDP2 export (DESIGN §3.12)";
            return Err(over(what, peak as f64, &exported.fsdp2_peak_slot, cap).into());
        }
    }
    write_atomic(
        &args.out,
        serde_json::to_string_pretty(&exported)?.as_bytes(),
    )?;
    if args.json {
        let mut answer = serde_json::to_value(&exported)?;
        answer["out"] = serde_json::json!(args.out);
        print_json(&answer);
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
        outln!(
            "  plan:  {:.1} ms, peak {}",
            exported.plan_iteration_time_us / 1e3,
            format_bytes(exported.plan_peak_memory_bytes as f64)
        );
        outln!(
            "  FSDP2: {:.1} ms (relaxed {:.1} ms), peak {} at {}",
            exported.fsdp2_iteration_time_us / 1e3,
            exported.fsdp2_relaxed_iteration_time_us / 1e3,
            format_bytes(exported.fsdp2_peak_memory_bytes as f64),
            exported.fsdp2_peak_slot
        );
        for note in &exported.approximations {
            outln!("  ~ {note}");
        }
        for change in &exported.changes {
            outln!("  + {change}");
        }
    }
    Ok(())
}
