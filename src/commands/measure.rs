//! `shardplan profile measure`: an MLP's units, the collectives and κ timed through a backend
//! (CPU or CUDA), or a zoo transformer's units replayed on the GPU (their matrix products, bytes
//! from the model).

use super::run::{cuda_backend, under_mpi};
use crate::cli::{BackendArg, MeasureArgs};
use crate::failure::flag_error;
use crate::output::print_json;
use anyhow::Context;
use serde_json::json;
use shardplan_runtime::backend::Collectives;
use shardplan_runtime::backend::{Backend, CpuBackend, Loopback, Mpi};
use shardplan_runtime::cuda::CudaBackend;
use shardplan_runtime::executor::initialise;
use shardplan_runtime::gpt2::Gpt2;
use shardplan_runtime::gpt2::data::Tokens;
use shardplan_runtime::measure::{
    compute_layout, compute_round, measurement_allocation, time_collectives, time_overlap_slowdown,
    time_units, workload_profile,
};
use shardplan_runtime::mlp::Mlp;
use shardplan_runtime::model_file::ModelFile;
use shardplan_runtime::transformer::{UnitKind, backward_gemms, forward_gemms};
use shardplan_runtime::workload::Train;
use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile, comm_curves};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::profile::{CommCurves, Profile};
use shardplan_scheduler::size::format_bytes;
use std::collections::BTreeMap;

pub fn measure(args: MeasureArgs) -> anyhow::Result<()> {
    check_outputs_distinct(&[("--out", &args.out)], &[("--model", &args.model)])?;
    match (args.backend, ModelFile::load(&args.model)?) {
        (BackendArg::Cpu, model) if under_mpi() => {
            let (_universe, mpi) = Mpi::init()?;
            measure_on_cpu(CpuBackend::new(mpi), model, &args)
        }
        (BackendArg::Cpu, model) => measure_on_cpu(CpuBackend::new(Loopback), model, &args),
        (BackendArg::Cuda, model) => {
            let (_universe, backend) = cuda_backend()?;
            match model {
                ModelFile::Mlp(spec) => {
                    let mlp = Mlp::new(spec, backend.rank(), backend.world_size());
                    measure_workload(backend, &mlp, &args)
                }
                ModelFile::Transformer(model) => measure_transformer(backend, &model, &args),
            }
        }
    }
}

/// The CPU backend: the MLP, or a GPT-2 with `[training]` (synthetic tokens: timing does not
/// depend on the data).
fn measure_on_cpu<C: Collectives>(
    backend: CpuBackend<C>,
    model: ModelFile,
    args: &MeasureArgs,
) -> anyhow::Result<()> {
    let (rank, world) = (backend.rank(), backend.world_size());
    match model {
        ModelFile::Mlp(spec) => measure_workload(backend, &Mlp::new(spec, rank, world), args),
        ModelFile::Transformer(model) => {
            let origin = args.model.display().to_string();
            if model.training.is_none() {
                return Err(shardplan_scheduler::Error::invalid(
                    &origin,
                    "training",
                    "a [training] table: on the CPU a transformer is measured by training it \
                     (models/gpt2-tiny.toml); zoo models are replayed on a GPU (--backend cuda) \
                     or profiled with `profile analytic`",
                )
                .into());
            }
            let tokens = Tokens::Synthetic {
                seed: 1,
                vocab: model.vocab as usize,
            };
            // The profile is for --world-size ranks: each holds batch_size / N sequences.
            let gpt2 = Gpt2::new(
                &model,
                &origin,
                rank,
                args.world_size as usize,
                tokens,
                None,
            )?;
            measure_workload(backend, &gpt2, args)
        }
    }
}

/// The curves: measured on the ranks this runs on, which must be the profile's world size; or,
/// on one rank with `--device` (required for a profile of more ranks), the catalog's curves for
/// `--world-size` ranks of that device. One rank without `--device` for a profile of one
/// measures what its collectives cost there (NCCL's copies on a GPU). Returns where they came
/// from.
fn curves<B: Backend>(
    backend: &B,
    start: usize,
    args: &MeasureArgs,
) -> anyhow::Result<(CommCurves, String)> {
    let ranks = backend.world_size();
    if ranks == 1 && (args.world_size > 1 || args.device.is_some()) {
        let device = args.device.as_deref().ok_or_else(|| {
            flag_error(
                "--device",
                format!(
                    "a device of the hardware catalog: one rank cannot measure the collectives \
                     of {} (or run under mpirun -np {})",
                    args.world_size, args.world_size
                ),
            )
        })?;
        let curves = comm_curves(&Catalog::bundled()?, device, args.world_size)?;
        return Ok((
            curves,
            format!(
                "hardware catalog {device} x{} (one rank: collectives not measured)",
                args.world_size
            ),
        ));
    }
    if args.world_size as usize != ranks {
        return Err(flag_error(
            "--world-size",
            format!(
                "the number of ranks, {ranks}, got {} (start it with mpirun -np {})",
                args.world_size, args.world_size
            ),
        ));
    }
    let curves = time_collectives(backend, start, args.max_message, args.repeats as usize)?;
    Ok((
        curves,
        format!("measured on {ranks} ranks ({})", backend.name()),
    ))
}

