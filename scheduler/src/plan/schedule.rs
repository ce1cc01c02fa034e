//! The validated in-memory schedule: per unit its level, recompute flag and, per op, the blocks
//! launched at each slot index. Validation enforces every rule of DESIGN §3.

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

/// A whole schedule, units in forward order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub units: Vec<UnitSchedule>,
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
    pub fn timeline(&self) -> Timeline {
        Timeline::new(self.units.len())
    }

    /// Checks every window, coverage and order rule against `profile`; the error names the unit,
    /// the op and the slot.
    pub fn validate(&self, profile: &Profile) -> Result<()> {
        if self.units.len() != profile.unit_count() {
            return Err(Error::Mismatch(format!(
                "the plan has {} units, the profile {}",
                self.units.len(),
                profile.unit_count()
            )));
        }
        let timeline = self.timeline();
        for (unit, u) in self.units.iter().enumerate() {
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
                for l in launches {
                    if l.blocks == 0 {
                        return Err(rule(
                            op,
                            Some(l.slot),
                            "a launch must carry at least one block".into(),
                        ));
                    }
                    if l.slot >= timeline.slot_count() || window.position(l.slot).is_none() {
                        let first = timeline.slot(window.slot_at(0));
                        let last = timeline.slot(window.slot_at(window.len - 1));
                        return Err(rule(
                            op,
                            Some(l.slot.min(timeline.slot_count() - 1)),
                            format!("outside its window {first}..{last}"),
                        ));
                    }
                    if !seen.insert(l.slot) {
                        return Err(rule(
                            op,
                            Some(l.slot),
                            "the slot is listed twice; merge the launches".into(),
                        ));
                    }
                    total += u64::from(l.blocks);
                }
                if total != u64::from(nb) {
                    return Err(rule(
                        op,
                        None,
                        format!("launches {total} blocks, the unit has {nb} (coverage)"),
                    ));
                }
            }
            if let Some(rs) = u.launches.get(&Op::ReduceScatter) {
                let window = timeline.window(unit, Op::ReduceScatter.window_kind());
                let last_rs = rs
                    .iter()
                    .filter_map(|l| window.position(l.slot))
                    .max()
                    .unwrap_or(0);
                for (&op, launches) in u.launches.iter().filter(|(op, _)| op.is_forward_gather()) {
                    if let Some(early) = launches
                        .iter()
                        .find(|l| window.position(l.slot).unwrap_or(0) < last_rs)
                    {
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
        }
        Ok(())
    }

    /// The communication queue of every slot in plan order: reductions first, oldest gradient
    /// first; then gathers, nearest deadline first; ties by unit. The file order of launches does
    /// not matter.
    pub fn queues(&self) -> Vec<Vec<Queued>> {
        let timeline = self.timeline();
        let mut keyed: Vec<Vec<(QueueKey, Queued)>> = vec![Vec::new(); timeline.slot_count()];
        for (unit, u) in self.units.iter().enumerate() {
            for (&op, launches) in &u.launches {
                let window = timeline.window(unit, op.window_kind());
                for l in launches {
                    let pos = window.position(l.slot).expect("validated schedule");
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
