//! The validated in-memory schedule: per unit its level, recompute flag and, per op, the blocks
//! launched at each slot index. A `Schedule` exists only valid: its constructor enforces every
//! rule of DESIGN §3.2 against the profile, and its launches carry their window positions.

use crate::profile::Profile;
use crate::timeline::{Level, Op, Timeline};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// `blocks` blocks of an op launched at the start of slot index `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub slot: usize,
    pub blocks: u32,
}

/// One unit's choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSchedule {
    pub level: Level,
    /// r_i: activation checkpointing (recompute in backward).
    pub recompute: bool,
    /// Launches per op; ops of other levels are absent.
    pub launches: BTreeMap<Op, Vec<Launch>>,
}

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
    /// Per unit and op of its level, the launches in window order.
    placed: Vec<BTreeMap<Op, Vec<Placed>>>,
}

/// Sort key of a queue entry: (reduction 0 / gather 1, urgency rank, unit).
type QueueKey = (u8, usize, usize);

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
        let placed = Self::place(profile, &units)?;
        Ok(Schedule { units, placed })
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
    fn place(profile: &Profile, units: &[UnitSchedule]) -> Result<Vec<BTreeMap<Op, Vec<Placed>>>> {
        if units.len() != profile.unit_count() {
            return Err(Error::Mismatch(format!(
                "the plan has {} units, the profile {}",
                units.len(),
                profile.unit_count()
            )));
        }
        let timeline = Timeline::new(units.len());
        let mut placed = Vec::with_capacity(units.len());
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
            for (&op, launches) in &u.launches {
                if !u.level.ops().contains(&op) && !launches.is_empty() {
                    return Err(rule(
                        op,
                        None,
                        format!(
                            "not an op of level `{}` (its ops: {})",
                            u.level.name(),
                            u.level
                                .ops()
                                .iter()
                                .map(|o| o.key())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
            let nb = profile.blocks(unit);
            let mut unit_placed = BTreeMap::new();
            for &op in u.level.ops() {
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
                let mut seen = std::collections::HashSet::new();
                let mut total = 0u64;
                let mut op_placed = Vec::with_capacity(launches.len());
                for l in launches {
                    if l.blocks == 0 {
                        return Err(rule(
                            op,
                            Some(l.slot),
                            "a launch must carry at least one block".into(),
                        ));
                    }
                    let Some(position) = (l.slot < timeline.slot_count())
                        .then(|| window.position(l.slot))
                        .flatten()
                    else {
                        let first = timeline.slot(window.slot_at(0));
                        let last = timeline.slot(window.slot_at(window.len - 1));
                        return Err(rule(
                            op,
                            Some(l.slot.min(timeline.slot_count() - 1)),
                            format!("outside its window {first}..{last}"),
                        ));
                    };
                    if !seen.insert(l.slot) {
                        return Err(rule(
                            op,
                            Some(l.slot),
                            "the slot is listed twice; merge the launches".into(),
                        ));
                    }
                    total += u64::from(l.blocks);
                    op_placed.push(Placed {
                        slot: l.slot,
                        position,
                        blocks: l.blocks,
                    });
                }
                op_placed.sort_by_key(|l| l.position);
                if total != u64::from(nb) {
                    return Err(rule(
                        op,
                        None,
                        format!("launches {total} blocks, the unit has {nb} (coverage)"),
                    ));
                }
                unit_placed.insert(op, op_placed);
            }
            if let Some(last_rs) = unit_placed
                .get(&Op::ReduceScatter)
                .and_then(|rs: &Vec<Placed>| rs.last())
                .map(|l| l.position)
            {
                let window = timeline.window(unit, Op::ReduceScatter.window_kind());
                for (&op, launches) in unit_placed.iter().filter(|(op, _)| op.is_forward_gather()) {
                    if let Some(early) = launches.iter().find(|l| l.position < last_rs) {
                        return Err(rule(
                            op,
                            Some(early.slot),
                            format!(
                                "a gather block before the unit's last reduction block at {} (order rule RS before AG)",
                                timeline.slot(window.slot_at(last_rs))
                            ),
                        ));
                    }
                }
            }
            placed.push(unit_placed);
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
                    let pos = l.position;
                    // Reductions: the older the gradient (larger position) the earlier. Gathers: the
                    // fewer slots left before the slot that needs them, the earlier.
                    let key = if op.is_reduction() {
                        (0, usize::MAX - pos, unit)
                    } else {
                        (1, window.len - pos, unit)
                    };
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
