//! Analytic profiles: a model spec and a hardware spec turned into a [`Profile`] with the
//! appendix formulas (FLOPs / (peak × MFU), activation bytes, α–β collective curves).

use crate::curve::CommCurve;
use crate::hardware::{Catalog, Device, Interconnect};
use crate::model::{Attention, ModelSpec, PositionEmbedding};
use crate::profile::{
    BytesPerParam, CommCurves, GroupCurves, Host, Link, PROFILE_SCHEMA, Profile, Topology,
    UnitProfile, offered_groups,
};
use crate::timeline::Collective;
use crate::{Error, Result};
use std::collections::BTreeMap;

mod nodes;
pub use nodes::{NodeLayout, RankLayout};

/// Message sizes of the analytic curves: 1 KiB … 4 GiB, powers of two.
const CURVE_SIZES_LOG2: std::ops::RangeInclusive<u32> = 10..=32;

/// Everything `shardplan profile analytic` takes besides the model.
#[derive(Debug, Clone)]
pub struct AnalyticOptions {
    pub device: String,
    pub world_size: u32,
    /// K, micro-batches per optimizer step (DESIGN §3.10).
    pub micro_batches: u32,
    pub micro_batch: u64,
    /// Defaults to the model's sequence length.
    pub seq_len: Option<u64>,
    /// Model FLOP utilisation in (0, 1].
    pub mfu: f64,
    pub attention: Attention,
    pub bytes_per_param: BytesPerParam,
    /// Overrides the block size derived from the curves.
    pub block_size_bytes: Option<u64>,
    pub overlap_slowdown: f64,
    /// κ_q, in [0, 1].
    pub comm_slowdown: f64,
    pub iteration_extra_us: f64,
    /// Ranks per node G, where the profile carries a topology (DESIGN §3.11): `Some(None)` takes
    /// the device's node size from the catalog; None is one link. [`AnalyticOptions::laid_out`]
    /// sets it as `profile analytic` does.
    pub topology: Option<Option<u32>>,
}

impl AnalyticOptions {
    /// The defaults: micro-batch 1, MFU 0.5, flash attention, 2/2/12 bytes, κ = 0, one
    /// link (no topology; [`AnalyticOptions::laid_out`] applies `profile analytic`'s layout).
    pub fn new(device: &str, world_size: u32) -> Self {
        AnalyticOptions {
            device: device.to_string(),
            world_size,
            micro_batches: 1,
            micro_batch: 1,
            seq_len: None,
            mfu: 0.5,
            attention: Attention::Flash,
            bytes_per_param: BytesPerParam {
                param: 2,
                grad: 2,
                optimizer: 12,
            },
            block_size_bytes: None,
            overlap_slowdown: 0.0,
            comm_slowdown: 0.0,
            iteration_extra_us: 0.0,
            topology: None,
        }
    }
}

impl AnalyticOptions {
    /// These options with the topology `layout` gives their world of ranks of their device
    /// ([`NodeLayout::gpus_per_node`]): `profile analytic`'s node layout, by default the device's
    /// nodes wherever the world spans more than one.
    pub fn laid_out(self, catalog: &Catalog, layout: NodeLayout) -> Result<Self> {
        let device = catalog.device(&self.device)?;
        let node = layout.gpus_per_node(&self.device, device, self.world_size)?;
        Ok(AnalyticOptions {
            topology: node.map(Some),
            ..self
        })
    }
}

/// The three ops' ring step counts and bandwidth factors for `n` ranks (nccl-tests busbw rules):
/// an AllReduce takes twice a gather's or a reduce-scatter's steps and bytes.
fn ring_time(ic_busbw_gbps: f64, ic: &Interconnect, n: u32, op: Collective, bytes: f64) -> f64 {
    let n = n as f64;
    let (steps, factor) = match op {
        Collective::AllReduce => (2.0 * (n - 1.0), 2.0 * (n - 1.0) / n),
        Collective::AllGather | Collective::ReduceScatter => (n - 1.0, (n - 1.0) / n),
    };
    let bytes_per_us = ic_busbw_gbps * 1e3;
    ic.base_latency_us + steps * ic.step_latency_us + factor * bytes / bytes_per_us
}

