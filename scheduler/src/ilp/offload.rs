//! Offload in the ILP (DESIGN §4.10): per unit o_i = [optimizer state, fp32 master and gradient on
//! the host, the step there], the host chain's end times and the rows that tie them to the
//! device's slots, so that Σ_s d_s is the strict simulation's steady iteration time.
//!
//! The space (DESIGN §4.10): `optimizer` only, `host_step = overlapped`, an offloaded unit's
//! reduction whole at the first position after B_i; the columns exist only for a profile with a
//! `[host]`, K = 1, one link in use, κ_q = 0, and per unit a sharded choice over the world, no tied
//! parameters and no device optimizer time.

use super::variables::{Col, Columns, UnitVars};
use crate::cost::Interference;
use crate::offload::{HostWork, Offload, gradient_shard_bytes, host_bytes};
use crate::profile::Profile;
use crate::schedule::offload::shard_bytes;
use crate::schedule::queue_key;
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
                })
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let host_work: f64 = candidates.iter().flat_map(|c| c.work).sum();
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
        }
        modes
    }

    /// The columns whose values a plan's launches and levels do not fix: the chain's ends.
    pub fn free_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.candidates
            .iter()
            .flat_map(|c| c.ends.iter().map(|e| e.index))
    }

    /// The values of o and w for a plan offloading `modes` (the chain's ends left at 0).
    pub fn set_values(&self, units: &[UnitVars], modes: &[Offload], values: &mut [f64]) {
        for c in &self.candidates {
            let on = !modes[c.unit].is_none();
            values[c.on.index] = f64::from(u8::from(on));
            for (w, x) in c.waits.iter().zip(&units[c.unit].groups[0].fg.launches) {
                values[w.index] = f64::from(u8::from(on && values[x.index] > 0.5));
            }
        }
    }

    /// Device memory (DESIGN §3.13): an offloaded unit keeps Ψ'p/N of its Ψ'(p+g+o)/N, and its
    /// reduced gradient shard Ψ'g/N from B_i to the end of its reduction's slot. Scaled as
    /// `memory` is.
    pub fn shift_memory(
        &self,
        profile: &Profile,
        units: &[UnitVars],
        memory: &mut [Expression],
        scale: f64,
    ) {
        let timeline = Timeline::new(units.len());
        for c in &self.candidates {
            let kept = shard_bytes(profile, c.unit, profile.bytes_per_param.param);
            let moved = units[c.unit].groups[0].persistent - kept;
            for m in memory.iter_mut() {
                m.add_mul(-moved / scale, c.on.var);
            }
            let shard = gradient_shard_bytes(profile, c.unit) / scale;
            let reduced = units[c.unit].groups[0].rs.window.slot_at(0);
            memory[timeline.backward(c.unit)].add_mul(shard, c.on.var);
            memory[reduced].add_mul(shard, c.on.var);
        }
    }

    /// Every offload row: the level and reduction it needs, the host's memory, the chain on the
    /// three FIFO channels with the iteration's wrap, and each forward gather's wait.
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
                    let bytes = host_bytes(profile, c.unit, Offload::Optimizer)
                        * f64::from(host.ranks_per_node);
                    bytes / host.memory_bytes as f64 * c.on.var
                })
                .sum();
            rows.push(constraint!(node <= 1.0));
        }
        let gathers = gather_entries(units, durations.len());
        for (n, c) in self.candidates.iter().enumerate() {
            let u = &units[c.unit];
            let group = &u.groups[0];
            rows.push(constraint!(c.on.var <= group.sharded()));
            let nb = f64::from(u.blocks);
            rows.push(constraint!(group.rs.launches[0].var >= nb * c.on.var));
            // The chain after the reduction's slot: its reductions all run before its gathers,
            // unit i's last among them (the newest gradient), so they end at start + Σ t·x.
            let slot = group.rs.window.slot_at(0);
            let reduced = start(slot) + reductions_at(units, slot);
            let [d2h, step, h2d] = c.ends;
            let [t_d, t_s, t_h] = c.work;
            rows.push(constraint!(d2h.var >= reduced + t_d - m + m * c.on.var));
            rows.push(constraint!(step.var >= d2h.var + t_s * c.on.var));
            rows.push(constraint!(h2d.var >= step.var + t_h * c.on.var));
            // FIFO: the previous unit of the host's order (the next one in forward order; the
            // lowest's chain of the previous iteration for the highest).
            let (prev, wrap) = match self.candidates.get(n + 1) {
                Some(p) => (p, Expression::default()),
                None => (&self.candidates[0], -period.clone()),
            };
            for k in 0..3 {
                rows.push(constraint!(
                    c.ends[k].var >= prev.ends[k].var + wrap.clone() + c.work[k] * c.on.var
                ));
            }
            let timeline = Timeline::new(units.len());
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
                let suffix: Expression = gathers[s]
                    .iter()
                    .filter(|(k, _, _)| *k >= key)
                    .map(|(_, t, x)| *t * x.var)
                    .sum();
                let next = if s < timeline.forward(c.unit) {
                    period.clone()
                } else {
                    Expression::default()
                };
                rows.push(constraint!(
                    durations[s].var + start(s) + next >= h2d.var + suffix - m + m * w.var
                ));
            }
        }
        rows
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

/// Per slot, its gather columns with their canonical queue key and block time.
fn gather_entries(
    units: &[UnitVars],
    slots: usize,
) -> Vec<Vec<(crate::schedule::QueueKey, f64, Col)>> {
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
