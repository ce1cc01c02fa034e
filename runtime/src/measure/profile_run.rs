//! `profile measure` end to end: a workload measured on the backend it runs on (its units, the
//! collectives, κ), or a zoo transformer's units replayed on a GPU. The CLI calls [`measure_model`] and
//! saves the profile; rank 0 alone saves it.

use super::host_link::{CopyRoom, measure_host};
use super::slots::{OtherCollectives, Slots, time_slot_interference};
use super::{
    DataSteps, LaunchRow, TimedLayouts, block_collectives, compute_placements, compute_slot,
    measurement_allocation, median, time_collectives, time_interference, time_launches, time_units,
    workload_profile,
};
use crate::backend::{Allocation, Backend, Group};
use crate::cuda::CudaBackend;
use crate::cuda::replay::ReplayBuffers;
use crate::dispatch::{AnyBackend, Data, Job, Model, ReplayJob};
use crate::executor::initialise;
use crate::layout::Placement;
use crate::model_file::ModelFile;
use crate::process::Oversubscribed;
use crate::train::{Train, optimize_unit};
use crate::transformer::{Gemm, UnitKind, backward_gemms, forward_gemms};
use crate::{Error, Result};
use serde_json::json;
use shardplan_scheduler::analytic::{
    AnalyticOptions, NCCL_COMMUNICATOR_BYTES, analytic_profile, analytic_topology, comm_curves,
};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::profile::{
    CommCurves, Group as TopologyGroup, GroupCurves, Link, Profile, Topology, offered_groups,
};
use shardplan_scheduler::size::format_bytes;
use shardplan_scheduler::timeline::Collective;
use std::collections::BTreeMap;

/// What to measure, as `profile measure`'s options give it.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    /// The world size the profile is for.
    pub world_size: u32,
    /// A catalog device: curves when one rank cannot measure them, a transformer's byte counts.
    pub device: Option<String>,
    /// A replayed zoo transformer's micro-batch (default 1) and sequence length (default the
    /// model's); a trained model's file sets both.
    pub micro_batch: Option<u64>,
    pub seq_len: Option<u64>,
    /// The largest collective message timed.
    pub max_message: u64,
    pub repeats: usize,
    /// A block size that overrides the measured curves'.
    pub block_size: Option<u64>,
    /// G, ranks per node: the profile gets a topology, every group the plan space offers with
    /// its curves (measured among the ranks, or the catalog's with one rank).
    pub gpus_per_node: Option<u32>,
    /// Times every kernel and product of one more step, one by one ([`super::time_launches`]).
    pub launch_times: bool,
    /// Measures the host link and the host's step (`[host]`, DESIGN §3.13) on a backend that
    /// offloads ([`super::measure_host`]).
    pub host_link: bool,
}

/// A measured profile and what the measurement saw (unit times, κ), for the report.
pub struct Measured {
    pub profile: Profile,
    /// This process's rank: only rank 0 writes the profile.
    pub rank: usize,
    pub details: serde_json::Value,
    /// Where one step's device time went, with `launch_times` (else empty).
    pub launches: Vec<LaunchRow>,
}

/// `profile measure` on this rank's backend: a trainable model (the MLP, a GPT-2 with
/// `[training]`, synthetic tokens: timing depends on neither the data nor the weights) measured
/// as a workload, for --world-size ranks (each holding its share of the global batch); a zoo
/// transformer's products replayed on a GPU. `origin` names the model file in errors.
pub fn measure_model(
    backend: AnyBackend,
    file: ModelFile,
    origin: &str,
    options: &MeasureOptions,
) -> Result<Measured> {
    match file {
        ModelFile::Transformer(model) if model.training.is_none() && options.launch_times => {
            Err(shardplan_scheduler::Error::invalid(
                origin,
                "training",
                "a [training] table for --launch-times: a replayed zoo transformer's products are \
             timed per unit, not per launch",
            )
            .into())
        }
        ModelFile::Transformer(model) if model.training.is_none() => {
            backend.replay(&model, origin, TransformerJob { origin, options })
        }
        file => {
            refuse_for_trained(origin, "--micro-batch", options.micro_batch)?;
            refuse_for_trained(origin, "--seq-len", options.seq_len)?;
            // One micro-batch's pass is what is measured; the profile says how many make a step.
            let ranks = (backend.rank(), options.world_size as usize);
            let model = Model::build(file, origin, ranks, Data::Synthetic)?;
            backend.run(&model, MeasureJob { options })
        }
    }
}

