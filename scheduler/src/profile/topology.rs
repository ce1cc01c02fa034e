//! The ranks' topology (DESIGN §3.11): G ranks per node, and the time curves of every group of
//! ranks a plan may communicate in besides the world (whose curves are the profile's `comm`). A
//! profile without one has a single link: today's model, digests and predictions unchanged.

use super::CommCurves;
use serde::{Deserialize, Serialize};

/// The link a group of ranks communicates over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Link {
    /// All its ranks share a node (NVLink on a GPU node).
    Intra,
    /// It spans nodes (one NIC per GPU).
    Inter,
}

impl Link {
    pub const ALL: [Link; 2] = [Link::Intra, Link::Inter];

    /// The link of a group of `ranks` ranks on nodes of `node`: inside a node when it fits one
    /// (groups are whole nodes or parts of one), across nodes otherwise.
    pub fn of_group(ranks: u32, node: u32) -> Link {
        if ranks <= node {
            Link::Intra
        } else {
            Link::Inter
        }
    }

    /// The link's index in [`Link::ALL`] (a per-link array's index).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Link::Intra => "intra",
            Link::Inter => "inter",
        }
    }
}

/// The curves of the groups of `ranks` ranks on `link`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupCurves {
    pub ranks: u32,
    pub link: Link,
    pub comm: CommCurves,
}

/// N ranks on nodes of `gpus_per_node`, and the groups a plan may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// G: ranks per node; divides N.
    pub gpus_per_node: u32,
    /// One entry per (ranks, link), ranks dividing N; the world itself is the profile's `comm`.
    #[serde(default)]
    pub groups: Vec<GroupCurves>,
    /// Device bytes one communicator holds (NCCL's buffers), counted in every plan's peak for
    /// the world's and each further communicator the plan uses; 0 when left out.
    #[serde(default)]
    pub communicator_bytes: u64,
}

/// A group a plan over `world` ranks on nodes of `node` ranks may communicate in (DESIGN §3.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Group {
    pub ranks: u32,
    pub link: Link,
}

/// The groups the plan space offers besides the world: each shard group of S = m·G < N ranks,
/// m a divisor of the node count N/G (MiCS' groups of whole nodes; on the intra link when m = 1,
/// else across nodes), with its replica group of N/S ranks (one per node: inter), and the hpZ
/// secondary group of G ranks inside a node; sorted, without repeats. None on a single node
/// (N ≤ G).
pub fn offered_groups(world: u32, node: u32) -> Vec<Group> {
    let mut groups = Vec::new();
    if world <= node || node == 0 {
        return groups;
    }
    let nodes = world / node;
    for m in (1..nodes).filter(|&m| nodes.is_multiple_of(m)) {
        let shard = m * node;
        groups.push(Group {
            ranks: shard,
            link: Link::of_group(shard, node),
        });
        groups.push(Group {
            ranks: world / shard,
            link: Link::Inter,
        });
    }
    groups.push(Group {
        ranks: node,
        link: Link::Intra,
    });
    groups.sort();
    groups.dedup();
    groups
}

impl Topology {
    /// Checks the topology against the world of `world` ranks; the error is (field, expected).
    pub(super) fn check(&self, world: u32) -> Result<(), (String, String)> {
        let g = self.gpus_per_node;
        if g == 0 || !world.is_multiple_of(g) {
            return Err((
                "topology.gpus_per_node".into(),
                format!("a positive divisor of world_size {world}, got {g}"),
            ));
        }
        for (k, group) in self.groups.iter().enumerate() {
            let field = |name: &str| format!("topology.groups[{k}].{name}");
            let r = group.ranks;
            if r < 2 || r >= world || !world.is_multiple_of(r) {
                return Err((
                    field("ranks"),
                    format!(
                        "a divisor of world_size {world} from 2 to {}, got {r}",
                        world / 2
                    ),
                ));
            }
            if group.link == Link::Intra && r > g {
                return Err((
                    field("link"),
                    format!(
                        "`inter`: a group of {r} ranks spans nodes of {g} (gpus_per_node), got `intra`"
                    ),
                ));
            }
            let repeated = self.groups[..k]
                .iter()
                .any(|o| o.ranks == r && o.link == group.link);
            if repeated {
                return Err((
                    field("ranks"),
                    format!(
                        "one entry per group, got a second of {r} ranks on the {} link",
                        group.link.name()
                    ),
                ));
            }
            for (op, curve) in [
                ("all_gather", &group.comm.all_gather),
                ("reduce_scatter", &group.comm.reduce_scatter),
                ("all_reduce", &group.comm.all_reduce),
            ] {
                if let Err(why) = curve.check() {
                    return Err((field(&format!("comm.{op}.points")), why));
                }
            }
        }
        Ok(())
    }

    /// The curves of the groups of `ranks` ranks on `link`, if the profile has them.
    pub fn curves(&self, ranks: u32, link: Link) -> Option<&CommCurves> {
        self.groups
            .iter()
            .find(|g| g.ranks == ranks && g.link == link)
            .map(|g| &g.comm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(ranks: u32, link: Link) -> Group {
        Group { ranks, link }
    }

    /// N = 64 on nodes of 8: shard groups of 8, 16, 32 (replicated 8, 4, 2 times across nodes)
    /// and the hpZ group of 8 inside a node, which is the shard group of 8.
    #[test]
    fn the_groups_of_64_ranks_on_nodes_of_8() {
        use Link::{Inter, Intra};
        assert_eq!(
            offered_groups(64, 8),
            [
                group(2, Inter),
                group(4, Inter),
                group(8, Intra),
                group(8, Inter),
                group(16, Inter),
                group(32, Inter),
            ]
        );
    }

    #[test]
    fn one_node_offers_no_groups_and_every_whole_number_of_nodes_dividing_the_count_is_offered() {
        use Link::{Inter, Intra};
        assert!(offered_groups(8, 8).is_empty());
        assert!(offered_groups(4, 8).is_empty());
        // 4 ranks as 2 nodes of 2: the shard group of 2 inside a node, replicated twice.
        assert_eq!(offered_groups(4, 2), [group(2, Intra), group(2, Inter)]);
        // 24 = 3 nodes of 8: shard groups of 8 (×3); 16 does not divide 24.
        assert_eq!(offered_groups(24, 8), [group(3, Inter), group(8, Intra)]);
        // 48 = 6 nodes of 8: shard groups of 1, 2 and 3 nodes (8, 16, 24), replicated 6, 3 and 2
        // times; 4 and 5 nodes do not divide 6.
        assert_eq!(
            offered_groups(48, 8),
            [
                group(2, Inter),
                group(3, Inter),
                group(6, Inter),
                group(8, Intra),
                group(16, Inter),
                group(24, Inter),
            ]
        );
        // 12 = 6 nodes of 2: S ∈ {2, 4, 6}, replicas {6, 3, 2}.
        assert_eq!(
            offered_groups(12, 2),
            [
                group(2, Intra),
                group(2, Inter),
                group(3, Inter),
                group(4, Inter),
                group(6, Inter),
            ]
        );
    }
}
