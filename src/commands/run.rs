//! `shardplan run`: starts this rank's backend (the runtime's dispatch: MPI or NCCL ranks under
//! mpirun, else one rank), builds the model, runs the plan and prints rank 0's report.

use super::{end_job_on_failure, report_for_job};
use crate::cli::{RunArgs, SemanticsArg};
use crate::failure::Failure;
use crate::output::{Output, ms, outln, print_json};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use shardplan_runtime::backend::Backend;
use shardplan_runtime::checkpoint::Checkpoints;
use shardplan_runtime::dispatch::{AfterRun, Data, Job, Model, start};
use shardplan_runtime::executor::{OnStall, OnStep, RunOptions};
use shardplan_runtime::layout::{Origins, check_training};
use shardplan_runtime::mlp::ReferenceCheck;
use shardplan_runtime::model_file::ModelFile;
use shardplan_runtime::session::{Durability, PlanRun, chrome_trace, run_plan};
use shardplan_runtime::train::Train;
use shardplan_scheduler::io::{check_outputs_distinct, write_atomic};
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sim::Semantics;
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use std::sync::Arc;
use std::time::Duration;

/// `shardplan run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let outputs: Vec<(&str, &std::path::Path)> = [
        ("--save-weights", &args.save_weights),
        ("--trace", &args.trace),
        ("--dump-params", &args.dump_params),
    ]
    .into_iter()
    .filter_map(|(flag, path)| path.as_deref().map(|p| (flag, p)))
    .collect();
    let mut inputs = vec![
        ("--profile", args.profile.as_path()),
        ("--plan", args.plan.as_path()),
        ("--model", args.model.as_path()),
    ];
    inputs.extend(args.data.as_deref().map(|p| ("--data", p)));
    inputs.extend(args.init_weights.as_deref().map(|p| ("--init-weights", p)));
    check_outputs_distinct(&outputs, &inputs)?;
    let file = ModelFile::load(&args.model)?;
    let (universe, backend) = start(args.backend.kind()?)?;
    let origin = args.model.display().to_string();
    let data = Data::Text {
        text: args.data.as_deref(),
        init_weights: args.init_weights.as_deref(),
    };
    let after = AfterRun {
        compare_reference: args.compare_reference,
        steps: args.steps as usize,
        save_weights: args.save_weights.as_deref(),
    };
    let result = Model::build(file, &origin, (backend.rank(), backend.world_size()), data)
        .and_then(|model| model.check_after(&after, &origin).map(|()| model))
        .map_err(anyhow::Error::from)
        .and_then(|model| {
            backend.run(
                &model,
                PlanJob {
                    args: &args,
                    model: &model,
                    after,
                },
            )
        });
    end_job_on_failure(universe.as_ref(), result, Output::of_json_flag(args.json))
}

/// What a step trains on, for the progress bar: `per_step` tokens or samples over all ranks.
struct Throughput {
    per_step: u64,
    unit: &'static str,
}

impl Throughput {
    /// A bar on stderr (hidden when stderr is not a terminal) that shows the steps done and the
    /// rate; the losses are printed per step at the end (they are summed over the ranks then).
    fn bar(self, steps: u64) -> (ProgressBar, OnStep) {
        let bar = ProgressBar::new(steps).with_style(
            ProgressStyle::with_template("{bar:30} step {pos}/{len}  {msg}  {elapsed}")
                .expect("the template is valid"),
        );
        let shown = bar.clone();
        let on_step = OnStep(Arc::new(move |step| {
            shown.set_position(step as u64 + 1);
            let seconds = shown.elapsed().as_secs_f64().max(1e-9);
            let rate = (step as u64 + 1) as f64 * self.per_step as f64 / seconds;
            shown.set_message(format!("{rate:.0} {}/s", self.unit));
        }));
        (bar, on_step)
    }
}

