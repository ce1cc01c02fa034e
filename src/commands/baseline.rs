//! `shardplan baseline`.

use crate::cli::{BaselineArgs, MemoryCap};
use crate::failure::flag_error;
use crate::output::{ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::baselines::baseline;
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use shardplan_scheduler::target::Target;

pub fn run(args: BaselineArgs) -> anyhow::Result<()> {
    let kind = args.kind;
    check_outputs_distinct(&[("--out", &args.out)], &[("--profile", &args.profile)])?;
    let profile = Profile::load(&args.profile)?;
    if let Some(reason) = kind.unavailable_on(&profile) {
        return Err(flag_error(
            "--kind",
            format!(
                "a baseline that profile {} offers; {reason}",
                args.profile.display()
            ),
        ));
    }
    let cap = args.memory_cap.and_then(MemoryCap::bytes);
    let checkpoint = if args.checkpoint {
        Recompute::On
    } else {
        Recompute::Off
    };
    let mut result = baseline(&profile, kind, checkpoint, cap)?;
    let target = Target::from(args.target);
    if target == Target::Fsdp2 {
        let exported = shardplan_scheduler::export::fsdp2(&profile, &result.schedule)?;
        if let Some(first) = exported.approximations.first() {
            return Err(flag_error(
                "--target",
                format!("runtime for this baseline: FSDP2 cannot run it as built ({first})"),
            ));
        }
        result.plan.target = Some(target);
    }
    result.plan.save(&args.out)?;
    let sim = &result.simulation;
    let fits = cap.map(|cap| sim.peak_memory_bytes <= cap as f64);
    if args.json {
        print_json(&json!({
            "out": args.out,
            "kind": kind.name(),
            "iteration_time_us": sim.iteration_time_us,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "peak_slot": sim.peak_slot,
            "peak_micro_batch": sim.peak_micro_batch,
            "fits_cap": fits,
            "host_memory_bytes": sim.host.as_ref().map(|h| whole_bytes(h.memory_bytes)),
        }));
    } else {
        let fit = match fits {
            Some(true) => ", fits the cap",
            Some(false) => ", EXCEEDS the cap",
            None => "",
        };
        let host = sim.host.as_ref().map_or(String::new(), |h| {
            format!(", host memory {} per node", format_bytes(h.memory_bytes))
        });
        outln!(
            "wrote {}: {} — iteration {}, peak {} at {}{fit}{host}",
            args.out.display(),
            kind.name(),
            ms(sim.iteration_time_us),
            format_bytes(sim.peak_memory_bytes),
            sim.peak_at()
        );
    }
    Ok(())
}
