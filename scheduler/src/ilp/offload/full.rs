//! `full` offload in the ILP (DESIGN §4.10): per unit and group of ranks f_i, v_i = f_i ∧ y_sdp,
//! and per gather position the copied shards z, the wait w and the copies' end h, with the rows
//! that tie each copied block's H2D to its slot's queue on the gather's link.

use super::{Candidate, GatherEntry, suffix_at};
use crate::ilp::variables::{Col, Columns, GroupVars, OpVars, UnitVars};
use crate::offload::{HostWork, Offload, gather_shard_bytes};
use crate::profile::{Host, Profile};
use crate::schedule::{QueueKey, queue_key};
use crate::timeline::Timeline;
use good_lp::{Constraint, Expression, constraint};

/// The columns of a unit's `full` offload over one group of ranks.
pub(in crate::ilp) struct FullVars {
    /// f_i.
    pub on: Col,
    /// v_i = f_i ∧ y_{i,sdp}: the copied shards stay from F_i to B_i.
    pub on_sdp: Col,
    /// The H2D of one gather block's shard, µs.
    pub copy_us: f64,
    /// Ψ'_i·p/(nb_i·S): one block's shard on the device, bytes.
    shard_bytes: f64,
    /// One per gather position (FG's, then BG's).
    pub gathers: Vec<FullGather>,
}

/// A gather position of a unit that may take `full`: its blocks' copies and their wait.
pub(in crate::ilp) struct FullGather {
    /// Whether this is a backward gather (BG); else a forward one (FG).
    backward: bool,
    /// The index into the op's positions.
    index: usize,
    pub slot: usize,
    pub key: QueueKey,
    /// z = f_i·x: the blocks launched here whose shards are copied.
    pub copies: Col,
    /// w = [f_i and a block launches here].
    pub wait: Col,
    /// h: when the last of these copies ends, µs from the iteration's start.
    pub copied: Col,
}

impl FullVars {
    /// f, v and per gather position z, w and h for unit `unit` over `group` (S = `ranks`),
    /// where it may take `full`: each launch column one block.
    pub fn declare(
        columns: &mut Columns,
        (profile, host): (&Profile, &Host),
        (unit, ranks): (usize, u32),
        group: &GroupVars,
    ) -> Option<FullVars> {
        let ops = std::iter::once((false, &group.fg)).chain(group.bg.iter().map(|bg| (true, bg)));
        if ops.clone().any(|(_, op)| op.blocks_per_launch != 1) {
            return None;
        }
        let work = HostWork::of(profile, host, (unit, ranks), Offload::Full)?;
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
            shard_bytes: gather_shard_bytes(profile, unit, ranks),
            gathers,
        })
    }

    /// −Ψ'(p+g+o)/S·f at every slot, and each copied shard as long as its gathered block: from
    /// its launch to the end of its window, then F_i (FG), B_i (BG), and F_i … B_i at sdp.
    pub fn shift_memory(
        &self,
        units: &[UnitVars],
        (unit, group): (usize, &GroupVars),
        memory: &mut [Expression],
        scale: f64,
    ) {
        let timeline = Timeline::new(units.len());
        let (forward, backward) = (timeline.forward(unit), timeline.backward(unit));
        let shard = self.shard_bytes / scale;
        let all = shard * f64::from(units[unit].blocks);
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

    /// v, z and w's links to f, y and x (f only at sdp or fsdp: an hpZ unit's backward gathers
    /// from its secondary shard); each position's copies after the unit's host step (the previous
    /// iteration's where the gather comes before its reduction) and the slot's start; the slot
    /// ends no earlier than its link's blocks after the first and the last copied block (DESIGN
    /// §4.10).
    pub fn rows(
        &self,
        c: &Candidate,
        (u, group): (&UnitVars, &GroupVars),
        (gathers, timeline): (&[Vec<GatherEntry>], &Timeline),
        durations: &[Col],
        m: f64,
    ) -> Vec<Constraint> {
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
        if group.hpz.is_some() {
            let mut gathered_whole = Expression::from(group.sdp.var);
            if let Some(y) = group.fsdp {
                gathered_whole += y.var;
            }
            rows.push(constraint!(f <= gathered_whole));
        }
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
            let suffix = suffix_at(gathers, s, g.key, op.link);
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
    pub fn launch(&self, group: &GroupVars) -> Col {
        self.op(group).launches[self.index]
    }
}