fn analytic_curve(busbw_gbps: f64, ic: &Interconnect, n: u32, op: Collective) -> CommCurve {
    CommCurve {
        points: CURVE_SIZES_LOG2
            .map(|e| {
                let bytes = 1u64 << e;
                (bytes, ring_time(busbw_gbps, ic, n, op, bytes as f64))
            })
            .collect(),
    }
}

/// The α–β curves of the three collectives for `world_size` ranks of catalog device `device`
/// (over the interconnect the catalog gives that many ranks).
pub fn comm_curves(catalog: &Catalog, device: &str, world_size: u32) -> Result<CommCurves> {
    let device = catalog.device(device)?;
    let ic = catalog.interconnect_for(device, world_size);
    let n = world_size;
    Ok(CommCurves {
        all_gather: analytic_curve(ic.all_gather_busbw_gbps, ic, n, Collective::AllGather),
        reduce_scatter: analytic_curve(
            ic.reduce_scatter_busbw_gbps,
            ic,
            n,
            Collective::ReduceScatter,
        ),
        all_reduce: analytic_curve(ic.all_reduce_busbw_gbps, ic, n, Collective::AllReduce),
    })
}

/// The α–β curves of the three collectives for groups of `ranks` ranks of catalog device `device`
/// on `link`: the catalog's intra-node interconnect inside a node, its inter-node one across.
pub fn group_curves(device: &Device, catalog: &Catalog, ranks: u32, link: Link) -> CommCurves {
    let key = match link {
        Link::Intra => &device.intra_node,
        Link::Inter => &device.inter_node,
    };
    let ic = &catalog.interconnects[key];
    CommCurves {
        all_gather: analytic_curve(ic.all_gather_busbw_gbps, ic, ranks, Collective::AllGather),
        reduce_scatter: analytic_curve(
            ic.reduce_scatter_busbw_gbps,
            ic,
            ranks,
            Collective::ReduceScatter,
        ),
        all_reduce: analytic_curve(ic.all_reduce_busbw_gbps, ic, ranks, Collective::AllReduce),
    }
}

/// The topology of `world` ranks of catalog device `device` on nodes of `node` ranks (the
/// catalog's `gpus_per_node`, at most `world`, when `None`): every group the plan space offers
/// ([`offered_groups`]) with its analytic curves.
pub fn analytic_topology(
    catalog: &Catalog,
    device: &str,
    world: u32,
    node: Option<u32>,
) -> Result<Topology> {
    let device = catalog.device(device)?;
    // A world smaller than the catalog's node fills part of one node.
    let node = node.unwrap_or(device.gpus_per_node.min(world));
    if node == 0 || !world.is_multiple_of(node) {
        return Err(Error::invalid(
            "--gpus-per-node",
            "gpus_per_node",
            format!("a positive divisor of the world size {world}, got {node}"),
        ));
    }
    let groups = offered_groups(world, node)
        .into_iter()
        .map(|g| GroupCurves {
            ranks: g.ranks,
            link: g.link,
            comm: group_curves(device, catalog, g.ranks, g.link),
        })
        .collect();
    Ok(Topology {
        gpus_per_node: node,
        groups,
        communicator_bytes: NCCL_COMMUNICATOR_BYTES,
    })
}

/// The device memory one NCCL communicator holds, estimated from NCCL's documented defaults
/// (DESIGN §3.11): per channel, a send and a receive connection to its ring neighbours, each with
/// the Simple protocol's `NCCL_BUFFSIZE` (4 MiB), LL128's (4 MiB) and LL's (256 KiB) buffers, on
/// 16 channels: 2·16·(4 + 4 + 0.25) MiB = 264 MiB.
pub const NCCL_COMMUNICATOR_BYTES: u64 = 2 * 16 * (8 * 1024 * 1024 + 256 * 1024);

