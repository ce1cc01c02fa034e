//! The decision variables of DESIGN §4 and the window positions each may use.
//!
//! Per unit i: level binaries y_{i,none}, y_{i,sdp}, y_{i,fsdp} and, where the topology offers a
//! secondary group H, y_{i,hpz} (fsdp keeping a 1/H shard, DESIGN §3.11); recompute r_i; per op and
//! allowed window position k the integer block count x_{i,op,k} and its running sum
//! C_{i,op,k} = Σ_{k' ≤ k} x_{i,op,k'} (the cumulative launch count that keeps memory rows
//! sparse); the RS→AG boundary indicators Z_{i,k} = [boundary ≤ k]. Per slot s the duration d_s.
//!
//! Ops in the ILP: AR (none), RS (sdp and fsdp share it: same window, same cost and lifetime),
//! FG (the forward gather: AG_i of sdp or AGF_i of fsdp; same window and cost, the level decides
//! how long its buffer lives), BG (AGB_i of fsdp), BGH (AGB_i of hpz, inside H on the intra link:
//! one set per unit, shared by every group's hpz, whose time, load and bytes it does not change).
//! One column u_H ≥ y_{i,hpz} counts the secondary group's communicator in memory.
//!
//! `columns` counts and indexes the columns as they are created; `declare` declares each unit's
//! variables over the window positions a model allows; this file holds the variables' types.

mod columns;
mod declare;

pub(super) use columns::{Col, Columns};
pub(super) use declare::declare_units;

use super::SolveOptions;
use crate::cost::Among;
use crate::profile::Link;
use crate::timeline::{Level, Op, Window};
use good_lp::Expression;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// One op's launch variables over its allowed window positions.
pub(super) struct OpVars {
    /// The op these variables launch (FG stands for AG and AGF alike).
    pub op: Op,
    /// The ranks its collective runs among (BGH: the secondary group).
    pub among: Among,
    /// The link whose queue its blocks join.
    pub link: Link,
    pub window: Window,
    /// Allowed positions, increasing.
    pub positions: Vec<usize>,
    /// Per position: None where the column launches at it; in the far-band relaxation
    /// (`super::far`), the window positions a band column stands for (its blocks count in memory
    /// and order as at its position, their communication in the band's pooled rows).
    pub bands: Vec<Option<Range<usize>>>,
    /// x_{i,op,k} for each allowed position.
    pub launches: Vec<Col>,
    /// C_{i,op,k} for each allowed position.
    pub cumulative: Vec<Col>,
    /// t_op(bytes(b)) + upd_op of one block: its time on the communication stream.
    pub block_time_us: f64,
    /// κ_c·t_op + κ_u·upd_op of one block: the compute it costs its slot.
    pub block_load_us: f64,
    /// Bytes of one block (Ψ'·p/nb or Ψ'·g/nb, Ψ' the laid-out parameters).
    pub block_bytes: f64,
    /// The unit's blocks one launch column counts (`super::target`): 1, or nb_i where the target
    /// launches a unit whole; the times and bytes above are of one launch.
    pub blocks_per_launch: u32,
    /// The index of the unit's group of ranks the op belongs to (`UnitVars::groups`); None for
    /// AR.
    pub group: Option<usize>,
    /// What each block brings one position later: the replica AllReduce that follows an RS block
    /// of a shard group (DESIGN §3.11).
    pub follower: Option<Follower>,
}

/// The block that follows each block of an op one window position later, on its own link.
#[derive(Debug, Clone, Copy)]
pub(super) struct Follower {
    pub link: Link,
    pub block_time_us: f64,
    pub block_load_us: f64,
}

