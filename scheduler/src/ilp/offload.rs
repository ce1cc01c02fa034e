//! Offload in the ILP (DESIGN §4.10): per unit o_i = [optimizer state, fp32 master and gradient on
//! the host, the step there] and f_i = [`full`: the parameter shard there too, copied to the
//! device before each gather block], the host chain's end times, the H2D channel's copies in the
//! order the simulator issues them, and the rows that tie them to the device's slots, so that
//! Σ_s d_s is the strict simulation's steady iteration time.
//!
//! The space (DESIGN §4.10): `optimizer` or `full`, `host_step = overlapped`, an offloaded unit's
//! reduction whole at the first position after B_i; the columns exist only for a profile with a
//! `[host]`, K = 1, one link in use, κ_q = 0, and per unit a sharded choice over the world, no tied
//! parameters and no device optimizer time (`full` also one block per launch column).

use super::variables::{Col, Columns, GroupVars, OpVars, UnitVars};
use crate::cost::Interference;
use crate::offload::{HostWork, Offload, gather_shard_bytes, gradient_shard_bytes, host_bytes};
use crate::profile::Profile;
use crate::schedule::offload::shard_bytes;
use crate::schedule::{QueueKey, queue_key};
use crate::timeline::{Op, Timeline};
use good_lp::{Constraint, Expression, constraint};

/// One unit the ILP may offload.
pub(super) struct Candidate {
    pub unit: usize,
    /// o_i.
    pub on: Col,
    /// e^D_i, e^S_i, e^H_i: when the gradient's D2H, the host step and the parameters' H2D of
    /// this iteration's chain end, µs from the iteration's start.
    pub ends: [Col; 3],
    /// D2H, step and H2D µs.
    work: [f64; 3],
    /// Per forward-gather position (index into the FG op's positions): w_{i,k} =
    /// [o_i and a forward gather block launches at k].
    pub waits: Vec<Col>,
    /// `full` offload's columns, where the unit may take it.
    pub full: Option<FullVars>,
}

/// The columns of a unit's `full` offload.
pub(super) struct FullVars {
    /// f_i.
    pub on: Col,
    /// v_i = f_i ∧ y_{i,sdp}: the copied shards stay from F_i to B_i.
    pub on_sdp: Col,
    /// The H2D of one gather block's shard, µs.
    copy_us: f64,
    /// Ψ'_i·p/(nb_i·N): one block's shard on the device, bytes.
    shard_bytes: f64,
    /// One per gather position (FG's, then BG's).
    pub gathers: Vec<FullGather>,
}

/// A gather position of a unit that may take `full`: its blocks' copies and their wait.
pub(super) struct FullGather {
    /// Whether this is a backward gather (BG); else a forward one (FG).
    backward: bool,
    /// The index into the op's positions.
    index: usize,
    slot: usize,
    key: QueueKey,
    /// z = f_i·x: the blocks launched here whose shards are copied.
    pub copies: Col,
    /// w = [f_i and a block launches here].
    pub wait: Col,
    /// h: when the last of these copies ends, µs from the iteration's start.
    pub copied: Col,
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
    /// In forward order; the host's FIFO order is the reverse (reductions run B_L … B_1).
    pub candidates: Vec<Candidate>,
    /// An upper bound on any slot's start plus a chain's end (the big M of gated rows).
    big_m: f64,
}

/// Whether `profile` gets offload columns at all (DESIGN §4.10).
pub(super) fn offered(profile: &Profile, units: &[UnitVars]) -> bool {
    profile.host.is_some()
        && profile.micro_batches == 1
        && Interference::of(profile).comm == 0.0
        && super::constraints::links_in_use(units).len() == 1
}