/// The `[host]` of `world` ranks of `device` (DESIGN §3.13), None where the catalog gives the
/// device no host: the ranks of a node are min(world, gpus_per_node); those sharing one host link
/// min(that, gpus_per_link) copy at once, so each rank's copy of S bytes takes
/// α + S·ranks_per_link/β; a rank's step per parameter is the host's × the ranks of its node.
pub fn analytic_host(catalog: &Catalog, device: &Device, world: u32) -> Option<Host> {
    let spec = device.host.as_ref()?;
    let link = &catalog.host_links[&spec.link];
    let ranks_per_node = device.gpus_per_node.min(world);
    let ranks_per_link = spec.gpus_per_link.min(ranks_per_node);
    let curve = |gbps: f64| CommCurve {
        points: CURVE_SIZES_LOG2
            .map(|e| {
                let bytes = 1u64 << e;
                let per_rank_bytes_per_us = gbps * 1e3 / f64::from(ranks_per_link);
                (
                    bytes,
                    link.latency_us + bytes as f64 / per_rank_bytes_per_us,
                )
            })
            .collect(),
    };
    Some(Host {
        ranks_per_node,
        ranks_per_link,
        memory_bytes: spec.memory_bytes,
        optimizer_us_per_param: spec.optimizer_us_per_param * f64::from(ranks_per_node),
        host_to_device: curve(link.host_to_device_gbps),
        device_to_host: curve(link.device_to_host_gbps),
    })
}

/// Builds the analytic profile of `model` under `opts`.
pub fn analytic_profile(
    model: &ModelSpec,
    catalog: &Catalog,
    opts: &AnalyticOptions,
) -> Result<Profile> {
    let device = catalog.device(&opts.device)?;
    if opts.world_size == 0 {
        return Err(Error::invalid(
            "--world-size",
            "world_size",
            "a positive integer",
        ));
    }
    if opts.micro_batch == 0 {
        return Err(Error::invalid(
            "--micro-batch",
            "micro_batch",
            "a positive integer",
        ));
    }
    if !(opts.mfu > 0.0 && opts.mfu <= 1.0) {
        return Err(Error::invalid(
            "--mfu",
            "mfu",
            format!("a fraction in (0, 1], got {}", opts.mfu),
        ));
    }
    let seq_len = opts.seq_len.unwrap_or(model.seq_len);
    if seq_len == 0 {
        return Err(Error::invalid("--seq-len", "seq_len", "a positive integer"));
    }
    if model.position_embedding == PositionEmbedding::Learned && seq_len > model.seq_len {
        return Err(Error::invalid(
            "--seq-len",
            "seq_len",
            format!(
                "at most the model's {} learned positions, got {seq_len}",
                model.seq_len
            ),
        ));
    }
    let n = opts.world_size;
    let comm = comm_curves(catalog, &opts.device, n)?;
    let block_size_bytes = opts.block_size_bytes.unwrap_or_else(|| comm.block_size());
    let flops_per_us = device.peak_bf16_tflops * 1e6 * opts.mfu;
    let units = model
        .unit_shapes(opts.micro_batch, seq_len, opts.attention)
        .into_iter()
        .map(|u| {
            let forward_us = u.forward_flops / flops_per_us;
            UnitProfile {
                name: u.name,
                params: u.params,
                forward_us,
                checkpointed_forward_us: None,
                backward_us: 2.0 * forward_us,
                recompute_us: None,
                optimizer_us: 0.0,
                activation_bytes: u.activation_bytes,
                checkpoint_activation_bytes: u.checkpoint_activation_bytes,
                forward_workspace_bytes: u.forward_workspace_bytes,
                backward_workspace_bytes: u.backward_workspace_bytes,
                reads_params_of: u.reads_params_of,
            }
        })
        .collect();
    let source = BTreeMap::from([
        ("generator".to_string(), "analytic".to_string()),
        ("model".to_string(), model.name.clone()),
        ("device".to_string(), opts.device.clone()),
        ("micro_batch".to_string(), opts.micro_batch.to_string()),
        ("seq_len".to_string(), seq_len.to_string()),
        ("mfu".to_string(), opts.mfu.to_string()),
        (
            "attention".to_string(),
            format!("{:?}", opts.attention).to_lowercase(),
        ),
        (
            "device_memory_bytes".to_string(),
            device.memory_bytes.to_string(),
        ),
    ]);
    let profile = Profile {
        schema: PROFILE_SCHEMA,
        name: format!("{} on {} x{}", model.name, opts.device, n),
        source,
        world_size: n,
        micro_batches: opts.micro_batches,
        block_size_bytes,
        overlap_slowdown: opts.overlap_slowdown,
        overlap_slowdown_reduce_scatter: None,
        overlap_slowdown_all_gather: None,
        comm_slowdown: opts.comm_slowdown,
        update_slowdown: None,
        iteration_extra_us: opts.iteration_extra_us,
        bytes_per_param: opts.bytes_per_param,
        shard_quantum_params: 1,
        units,
        comm,
        topology: opts
            .topology
            .map(|node| analytic_topology(catalog, &opts.device, n, node))
            .transpose()?,
        host: analytic_host(catalog, device, n),
    };
    profile.validate("analytic profile")?;
    Ok(profile)
}

