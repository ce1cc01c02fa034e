//! `shardplan run` and `shardplan profile measure` (the CPU backend: MPI ranks, or one rank
//! without mpirun).

use crate::cli::{MeasureArgs, RunArgs, SemanticsArg};
use crate::output::{ms, print_json};
use serde_json::json;
use shardplan_runtime::backend::{Backend, Collectives, CpuBackend, Loopback, Mpi};
use shardplan_runtime::executor::{RunOptions, Span, final_params, initialise, run as execute};
use shardplan_runtime::layout::layout;
use shardplan_runtime::measure::{
    mlp_profile, time_collectives, time_overlap_slowdown, time_units,
};
use shardplan_runtime::mlp::MlpSpec;
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::format_bytes;
use std::collections::BTreeMap;
use std::time::Duration;

/// Whether this process was started by an MPI launcher.
fn under_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// `shardplan run`: MPI ranks under mpirun, one rank (loopback collectives) without.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.timeout > 0.0 && args.timeout.is_finite(),
        "--timeout: expected positive seconds"
    );
    if under_mpi() {
        let (_universe, mpi) = Mpi::init()?;
        run_with(CpuBackend::new(mpi), &args)
    } else {
        run_with(CpuBackend::new(Loopback), &args)
    }
}

/// `shardplan profile measure`.
pub fn measure(args: MeasureArgs) -> anyhow::Result<()> {
    if under_mpi() {
        let (_universe, mpi) = Mpi::init()?;
        measure_with(&mpi, &args)
    } else {
        measure_with(&Loopback, &args)
    }
}

fn run_with<C: Collectives>(mut backend: CpuBackend<C>, args: &RunArgs) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile)?;
    let plan = Plan::load(&args.plan)?;
    let spec = MlpSpec::load(&args.model)?;
    let schedule = plan.schedule(&profile, &args.plan.display().to_string())?;
    let world = backend.world_size();
    anyhow::ensure!(
        plan.world_size as usize == world,
        "{}: the plan is for {} ranks, this run has {world} (start it with mpirun -np {})",
        args.plan.display(),
        plan.world_size,
        plan.world_size
    );
    let layout = layout(&spec, &profile, &schedule, world)?;
    backend.allocate((layout.arena.size_bytes / 4) as usize, args.steps as usize)?;
    backend.reserve_scratch(layout.largest_block);
    initialise(&backend, &spec, &layout)?;
    let semantics = match args.semantics {
        SemanticsArg::Strict => Semantics::Strict,
        SemanticsArg::Relaxed => Semantics::Relaxed,
    };
    let options = RunOptions {
        steps: args.steps as usize,
        semantics,
        timeout: Duration::from_secs_f64(args.timeout),
        trace: args.trace.is_some(),
    };
    let report = execute(&backend, &spec, &schedule, &layout, &options)?;
    let params = final_params(&backend, &spec, &layout)?;
    if backend.rank() != 0 {
        return Ok(());
    }
    if let Some(path) = &args.dump_params {
        write_atomic(path, serde_json::to_string(&params)?.as_bytes())?;
    }
    if let Some(path) = &args.trace {
        write_atomic(path, &serde_json::to_vec(&trace(&spec, &report.spans))?)?;
    }
    let predicted = simulate(&profile, &schedule, semantics);
    let measured = steady_mean(&report.step_us);
    let final_loss = *report.losses.last().expect("at least one step");
    if args.json {
        print_json(&json!({
            "steps": args.steps,
            "backend": backend.name(),
            "world_size": world,
            "semantics": semantics.name(),
            "losses": report.losses,
            "final_loss": final_loss,
            "step_us": report.step_us,
            "measured_iteration_time_us": measured,
            "predicted_iteration_time_us": predicted.iteration_time_us,
            "arena_bytes": report.arena_bytes,
            "arena_live_peak_bytes": report.live_peak_bytes,
            "predicted_peak_memory_bytes": predicted.peak_memory_bytes.ceil() as u64,
            "executor_overhead_us_per_slot": if report.executor_overhead_us_per_slot.is_finite() { Some(report.executor_overhead_us_per_slot) } else { None },
        }));
    } else {
        for (k, (loss, us)) in report.losses.iter().zip(&report.step_us).enumerate() {
            println!("step {:>4}  loss {loss:.6}  {}", k + 1, ms(*us));
        }
        println!(
            "{} backend, {} ranks, {} semantics, plan by {}",
            backend.name(),
            world,
            semantics.name(),
            plan.producer.name
        );
        println!(
            "  iteration   measured {} (mean after the first step), predicted {}",
            ms(measured),
            ms(predicted.iteration_time_us)
        );
        println!(
            "  memory      arena {} (live peak {}), predicted peak {}",
            format_bytes(report.arena_bytes as f64),
            format_bytes(report.live_peak_bytes as f64),
            format_bytes(predicted.peak_memory_bytes)
        );
    }
    Ok(())
}

/// Mean step time after the first (warm-up) step.
fn steady_mean(step_us: &[f64]) -> f64 {
    let tail = if step_us.len() > 1 {
        &step_us[1..]
    } else {
        step_us
    };
    tail.iter().sum::<f64>() / tail.len() as f64
}

fn trace(spec: &MlpSpec, spans: &[Span]) -> serde_json::Value {
    let mut events = vec![
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "compute"}}),
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "communication"}}),
    ];
    events.extend(spans.iter().map(|s| {
        json!({"name": format!("{} {}", s.what, spec.unit_name(s.unit)), "ph": "X", "pid": 1, "tid": s.stream,
               "ts": s.start_us, "dur": s.end_us - s.start_us, "args": {"step": s.step}})
    }));
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

fn measure_with<C: Collectives>(c: &C, args: &MeasureArgs) -> anyhow::Result<()> {
    let spec = MlpSpec::load(&args.model)?;
    anyhow::ensure!(
        args.world_size as usize == c.size(),
        "--world-size {} but {} MPI ranks: start it with mpirun -np {}",
        args.world_size,
        c.size(),
        args.world_size
    );
    let times = time_units(&spec, args.repeats as usize);
    let curves = time_collectives(c, args.max_message, args.repeats as usize)?;
    let source = BTreeMap::from([
        ("generator".to_string(), "measured".to_string()),
        ("backend".to_string(), "cpu".to_string()),
        ("model".to_string(), spec.name.clone()),
    ]);
    let mut profile = mlp_profile(
        &spec,
        args.world_size,
        &times,
        curves,
        args.block_size,
        source,
    )?;
    profile.overlap_slowdown = time_overlap_slowdown(c, &spec, profile.block_size_bytes, 400);
    if c.rank() == 0 {
        profile.save(&args.out)?;
        if args.json {
            print_json(
                &json!({"out": args.out, "units": profile.unit_count(), "block_size_bytes": profile.block_size_bytes,
                               "unit_times_us": times, "overlap_slowdown": profile.overlap_slowdown}),
            );
        } else {
            println!(
                "wrote {}: {} units, block size {}, overlap slowdown {:.2}",
                args.out.display(),
                profile.unit_count(),
                format_bytes(profile.block_size_bytes as f64),
                profile.overlap_slowdown
            );
        }
    }
    Ok(())
}
