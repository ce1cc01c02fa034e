//! The ranks' topology in profiles (DESIGN §3.11): analytic group curves from the catalog's two
//! interconnects, profiles without one unchanged (digests and predictions), the file round trip,
//! and bad topologies refused naming the field.

mod common;

use common::{affine, repo_root, zoo_profile};
use shardplan_scheduler::analytic::{AnalyticOptions, NCCL_COMMUNICATOR_BYTES, analytic_profile};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::profile::{
    CommCurves, GroupCurves, Link, Profile, Topology, offered_groups,
};
use shardplan_scheduler::schedule::Recompute;

fn llama70b(world: u32, node: Option<Option<u32>>) -> Result<Profile, String> {
    let path = repo_root().join("models/llama2-70b.toml");
    let options = AnalyticOptions {
        topology: node,
        ..AnalyticOptions::new("h100-sxm", world)
    };
    analytic_profile(
        &ModelSpec::load(&path).unwrap(),
        &Catalog::bundled().unwrap(),
        &options,
    )
    .map_err(|e| e.to_string())
}

/// 64 H100s as 8 nodes of 8 (the catalog's node): every offered group with curves; a group of 8
/// inside a node moves 1 GiB faster than a group of 8 across nodes, by the catalog's NVLink over
/// InfiniBand bandwidth; the world's curves, every flat baseline's time and the flat profile's
/// digest are unchanged by the topology, and each peak grows by the world communicator's buffers
/// (NCCL's, 264 MiB).
#[test]
fn an_analytic_topology_adds_the_groups_and_changes_no_prediction() {
    let flat = zoo_profile("llama2-70b");
    let nodes = llama70b(64, Some(None)).unwrap();
    let topology = nodes.topology.as_ref().unwrap();
    assert_eq!(topology.gpus_per_node, 8);
    let groups: Vec<_> = topology.groups.iter().map(|g| (g.ranks, g.link)).collect();
    let offered: Vec<_> = offered_groups(64, 8)
        .into_iter()
        .map(|g| (g.ranks, g.link))
        .collect();
    assert_eq!(groups, offered);
    let gib = (1u64 << 30) as f64;
    let intra = topology.curves(8, Link::Intra).unwrap();
    let inter = topology.curves(8, Link::Inter).unwrap();
    let (fast, slow) = (intra.all_gather.time_us(gib), inter.all_gather.time_us(gib));
    let catalog = Catalog::bundled().unwrap();
    let device = catalog.device("h100-sxm").unwrap();
    let ratio = catalog.interconnects[&device.intra_node].all_gather_busbw_gbps
        / catalog.interconnects[&device.inter_node].all_gather_busbw_gbps;
    assert!(
        (slow / fast / ratio - 1.0).abs() < 0.01,
        "{slow} / {fast} against the bandwidth ratio {ratio}"
    );
    assert_eq!(nodes.comm, flat.comm);
    assert_ne!(nodes.digest(), flat.digest());
    assert_eq!(flat.digest(), zoo_profile("llama2-70b").digest());
    for kind in BaselineKind::ALL {
        let (a, b) = (
            baseline(&flat, kind, Recompute::On, None).unwrap(),
            baseline(&nodes, kind, Recompute::On, None).unwrap(),
        );
        assert_eq!(
            a.simulation.iteration_time_us,
            b.simulation.iteration_time_us
        );
        assert_eq!(
            b.simulation.peak_memory_bytes - a.simulation.peak_memory_bytes,
            NCCL_COMMUNICATOR_BYTES as f64
        );
    }
    let again = Profile::from_toml(&nodes.to_toml(), "round trip").unwrap();
    assert_eq!(again, nodes);
    assert_eq!(again.digest(), nodes.digest());
}

