//! The validated in-memory schedule: per unit its level, recompute flag and, per op, the blocks
//! launched at each slot index. A `Schedule` exists only valid: its constructor enforces every
//! rule of DESIGN §3.2 against the profile, and its launches carry their window positions.

use crate::profile::Profile;
use crate::timeline::{Level, Op, Timeline, Window};
use crate::{Error, Result};
use std::collections::BTreeMap;

pub mod offload;
mod unit;

pub use offload::{HostStep, Offload};

pub use unit::{Accumulation, Launch, Recompute, RecomputeChoice, ReplicaReduce, UnitSchedule};

/// `blocks` blocks of an op launched at slot index `slot`, the `position`-th slot of the op's
/// window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub slot: usize,
    pub position: usize,
    pub blocks: u32,
}

/// A whole schedule, units in forward order, valid for the profile it was built against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    units: Vec<UnitSchedule>,
    /// K, the profile's micro-batches per step.
    micro_batches: u32,
    /// Per unit and op of its level, the launches in window order.
    placed: Vec<BTreeMap<Op, Vec<Placed>>>,
    /// Per unit and op of the inner boundary, its launches in window order (empty at K = 1).
    inner_placed: Vec<BTreeMap<Op, Vec<Placed>>>,
    /// Per unit, where its state lives (DESIGN §3.13): all `none` unless [`Schedule::offloaded`].
    offload: Vec<Offload>,
    /// When the host steps (DESIGN §3.13).
    host_step: HostStep,
}

/// Per unit and op, launches in window order.
type PlacedOps = Vec<BTreeMap<Op, Vec<Placed>>>;

/// Sort key of a queue entry: (reduction 0 / gather 1, urgency rank, unit).
pub type QueueKey = (u8, usize, usize);

/// The canonical order of a slot's queue (DESIGN §3.7) as a key of a launch at window position
/// `pos` of a window of `window_len` slots: reductions first, the older gradient (larger
/// position) earlier; then gathers, the fewer slots left before the slot that needs them the
/// earlier; ties by unit.
pub fn queue_key(op: Op, pos: usize, window_len: usize, unit: usize) -> QueueKey {
    if op.is_reduction() {
        (0, usize::MAX - pos, unit)
    } else {
        (1, window_len - pos, unit)
    }
}

/// Each slot's entries sorted by their keys (stably: the canonical order, DESIGN §3.7).
pub fn in_canonical_order<T>(keyed: Vec<Vec<(QueueKey, T)>>) -> Vec<Vec<T>> {
    keyed
        .into_iter()
        .map(|mut q| {
            q.sort_by_key(|(key, _)| *key);
            q.into_iter().map(|(_, entry)| entry).collect()
        })
        .collect()
}

/// One entry of a slot's communication queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub unit: usize,
    pub op: Op,
    pub blocks: u32,
}

impl Schedule {
    /// The schedule of `units`, if every window, coverage and order rule holds against
    /// `profile`; the error names the unit, the op and the slot.
    pub fn new(profile: &Profile, units: Vec<UnitSchedule>) -> Result<Self> {
        let (placed, inner_placed) = Self::place(profile, &units)?;
        Ok(Schedule {
            offload: vec![Offload::None; units.len()],
            host_step: HostStep::default(),
            units,
            micro_batches: profile.micro_batches,
            placed,
            inner_placed,
        })
    }

    /// The schedule with each unit's `offload` and the plan's `host_step` (DESIGN §3.13), checked
    /// against `profile` (a host to offload to, sharded units at K = 1 without groups, the host's
    /// memory); `origin` names the plan in errors.
    pub fn offloaded(
        self,
        profile: &Profile,
        offload: Vec<Offload>,
        host_step: HostStep,
        origin: &str,
    ) -> Result<Self> {
        offload::check(profile, &self.units, &offload, host_step)
            .map_err(|(field, expected)| Error::invalid(origin, field, expected))?;
        Ok(Schedule {
            offload,
            host_step,
            ..self
        })
    }

    /// Unit `unit`'s offload mode.
    pub fn offload(&self, unit: usize) -> Offload {
        self.offload[unit]
    }

    /// Every unit's offload mode, in unit order.
    pub fn offload_modes(&self) -> &[Offload] {
        &self.offload
    }

    /// Whether any unit is offloaded.
    pub fn offloads(&self) -> bool {
        self.offload.iter().any(|m| !m.is_none())
    }

    /// When the host steps.
    pub fn host_step(&self) -> HostStep {
        self.host_step
    }

    /// K, micro-batches per step.
    pub fn micro_batches(&self) -> u32 {
        self.micro_batches
    }