/// The zoo model `name` (`models/{name}.toml`), for tests.
#[cfg(test)]
pub(crate) fn zoo(name: &str) -> ModelSpec {
    ModelSpec::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../models/{name}.toml")),
    )
    .unwrap()
}

/// The analytic profile of the zoo model `name` on `world_size` H100 SXMs on one link (`profile
/// analytic --flat`), for tests.
#[cfg(test)]
pub(crate) fn zoo_profile(name: &str, world_size: u32) -> Profile {
    analytic_profile(
        &zoo(name),
        &Catalog::bundled().unwrap(),
        &AnalyticOptions::new("h100-sxm", world_size),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama2_7b_block_forward_time_is_flops_over_peak_times_mfu() {
        let profile = zoo_profile("llama2-7b", 64);
        assert_eq!(profile.units.len(), 34);
        let block = &profile.units[1];
        // tokens 4096 · (2 · 202,375,168 matrix params + 4 · 4096 · 4096) FLOPs / (989e12 · 0.5) s.
        let flops = 4096.0 * (2.0 * 202_375_168.0 + 4.0 * 4096.0 * 4096.0);
        assert!((block.forward_us - flops / 494.5e6).abs() < 1e-6);
        assert_eq!(block.backward_us, 2.0 * block.forward_us);
        assert_eq!(block.activation_bytes, 34 * 4096 * 4096);
        assert_eq!(block.checkpoint_activation_bytes, 2 * 4096 * 4096);
    }

    #[test]
    fn collective_time_follows_the_ring_formula() {
        let profile = zoo_profile("llama2-7b", 8);
        // NVLink4: 8 + 7·1 µs + (7/8) · 2^30 B / 370e3 B/µs.
        let expected = 15.0 + 0.875 * 1073741824.0 / 370e3;
        assert!((profile.comm.all_gather.time_us(1073741824.0) - expected).abs() < 1e-9);
        assert!(profile.block_size_bytes.is_power_of_two());
    }

    #[test]
    fn host_copies_share_the_link_and_steps_share_the_host() {
        let profile = zoo_profile("llama2-7b", 8);
        let host = profile.host.as_ref().unwrap();
        assert_eq!((host.ranks_per_node, host.ranks_per_link), (8, 2));
        // 10 µs + 2^30 B · 2 ranks / 55e3 B/µs.
        let expected = 10.0 + 1073741824.0 * 2.0 / 55e3;
        assert!((host.host_to_device.time_us(1073741824.0) - expected).abs() < 1e-9);
        assert!((host.optimizer_us_per_param - 8.0 * 2.5e-4).abs() < 1e-18);
        let alone = zoo_profile("llama2-7b", 1);
        let host = alone.host.as_ref().unwrap();
        assert_eq!((host.ranks_per_node, host.ranks_per_link), (1, 1));
        assert!((host.device_to_host.time_us(55e3) - 11.0).abs() < 1e-9);
    }

    #[test]
    fn rejects_bad_options() {
        let c = Catalog::bundled().unwrap();
        let mut o = AnalyticOptions::new("h100-sxm", 8);
        o.mfu = 1.5;
        assert!(
            analytic_profile(&zoo("gpt2-small"), &c, &o)
                .unwrap_err()
                .to_string()
                .contains("mfu")
        );
        let o = AnalyticOptions::new("h100-sxm", 0);
        assert!(analytic_profile(&zoo("gpt2-small"), &c, &o).is_err());
    }
}