/// Refuses `setting`, a replayed transformer's, where it is `given` for a trained model (the MLP,
/// a GPT-2 with [training]): its file sets its batch and sequence.
fn refuse_for_trained<T>(origin: &str, setting: &'static str, given: Option<T>) -> Result<()> {
    if given.is_none() {
        return Ok(());
    }
    Err(Error::Setting {
        setting,
        expected: format!(
            "a zoo transformer replayed on a GPU for {setting}: {origin} is trained as its file \
             says (the MLP's batch_per_rank, a GPT-2's [training] table)"
        ),
    })
}

/// [`measure_workload`] as a [`Job`].
struct MeasureJob<'a> {
    options: &'a MeasureOptions,
}

impl Job for MeasureJob<'_> {
    type Output = Result<Measured>;
    fn run<B: Backend, W: Train<B>>(self, backend: B, workload: &W) -> Result<Measured> {
        measure_workload(backend, workload, self.options)
    }
}

/// [`measure_transformer`] as a [`ReplayJob`].
struct TransformerJob<'a> {
    origin: &'a str,
    options: &'a MeasureOptions,
}

impl ReplayJob for TransformerJob<'_> {
    type Output = Measured;
    fn run(self, backend: CudaBackend, model: &ModelSpec) -> Result<Measured> {
        measure_transformer(backend, model, self.origin, self.options)
    }
}

/// The curves: measured on the ranks this runs on, which must be the profile's world size; or,
/// on one rank with a device (required for a profile of more ranks), the catalog's curves for
/// the profile's ranks of that device (DESIGN §6.6). With a node size, the topology's groups
/// too, the same way (DESIGN §3.11). Returns where they came from.
fn curves<B: Backend>(
    backend: &mut B,
    start: usize,
    options: &MeasureOptions,
) -> Result<(CommCurves, Option<Topology>, String)> {
    let ranks = backend.world_size();
    let world = options.world_size;
    if ranks > 1 && options.device.is_some() {
        return Err(Error::Setting {
            setting: "--device",
            expected: format!(
                "one rank for it (whose collectives the catalog's curves stand in for): these \
                 {ranks} ranks measure their own"
            ),
        });
    }
    if ranks == 1 && (world > 1 || options.device.is_some()) {
        let device = options.device.as_deref().ok_or_else(|| Error::Setting {
            setting: "--device",
            expected: format!(
                "a device of the hardware catalog: one rank cannot measure the collectives \
                 of {world} (or run under mpirun -np {world})"
            ),
        })?;
        let catalog = Catalog::bundled()?;
        let curves = comm_curves(&catalog, device, world)?;
        let topology = (options.gpus_per_node)
            .map(|node| analytic_topology(&catalog, device, world, Some(node)))
            .transpose()?
            .map(|t| Topology {
                communicator_bytes: backend.communicator_bytes().unwrap_or(t.communicator_bytes),
                ..t
            });
        let source =
            format!("hardware catalog {device} x{world} (one rank: collectives not measured)");
        return Ok((curves, topology, source));
    }
    if world as usize != ranks {
        return Err(Error::Setting {
            setting: "--world-size",
            expected: format!(
                "the number of ranks, {ranks}, got {world} (start it with mpirun -np {world})"
            ),
        });
    }
    let (max, repeats) = (options.max_message, options.repeats);
    let curves = time_collectives(backend, Group::World, start, max, repeats)?;
    let topology = match options.gpus_per_node {
        Some(node) => Some(measured_topology(backend, start, node, options)?),
        None => None,
    };
    Ok((
        curves,
        topology,
        format!("measured on {ranks} ranks ({})", backend.name()),
    ))
}