    /// The launches of `op` of `unit` at the inner boundary, in window order; empty where the op
    /// does not run there.
    pub fn inner_launches(&self, unit: usize, op: Op) -> &[Placed] {
        self.inner_placed[unit].get(&op).map_or(&[], Vec::as_slice)
    }

    /// Whether this schedule is valid for `profile` too (a hint made for another profile).
    pub fn fits(&self, profile: &Profile) -> bool {
        Self::place(profile, &self.units).is_ok()
    }

    pub fn timeline(&self) -> Timeline {
        Timeline::new(self.units.len())
    }

    /// The units' choices, in forward order.
    pub fn units(&self) -> &[UnitSchedule] {
        &self.units
    }

    /// The units' choices, to edit and build a new schedule from.
    pub fn into_units(self) -> Vec<UnitSchedule> {
        self.units
    }

    /// The launches of `op` of `unit` in window order; empty for an op not of the unit's level.
    pub fn launches(&self, unit: usize, op: Op) -> &[Placed] {
        self.placed[unit].get(&op).map_or(&[], Vec::as_slice)
    }

    /// Every op of `unit`'s level with its launches in window order.
    pub fn ops(&self, unit: usize) -> impl Iterator<Item = (Op, &[Placed])> {
        self.placed[unit].iter().map(|(&op, l)| (op, l.as_slice()))
    }

    /// The first and last window positions of an op's launches (every op of a unit's level
    /// launches at least one block); None for an op not of the level.
    pub fn span(&self, unit: usize, op: Op) -> Option<(usize, usize)> {
        let launches = self.launches(unit, op);
        Some((launches.first()?.position, launches.last()?.position))
    }

    /// Checks every window, coverage and order rule of DESIGN §3.2 and places each launch at
    /// its window position.
    fn place(profile: &Profile, units: &[UnitSchedule]) -> Result<(PlacedOps, PlacedOps)> {
        if units.len() != profile.unit_count() {
            return Err(Error::Mismatch(format!(
                "the plan has {} units, the profile {}",
                units.len(),
                profile.unit_count()
            )));
        }
        let timeline = Timeline::new(units.len());
        let mut placed = Vec::with_capacity(units.len());
        let mut inner_placed = Vec::with_capacity(units.len());
        for (unit, u) in units.iter().enumerate() {
            let rule = |op: Op, slot: Option<usize>, why: String| Error::Rule {
                unit: unit + 1,
                unit_name: profile.units[unit].name.clone(),
                op: op.to_string(),
                slot: slot
                    .map(|s| format!(" at {}", timeline.slot(s)))
                    .unwrap_or_default(),
                rule: why,
            };
            let ops = u.ops();
            for (&op, launches) in &u.launches {
                if op == Op::ReplicaAllReduce && !launches.is_empty() {
                    return Err(rule(
                        op,
                        None,
                        "takes no launches of its own: each RS block's follows it a slot later"
                            .into(),
                    ));
                }
                if !ops.contains(&op) && !launches.is_empty() {
                    return Err(rule(
                        op,
                        None,
                        format!(
                            "not an op of level `{}`{} (its ops: {})",
                            u.level.name(),
                            if u.shard_group.is_some() {
                                " over a shard group"
                            } else {
                                ""
                            },
                            op_keys(&ops)
                        ),
                    ));
                }
            }
            let groups = crate::groups::UnitGroups {
                level: u.level,
                shard_group: u.shard_group,
                secondary_group: u.secondary_group,
            };
            crate::groups::check(profile, groups)
                .map_err(|(field, why)| rule(ops[0], None, format!("{field}: {why}")))?;
            let nb = profile.blocks(unit);
            let mut unit_placed = BTreeMap::new();
            for &op in ops.iter().filter(|&&op| op != Op::ReplicaAllReduce) {
                let window = timeline.window(unit, op.window_kind());
                if window.len == 0 {
                    return Err(rule(
                        op,
                        None,
                        format!(
                            "its window is empty, so the unit cannot be `{}` (the last unit cannot be fsdp)",
                            u.level.name()
                        ),
                    ));
                }
                let launches = u.launches.get(&op).map(Vec::as_slice).unwrap_or_default();
                let name = |s| timeline.slot(s);
                let op_placed = place_op(timeline, window, launches, nb, name, |slot, why| {
                    rule(op, slot, why)
                })?;
                unit_placed.insert(op, op_placed);
            }
            let hsdp = u.shard_group.is_some();
            check_reduction_order(&unit_placed, timeline, (unit, hsdp), |op, slot, why| {
                rule(op, Some(slot), why)
            })?;
            if hsdp {
                // Each RS block's replica AllReduce, in the next slot (DESIGN §3.11).
                let window = timeline.window(unit, Op::ReduceScatter.window_kind());
                let ra = followers(window, &unit_placed[&Op::ReduceScatter]);
                unit_placed.insert(Op::ReplicaAllReduce, ra);
            }
            placed.push(unit_placed);
            inner_placed.push(Self::place_inner(profile, timeline, unit, u, |op, why| {
                rule(op, None, why)
            })?);
        }
        Ok((placed, inner_placed))
    }