impl OpVars {
    /// Every (position offset, link, time, load) a block of the op puts on the timeline: its own
    /// at offset 0, its follower's at offset 1.
    pub fn parts(&self) -> impl Iterator<Item = (usize, Link, f64, f64)> + '_ {
        std::iter::once((0, self.link, self.block_time_us, self.block_load_us)).chain(
            self.follower
                .iter()
                .map(|f| (1, f.link, f.block_time_us, f.block_load_us)),
        )
    }

    /// C at window position `pos`: the running sum at the last allowed position ≤ pos.
    pub fn cumulative_at(&self, pos: usize) -> Option<Col> {
        let k = self.positions.partition_point(|&p| p <= pos);
        (k > 0).then(|| self.cumulative[k - 1])
    }

    /// The launch columns at a position of their own (not band columns), with their slot.
    pub fn launches_at_slots(&self) -> impl Iterator<Item = (usize, Col)> + '_ {
        self.positions
            .iter()
            .zip(&self.launches)
            .zip(&self.bands)
            .filter(|(_, band)| band.is_none())
            .map(|((&k, x), _)| (self.window.slot_at(k), *x))
    }

    /// The band columns (`super::far`), with the window positions each stands for.
    pub fn band_launches(&self) -> impl Iterator<Item = (&Range<usize>, Col)> + '_ {
        self.bands
            .iter()
            .zip(&self.launches)
            .filter_map(|(band, x)| Some((band.as_ref()?, *x)))
    }

    /// The last running sum: all blocks of the op.
    pub fn total(&self) -> Col {
        *self
            .cumulative
            .last()
            .expect("an op has at least one allowed position")
    }
}

/// Launch positions outside the window limits that get columns of their own, per (unit, ILP op).
pub(super) type ExtraPositions = BTreeMap<(usize, Op), BTreeSet<usize>>;

/// The launch columns a model declares: the positions the window limits of `options` allow and
/// those of `extra` launch at their position; with `far_bands`, band columns of the far-band
/// relaxation stand for every other position (`super::far`).
#[derive(Clone, Copy)]
pub(super) struct Shape<'a> {
    pub options: &'a SolveOptions,
    pub extra: &'a ExtraPositions,
    pub far_bands: bool,
}

/// A unit's level as the ILP chooses it: replicated, or sdp, fsdp or hpz (fsdp keeping a
/// secondary shard) over the unit's group of ranks of that index (`UnitVars::groups`: 0 the
/// world, then each shard group; DESIGN §3.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Choice {
    None,
    Sdp(usize),
    Fsdp(usize),
    Hpz(usize),
}

impl Choice {
    /// The schedule's level of the choice.
    pub fn level(self) -> Level {
        match self {
            Choice::None => Level::None,
            Choice::Sdp(_) => Level::Sdp,
            Choice::Fsdp(_) | Choice::Hpz(_) => Level::Fsdp,
        }
    }

    /// The group of ranks a sharded choice shards over.
    pub fn group(self) -> Option<usize> {
        match self {
            Choice::None => None,
            Choice::Sdp(g) | Choice::Fsdp(g) | Choice::Hpz(g) => Some(g),
        }
    }
}

/// What a plan fixes of a unit before its launches: its level (over which group) and recompute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UnitLevel {
    pub choice: Choice,
    pub recompute: bool,
}

/// The variables of a unit sharded over one group of ranks: the world, or a shard group of S < N
/// ranks (HSDP, whose RS blocks bring their replica AllReduce a position later).
pub(super) struct GroupVars {
    /// S; None: the world.
    pub shard: Option<u32>,
    pub sdp: Col,
    pub fsdp: Option<Col>,
    /// y_{i,hpz}, where the plan space offers the secondary group `secondary` in this group.
    pub hpz: Option<Col>,
    /// H, the secondary group hpz uses.
    pub secondary: Option<u32>,
    /// Ψ'_i·p/H, the secondary shard an hpz unit keeps from F_i to B_i.
    pub secondary_bytes: f64,
    pub rs: OpVars,
    pub fg: OpVars,
    pub bg: Option<OpVars>,
    /// Positions from the last RS block to the first forward gather: 0 over the world (same
    /// slot, RS first), 2 over a shard group (RA in between, a slot apart).
    pub gap: usize,
    /// (k, Z_{i,k}) for k in the range where the order between RS and FG positions can bind,
    /// Z = [boundary ≤ k]; the boundary is implicitly ≤ the last RS position + gap.
    pub boundary: Vec<(usize, Col)>,
    /// Ψ'_i(p+g+o)/S.
    pub persistent: f64,
    /// u, the communicators this group adds (shared by every unit; None over the world).
    pub communicator: Option<Col>,
}

impl GroupVars {
    /// y_{i,sdp} + y_{i,fsdp} + y_{i,hpz} of this group.
    pub fn sharded(&self) -> Expression {
        [Some(self.sdp), self.fsdp, self.hpz]
            .into_iter()
            .flatten()
            .map(|c| Expression::from(c.var))
            .sum()
    }