/// 48 H100s as 6 nodes of 8: analytic writes the shard groups of 1, 2 and 3 nodes (8, 16, 24;
/// 3 is no power of two) with their replica groups (6, 3, 2), a group of several nodes timed as
/// NCCL's ring over its S ranks bound by the NIC (the catalog's formula, computed here by hand:
/// base + (S − 1)·step + (S − 1)/S·bytes/busbw), and the ILP offers all three; a profile written
/// before, without the curves of 24 ranks and of its replica group, loads and offers 8 and 16.
#[test]
fn analytic_writes_every_group_of_whole_nodes_and_old_profiles_offer_fewer() {
    use shardplan_scheduler::groups::shard_groups;
    let profile = llama70b(48, Some(None)).unwrap();
    let topology = profile.topology.as_ref().unwrap();
    let groups: Vec<_> = topology.groups.iter().map(|g| (g.ranks, g.link)).collect();
    use Link::{Inter, Intra};
    assert_eq!(
        groups,
        [
            (2, Inter),
            (3, Inter),
            (6, Inter),
            (8, Intra),
            (16, Inter),
            (24, Inter)
        ]
    );
    let gib = (1u64 << 30) as f64;
    // ib-ndr400: 46 GB/s bus bandwidth, 15 µs base, 6 µs a step.
    let ring = |steps: f64, factor: f64| 15.0 + steps * 6.0 + factor * gib / 46e3;
    let s24 = topology.curves(24, Inter).unwrap();
    let expected = ring(23.0, 23.0 / 24.0);
    for (op, curve) in [("AG", &s24.all_gather), ("RS", &s24.reduce_scatter)] {
        let t = curve.time_us(gib);
        assert!(
            (t / expected - 1.0).abs() < 1e-9,
            "{op} over 24: {t}, by hand {expected}"
        );
    }
    let replica = topology.curves(2, Inter).unwrap().all_reduce.time_us(gib);
    let by_hand = ring(2.0, 1.0);
    assert!(
        (replica / by_hand - 1.0).abs() < 1e-9,
        "RA over 2: {replica}, {by_hand}"
    );
    assert_eq!(shard_groups(&profile), [8, 16, 24]);
    let mut old = profile.clone();
    let topology = old.topology.as_mut().unwrap();
    topology.groups.retain(|g| ![24, 2].contains(&g.ranks));
    let old = Profile::from_toml(&old.to_toml(), "old.toml").unwrap();
    assert_eq!(shard_groups(&old), [8, 16]);
}

/// One node (N ≤ G) offers no groups; a world smaller than the catalog's node fills part of one;
/// an explicit node size must divide the world.
#[test]
fn single_nodes_and_node_sizes_that_do_not_divide_the_world() {
    let one = llama70b(8, Some(None)).unwrap().topology.unwrap();
    assert_eq!((one.gpus_per_node, one.groups.len()), (8, 0));
    let part = llama70b(4, Some(None)).unwrap().topology.unwrap();
    assert_eq!((part.gpus_per_node, part.groups.len()), (4, 0));
    let two_by_two = llama70b(4, Some(Some(2))).unwrap().topology.unwrap();
    let groups: Vec<_> = two_by_two
        .groups
        .iter()
        .map(|g| (g.ranks, g.link))
        .collect();
    assert_eq!(groups, [(2, Link::Intra), (2, Link::Inter)]);
    let e = llama70b(64, Some(Some(12))).unwrap_err();
    assert!(
        e.contains("gpus_per_node") && e.contains("divisor of the world size 64, got 12"),
        "{e}"
    );
}

/// Bad topologies in a profile file are refused naming the field and what was expected.
#[test]
fn bad_topologies_are_refused_naming_the_field() {
    let base = llama70b(64, Some(None)).unwrap();
    let curves = || CommCurves {
        all_gather: affine(10.0, 1e3),
        reduce_scatter: affine(10.0, 1e3),
        all_reduce: affine(20.0, 1e3),
    };
    let group = |ranks, link| GroupCurves {
        ranks,
        link,
        comm: curves(),
    };
    let refused = |topology: Topology, field: &str, expected: &str| {
        let mut p = base.clone();
        p.topology = Some(topology);
        let e = Profile::from_toml(&p.to_toml(), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(field) && e.contains(expected), "{e}");
    };
    let nodes_of = |gpus_per_node, groups| Topology {
        gpus_per_node,
        groups,
        communicator_bytes: 0,
    };
    refused(
        nodes_of(6, vec![]),
        "topology.gpus_per_node",
        "a positive divisor of world_size 64, got 6",
    );
    refused(
        nodes_of(8, vec![group(3, Link::Inter)]),
        "topology.groups[0].ranks",
        "a divisor of world_size 64 from 2 to 32, got 3",
    );
    refused(
        nodes_of(8, vec![group(64, Link::Inter)]),
        "topology.groups[0].ranks",
        "got 64",
    );
    refused(
        nodes_of(8, vec![group(16, Link::Intra)]),
        "topology.groups[0].link",
        "a group of 16 ranks spans nodes of 8",
    );
    refused(
        nodes_of(8, vec![group(8, Link::Intra), group(8, Link::Intra)]),
        "topology.groups[1].ranks",
        "one entry per group",
    );
    let mut broken = group(8, Link::Intra);
    broken.comm.all_reduce.points.clear();
    refused(
        nodes_of(8, vec![broken]),
        "topology.groups[0].comm.all_reduce.points",
        "",
    );
}