/// The plan run on the rank's backend and model, and rank 0's report.
struct PlanJob<'a> {
    args: &'a RunArgs,
    model: &'a Model,
    /// What rank 0 does with the trained weights.
    after: AfterRun<'a>,
}

impl Job for PlanJob<'_> {
    type Output = anyhow::Result<()>;
    fn run<B: Backend, W: Train<B>>(self, backend: B, workload: &W) -> anyhow::Result<()> {
        run_with(backend, workload, self.args, self.model, self.after)
    }
}

/// Runs `workload`; rank 0 then finishes with the trained weights (the MLP's reference check, GPT-2's
/// weights saved, as asked) and prints the report.
fn run_with<B: Backend, W: Train<B>>(
    backend: B,
    workload: &W,
    args: &RunArgs,
    model: &Model,
    after: AfterRun,
) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile)?;
    let origins = Origins {
        model: &args.model.display().to_string(),
        profile: &args.profile.display().to_string(),
    };
    check_training(workload, &profile, origins)?;
    let plan = Plan::load(&args.plan)?;
    let semantics = match args.semantics {
        SemanticsArg::Strict => Semantics::Strict,
        SemanticsArg::Relaxed => Semantics::Relaxed,
    };
    let (per_step, unit) = model.per_step();
    let bar =
        (backend.rank() == 0 && !args.json).then(|| Throughput { per_step, unit }.bar(args.steps));
    let options = RunOptions {
        steps: args.steps as usize,
        first_step: 0,
        semantics,
        timeout: Duration::from_secs_f64(args.timeout),
        trace: args.trace.is_some(),
        on_step: bar.as_ref().map(|(_, on_step)| on_step.clone()),
        on_stall: (backend.world_size() > 1)
            .then(|| stall_report(backend.rank(), Output::of_json_flag(args.json))),
    };
    let origin = args.plan.display().to_string();
    let durability = Durability {
        checkpoints: args
            .checkpoint_every
            .zip(args.checkpoint_dir.clone())
            .map(|(every, dir)| Checkpoints { every, dir }),
        resume: args.resume.clone(),
    };
    let done = run_plan(
        backend,
        workload,
        &profile,
        &plan,
        &origin,
        &options,
        &durability,
    );
    if let Some((bar, _)) = bar {
        bar.finish_and_clear();
    }
    let done = done?;
    if done.rank != 0 {
        return Ok(());
    }
    if let Some(path) = &args.dump_params {
        write_atomic(path, serde_json::to_string(&done.params)?.as_bytes())?;
    }
    if let Some(path) = &args.trace {
        let trace = chrome_trace(workload, &done.report.spans);
        write_atomic(path, &serde_json::to_vec(&trace)?)?;
    }
    let reference = model.finish(&done.params, &after)?;
    report(args, &plan, &done, reference.as_ref());
    Ok(())
}

/// How rank `rank` reports a collective the watchdog found stalled, before the job ends.
fn stall_report(rank: usize, output: Output) -> OnStall {
    OnStall(Arc::new(move |error: &shardplan_runtime::Error| {
        let error = shardplan_runtime::Error::Timeout(error.to_string());
        report_for_job(&Failure::of(&error.into()), rank, output);
    }))
}