    /// The launch variables of the group's ops.
    pub fn ops(&self) -> impl Iterator<Item = &OpVars> {
        [&self.rs, &self.fg].into_iter().chain(self.bg.iter())
    }
}

/// All variables of one unit.
pub(super) struct UnitVars {
    pub blocks: u32,
    pub none: Option<Col>,
    pub recompute: Option<Col>,
    pub ar: Option<OpVars>,
    /// The groups of ranks the unit may shard over: the world first, then each offered shard
    /// group.
    pub groups: Vec<GroupVars>,
    /// BGH, AGB_i of hpz inside the secondary group H, where some group has hpz: its blocks' time,
    /// load and bytes are the same over whichever group the unit shards, so one set covers
    /// Σ_g y_{i,hpz,g} (as FG covers sdp and fsdp), not one per group (DESIGN §3.11).
    pub bgh: Option<OpVars>,
    /// u_H, the secondary group's communicator (one column shared by every unit that has hpz).
    pub secondary_communicator: Option<Col>,
    /// Persistent bytes when replicated.
    pub persistent_full: f64,
}

impl UnitVars {
    /// Every choice with its column (None where the unit does not have it).
    pub fn choices(&self) -> Vec<(Choice, Option<Col>)> {
        let mut choices = vec![(Choice::None, self.none)];
        for (g, group) in self.groups.iter().enumerate() {
            choices.extend([
                (Choice::Sdp(g), Some(group.sdp)),
                (Choice::Fsdp(g), group.fsdp),
                (Choice::Hpz(g), group.hpz),
            ]);
        }
        choices
    }

    /// The column of y_{i,c}, where the unit has the choice.
    pub fn column(&self, choice: Choice) -> Option<Col> {
        match choice {
            Choice::None => self.none,
            Choice::Sdp(g) => self.groups.get(g).map(|group| group.sdp),
            Choice::Fsdp(g) => self.groups.get(g)?.fsdp,
            Choice::Hpz(g) => self.groups.get(g)?.hpz,
        }
    }

    /// The expression of y_{i,c} (0 when the choice is not available to the unit).
    pub fn choice(&self, choice: Choice) -> Expression {
        self.column(choice)
            .map_or_else(Expression::default, |c| c.var.into())
    }

    /// The expression of the unit being at `level` over any group: y_{i,none}, Σ_g y_{i,sdp,g},
    /// or Σ_g (y_{i,fsdp,g} + y_{i,hpz,g}) (hpz is fsdp with a secondary shard).
    pub fn level(&self, level: Level) -> Expression {
        self.choices()
            .into_iter()
            .filter(|(choice, _)| choice.level() == level)
            .map(|(choice, _)| self.choice(choice))
            .sum()
    }

    /// Σ of every sharded choice: the unit is sharded.
    pub fn sharded(&self) -> Expression {
        self.level(Level::Sdp) + self.level(Level::Fsdp)
    }

    /// The choices an op's blocks cover (§4.2 coverage): y_none for AR; within the op's group,
    /// y_sdp + y_fsdp + y_hpz for RS and FG, y_fsdp for BG, y_hpz for BGH.
    pub fn covered_level(&self, op: &OpVars) -> Expression {
        self.choices()
            .into_iter()
            .filter(|&(choice, _)| covers(op, choice))
            .map(|(choice, _)| self.choice(choice))
            .sum()
    }

    /// All launch variables of the unit's ops: AR, then each group's, then BGH.
    pub fn ops(&self) -> impl Iterator<Item = &OpVars> {
        self.ar
            .iter()
            .chain(self.groups.iter().flat_map(GroupVars::ops))
            .chain(self.bgh.iter())
    }
}

/// Whether `op`'s blocks run at `choice`: AR at none; BGH (AGB inside H) at hpz over any group; a
/// group's RS and FG (AG or AGF) at each of that group's sharded choices, its BG (AGB among the
/// group) at fsdp.
pub(super) fn covers(op: &OpVars, choice: Choice) -> bool {
    match (op.op, op.among) {
        (Op::AllReduce, _) => return choice == Choice::None,
        (Op::GatherBackward, Among::Secondary(_)) => return matches!(choice, Choice::Hpz(_)),
        _ => {}
    }
    let Some(g) = op.group.filter(|&g| choice.group() == Some(g)) else {
        return false;
    };
    op.op != Op::GatherBackward || choice == Choice::Fsdp(g)
}
