//! Offload in the ILP (DESIGN §4.10): per unit and group of ranks it may shard over, o = [optimizer
//! state, fp32 master and gradient on the host, the step there] and f = [`full`: the parameter
//! shard there too, copied to the device before each gather block], the host chain's end times,
//! the H2D channel's copies in the order the simulator issues them, and the rows that tie them to
//! the device's slots on each link, so that Σ_s d_s is the strict simulation's steady iteration
//! time.
//!
//! The space (DESIGN §4.10): `optimizer` or `full`, `host_step = overlapped`, an offloaded unit's
//! reduction whole at the first position after B_i (over a shard group, its replica AllReduce a
//! position later); the columns exist only for a profile with a `[host]`, K = 1 and κ_q = 0, and
//! per unit and group a sharded choice (`full` not at hpz, and one block per launch column), no
//! tied parameters and no device optimizer time.

mod full;

use super::variables::{Col, Columns, GroupVars, UnitVars};
use crate::cost::Interference;
use crate::offload::{HostWork, Offload, gradient_shard_bytes, host_bytes};
use crate::profile::{Link, Profile};
use crate::schedule::offload::shard_bytes;
use crate::schedule::{QueueKey, queue_key};
use crate::timeline::{Op, Timeline};
use full::FullVars;
use good_lp::{Constraint, Expression, constraint};

/// One unit and group of ranks the ILP may offload.
pub(super) struct Candidate {
    pub unit: usize,
    /// The index of the unit's group of ranks (`UnitVars::groups`: 0 the world) whose sharded
    /// choices this offloads.
    pub group: usize,
    /// S, the ranks that group shards over.
    ranks: u32,
    /// o_i.
    pub on: Col,
    /// e^D_i, e^S_i, e^H_i: when the gradient's D2H, the host step and the parameters' H2D of
    /// this iteration's chain end, µs from the iteration's start.
    pub ends: [Col; 3],
    /// D2H, step and H2D µs.
    work: [f64; 3],
    /// The queue entry after which the reduced gradient shard is final.
    reduced: Reduced,
    /// Per forward-gather position (index into the FG op's positions): w_{i,k} =
    /// [o_i and a forward gather block launches at k].
    pub waits: Vec<Col>,
    /// `full` offload's columns, where the unit may take it.
    pub full: Option<FullVars>,
}

/// The queue entry that ends an offloaded unit's reduction: its RS at the first position after
/// B_i over the world, the replica AllReduce that follows it a position later over a shard group
/// (DESIGN §3.13).
#[derive(Debug, Clone, Copy)]
struct Reduced {
    slot: usize,
    key: QueueKey,
    link: Link,
}

impl Reduced {
    fn of(unit: usize, group: &GroupVars) -> Reduced {
        let rs = &group.rs;
        match &rs.follower {
            Some(f) => Reduced {
                slot: rs.window.slot_at(1),
                key: queue_key(Op::ReplicaAllReduce, 1, rs.window.len, unit),
                link: f.link,
            },
            None => Reduced {
                slot: rs.window.slot_at(0),
                key: queue_key(Op::ReduceScatter, 0, rs.window.len, unit),
                link: rs.link,
            },
        }
    }
}

impl Candidate {
    /// o_i + f_i: the unit's gradient goes to the host and the host steps it.
    fn offloaded(&self) -> Expression {
        let mut a = Expression::from(self.on.var);
        if let Some(f) = &self.full {
            a += f.on.var;
        }
        a
    }
}

/// The offload columns of a model.
pub(super) struct OffloadVars {
    /// In forward order (a unit's groups in their order); the host's FIFO order is the reverse
    /// (reductions end B_L … B_1, DESIGN §4.10).
    pub candidates: Vec<Candidate>,
    /// The big M of the gated rows: an upper bound on what a row asks of its left side when its
    /// gate is off (`big_m`).
    big_m: f64,
}

/// Whether `profile` gets offload columns at all (DESIGN §4.10).
pub(super) fn offered(profile: &Profile) -> bool {
    profile.host.is_some() && profile.micro_batches == 1 && Interference::of(profile).comm == 0.0
}

