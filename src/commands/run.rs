//! `shardplan run` and `shardplan profile measure`: the CPU backend (MPI ranks, or one rank
//! without mpirun) and the CUDA backend (one GPU per process; under mpirun the ranks share an NCCL
//! id over MPI, without it one GPU alone).

use super::end_job_on_failure;
use crate::cli::{BackendArg, RunArgs, SemanticsArg};
use crate::failure::flag_error;
use crate::output::{ms, outln, print_json};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use shardplan_runtime::backend::{Backend, CpuBackend, Loopback, Mpi};
use shardplan_runtime::executor::{OnStep, RunOptions};
use shardplan_runtime::gpt2::data::Tokens;
use shardplan_runtime::gpt2::{Gpt2, Gpt2Kernels, weights};
use shardplan_runtime::launch::{cuda_backend, under_mpi};
use shardplan_runtime::mlp::{
    Mlp, MlpKernels, MlpSpec, max_relative_error, reference_training, update_relative_error,
};
use shardplan_runtime::model_file::ModelFile;
use shardplan_runtime::session::{PlanRun, chrome_trace, run_plan};
use shardplan_runtime::workload::Train;
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
    let model = ModelFile::load(&args.model)?;
    match args.backend {
        BackendArg::Cpu if under_mpi() => {
            let (universe, mpi) = Mpi::init()?;
            let result = run_model(CpuBackend::new(mpi), model, &args);
            end_job_on_failure(Some(&universe), result, args.json)
        }
        BackendArg::Cpu => run_model(CpuBackend::new(Loopback), model, &args),
        BackendArg::Cuda => {
            let (universe, backend) = cuda_backend()?;
            let result = run_model(backend, model, &args);
            end_job_on_failure(universe.as_ref(), result, args.json)
        }
    }
}

/// Either workload on a backend that has both's kernels.
fn run_model<B: MlpKernels + Gpt2Kernels>(
    backend: B,
    model: ModelFile,
    args: &RunArgs,
) -> anyhow::Result<()> {
    let (rank, world) = (backend.rank(), backend.world_size());
    match model {
        ModelFile::Mlp(spec) => {
            let throughput = Throughput::samples(&spec, world);
            let mlp = Mlp::new(spec, rank, world);
            run_with(backend, &mlp, args, throughput, |params| {
                mlp_check(&mlp, params, args)
            })
        }
        ModelFile::Transformer(model) => {
            let origin = args.model.display().to_string();
            let data = args.data.as_deref().ok_or_else(|| {
                flag_error(
                    "--data",
                    format!("a text file: {origin} is a GPT-2, which trains on text"),
                )
            })?;
            let tokens = Tokens::load(data, model.seq_len as usize, model.vocab as usize)?;
            let init = args.init_weights.as_deref();
            let gpt2 = Gpt2::new(&model, &origin, rank, world, tokens, init)?;
            let throughput = Throughput {
                per_step: (gpt2.shape().rows() * world) as u64,
                unit: "tokens",
            };
            run_with(backend, &gpt2, args, throughput, |params| {
                if let Some(path) = &args.save_weights {
                    write_atomic(path, &weights::serialize(gpt2.tensors(), params)?)?;
                }
                Ok(None)
            })
        }
    }
}

/// How the trained weights compare with the single-process CPU reference.
struct ReferenceCheck {
    weights_max_relative_error: f64,
    update_relative_error: f64,
    losses: Vec<f32>,
}

/// The MLP's check against its single-process reference, when asked for.
fn mlp_check(
    mlp: &Mlp,
    params: &[Vec<f32>],
    args: &RunArgs,
) -> anyhow::Result<Option<ReferenceCheck>> {
    if !args.compare_reference {
        return Ok(None);
    }
    let spec = mlp.spec();
    let (reference, losses) = reference_training(spec, mlp.world(), args.steps as usize);
    let initial: Vec<Vec<f32>> = (0..spec.units())
        .map(|u| spec.initial_params(u, spec.params(u)))
        .collect();
    Ok(Some(ReferenceCheck {
        weights_max_relative_error: max_relative_error(params, &reference)?,
        update_relative_error: update_relative_error(params, &reference, &initial)?,
        losses,
    }))
}

/// What a step trains on, for the progress bar: `per_step` tokens or samples over all ranks.
struct Throughput {
    per_step: u64,
    unit: &'static str,
}

impl Throughput {
    fn samples(spec: &MlpSpec, world: usize) -> Self {
        Throughput {
            per_step: (spec.batch_per_rank * world) as u64,
            unit: "samples",
        }
    }

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

/// Runs `workload`; rank 0 then hands the trained weights to `finish` (which may report the
/// largest relative difference from a reference) and prints the report.
fn run_with<B: Backend, W: Train<B>>(
    backend: B,
    workload: &W,
    args: &RunArgs,
    throughput: Throughput,
    finish: impl FnOnce(&[Vec<f32>]) -> anyhow::Result<Option<ReferenceCheck>>,
) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile)?;
    let plan = Plan::load(&args.plan)?;
    let semantics = match args.semantics {
        SemanticsArg::Strict => Semantics::Strict,
        SemanticsArg::Relaxed => Semantics::Relaxed,
    };
    let bar = (backend.rank() == 0 && !args.json).then(|| throughput.bar(args.steps));
    let options = RunOptions {
        steps: args.steps as usize,
        semantics,
        timeout: Duration::from_secs_f64(args.timeout),
        trace: args.trace.is_some(),
        on_step: bar.as_ref().map(|(_, on_step)| on_step.clone()),
    };
    let origin = args.plan.display().to_string();
    let done = run_plan(backend, workload, &profile, &plan, &origin, &options);
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
    let reference = finish(&done.params)?;
    report(args, &plan, &done, reference.as_ref());
    Ok(())
}

fn report(args: &RunArgs, plan: &Plan, done: &PlanRun, reference: Option<&ReferenceCheck>) {
    let (report, predicted) = (&done.report, &done.predicted);
    let semantics = predicted.semantics;
    let measured = done.measured_iteration_us;
    let memory = done.device_memory;
    if args.json {
        print_json(&json!({
            "steps": args.steps,
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
            "peak_resident_bytes": done.peak_resident_bytes,
            "predicted_peak_memory_bytes": whole_bytes(predicted.peak_memory_bytes),
            "executor_overhead_us_per_slot": if report.executor_overhead_us_per_slot.is_finite() { Some(report.executor_overhead_us_per_slot) } else { None },
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
    for (k, (loss, us)) in report.losses.iter().zip(&report.step_us).enumerate() {
        outln!("step {:>4}  loss {loss:.6}  {}", k + 1, ms(*us));
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
    if let Some(rss) = done.peak_resident_bytes {
        outln!(
            "  process     rank {}'s peak resident memory {} (arena, program and libraries)",
            done.rank,
            format_bytes(rss as f64)
        );
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