fn report(args: &RunArgs, plan: &Plan, done: &PlanRun, reference: Option<&ReferenceCheck>) {
    let (report, predicted) = (&done.report, &done.predicted);
    let semantics = predicted.semantics;
    let measured = done.measured_iteration_us;
    let memory = done.device_memory;
    if args.json {
        print_json(&json!({
            "steps": args.steps,
            "first_step": done.first_step,
            "resumed_from": done.resumed_from,
            "refused_checkpoints": done.refused_checkpoints,
            "checkpoints_written": done.checkpoints_written,
            "backend": done.backend,
            "world_size": done.world_size,
            "semantics": semantics.name(),
            "losses": report.losses,
            "final_loss": report.losses.last(),
            "step_us": report.step_us,
            "measured_iteration_time_us": measured,
            "predicted_iteration_time_us": predicted.iteration_time_us,
            "arena_bytes": report.arena_bytes,
            "arena_live_peak_bytes": report.live_peak_bytes,
            "arena_layouts": report.arena_layouts,
            "host_arena_bytes": report.host_arena_bytes,
            "predicted_host_node_bytes": predicted.host.map(|h| whole_bytes(h.memory_bytes)),
            "peak_resident_bytes": done.peak_resident_bytes,
            "oversubscribed": done.oversubscribed.map(|o| json!({"ranks": o.ranks, "cores": o.cores})),
            "predicted_peak_memory_bytes": whole_bytes(predicted.peak_memory_bytes),
            "executor_overhead_us_per_slot": report.executor_overhead_us_per_slot,
            "weights_max_relative_error_vs_reference": reference.map(|r| r.weights_max_relative_error),
            "weights_update_relative_error_vs_reference": reference.map(|r| r.update_relative_error),
            "reference_losses": reference.map(|r| &r.losses),
            "device_memory": memory.map(|m| json!({
                "total_bytes": m.total, "before_arena_bytes": m.before_arena,
                "after_arena_bytes": m.after_arena, "after_run_bytes": m.now,
                "pool_before_arena": {"reserved_bytes": m.pool_before_arena.reserved, "used_bytes": m.pool_before_arena.used},
                "pool_after_run": {"reserved_bytes": m.pool_now.reserved, "used_bytes": m.pool_now.used},
                "used_by_run_bytes": m.used_by_run(),
            })),
        }));
        return;
    }
    if let Some(from) = &done.resumed_from {
        outln!(
            "resumed after step {} from {}",
            done.first_step,
            from.display()
        );
    }
    for refused in &done.refused_checkpoints {
        outln!("  a newer checkpoint was refused: {refused}");
    }
    for (k, (loss, us)) in report.losses.iter().zip(&report.step_us).enumerate() {
        outln!(
            "step {:>4}  loss {loss:.6}  {}",
            done.first_step + k + 1,
            ms(*us)
        );
    }
    outln!(
        "{} backend, {} ranks, {} semantics, plan by {}",
        done.backend,
        done.world_size,
        semantics.name(),
        plan.producer.name
    );
    outln!(
        "  iteration   measured {} (median after the first step), predicted {}",
        ms(measured),
        ms(predicted.iteration_time_us)
    );
    outln!(
        "  memory      arena {} (live peak {}{}), predicted peak {}",
        format_bytes(report.arena_bytes as f64),
        format_bytes(report.live_peak_bytes as f64),
        if report.arena_layouts == 2 {
            "; even and odd steps alternate two layouts"
        } else {
            ""
        },
        format_bytes(predicted.peak_memory_bytes)
    );
    if let Some(host) = predicted.host {
        outln!(
            "  host        arena {} (offloaded state), predicted {} per node",
            format_bytes(report.host_arena_bytes as f64),
            format_bytes(host.memory_bytes)
        );
    }
    if let Some(rss) = done.peak_resident_bytes {
        outln!(
            "  process     rank {}'s peak resident memory {} (arena, program and libraries)",
            done.rank,
            format_bytes(rss as f64)
        );
    }
    if let Some(o) = done.oversubscribed {
        outln!("  host        {}", o.described());
    }
    if let Some(r) = reference {
        outln!(
            "  weights     against the CPU reference: largest difference {:.2e} of the largest weight, {:.2e} of the update",
            r.weights_max_relative_error,
            r.update_relative_error
        );
    }
    if let Some(m) = memory {
        outln!(
            "  device      {} used by the run (arena and workspaces; set-up before it {}, of {})",
            format_bytes(m.used_by_run() as f64),
            format_bytes(m.before_arena as f64),
            format_bytes(m.total as f64)
        );
    }
}