/// The topology of this job's ranks on nodes of `node`: every offered group's curves timed among
/// its ranks, all groups of a shape at once. A group across nodes is timed as a replica group
/// (one rank per node) where one fits, else as consecutive ranks; a communicator's bytes are the
/// backend's (0 on the CPU, DESIGN §6.11), else NCCL's analytic estimate.
fn measured_topology<B: Backend>(
    backend: &mut B,
    start: usize,
    node: u32,
    options: &MeasureOptions,
) -> Result<Topology> {
    let world = backend.world_size() as u32;
    if node == 0 || !world.is_multiple_of(node) {
        return Err(Error::Setting {
            setting: "--gpus-per-node",
            expected: format!("a positive divisor of the world size {world}, got {node}"),
        });
    }
    let offered = offered_groups(world, node);
    let shape = |g: &TopologyGroup| match g.link {
        Link::Inter if g.ranks * node <= world => Group::Across((world / g.ranks) as usize),
        _ => Group::Consecutive(g.ranks as usize),
    };
    let shapes: Vec<Group> = offered.iter().map(shape).collect();
    backend.open_groups(&shapes)?;
    let groups = (offered.iter().zip(shapes))
        .map(|(g, group)| {
            let (max, repeats) = (options.max_message, options.repeats);
            Ok(GroupCurves {
                ranks: g.ranks,
                link: g.link,
                comm: time_collectives(backend, group, start, max, repeats)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Topology {
        gpus_per_node: node,
        groups,
        communicator_bytes: (backend.communicator_bytes()).unwrap_or(NCCL_COMMUNICATOR_BYTES),
    })
}

/// A workload's profile: its units timed, the collectives, κ beside block-sized AllReduces.
pub fn measure_workload<B: Backend, W: Train<B>>(
    mut backend: B,
    workload: &W,
    options: &MeasureOptions,
) -> Result<Measured> {
    let world = backend.world_size();
    if options.launch_times {
        // Refused at once by a backend without a launch clock, not after the units are timed.
        backend.start_launch_clock()?;
        backend.launch_times()?;
    }
    workload.load_kernels(&backend)?;
    let message_bytes = options.max_message.max(options.block_size.unwrap_or(0));
    let [plain, checkpointed] = compute_placements(workload, options.world_size)?;
    let elements = |p: &Placement| ((p.arena.size_bytes / 4) as usize).div_ceil(16) * 16;
    // Rounds time one data step at a time: its layout serves them all. After the plain layout, a
    // copy whose optimizer steps run beside compute rounds of the first (κ_u) without touching
    // their bytes, then the checkpointed layout.
    let layout = plain.for_step(0);
    let copy_offset = elements(&plain);
    let copy = layout.shifted(copy_offset);
    let recomputing = checkpointed.for_step(0).shifted(2 * copy_offset);
    let compute_elements = 2 * copy_offset + elements(&checkpointed);
    let (mut allocation, start) = measurement_allocation(compute_elements, world, message_bytes);
    let host_room = match options.host_link {
        false => None,
        true => Some(host_room(
            &backend,
            &mut allocation,
            start,
            options.max_message,
        )?),
    };
    backend.allocate(allocation)?;
    for each in [layout, &copy, &recomputing] {
        initialise(&backend, workload, each)?;
    }
    let steps = DataSteps::default();
    let layouts = TimedLayouts {
        plain: layout,
        checkpointed: &recomputing,
    };
    let times = time_units(&backend, workload, layouts, options.repeats, &steps)?;
    let launches = match options.launch_times {
        true => time_launches(&backend, workload, layout, &steps)?,
        false => Vec::new(),
    };
    let (comm, topology, comm_source) = curves(&mut backend, start, options)?;
    let mut source = BTreeMap::from([
        ("generator".to_string(), "measured".to_string()),
        ("backend".to_string(), backend.name().to_string()),
        ("model".to_string(), workload.name().to_string()),
        ("comm".to_string(), comm_source),
    ]);
    if let Some(o) = Oversubscribed::here().filter(|_| backend.host_computes()) {
        source.insert("host".to_string(), o.described());
    }
    let mut profile = workload_profile(
        workload,
        options.world_size,
        &times,
        comm,
        options.block_size,
        source,
    )?;
    profile.topology = topology;
    let kappa_bytes = profile.block_size_bytes.min(message_bytes);
    let l = workload.unit_count();
    let pass = |s: usize| compute_slot(&backend, workload, layout, s, &steps);
    let block = |kind| block_collectives(&backend, start, kappa_bytes, 1, kind);
    let all_reduce = block(Collective::AllReduce)?;
    // Where the host computes, one κ_c serves every collective (DESIGN §6.6): measured apart,
    // a ReduceScatter's or AllGather's slots cost compute more than a run's do.
    let (reduce_scatter, all_gather);
    let others = match backend.host_computes() {
        true => None,
        false => {
            reduce_scatter = block(Collective::ReduceScatter)?;
            all_gather = block(Collective::AllGather)?;
            Some(OtherCollectives {
                reduce_scatter: &reduce_scatter,
                all_gather: &all_gather,
            })
        }
    };
    let update = |s: usize| optimize_unit(workload, &backend, &copy, s % l, 1);
    let slots = Slots {
        slots: 2 * l,
        compute: &pass,
        all_reduce: &all_reduce,
        others,
        update: &update,
    };
    let interference = time_slot_interference(&backend, &slots)?;
    // o_i as the update slots timed it: slot s stepped unit s mod L, so each unit twice.
    for (i, unit) in profile.units.iter_mut().enumerate() {
        unit.optimizer_us = (interference.update_us[i] + interference.update_us[i + l]) / 2.0;
    }
    profile.overlap_slowdown = interference.compute;
    profile.overlap_slowdown_reduce_scatter = interference.reduce_scatter;
    profile.overlap_slowdown_all_gather = interference.all_gather;
    profile.comm_slowdown = interference.comm;
    profile.update_slowdown = Some(interference.update);
    if let Some(room) = host_room {
        profile.host = Some(measure_host(&backend, room, options.repeats, &profile)?);
    }
    let mut details = json!({
        "unit_times_us": times,
        "interference": interference,
    });
    if options.launch_times {
        details["launches"] = json!(launches);
        let categories: serde_json::Map<String, serde_json::Value> = super::by_category(&launches)
            .into_iter()
            .map(|(category, us)| (category.name().to_string(), json!(us)))
            .collect();
        details["launch_categories_us"] = json!(categories);
    }
    Ok(Measured {
        profile,
        rank: backend.rank(),
        details,
        launches,
    })
}

/// Where `--host-link` copies (DESIGN §6.12): the device arena's message area from `start`, and a
/// host arena of `max_bytes` added to `allocation`; refused on a backend that does not offload.
fn host_room<B: Backend>(
    backend: &B,
    allocation: &mut Allocation,
    start: usize,
    max_bytes: u64,
) -> Result<CopyRoom> {
    if !backend.offloads() {
        return Err(Error::Setting {
            setting: "--host-link",
            expected: format!(
                "a backend that offloads (--backend cpu; the {} backend does not offload yet)",
                backend.name()
            ),
        });
    }
    allocation.host_arena_elements = CopyRoom::host_elements(max_bytes);
    Ok(CopyRoom {
        device_start: start,
        host_start: allocation.arena_elements,
        max_bytes,
    })
}

/// Passes over a replay that warm up before [`replay_us`] times it.
const REPLAY_WARM_UP: usize = 3;

/// µs of one pass over `gemms`: the median of `repeats` passes after [`REPLAY_WARM_UP`] (0 for
/// no products).
fn replay_us(
    backend: &CudaBackend,
    gemms: &[Gemm],
    buffers: &ReplayBuffers,
    repeats: usize,
) -> Result<f64> {
    if gemms.is_empty() {
        return Ok(0.0);
    }
    let passes = backend.time_replay(gemms, buffers, REPLAY_WARM_UP + repeats)?;
    Ok(median(passes[REPLAY_WARM_UP..].to_vec()))
}

/// A zoo transformer on a GPU: its units' products replayed, bytes from the model formulas.
fn measure_transformer(
    mut backend: CudaBackend,
    model: &ModelSpec,
    origin: &str,
    options: &MeasureOptions,
) -> Result<Measured> {
    let device = options.device.as_deref().ok_or_else(|| Error::Setting {
        setting: "--device",
        expected: format!(
            "a device of the hardware catalog: {origin} is a transformer, whose byte counts and \
             curves come from the catalog"
        ),
    })?;
    if options.host_link {
        return Err(Error::Setting {
            setting: "--host-link",
            expected: format!(
                "a trained model on a backend that offloads (--backend cpu): {origin} is a \
                 transformer replayed on a GPU"
            ),
        });
    }
    let mut analytic = AnalyticOptions::new(device, options.world_size);
    let micro_batch = options.micro_batch.unwrap_or(1);
    analytic.micro_batch = micro_batch;
    analytic.seq_len = options.seq_len;
    analytic.block_size_bytes = options.block_size;
    analytic.topology = options.gpus_per_node.map(Some);
    let mut profile = analytic_profile(model, &Catalog::bundled()?, &analytic)?;
    let seq_len = options.seq_len.unwrap_or(model.seq_len);
    let layers = model.layers as usize;
    let mut times = BTreeMap::new();
    let mut block_round = None;
    for kind in [UnitKind::Embedding, UnitKind::Block, UnitKind::Head] {
        let forward = forward_gemms(model, kind, micro_batch, seq_len);
        let backward = backward_gemms(&forward);
        let all: Vec<_> = forward.iter().chain(&backward).copied().collect();
        let buffers = backend.replay_buffers(&all)?;
        let f = replay_us(&backend, &forward, &buffers, options.repeats)?;
        let b = replay_us(&backend, &backward, &buffers, options.repeats)?;
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
    let (allocation, start) = measurement_allocation(0, world, options.max_message);
    backend.allocate(allocation)?;
    let comm_source = if world >= 2 {
        let (comm, topology, source) = curves(&mut backend, start, options)?;
        profile.block_size_bytes = options.block_size.unwrap_or_else(|| comm.block_size());
        profile.comm = comm;
        profile.topology = topology.or(profile.topology.take());
        source
    } else {
        format!(
            "hardware catalog {device} x{} (one GPU: collectives not measured)",
            options.world_size
        )
    };
    let (block, buffers) = block_round
        .ok_or_else(|| Error::Backend("the transformer replay has no block unit".into()))?;
    let round = || backend.replay(&block, &buffers);
    let kappa_bytes = profile.block_size_bytes.min(options.max_message);
    let reductions = block_collectives(&backend, start, kappa_bytes, 400, Collective::AllReduce)?;
    let interference = time_interference(&backend, &round, &reductions)?;
    profile.overlap_slowdown = interference.compute;
    profile.comm_slowdown = interference.comm;
    profile.source = BTreeMap::from([
        (
            "generator".to_string(),
            "measured: matrix products replayed".to_string(),
        ),
        ("backend".to_string(), "cuda".to_string()),
        ("gpu".to_string(), backend.device_name()),
        ("model".to_string(), model.name.clone()),
        ("micro_batch".to_string(), micro_batch.to_string()),
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
    ])
    .into_iter()
    .chain(
        (Oversubscribed::here().filter(|_| backend.host_computes()))
            .map(|o| ("host".to_string(), o.described())),
    )
    .collect();
    profile.name = format!(
        "{} on {} x{}",
        model.name,
        backend.device_name(),
        options.world_size
    );
    profile.validate("measured profile")?;
    let by_kind: BTreeMap<String, _> = times
        .iter()
        .map(|(kind, t)| (format!("{kind:?}"), t))
        .collect();
    Ok(Measured {
        profile,
        rank: backend.rank(),
        details: json!({"unit_times_us": by_kind}),
        launches: Vec::new(),
    })
}