    /// Checks a unit's choices across micro-batches (DESIGN §3.10) and places its inner
    /// boundary's launches: only at K ≥ 2, `keep` only at sdp or fsdp, launches exactly for
    /// [`Accumulation::inner_ops`], each inside its window (I in place of E) and covering the
    /// unit's blocks.
    fn place_inner(
        profile: &Profile,
        timeline: Timeline,
        unit: usize,
        u: &UnitSchedule,
        rule: impl Fn(Op, String) -> Error,
    ) -> Result<BTreeMap<Op, Vec<Placed>>> {
        let a = &u.accumulation;
        let first_op = u.ops()[0];
        if profile.micro_batches == 1 {
            if *a != Accumulation::default() {
                return Err(rule(
                    first_op,
                    "accumulate, keep, replica_reduce and inner launches need micro-batches: the \
                     profile has micro_batches = 1"
                        .into(),
                ));
            }
            return Ok(BTreeMap::new());
        }
        if a.keep && u.level == Level::None {
            return Err(rule(
                first_op,
                "keep = true needs sdp or fsdp: a replicated unit's parameters are never freed"
                    .into(),
            ));
        }
        if let Some(reader) = profile
            .borrower(unit)
            .filter(|_| a.keep && u.level == Level::Fsdp)
        {
            return Err(rule(
                first_op,
                format!(
                    "keep = true is not available to an fsdp unit whose parameters unit {} \
                     (`{}`) reads: it would read the kept parameters while the backward gather \
                     rewrites them (DESIGN §3.10); use sdp with keep, or keep = false",
                    reader + 1,
                    profile.units[reader].name
                ),
            ));
        }
        if a.replica_reduce == ReplicaReduce::Last {
            let why = if u.shard_group.is_none() {
                Some("a unit over a shard group (shard_group), this one is over the world")
            } else if a.accumulate {
                Some("accumulate = false: an accumulating unit reduces once per step anyway")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(rule(
                    first_op,
                    format!("replica_reduce = \"last\" needs {why}"),
                ));
            }
        }
        let ops = a.inner_ops(u.level);
        if let Some((&op, _)) = a
            .inner
            .iter()
            .find(|(op, l)| !ops.contains(op) && !l.is_empty())
        {
            return Err(rule(
                op,
                format!(
                    "does not run at the inner boundary (accumulate = {}, keep = {}: its inner ops are [{}])",
                    a.accumulate,
                    a.keep,
                    op_keys(&ops)
                ),
            ));
        }
        let nb = profile.blocks(unit);
        let mut placed = BTreeMap::new();
        for op in ops {
            let window = timeline.window(unit, op.window_kind());
            let launches = a.inner.get(&op).map(Vec::as_slice).unwrap_or_default();
            let name = |s| timeline.inner_slot(s);
            let op_placed = place_op(timeline, window, launches, nb, name, |slot, why| {
                let at = slot.map(|s| format!(" at {}", timeline.inner_slot(s)));
                rule(
                    op,
                    format!("inner boundary{}: {why}", at.unwrap_or_default()),
                )
            })?;
            placed.insert(op, op_placed);
        }
        let replica_every = u.shard_group.is_some() && a.replica_reduce == ReplicaReduce::Every;
        if let Some(rs) = placed.get(&Op::ReduceScatter).filter(|_| replica_every) {
            // Each inner RS block's replica AllReduce, in the next slot (DESIGN §3.11.1).
            let window = timeline.window(unit, Op::ReduceScatter.window_kind());
            let last = rs.last().map_or(0, |l| l.position);
            if last + 1 >= window.len {
                return Err(rule(
                    Op::ReduceScatter,
                    format!(
                        "inner boundary at {}: over a shard group, an RS block's replica \
                         AllReduce follows in the next slot, and the window ends there",
                        timeline.inner_slot(window.slot_at(last))
                    ),
                ));
            }
            let ra = followers(window, rs);
            placed.insert(Op::ReplicaAllReduce, ra);
        }
        Ok(placed)
    }