impl OffloadVars {
    /// Declares o, the chain's ends and w for every unit and group that may offload; None where
    /// the profile offers none. `ceiling`: the iteration time Σ_s d_s is held to (µs), if any.
    pub fn declare(
        columns: &mut Columns,
        profile: &Profile,
        units: &[UnitVars],
        ceiling: Option<f64>,
    ) -> Option<OffloadVars> {
        if !offered(profile) {
            return None;
        }
        let host = profile.host.as_ref()?;
        let mut candidates = Vec::new();
        for (unit, u) in units.iter().enumerate() {
            for (g, group) in u.groups.iter().enumerate() {
                if !may_offload(profile, unit, group) {
                    continue;
                }
                let ranks = group.shard.unwrap_or(profile.world_size);
                let Some(work) = HostWork::of(profile, host, (unit, ranks), Offload::Optimizer)
                else {
                    continue;
                };
                candidates.push(Candidate {
                    unit,
                    group: g,
                    ranks,
                    on: columns.binary(),
                    ends: [
                        columns.continuous(),
                        columns.continuous(),
                        columns.continuous(),
                    ],
                    work: [
                        work.d2h_us,
                        work.step_us,
                        work.h2d_after_step_us.unwrap_or(0.0),
                    ],
                    reduced: Reduced::of(unit, group),
                    waits: group
                        .fg
                        .positions
                        .iter()
                        .map(|_| columns.binary())
                        .collect(),
                    full: FullVars::declare(columns, (profile, host), (unit, ranks), group),
                });
            }
        }
        if candidates.is_empty() {
            return None;
        }
        let host_work: f64 = candidates
            .iter()
            .map(|c| {
                let copies = c
                    .full
                    .as_ref()
                    .map_or(0.0, |f| f.copy_us * f64::from(units[c.unit].blocks) * 2.0);
                c.work.iter().sum::<f64>() + copies
            })
            .sum();
        let big_m = big_m(
            serial_us(profile, units),
            host_work,
            longest_us(units, &candidates),
            ceiling,
        );
        Some(OffloadVars { candidates, big_m })
    }

    /// The offloaded units of a solution's values.
    pub fn modes(&self, units: usize, values: &[f64]) -> Vec<Offload> {
        let mut modes = vec![Offload::None; units];
        for c in &self.candidates {
            if values[c.on.index] > 0.5 {
                modes[c.unit] = Offload::Optimizer;
            }
            if c.full.as_ref().is_some_and(|f| values[f.on.index] > 0.5) {
                modes[c.unit] = Offload::Full;
            }
        }
        modes
    }

