//! How an analytic profile lays its ranks on nodes (DESIGN §3.11): by default on the device's
//! nodes wherever the world spans more than one, on one link when asked, or on nodes of a given
//! size; and a profile's layout as its summary line says it.

use crate::hardware::Device;
use crate::profile::Profile;
use crate::{Error, Result};
use serde::Serialize;
use std::fmt;

/// Where `profile analytic` puts the world's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLayout {
    /// The default: nodes of the catalog's `gpus_per_node` wherever the world spans more than
    /// one (the node size must divide N), else one link (one node needs no topology).
    DeviceNodes,
    /// One link for every collective, no topology (`--flat`): the inter-node interconnect once
    /// the world spans nodes.
    Flat,
    /// A topology on nodes of the catalog's size, at most N (`--gpus-per-node catalog`): on one
    /// node, a topology without groups.
    CatalogNode,
    /// A topology on nodes of G ranks (`--gpus-per-node G`).
    NodesOf(u32),
}

impl NodeLayout {
    /// The ranks per node of the topology this layout gives `world` ranks of `device` (named
    /// `device_name` in the catalog), or None where every collective runs on one link. A default
    /// layout whose world spans nodes it does not fill is refused, naming `--world-size`.
    pub fn gpus_per_node(
        self,
        device_name: &str,
        device: &Device,
        world: u32,
    ) -> Result<Option<u32>> {
        let node = device.gpus_per_node;
        match self {
            NodeLayout::Flat => Ok(None),
            NodeLayout::NodesOf(ranks) => Ok(Some(ranks)),
            NodeLayout::CatalogNode => Ok(Some(node.min(world))),
            NodeLayout::DeviceNodes if world <= node => Ok(None),
            NodeLayout::DeviceNodes if world.is_multiple_of(node) => Ok(Some(node)),
            NodeLayout::DeviceNodes => Err(Error::invalid(
                "--world-size",
                "world_size",
                format!(
                    "a multiple of {device_name}'s {node} GPUs a node (the catalog's \
                     gpus_per_node) to span its nodes, got {world}; --gpus-per-node G for nodes \
                     of another size, --flat for one link"
                ),
            )),
        }
    }
}

/// Where a profile's ranks sit and on which interconnects they communicate, as `profile
/// analytic`'s summary says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RankLayout {
    /// Nodes of `gpus_per_node` ranks: groups inside a node on `intra`, across on `inter`.
    Nodes {
        world_size: u32,
        nodes: u32,
        gpus_per_node: u32,
        intra: String,
        inter: String,
    },
    /// Every collective on the one interconnect `link`.
    Flat { world_size: u32, link: String },
}

impl RankLayout {
    /// The layout of `profile`, an analytic profile of `device`.
    pub fn of(profile: &Profile, device: &Device) -> RankLayout {
        let world_size = profile.world_size;
        match &profile.topology {
            Some(topology) => RankLayout::Nodes {
                world_size,
                nodes: world_size / topology.gpus_per_node,
                gpus_per_node: topology.gpus_per_node,
                intra: device.intra_node.clone(),
                inter: device.inter_node.clone(),
            },
            None => RankLayout::Flat {
                world_size,
                link: device.interconnect_key_for(world_size).to_string(),
            },
        }
    }
}

/// `64 ranks on 8 nodes of 8 (intra: nvlink4, inter: ib-ndr400)`, `64 ranks on one link (flat:
/// ib-ndr400)`.
impl fmt::Display for RankLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankLayout::Nodes {
                world_size,
                nodes,
                gpus_per_node,
                intra,
                inter,
            } => {
                let noun = if *nodes == 1 { "node" } else { "nodes" };
                write!(
                    f,
                    "{world_size} ranks on {nodes} {noun} of {gpus_per_node} (intra: {intra}, \
                     inter: {inter})"
                )
            }
            RankLayout::Flat { world_size, link } => {
                write!(f, "{world_size} ranks on one link (flat: {link})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Catalog;

    fn h100() -> Device {
        Catalog::bundled()
            .unwrap()
            .device("h100-sxm")
            .unwrap()
            .clone()
    }

    #[test]
    fn the_default_takes_the_device_nodes_only_beyond_one_node() {
        let d = h100();
        let default = |n| NodeLayout::DeviceNodes.gpus_per_node("h100-sxm", &d, n);
        assert_eq!(default(64).unwrap(), Some(8));
        assert_eq!(default(16).unwrap(), Some(8));
        assert_eq!(default(8).unwrap(), None);
        assert_eq!(default(1).unwrap(), None);
        let refused = default(12).unwrap_err().to_string();
        assert!(
            refused.starts_with("--world-size: field `world_size`")
                && refused.contains("h100-sxm's 8 GPUs a node")
                && refused.contains("got 12")
                && refused.contains("--flat"),
            "{refused}"
        );
    }

    #[test]
    fn explicit_layouts_are_taken_as_given() {
        let d = h100();
        let at = |layout: NodeLayout, n| layout.gpus_per_node("h100-sxm", &d, n).unwrap();
        assert_eq!(at(NodeLayout::Flat, 64), None);
        assert_eq!(at(NodeLayout::Flat, 12), None);
        assert_eq!(at(NodeLayout::NodesOf(4), 12), Some(4));
        assert_eq!(at(NodeLayout::CatalogNode, 64), Some(8));
        assert_eq!(at(NodeLayout::CatalogNode, 4), Some(4));
    }
}
