//! The groups of ranks a unit may be sharded over beyond the world (DESIGN §3.11): the shard
//! groups S < N (HSDP) and the hpZ secondary group H that the plan space offers a profile, and
//! the checks of a unit's groups against its profile. With micro-batches (K ≥ 2) the groups are
//! the same; what a shard-group unit does at each micro-batch boundary is its accumulation's
//! (DESIGN §3.11.1).

use crate::profile::{Link, Profile, Topology};
use crate::timeline::Level;

/// The topology of `profile`, where it has one.
fn hierarchical(profile: &Profile) -> Option<&Topology> {
    profile.topology.as_ref()
}

/// Whether the profile has the curves of a shard group of `s` ranks and of its replica group,
/// and the group is a part of a node or whole nodes (`s` divides G or G divides `s`: one that
/// splits a node across others has no link of its own, [`Link::of_group`]).
fn has_shard_group(topology: &Topology, world: u32, s: u32) -> bool {
    let node = topology.gpus_per_node;
    world.is_multiple_of(s)
        && (node.is_multiple_of(s) || s.is_multiple_of(node))
        && topology
            .curves(s, Link::of_group(s, topology.gpus_per_node))
            .is_some()
        && topology.curves(world / s, Link::Inter).is_some()
}

/// The shard groups smaller than the world the ILP offers `profile` (DESIGN §3.11): every group
/// of whole nodes, S = m·G < N with m dividing the node count N/G (the node itself, whose
/// collectives stay on the intra link, and MiCS' groups of several nodes across the inter link),
/// where its shard and replica groups have curves in the profile's topology, ascending; none
/// without a topology. A profile written before these groups had curves offers the ones it has.
/// They are the `hsdp` baseline's candidates too, so its plans lie in the ILP's space.
pub fn shard_groups(profile: &Profile) -> Vec<u32> {
    let Some(topology) = hierarchical(profile) else {
        return Vec::new();
    };
    let (world, node) = (profile.world_size, topology.gpus_per_node);
    let nodes = world.checked_div(node).unwrap_or(0);
    (1..nodes)
        .filter(|&m| nodes.is_multiple_of(m))
        .map(|m| m * node)
        .filter(|&s| has_shard_group(topology, world, s))
        .collect()
}

/// The secondary group the plan space offers `profile`: a node's G ranks, where the world spans
/// nodes and the topology has the node group's curves.
pub fn secondary_group(profile: &Profile) -> Option<u32> {
    let t = hierarchical(profile)?;
    let g = t.gpus_per_node;
    (g < profile.world_size && t.curves(g, Link::Intra).is_some()).then_some(g)
}

/// A unit's level and the groups of ranks it names, as a plan gives them.
pub struct UnitGroups {
    pub level: Level,
    /// S; None: the world.
    pub shard_group: Option<u32>,
    /// H; None: no secondary shard.
    pub secondary_group: Option<u32>,
}

/// Checks a unit's shard and secondary groups against `profile`: the error is (field, what was
/// expected).
pub fn check(profile: &Profile, u: UnitGroups) -> Result<(), (&'static str, String)> {
    let world = profile.world_size;
    let needs = |field| -> Result<&Topology, (&'static str, String)> {
        profile.topology.as_ref().ok_or((
            field,
            "a profile with a [topology] (gpus_per_node and its groups), this one has none".into(),
        ))
    };
    if let Some(s) = u.shard_group {
        let topology = needs("shard_group")?;
        if u.level == Level::None {
            return Err((
                "shard_group",
                "a sharded unit (sdp or fsdp), this one is `none`".into(),
            ));
        }
        if s < 2 || s >= world || !has_shard_group(topology, world, s) {
            return Err((
                "shard_group",
                format!(
                    "a divisor of world_size {world} below it, inside a node or whole nodes, \
                     whose shard and replica groups have curves in the profile's [topology] \
                     (offered: {}), got {s}",
                    listed(&shard_groups(profile))
                ),
            ));
        }
    }
    if let Some(h) = u.secondary_group {
        let topology = needs("secondary_group")?;
        if u.level != Level::Fsdp {
            return Err((
                "secondary_group",
                format!(
                    "only an fsdp unit keeps a secondary shard, this one is `{}`",
                    u.level.name()
                ),
            ));
        }
        let shard = u.shard_group.unwrap_or(world);
        let inside: Vec<u32> = topology
            .groups
            .iter()
            .filter(|g| g.link == Link::Intra && g.ranks < shard && shard.is_multiple_of(g.ranks))
            .map(|g| g.ranks)
            .collect();
        if !inside.contains(&h) {
            return Err((
                "secondary_group",
                format!(
                    "the ranks of a group inside a node, dividing the shard group of {shard} and \
                     smaller, whose curves the profile's [topology] has ({}), got {h}",
                    listed(&inside)
                ),
            ));
        }
    }
    Ok(())
}

/// `8, 16` or `none`.
fn listed(values: &[u32]) -> String {
    if values.is_empty() {
        return "none".into();
    }
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