    /// The columns whose values a plan's launches and levels do not fix: the chain's ends and
    /// the copies' ends.
    pub fn free_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.candidates.iter().flat_map(|c| {
            c.ends.iter().map(|e| e.index).chain(
                c.full
                    .iter()
                    .flat_map(|f| f.gathers.iter().map(|g| g.copied.index)),
            )
        })
    }

    /// The values of o, f, v, w and z for a plan offloading `modes` (the ends left at 0), each
    /// on the candidate of the group the plan's levels choose; false where a mode has no column.
    pub fn set_values(&self, units: &[UnitVars], modes: &[Offload], values: &mut [f64]) -> bool {
        let bit = |b: bool| f64::from(u8::from(b));
        let mut placed = vec![false; units.len()];
        for c in &self.candidates {
            let group = &units[c.unit].groups[c.group];
            let chosen = [Some(group.sdp), group.fsdp, group.hpz]
                .into_iter()
                .flatten()
                .any(|y| values[y.index] > 0.5);
            let on = chosen && modes[c.unit] == Offload::Optimizer;
            let full = chosen && modes[c.unit] == Offload::Full;
            placed[c.unit] |= on || (full && c.full.is_some());
            values[c.on.index] = bit(on);
            for (w, x) in c.waits.iter().zip(&group.fg.launches) {
                values[w.index] = bit(on && values[x.index] > 0.5);
            }
            if let Some(f) = &c.full {
                values[f.on.index] = bit(full);
                values[f.on_sdp.index] = bit(full && values[group.sdp.index] > 0.5);
                for g in &f.gathers {
                    let x = values[g.launch(group).index];
                    values[g.copies.index] = if full { x } else { 0.0 };
                    values[g.wait.index] = bit(full && x > 0.5);
                }
            }
        }
        modes
            .iter()
            .zip(placed)
            .all(|(mode, placed)| mode.is_none() || placed)
    }

    /// Device memory (DESIGN §3.13): an offloaded unit keeps Ψ'p/S of its Ψ'(p+g+o)/S
    /// (`optimizer`) or nothing (`full`: its gather blocks' shards instead, each as long as its
    /// gathered block), and its reduced gradient shard Ψ'g/S from B_i to the end of its
    /// reduction's slot (over a shard group, of its replica AllReduce's). Scaled as `memory` is.
    pub fn shift_memory(
        &self,
        profile: &Profile,
        units: &[UnitVars],
        memory: &mut [Expression],
        scale: f64,
    ) {
        let timeline = Timeline::new(units.len());
        for c in &self.candidates {
            let group = &units[c.unit].groups[c.group];
            let kept = shard_bytes(profile, c.unit, profile.bytes_per_param.param, c.ranks);
            let moved = group.persistent - kept;
            for m in memory.iter_mut() {
                m.add_mul(-moved / scale, c.on.var);
            }
            let shard = gradient_shard_bytes(profile, c.unit, c.ranks) / scale;
            let offloaded = c.offloaded();
            memory[timeline.backward(c.unit)] += shard * offloaded.clone();
            let held = 1 + usize::from(group.rs.follower.is_some());
            for k in 0..held {
                memory[group.rs.window.slot_at(k)] += shard * offloaded.clone();
            }
            if let Some(f) = &c.full {
                f.shift_memory(units, (c.unit, group), memory, scale);
            }
        }
    }

    /// Every offload row: the level and reduction it needs, the host's memory, the chain on the
    /// D2H and step channels with the iteration's wrap, the H2D channel's copies, each forward
    /// gather's wait (`optimizer`) and each gather block's copy and wait (`full`).
    pub fn rows(
        &self,
        profile: &Profile,
        units: &[UnitVars],
        durations: &[Col],
    ) -> Vec<Constraint> {
        let mut rows = Vec::new();
        let m = self.big_m;
        let start = |s: usize| -> Expression { durations[..s].iter().map(|d| d.var).sum() };
        let period = start(durations.len());
        if let Some(host) = &profile.host {
            let node: Expression = self
                .candidates
                .iter()
                .map(|c| {
                    let per_node = f64::from(host.ranks_per_node) / host.memory_bytes as f64;
                    let bytes = |mode| host_bytes(profile, c.unit, mode, c.ranks) * per_node;
                    let mut e = bytes(Offload::Optimizer) * c.on.var;
                    if let Some(f) = &c.full {
                        e += bytes(Offload::Full) * f.on.var;
                    }
                    e
                })
                .sum();
            rows.push(constraint!(node <= 1.0));
        }
        let gathers = gather_entries(units, durations.len());
        let timeline = Timeline::new(units.len());
        for (n, c) in self.candidates.iter().enumerate() {
            let u = &units[c.unit];
            let group = &u.groups[c.group];
            let offloaded = c.offloaded();
            rows.push(constraint!(offloaded.clone() <= group.sharded()));
            let nb = f64::from(u.blocks);
            rows.push(constraint!(
                group.rs.launches[0].var >= nb * offloaded.clone()
            ));
            // The chain after the entry that ends the reduction: reductions run before gathers
            // on each link, the newest gradient's last (§3.7), so it ends at the slot's start
            // plus its link's reductions queued up to it.
            let r = c.reduced;
            let reduced = start(r.slot) + reductions_up_to(units, r);
            let [d2h, step, h2d] = c.ends;
            let [t_d, t_s, t_h] = c.work;
            rows.push(constraint!(
                d2h.var >= reduced + t_d - m + m * offloaded.clone()
            ));
            rows.push(constraint!(step.var >= d2h.var + t_s * offloaded.clone()));
            rows.push(constraint!(
                h2d.var >= step.var + t_h * c.on.var - m + m * c.on.var
            ));
            // FIFO: the previous candidate of the host's order (the next one in forward order;
            // the lowest's chain of the previous iteration for the highest). The H2D channel's
            // order is the copies' (`h2d_chain`).
            let (prev, wrap) = match self.candidates.get(n + 1) {
                Some(p) => (p, Expression::default()),
                None => (&self.candidates[0], -period.clone()),
            };
            for k in 0..2 {
                rows.push(constraint!(
                    c.ends[k].var
                        >= prev.ends[k].var + wrap.clone() + c.work[k] * offloaded.clone()
                ));
            }
            for (q, (&pos, x)) in group
                .fg
                .positions
                .iter()
                .zip(&group.fg.launches)
                .enumerate()
            {
                let w = c.waits[q];
                rows.push(constraint!(w.var <= c.on.var));
                rows.push(constraint!(w.var <= x.var));
                rows.push(constraint!(nb * w.var >= x.var - nb + nb * c.on.var));
                let s = group.fg.window.slot_at(pos);
                let key = queue_key(Op::GatherForward, pos, group.fg.window.len, c.unit);
                let suffix = suffix_at(&gathers, s, key, group.fg.link);
                let next = if s < timeline.forward(c.unit) {
                    period.clone()
                } else {
                    Expression::default()
                };
                rows.push(constraint!(
                    durations[s].var + start(s) + next >= h2d.var + suffix - m + m * w.var
                ));
            }
            if let Some(f) = &c.full {
                rows.extend(f.rows(c, (u, group), (&gathers, &timeline), durations, m));
            }
        }
        rows.extend(self.h2d_chain(durations.len(), &period));
        rows
    }

    /// The H2D channel, FIFO in the order the simulator issues its copies (slot by slot, each
    /// slot's queue in canonical order): an `optimizer` unit's shard after its step at the entry
    /// that ends its reduction, a `full` unit's shards at each gather position; the first after
    /// the previous iteration's last.
    fn h2d_chain(&self, slots: usize, period: &Expression) -> Vec<Constraint> {
        let mut events: Vec<(usize, QueueKey, Col, Expression)> = Vec::new();
        for c in &self.candidates {
            let work = c.work[2] * c.on.var;
            events.push((c.reduced.slot, c.reduced.key, c.ends[2], work));
            if let Some(f) = &c.full {
                for g in &f.gathers {
                    events.push((g.slot, g.key, g.copied, f.copy_us * g.copies.var));
                }
            }
        }
        debug_assert!(events.iter().all(|e| e.0 < slots));
        events.sort_by_key(|e| (e.0, e.1));
        let mut rows = Vec::new();
        for (n, (_, _, end, work)) in events.iter().enumerate() {
            let (prev, wrap) = match n.checked_sub(1) {
                Some(p) => (events[p].2, Expression::default()),
                None => (events[events.len() - 1].2, -period.clone()),
            };
            rows.push(constraint!(end.var >= prev.var + wrap + work.clone()));
        }
        rows
    }
}

