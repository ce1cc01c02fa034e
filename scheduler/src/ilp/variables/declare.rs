//! Each unit's variables declared over the window positions a model allows: its level columns per
//! group of ranks, its ops' launch columns and running sums, and the RS→AG boundary.

use super::{Col, Columns, Follower, GroupVars, OpVars, Shape, UnitVars};
use crate::cost::{
    Among, Interference, block_bytes, block_time, persistent_bytes, persistent_bytes_over,
    secondary_shard_bytes,
};
use crate::profile::Profile;
use crate::timeline::{Level, Op, Timeline};
use std::ops::Range;

/// The launch variables of `op` of `unit` among `among`, in group `group` (None: AR and BGH); a shard
/// group's RS leaves out its window's last position, where its replica AllReduce (the follower)
/// would fall outside the window.
fn op_vars(
    columns: &mut Columns,
    profile: &Profile,
    timeline: Timeline,
    (unit, op, among, group): (usize, Op, Among, Option<usize>),
    shape: Shape,
) -> OpVars {
    let mut window = timeline.window(unit, op.window_kind());
    let follower = match among {
        Among::Shard(s) if op == Op::ReduceScatter => {
            window.len -= 1;
            let replica = Among::Replica(profile.world_size / s);
            let time = block_time(profile, unit, Op::ReplicaAllReduce, replica);
            Some(Follower {
                link: replica.link(profile),
                block_time_us: time.total_us(),
                block_load_us: Interference::of(profile).load_us(Op::ReplicaAllReduce, time),
            })
        }
        _ => None,
    };
    let limited = shape.options.limits.positions(op, window);
    let extra = shape.extra.get(&(unit, op));
    let target = shape.options.target;
    let exact: Vec<bool> = (0..window.len)
        .map(|k| {
            (limited.contains(&k) || extra.is_some_and(|e| e.contains(&k)))
                && target.allows(timeline, (unit, op), window, k)
        })
        .collect();
    let mut at: Vec<(usize, Option<Range<usize>>)> = (0..window.len)
        .filter(|&k| exact[k])
        .map(|k| (k, None))
        .collect();
    if shape.far_bands {
        let bands = crate::ilp::bands::bands(op, window, &exact);
        at.extend(bands.into_iter().map(|(k, band)| (k, Some(band))));
        at.sort_by_key(|(k, _)| *k);
    }
    let (positions, bands): (Vec<usize>, Vec<_>) = at.into_iter().unzip();
    let per_launch = target.blocks_per_launch(profile, unit);
    let launch = f64::from(per_launch);
    let nb = profile.blocks(unit) / per_launch;
    let time = block_time(profile, unit, op, among);
    let launches = positions.iter().map(|_| columns.integer(nb)).collect();
    let cumulative = positions.iter().map(|_| columns.continuous()).collect();
    OpVars {
        op,
        among,
        link: among.link(profile),
        window,
        positions,
        bands,
        launches,
        cumulative,
        block_time_us: time.total_us() * launch,
        block_load_us: Interference::of(profile).load_us(op, time) * launch,
        block_bytes: block_bytes(profile, unit, op) * launch,
        blocks_per_launch: per_launch,
        group,
        follower: follower.map(|f| Follower {
            block_time_us: f.block_time_us * launch,
            block_load_us: f.block_load_us * launch,
            ..f
        }),
    }
}