fn measure_workload<B: Backend, W: Train<B>>(
    mut backend: B,
    workload: &W,
    args: &MeasureArgs,
) -> anyhow::Result<()> {
    let world = backend.world_size();
    let message_bytes = args.max_message.max(args.block_size.unwrap_or(0));
    let layout = compute_layout(workload, args.world_size)?;
    let compute_elements = (layout.arena.size_bytes / 4) as usize;
    let (allocation, start) = measurement_allocation(compute_elements, world, message_bytes);
    backend.allocate(allocation)?;
    initialise(&backend, workload, &layout)?;
    let times = time_units(&backend, workload, &layout, args.repeats as usize)?;
    let (comm, comm_source) = curves(&backend, start, args)?;
    let source = BTreeMap::from([
        ("generator".to_string(), "measured".to_string()),
        ("backend".to_string(), backend.name().to_string()),
        ("model".to_string(), workload.name().to_string()),
        ("comm".to_string(), comm_source),
    ]);
    let mut profile = workload_profile(
        workload,
        args.world_size,
        &times,
        comm,
        args.block_size,
        source,
    )?;
    let kappa_bytes = profile.block_size_bytes.min(message_bytes);
    let round = || compute_round(&backend, workload, &layout);
    profile.overlap_slowdown = time_overlap_slowdown(&backend, &round, start, kappa_bytes, 400)?;
    if backend.rank() == 0 {
        save(
            &profile,
            args,
            json!({"unit_times_us": times, "overlap_slowdown": profile.overlap_slowdown}),
        )?;
    }
    Ok(())
}

fn measure_transformer(
    mut backend: CudaBackend,
    model: &ModelSpec,
    args: &MeasureArgs,
) -> anyhow::Result<()> {
    let device = args.device.as_deref().with_context(|| {
        format!("{}: a transformer's profile needs --device (its byte counts and curves come from the catalog)", args.model.display())
    })?;
    let mut options = AnalyticOptions::new(device, args.world_size);
    options.micro_batch = args.micro_batch;
    options.seq_len = args.seq_len;
    options.block_size_bytes = args.block_size;
    let mut profile = analytic_profile(model, &Catalog::bundled()?, &options)?;
    let seq_len = args.seq_len.unwrap_or(model.seq_len);
    let layers = model.layers as usize;
    let repeats = args.repeats as usize;
    let mut times = BTreeMap::new();
    let mut block_round = None;
    for kind in [UnitKind::Embedding, UnitKind::Block, UnitKind::Head] {
        let forward = forward_gemms(model, kind, args.micro_batch, seq_len);
        let backward = backward_gemms(&forward);
        let all: Vec<_> = forward.iter().chain(&backward).copied().collect();
        let buffers = backend.replay_buffers(&all)?;
        let f = backend.time_replay(&forward, &buffers, repeats)?;
        let b = backend.time_replay(&backward, &buffers, repeats)?;
        times.insert(kind, (f, b));
        if kind == UnitKind::Block {
            block_round = Some((all, buffers));
        }
    }
    for (i, unit) in profile.units.iter_mut().enumerate() {
        let (f, b) = times[&UnitKind::of(i, layers)];
        (unit.forward_us, unit.backward_us) = (f, b);
    }
    let world = backend.world_size();
    let (allocation, start) = measurement_allocation(0, world, args.max_message);
    backend.allocate(allocation)?;
    let comm_source = if world >= 2 {
        let (comm, source) = curves(&backend, start, args)?;
        profile.block_size_bytes = args.block_size.unwrap_or_else(|| comm.block_size());
        profile.comm = comm;
        source
    } else {
        format!(
            "hardware catalog {device} x{} (one GPU: collectives not measured)",
            args.world_size
        )
    };
    let (block, buffers) = block_round.context("the replay has a block")?;
    let round = || backend.replay(&block, &buffers);
    let kappa_bytes = profile.block_size_bytes.min(args.max_message);
    profile.overlap_slowdown = time_overlap_slowdown(&backend, &round, start, kappa_bytes, 400)?;
    profile.source = BTreeMap::from([
        (
            "generator".to_string(),
            "measured: matrix products replayed".to_string(),
        ),
        ("backend".to_string(), "cuda".to_string()),
        ("gpu".to_string(), backend.device_name()),
        ("model".to_string(), model.name.clone()),
        ("micro_batch".to_string(), args.micro_batch.to_string()),
        ("seq_len".to_string(), seq_len.to_string()),
        (
            "bytes".to_string(),
            format!("model formulas ({device} catalog)"),
        ),
        (
            "overlap_slowdown".to_string(),
            format!(
                "measured: a block's replay beside AllReduces of {} on {world} rank(s)",
                format_bytes(kappa_bytes as f64)
            ),
        ),
        ("comm".to_string(), comm_source),
    ]);
    profile.name = format!(
        "{} on {} x{}",
        model.name,
        backend.device_name(),
        args.world_size
    );
    profile.validate("measured profile")?;
    if backend.rank() == 0 {
        let by_kind: BTreeMap<String, _> = times
            .iter()
            .map(|(kind, t)| (format!("{kind:?}"), t))
            .collect();
        save(&profile, args, json!({"unit_times_us": by_kind}))?;
    }
    Ok(())
}

fn save(profile: &Profile, args: &MeasureArgs, details: serde_json::Value) -> anyhow::Result<()> {
    profile.save(&args.out)?;
    if args.json {
        print_json(&json!({"out": args.out, "units": profile.unit_count(),
                           "block_size_bytes": profile.block_size_bytes, "details": details}));
    } else {
        println!(
            "wrote {}: {} units, block size {}, overlap slowdown {:.2}",
            args.out.display(),
            profile.unit_count(),
            format_bytes(profile.block_size_bytes as f64),
            profile.overlap_slowdown
        );
    }
    Ok(())
}