/// Whether unit `unit` may offload over `group` in the ILP: the group has a sharded choice, its
/// reduction may launch right after B_i, the unit lends and borrows no parameters, and its
/// reduction carries no device optimizer step (DESIGN §4.10).
fn may_offload(profile: &Profile, unit: usize, group: &GroupVars) -> bool {
    group.rs.positions.first() == Some(&0)
        && profile.borrower(unit).is_none()
        && profile.units[unit].reads_params_of.is_none()
        && profile.units[unit].optimizer_us == 0.0
}

/// Σ t·x of every reduction block (an RS's replica AllReduce follower included) queued at
/// `reduced`'s slot on its link at or before its key: the entries that run before it ends.
fn reductions_up_to(units: &[UnitVars], reduced: Reduced) -> Expression {
    let mut sum = Expression::default();
    for (unit, u) in units.iter().enumerate() {
        for op in u.ops().filter(|op| op.op.is_reduction()) {
            let len = op.window.len;
            for (&pos, x) in op.positions.iter().zip(&op.launches) {
                let own = (
                    op.window.slot_at(pos),
                    queue_key(op.op, pos, len, unit),
                    op.link,
                );
                let parts = std::iter::once((own, op.block_time_us)).chain(
                    op.follower.iter().filter(|_| pos + 1 < len).map(|f| {
                        let slot = op.window.slot_at(pos + 1);
                        let key = queue_key(Op::ReplicaAllReduce, pos + 1, len, unit);
                        ((slot, key, f.link), f.block_time_us)
                    }),
                );
                for ((slot, key, link), t) in parts {
                    if slot == reduced.slot && link == reduced.link && key <= reduced.key {
                        sum += t * x.var;
                    }
                }
            }
        }
    }
    sum
}