/// Declares every unit's variables. A replicated unit is left out where its persistent state
/// alone, beside every other unit sharded, exceeds `memory_bound` (a presolve that removes the
/// AR columns of large models). Each unit shards over the world and over every shard group the
/// profile offers ([`crate::groups::shard_groups`]) whose window (B_i, F_i) holds RS, RA and a
/// gather (3 slots); hpz exists in each group with a smaller secondary group on offer
/// ([`crate::groups::secondary_group`]) for every unit that can be fsdp. Launch columns as
/// `shape` says.
pub(in crate::ilp) fn declare_units(
    columns: &mut Columns,
    profile: &Profile,
    shape: Shape,
    memory_bound: Option<f64>,
) -> Vec<UnitVars> {
    let options = shape.options;
    let timeline = Timeline::new(profile.unit_count());
    let sharded_total: f64 = (0..profile.unit_count())
        .map(|i| persistent_bytes(profile, i, Level::Sdp))
        .sum();
    let secondary = crate::groups::secondary_group(profile);
    let secondary_communicator = secondary.map(|_| columns.fraction());
    let shards: Vec<(u32, Col)> = crate::groups::shard_groups(profile)
        .into_iter()
        .map(|s| (s, columns.fraction()))
        .collect();
    (0..profile.unit_count())
        .map(|unit| {
            let full = persistent_bytes(profile, unit, Level::None);
            let sharded = persistent_bytes(profile, unit, Level::Sdp);
            let replicable = memory_bound.is_none_or(|m| sharded_total - sharded + full <= m);
            let u = &profile.units[unit];
            let recomputable =
                options.allow_recompute && u.checkpoint_activation_bytes < u.activation_bytes;
            let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len;
            let over = std::iter::once(None).chain(
                shards
                    .iter()
                    .filter(|_| after >= 3)
                    .map(|&(s, u)| Some((s, u))),
            );
            let can_fsdp = timeline.window(unit, Op::GatherBackward.window_kind()).len > 0;
            let keys: Vec<GroupKey> = over
                .enumerate()
                .map(|(index, shard)| {
                    let ranks = shard.map_or(profile.world_size, |(s, _)| s);
                    GroupKey {
                        unit,
                        index,
                        shard,
                        ranks,
                        can_fsdp,
                        hpz: secondary
                            .filter(|&h| can_fsdp && h < ranks && ranks.is_multiple_of(h)),
                    }
                })
                .collect();
            // Columns in the order of the flat model (none, the world's levels, recompute, AR,
            // the world's ops), then each shard group's: HiGHS' search depends on it.
            let none = replicable.then(|| columns.binary());
            let world_levels = group_levels(columns, &keys[0]);
            let recompute = recomputable.then(|| columns.binary());
            let ar = replicable.then(|| {
                let key = (unit, Op::AllReduce, Among::World, None);
                op_vars(columns, profile, timeline, key, shape)
            });
            let context = (timeline, shape);
            let mut groups = vec![group_vars(
                columns,
                profile,
                context,
                (&keys[0], world_levels),
            )];
            for key in &keys[1..] {
                let levels = group_levels(columns, key);
                groups.push(group_vars(columns, profile, context, (key, levels)));
            }
            let bgh = keys.iter().find_map(|key| key.hpz).map(|h| {
                let key = (unit, Op::GatherBackward, Among::Secondary(h), None);
                op_vars(columns, profile, timeline, key, shape)
            });
            let has_hpz = groups.iter().any(|g| g.hpz.is_some());
            UnitVars {
                blocks: profile.blocks(unit) / options.target.blocks_per_launch(profile, unit),
                none,
                recompute,
                ar,
                groups,
                bgh,
                secondary_communicator: secondary_communicator.filter(|_| has_hpz),
                persistent_full: full,
            }
        })
        .collect()
}

/// Which group of which unit [`group_vars`] declares: the unit, the group's index, its shard
/// group and communicator column (None: the world), the ranks it shards over, whether the unit
/// can be fsdp, and its hpz secondary group where it has one (the secondary group on offer, when
/// smaller than the group and dividing it).
struct GroupKey {
    unit: usize,
    index: usize,
    shard: Option<(u32, Col)>,
    ranks: u32,
    can_fsdp: bool,
    hpz: Option<u32>,
}

/// A group's level columns: y_sdp, and y_fsdp and y_hpz where the unit has them.
struct GroupLevels {
    sdp: Col,
    fsdp: Option<Col>,
    hpz: Option<Col>,
}

/// Declares the level columns of the group `key`.
fn group_levels(columns: &mut Columns, key: &GroupKey) -> GroupLevels {
    GroupLevels {
        sdp: columns.binary(),
        fsdp: key.can_fsdp.then(|| columns.binary()),
        hpz: key.hpz.map(|_| columns.binary()),
    }
}

/// The variables of one unit over one group of ranks (DESIGN §3.11), its level columns given:
/// its ops among the group and the RS→AG boundary.
fn group_vars(
    columns: &mut Columns,
    profile: &Profile,
    (timeline, shape): (Timeline, Shape),
    (key, levels): (&GroupKey, GroupLevels),
) -> GroupVars {
    let (unit, index, shard, hpz_group) = (key.unit, key.index, key.shard, key.hpz);
    let in_group = shard.map_or(Among::World, |(s, _)| Among::Shard(s));
    let GroupLevels { sdp, fsdp, hpz } = levels;
    let group = Some(index);
    let mut declare =
        |op, among| op_vars(columns, profile, timeline, (unit, op, among, group), shape);
    let rs = declare(Op::ReduceScatter, in_group);
    let fg = declare(Op::GatherForward, in_group);
    let bg = key.can_fsdp.then(|| declare(Op::GatherBackward, in_group));
    let gap = if shard.is_some() { 2 } else { 0 };
    let first_gather = fg.positions[0];
    let last_reduction = *rs.positions.last().expect("RS has a position");
    let boundary = (first_gather..last_reduction + gap)
        .map(|k| (k, columns.binary()))
        .collect();
    GroupVars {
        shard: shard.map(|(s, _)| s),
        sdp,
        fsdp,
        hpz,
        secondary: hpz_group,
        secondary_bytes: hpz_group.map_or(0.0, |h| secondary_shard_bytes(profile, unit, h)),
        rs,
        fg,
        bg,
        gap,
        boundary,
        persistent: persistent_bytes_over(profile, unit, Level::Sdp, Some(key.ranks)),
        communicator: shard.map(|(_, u)| u),
    }
}