    /// The communication queue of every slot in plan order: reductions first, oldest gradient
    /// first; then gathers, nearest deadline first; ties by unit. The file order of launches does
    /// not matter.
    pub fn queues(&self) -> Vec<Vec<Queued>> {
        let timeline = self.timeline();
        let mut keyed: Vec<Vec<(QueueKey, Queued)>> = vec![Vec::new(); timeline.slot_count()];
        for (unit, ops) in self.placed.iter().enumerate() {
            for (&op, launches) in ops {
                let window = timeline.window(unit, op.window_kind());
                for l in launches {
                    let key = queue_key(op, l.position, window.len, unit);
                    keyed[l.slot].push((
                        key,
                        Queued {
                            unit,
                            op,
                            blocks: l.blocks,
                        },
                    ));
                }
            }
        }
        keyed
            .into_iter()
            .map(|mut q| {
                q.sort_by_key(|(key, _)| *key);
                q.into_iter().map(|(_, e)| e).collect()
            })
            .collect()
    }
}

/// The order rules of a unit's reductions and forward gathers (DESIGN §3.2, §3.11): every
/// forward gather at or after the last RS block (same slot allowed: RS runs first). Over a shard
/// group (`hsdp`), each RS block's replica AllReduce follows in the next slot, so no RS block
/// launches in the window's last slot, and every forward gather comes a slot after the last RA
/// (the optimizer step follows RA, and the two may run on different links): at least two
/// positions after the last RS.
fn check_reduction_order(
    placed: &BTreeMap<Op, Vec<Placed>>,
    timeline: Timeline,
    (unit, hsdp): (usize, bool),
    rule: impl Fn(Op, usize, String) -> Error,
) -> Result<()> {
    let window = timeline.window(unit, Op::ReduceScatter.window_kind());
    let Some(last) = placed
        .get(&Op::ReduceScatter)
        .and_then(|rs| rs.last())
        .copied()
    else {
        return Ok(());
    };
    if hsdp && last.position + 1 >= window.len {
        return Err(rule(
            Op::ReduceScatter,
            last.slot,
            format!(
                "over a shard group, an RS block's replica AllReduce follows in the next slot, \
                 and the window ends at {}",
                timeline.slot(last.slot)
            ),
        ));
    }
    let (gap, rule_name) = if hsdp {
        (2, "RS, then RA a slot later, then AG a slot after that")
    } else {
        (0, "RS before AG")
    };
    for (&op, launches) in placed.iter().filter(|(op, _)| op.is_forward_gather()) {
        if let Some(early) = launches.iter().find(|l| l.position < last.position + gap) {
            return Err(rule(
                op,
                early.slot,
                format!(
                    "a gather block too early after the unit's last reduction block at {} \
                     (order rule {rule_name})",
                    timeline.slot(last.slot)
                ),
            ));
        }
    }
    Ok(())
}

/// The replica AllReduce of each ReduceScatter launch: its blocks one window position later
/// (DESIGN §3.11); the caller has checked that the position lies in the window.
fn followers(window: Window, reduce_scatter: &[Placed]) -> Vec<Placed> {
    reduce_scatter
        .iter()
        .map(|l| Placed {
            slot: window.slot_at(l.position + 1),
            position: l.position + 1,
            blocks: l.blocks,
        })
        .collect()
}

/// Places one op's launches at their window positions: each inside the window, each slot once,
/// at least one block each, `nb` blocks in all; `rule` makes the error for a slot (or none).
fn place_op(
    timeline: Timeline,
    window: Window,
    launches: &[Launch],
    nb: u32,
    slot_name: impl Fn(usize) -> crate::timeline::Slot,
    rule: impl Fn(Option<usize>, String) -> Error,
) -> Result<Vec<Placed>> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut placed = Vec::with_capacity(launches.len());
    for l in launches {
        if l.blocks == 0 {
            return Err(rule(
                Some(l.slot),
                "a launch must carry at least one block".into(),
            ));
        }
        let Some(position) = (l.slot < timeline.slot_count())
            .then(|| window.position(l.slot))
            .flatten()
        else {
            let first = slot_name(window.slot_at(0));
            let last = slot_name(window.slot_at(window.len - 1));
            return Err(rule(
                Some(l.slot.min(timeline.slot_count() - 1)),
                format!("outside its window {first}..{last}"),
            ));
        };
        if !seen.insert(l.slot) {
            return Err(rule(
                Some(l.slot),
                "the slot is listed twice; merge the launches".into(),
            ));
        }
        total += u64::from(l.blocks);
        placed.push(Placed {
            slot: l.slot,
            position,
            blocks: l.blocks,
        });
    }
    placed.sort_by_key(|l| l.position);
    if total != u64::from(nb) {
        return Err(rule(
            None,
            format!("launches {total} blocks, the unit has {nb} (coverage)"),
        ));
    }
    Ok(placed)
}

/// Ops as plan files name them: `rs, ag`.
fn op_keys(ops: &[Op]) -> String {
    ops.iter().map(|o| o.key()).collect::<Vec<_>>().join(", ")
}