/// A gather column of a slot: its canonical queue key, link, block time and column.
type GatherEntry = (QueueKey, Link, f64, Col);

/// Σ t·x of the gathers of slot `s` on `link` at or after `key` in the canonical order.
fn suffix_at(gathers: &[Vec<GatherEntry>], s: usize, key: QueueKey, link: Link) -> Expression {
    gathers[s]
        .iter()
        .filter(|(k, l, _, _)| *k >= key && *l == link)
        .map(|(_, _, t, x)| *t * x.var)
        .sum()
}

/// Per slot, its gather columns with their canonical queue key, link and block time.
fn gather_entries(units: &[UnitVars], slots: usize) -> Vec<Vec<GatherEntry>> {
    let mut entries = vec![Vec::new(); slots];
    for (unit, u) in units.iter().enumerate() {
        for op in u.ops().filter(|op| !op.op.is_reduction()) {
            for (&pos, x) in op.positions.iter().zip(&op.launches) {
                let key = queue_key(op.op, pos, op.window.len, unit);
                entries[op.window.slot_at(pos)].push((key, op.link, op.block_time_us, *x));
            }
        }
    }
    entries
}

/// The big M of the gated rows, from the serialised work `serial` (µs), every candidate's host
/// work W (D2H, step, H2D and 2·nb copies), the longest single piece of work t̄ (an op's block, a
/// candidate's D2H, step, H2D or shard copy) and the ceiling T̄ on Σ_s d_s where the model has
/// one:
///
/// ```text
/// M = min(4·(serial + W), 5·T̄ + t̄)
/// ```
///
/// The second is valid over the plans with T ≤ T̄ (DESIGN §4.10). At an integer point each host
/// channel's work is at most T (its FIFO's wrap row), so the least host ends (every end ≥ 0) are
/// at most 4T: a reduction ends by T, and the D2H, step and H2D channels each add at most T. A
/// gated row whose gate is off asks its left side for at most an end, a slot's gather suffix
/// (≤ T) and one piece of work (≤ t̄).
fn big_m(serial: f64, host_work: f64, longest: f64, ceiling: Option<f64>) -> f64 {
    let loose = 4.0 * (serial + host_work);
    ceiling.map_or(loose, |t| loose.min(5.0 * t + longest))
}

/// The longest single piece of work a gated row may add: an op's block (a follower's too), a
/// candidate's D2H, step or H2D, or one shard copy of `full`.
fn longest_us(units: &[UnitVars], candidates: &[Candidate]) -> f64 {
    let blocks = units
        .iter()
        .flat_map(|u| u.ops().flat_map(|op| op.parts().map(|(_, _, t, _)| t)));
    let host = candidates.iter().flat_map(|c| {
        c.work
            .iter()
            .copied()
            .chain(c.full.as_ref().map(|f| f.copy_us))
    });
    blocks.chain(host).fold(0.0, f64::max)
}

/// Every slot's most compute and every op's blocks (a replica AllReduce follower's too),
/// serialised: no slot start or chain end of a steady iteration exceeds a small multiple of it
/// with the host's work added.
fn serial_us(profile: &Profile, units: &[UnitVars]) -> f64 {
    let compute: f64 = profile
        .units
        .iter()
        .map(|p| {
            p.forward_us.max(p.checkpointed_forward_time_us())
                + p.backward_us
                + p.recompute_time_us()
        })
        .sum::<f64>()
        + profile.iteration_extra_us;
    let blocks: f64 = units
        .iter()
        .map(|u| {
            u.ops()
                .flat_map(|op| op.parts().map(|(_, _, t, _)| t))
                .sum::<f64>()
                * f64::from(u.blocks)
        })
        .sum();
    compute + blocks
}