impl OffloadVars {
    /// Declares o, the chain's ends and w for every unit that may offload; None where the
    /// profile offers none.
    pub fn declare(
        columns: &mut Columns,
        profile: &Profile,
        units: &[UnitVars],
    ) -> Option<OffloadVars> {
        if !offered(profile, units) {
            return None;
        }
        let host = profile.host.as_ref()?;
        let candidates: Vec<Candidate> = units
            .iter()
            .enumerate()
            .filter(|&(i, u)| may_offload(profile, i, u))
            .filter_map(|(unit, u)| {
                let work = HostWork::of(profile, host, unit, Offload::Optimizer)?;
                Some(Candidate {
                    unit,
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
                    waits: u.groups[0]
                        .fg
                        .positions
                        .iter()
                        .map(|_| columns.binary())
                        .collect(),
                    full: FullVars::declare(columns, profile, host, unit, u),
                })
            })
            .collect();
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
        Some(OffloadVars {
            candidates,
            big_m: 4.0 * (serial_us(profile, units) + host_work),
        })
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

    /// The values of o, f, v, w and z for a plan offloading `modes` (the ends left at 0); false
    /// where a mode has no column.
    pub fn set_values(&self, units: &[UnitVars], modes: &[Offload], values: &mut [f64]) -> bool {
        let bit = |b: bool| f64::from(u8::from(b));
        for c in &self.candidates {
            let group = &units[c.unit].groups[0];
            let on = modes[c.unit] == Offload::Optimizer;
            let full = modes[c.unit] == Offload::Full;
            values[c.on.index] = bit(on);
            for (w, x) in c.waits.iter().zip(&group.fg.launches) {
                values[w.index] = bit(on && values[x.index] > 0.5);
            }
            match &c.full {
                Some(f) => {
                    values[f.on.index] = bit(full);
                    values[f.on_sdp.index] = bit(full && values[group.sdp.index] > 0.5);
                    for g in &f.gathers {
                        let x = values[g.launch(group).index];
                        values[g.copies.index] = if full { x } else { 0.0 };
                        values[g.wait.index] = bit(full && x > 0.5);
                    }
                }
                None if full => return false,
                None => {}
            }
        }
        true
    }

    /// Device memory (DESIGN §3.13): an offloaded unit keeps Ψ'p/N of its Ψ'(p+g+o)/N
    /// (`optimizer`) or nothing (`full`: its gather blocks' shards instead, each as long as its
    /// gathered block), and its reduced gradient shard Ψ'g/N from B_i to the end of its
    /// reduction's slot. Scaled as `memory` is.
    pub fn shift_memory(
        &self,
        profile: &Profile,
        units: &[UnitVars],
        memory: &mut [Expression],
        scale: f64,
    ) {
        let timeline = Timeline::new(units.len());
        for c in &self.candidates {
            let group = &units[c.unit].groups[0];
            let kept = shard_bytes(profile, c.unit, profile.bytes_per_param.param);
            let moved = group.persistent - kept;
            for m in memory.iter_mut() {
                m.add_mul(-moved / scale, c.on.var);
            }
            let shard = gradient_shard_bytes(profile, c.unit) / scale;
            let reduced = group.rs.window.slot_at(0);
            let offloaded = c.offloaded();
            memory[timeline.backward(c.unit)] += shard * offloaded.clone();
            memory[reduced] += shard * offloaded;
            if let Some(f) = &c.full {
                f.shift_memory(units, c.unit, memory, scale);
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
                    let bytes = |mode| host_bytes(profile, c.unit, mode) * per_node;
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
            let group = &u.groups[0];
            let offloaded = c.offloaded();
            rows.push(constraint!(offloaded.clone() <= group.sharded()));
            let nb = f64::from(u.blocks);
            rows.push(constraint!(
                group.rs.launches[0].var >= nb * offloaded.clone()
            ));
            // The chain after the reduction's slot: its reductions all run before its gathers,
            // unit i's last among them (the newest gradient), so they end at start + Σ t·x.
            let slot = group.rs.window.slot_at(0);
            let reduced = start(slot) + reductions_at(units, slot);
            let [d2h, step, h2d] = c.ends;
            let [t_d, t_s, t_h] = c.work;
            rows.push(constraint!(
                d2h.var >= reduced + t_d - m + m * offloaded.clone()
            ));
            rows.push(constraint!(step.var >= d2h.var + t_s * offloaded.clone()));
            rows.push(constraint!(
                h2d.var >= step.var + t_h * c.on.var - m + m * c.on.var
            ));
            // FIFO: the previous unit of the host's order (the next one in forward order; the
            // lowest's chain of the previous iteration for the highest). The H2D channel's order
            // is the copies' (`h2d_chain`).
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
                let suffix = suffix_at(&gathers, s, key);
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
                rows.extend(f.rows(c, u, (&gathers, &timeline), durations, m));
            }
        }
        rows.extend(self.h2d_chain(units, durations.len(), &period));
        rows
    }

    /// The H2D channel, FIFO in the order the simulator issues its copies (slot by slot, each
    /// slot's queue in canonical order): an `optimizer` unit's shard after its step at its
    /// reduction, a `full` unit's shards at each gather position; the first after the previous
    /// iteration's last.
    fn h2d_chain(&self, units: &[UnitVars], slots: usize, period: &Expression) -> Vec<Constraint> {
        let mut events: Vec<(usize, QueueKey, Col, Expression)> = Vec::new();
        for c in &self.candidates {
            let rs = &units[c.unit].groups[0].rs;
            let key = queue_key(Op::ReduceScatter, 0, rs.window.len, c.unit);
            let work = c.work[2] * c.on.var;
            events.push((rs.window.slot_at(0), key, c.ends[2], work));
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

impl FullVars {
    /// f, v and per gather position z, w and h for unit `unit`, where it may take `full`.
    fn declare(
        columns: &mut Columns,
        profile: &Profile,
        host: &crate::profile::Host,
        unit: usize,
        u: &UnitVars,
    ) -> Option<FullVars> {
        let group = &u.groups[0];
        let ops = std::iter::once((false, &group.fg)).chain(group.bg.iter().map(|bg| (true, bg)));
        if ops.clone().any(|(_, op)| op.blocks_per_launch != 1) {
            return None;
        }
        let work = HostWork::of(profile, host, unit, Offload::Full)?;
        let gathers = ops
            .flat_map(|(backward, op)| {
                op.positions
                    .iter()
                    .enumerate()
                    .map(move |(index, &pos)| (backward, op, index, pos))
            })
            .map(|(backward, op, index, pos)| FullGather {
                backward,
                index,
                slot: op.window.slot_at(pos),
                key: queue_key(op.op, pos, op.window.len, unit),
                copies: columns.continuous(),
                wait: columns.binary(),
                copied: columns.continuous(),
            })
            .collect();
        Some(FullVars {
            on: columns.binary(),
            on_sdp: columns.continuous(),
            copy_us: work.h2d_per_gather_block_us?,
            shard_bytes: gather_shard_bytes(profile, unit),
            gathers,
        })
    }

    /// −Ψ'(p+g+o)/N·f at every slot, and each copied shard as long as its gathered block: from
    /// its launch to the end of its window, then F_i (FG), B_i (BG), and F_i … B_i at sdp.
    fn shift_memory(&self, units: &[UnitVars], unit: usize, memory: &mut [Expression], scale: f64) {
        let timeline = Timeline::new(units.len());
        let u = &units[unit];
        let group = &u.groups[0];
        let (forward, backward) = (timeline.forward(unit), timeline.backward(unit));
        let shard = self.shard_bytes / scale;
        let all = shard * f64::from(u.blocks);
        for (s, m) in memory.iter_mut().enumerate() {
            m.add_mul(-group.persistent / scale, self.on.var);
            if s == forward || s == backward {
                m.add_mul(all, self.on.var);
            } else if s > forward && s < backward {
                m.add_mul(all, self.on_sdp.var);
            }
            for g in &self.gathers {
                let op = g.op(group);
                if let Some(k) = op.window.position(s)
                    && op.positions[g.index] <= k
                {
                    m.add_mul(shard, g.copies.var);
                }
            }
        }
    }

    /// v, z and w's links to f, y and x; each position's copies after the unit's host step
    /// (the previous iteration's where the gather comes before its reduction) and the slot's
    /// start; the slot ends no earlier than its link's blocks after the first and the last
    /// copied block (DESIGN §4.10).
    fn rows(
        &self,
        c: &Candidate,
        u: &UnitVars,
        (gathers, timeline): (&[Vec<GatherEntry>], &Timeline),
        durations: &[Col],
        m: f64,
    ) -> Vec<Constraint> {
        let group = &u.groups[0];
        let nb = f64::from(u.blocks);
        let (f, v) = (self.on.var, self.on_sdp.var);
        let start = |s: usize| -> Expression { durations[..s].iter().map(|d| d.var).sum() };
        let period: Expression = durations.iter().map(|d| d.var).sum();
        let stepped = c.ends[1].var;
        let t = self.copy_us;
        let mut rows = vec![
            constraint!(v >= f + group.sdp.var - 1.0),
            constraint!(v <= f),
            constraint!(v <= group.sdp.var),
        ];
        for g in &self.gathers {
            let op = g.op(group);
            let x = g.launch(group).var;
            let (z, w, h) = (g.copies.var, g.wait.var, g.copied.var);
            let b = op.block_time_us;
            rows.extend([
                constraint!(z <= x),
                constraint!(z <= nb * f),
                constraint!(z >= x - nb + nb * f),
                constraint!(w <= f),
                constraint!(w <= x),
                constraint!(nb * w >= x - nb + nb * f),
            ]);
            let s = g.slot;
            let before = g.backward || s < timeline.forward(c.unit);
            let ready = if before {
                stepped - period.clone()
            } else {
                Expression::from(stepped)
            };
            rows.push(constraint!(h >= start(s) + t * z));
            rows.push(constraint!(h >= ready + t * z - m + m * w));
            let suffix = suffix_at(gathers, s, g.key);
            let end = durations[s].var + start(s);
            rows.push(constraint!(
                end.clone() >= h - t * z + t + suffix.clone() - m + m * w
            ));
            rows.push(constraint!(end >= h + b + suffix - b * x - m + m * w));
        }
        rows
    }
}

impl FullGather {
    fn op<'a>(&self, group: &'a GroupVars) -> &'a OpVars {
        match (&group.bg, self.backward) {
            (Some(bg), true) => bg,
            _ => &group.fg,
        }
    }

    /// x: the launch column of this position.
    fn launch(&self, group: &GroupVars) -> Col {
        self.op(group).launches[self.index]
    }
}

/// Whether unit `unit` may offload in the ILP: it has a sharded choice over the world only, its
/// reduction may launch right after B_i, it lends and borrows no parameters, and its reduction
/// carries no device optimizer step (DESIGN §4.10).
fn may_offload(profile: &Profile, unit: usize, u: &UnitVars) -> bool {
    let [group] = u.groups.as_slice() else {
        return false;
    };
    group.shard.is_none()
        && group.hpz.is_none()
        && group.rs.positions.first() == Some(&0)
        && profile.borrower(unit).is_none()
        && profile.units[unit].reads_params_of.is_none()
        && profile.units[unit].optimizer_us == 0.0
}

/// Σ t·x of every reduction block launched at `slot`.
fn reductions_at(units: &[UnitVars], slot: usize) -> Expression {
    units
        .iter()
        .flat_map(UnitVars::ops)
        .filter(|op| op.op.is_reduction())
        .flat_map(|op| {
            op.launches_at_slots()
                .filter(move |&(s, _)| s == slot)
                .map(move |(_, x)| op.block_time_us * x.var)
        })
        .sum()
}

/// A gather column of a slot: its canonical queue key, block time and column.
type GatherEntry = (QueueKey, f64, Col);

/// Σ t·x of the gathers of slot `s` at or after `key` in the canonical order.
fn suffix_at(gathers: &[Vec<GatherEntry>], s: usize, key: QueueKey) -> Expression {
    gathers[s]
        .iter()
        .filter(|(k, _, _)| *k >= key)
        .map(|(_, t, x)| *t * x.var)
        .sum()
}

/// Per slot, its gather columns with their canonical queue key and block time.
fn gather_entries(units: &[UnitVars], slots: usize) -> Vec<Vec<GatherEntry>> {
    let mut entries = vec![Vec::new(); slots];
    for (unit, u) in units.iter().enumerate() {
        for op in u.ops().filter(|op| !op.op.is_reduction()) {
            for (&pos, x) in op.positions.iter().zip(&op.launches) {
                let key = queue_key(op.op, pos, op.window.len, unit);
                entries[op.window.slot_at(pos)].push((key, op.block_time_us, *x));
            }
        }
    }
    entries
}

/// Every slot's most compute and every op's blocks, serialised: no slot start or chain end of a
/// steady iteration exceeds a small multiple of it with the host's work added.
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
                .map(|op| op.block_time_us * f64::from(u.blocks))
                .sum::<f64>()
        })
        .sum();
    compute + blocks
}
