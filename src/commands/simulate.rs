//! `shardplan simulate`.

use crate::cli::{SemanticsArg, SimulateArgs};
use crate::output::{ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::sim::{Semantics, chrome_trace, simulate};
use shardplan_scheduler::size::{format_bytes, whole_bytes};

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if let Some(trace) = &args.trace {
        check_outputs_distinct(
            &[("--trace", trace)],
            &[("--profile", &args.profile), ("--plan", &args.plan)],
        )?;
    }
    let (profile, plan, schedule) = super::load_plan(&args.profile, &args.plan)?;
    let semantics = match args.semantics {
        SemanticsArg::Strict => Semantics::Strict,
        SemanticsArg::Relaxed => Semantics::Relaxed,
    };
    let sim = simulate(&profile, &schedule, semantics);
    if let Some(path) = &args.trace {
        let trace = serde_json::to_vec(&chrome_trace(&profile, &sim))?;
        write_atomic(path, &trace)?;
    }
    let fits = plan
        .memory_cap_bytes
        .map(|cap| sim.peak_memory_bytes <= cap as f64);
    if args.json {
        print_json(&json!({
            "producer": plan.producer.name,
            "semantics": semantics.name(),
            "iteration_time_us": sim.iteration_time_us,
            "compute_us": sim.compute_us,
            "comm_us": sim.comm_us,
            "exposed_comm_us": sim.exposed_comm_us,
            "overlap_slowdown_us": sim.overlap_slowdown_us,
            "comm_slowdown_us": sim.comm_slowdown_us,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "peak_slot": sim.peak_slot,
            "peak_micro_batch": sim.peak_micro_batch,
            "micro_batches": profile.micro_batches,
            "memory_cap_bytes": plan.memory_cap_bytes,
            "fits_cap": fits,
            "host": sim.host,
            "slots": sim.slots,
        }));
    } else {
        outln!(
            "plan {} ({}), {} semantics",
            args.plan.display(),
            plan.producer.name,
            semantics.name()
        );
        outln!("  iteration time   {}", ms(sim.iteration_time_us));
        outln!("  compute          {}", ms(sim.compute_us));
        outln!("  communication    {}", ms(sim.comm_us));
        outln!("  exposed comm     {}", ms(sim.exposed_comm_us));
        outln!("  overlap slowdown {}", ms(sim.overlap_slowdown_us));
        outln!("  comm slowdown    {}", ms(sim.comm_slowdown_us));
        outln!(
            "  peak memory      {} at {}",
            format_bytes(sim.peak_memory_bytes),
            sim.peak_at()
        );
        if let (Some(cap), Some(fits)) = (plan.memory_cap_bytes, fits) {
            outln!(
                "  memory cap       {} ({})",
                format_bytes(cap as f64),
                if fits { "fits" } else { "EXCEEDED" }
            );
        }
        if let Some(host) = &sim.host {
            outln!(
                "  host             {} per node; per rank D2H {}, step {}, H2D {}",
                format_bytes(host.memory_bytes),
                ms(host.device_to_host_us),
                ms(host.step_us),
                ms(host.host_to_device_us)
            );
        }
        if let Some(path) = &args.trace {
            outln!("  trace            {}", path.display());
        }
    }
    Ok(())
}
