//! The decision variables of DESIGN §4 and the window positions each may use.
//!
//! Per unit i: level binaries y_{i,none}, y_{i,sdp}, y_{i,fsdp}; recompute r_i; per op and
//! allowed window position k the integer block count x_{i,op,k} and its running sum
//! C_{i,op,k} = Σ_{k' ≤ k} x_{i,op,k'} (the cumulative launch count that keeps memory rows
//! sparse); the RS→AG boundary indicators Z_{i,k} = [boundary ≤ k]. Per slot s the duration d_s.
//!
//! Ops in the ILP: AR (none), RS (sdp and fsdp share it: same window, same cost and lifetime),
//! FG (the forward gather: AG_i of sdp or AGF_i of fsdp; same window and cost, the level decides
//! how long its buffer lives), BG (AGB_i of fsdp).

use super::SolveOptions;
use crate::cost::{Interference, block_bytes, block_time, persistent_bytes};
use crate::profile::Profile;
use crate::timeline::{Level, Op, Timeline, Window};
use good_lp::{Expression, ProblemVariables, Variable, variable};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// A variable and its column index (good_lp keeps the index private; HiGHS needs it for the
/// warm start and to read values back).
#[derive(Debug, Clone, Copy)]
pub(super) struct Col {
    pub var: Variable,
    pub index: usize,
}

/// The problem's variables in creation order.
pub(super) struct Columns {
    pub problem: ProblemVariables,
    pub count: usize,
    pub integer: usize,
    /// The LP relaxation: binary and integer columns keep their bounds but not their integrality.
    pub relaxed: bool,
}

impl Columns {
    fn add(&mut self, def: good_lp::VariableDefinition, integer: bool) -> Col {
        let var = self.problem.add(def);
        let col = Col {
            var,
            index: self.count,
        };
        self.count += 1;
        self.integer += usize::from(integer);
        col
    }

    pub fn binary(&mut self) -> Col {
        let def = if self.relaxed {
            variable().min(0).max(1)
        } else {
            variable().binary()
        };
        self.add(def, true)
    }

    pub fn integer(&mut self, max: u32) -> Col {
        let def = variable().min(0).max(max);
        self.add(if self.relaxed { def } else { def.integer() }, true)
    }

    pub fn continuous(&mut self) -> Col {
        self.add(variable().min(0), false)
    }
}

/// One op's launch variables over its allowed window positions.
pub(super) struct OpVars {
    /// The op these variables launch (FG stands for AG and AGF alike).
    pub op: Op,
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
}

impl OpVars {
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

/// All variables of one unit.
pub(super) struct UnitVars {
    pub blocks: u32,
    pub none: Option<Col>,
    pub sdp: Col,
    pub fsdp: Option<Col>,
    pub recompute: Option<Col>,
    pub ar: Option<OpVars>,
    pub rs: OpVars,
    pub fg: OpVars,
    pub bg: Option<OpVars>,
    /// (k, Z_{i,k}) for k in the range where RS and FG positions overlap, Z = [boundary ≤ k];
    /// the boundary is implicitly ≤ the last RS position.
    pub boundary: Vec<(usize, Col)>,
    /// Persistent bytes when replicated and when sharded.
    pub persistent_full: f64,
    pub persistent_sharded: f64,
}

impl UnitVars {
    /// The expression of y_{i,ℓ} (0 when the level is not available to the unit).
    pub fn level(&self, level: Level) -> Expression {
        match level {
            Level::None => self.none.map_or_else(Expression::default, |c| c.var.into()),
            Level::Sdp => self.sdp.var.into(),
            Level::Fsdp => self.fsdp.map_or_else(Expression::default, |c| c.var.into()),
        }
    }

    /// y_{i,sdp} + y_{i,fsdp}: the unit is sharded.
    pub fn sharded(&self) -> Expression {
        self.level(Level::Sdp) + self.level(Level::Fsdp)
    }

    /// The level variable an op's blocks cover (§4.2 coverage): y_none for AR, y_sdp + y_fsdp
    /// for RS and FG, y_fsdp for BG.
    pub fn covered_level(&self, op: Op) -> Expression {
        Level::ALL
            .into_iter()
            .filter(|&level| covers(op, level))
            .map(|level| self.level(level))
            .sum()
    }

    /// All launch variables of the unit's ops.
    pub fn ops(&self) -> impl Iterator<Item = &OpVars> {
        self.ar
            .iter()
            .chain([&self.rs, &self.fg])
            .chain(self.bg.iter())
    }
}

/// Whether the ILP's `op` runs at `level`: AR at none, RS and FG (AG or AGF) at sdp and fsdp,
/// BG (AGB) at fsdp.
pub(super) fn covers(op: Op, level: Level) -> bool {
    match op {
        Op::AllReduce => level == Level::None,
        Op::GatherBackward => level == Level::Fsdp,
        Op::ReduceScatter | Op::Gather | Op::GatherForward => level != Level::None,
    }
}

fn op_vars(
    columns: &mut Columns,
    profile: &Profile,
    timeline: Timeline,
    unit: usize,
    op: Op,
    shape: Shape,
) -> OpVars {
    let window = timeline.window(unit, op.window_kind());
    let limited = shape.options.limits.positions(op, window);
    let extra = shape.extra.get(&(unit, op));
    let exact: Vec<bool> = (0..window.len)
        .map(|k| limited.contains(&k) || extra.is_some_and(|e| e.contains(&k)))
        .collect();
    let mut at: Vec<(usize, Option<Range<usize>>)> = (0..window.len)
        .filter(|&k| exact[k])
        .map(|k| (k, None))
        .collect();
    if shape.far_bands {
        let bands = super::bands::bands(op, window, &exact);
        at.extend(bands.into_iter().map(|(k, band)| (k, Some(band))));
        at.sort_by_key(|(k, _)| *k);
    }
    let (positions, bands): (Vec<usize>, Vec<_>) = at.into_iter().unzip();
    let nb = profile.blocks(unit);
    let time = block_time(profile, unit, op);
    let launches = positions.iter().map(|_| columns.integer(nb)).collect();
    let cumulative = positions.iter().map(|_| columns.continuous()).collect();
    OpVars {
        op,
        window,
        positions,
        bands,
        launches,
        cumulative,
        block_time_us: time.total_us(),
        block_load_us: Interference::of(profile).load_us(op, time),
        block_bytes: block_bytes(profile, unit, op),
    }
}

/// Declares every unit's variables. A replicated unit is left out where its persistent state
/// alone, beside every other unit sharded, exceeds `memory_bound` (a presolve that removes the
/// AR columns of large models). Launch columns as `shape` says.
pub(super) fn declare_units(
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
    (0..profile.unit_count())
        .map(|unit| {
            let full = persistent_bytes(profile, unit, Level::None);
            let sharded = persistent_bytes(profile, unit, Level::Sdp);
            let replicable = memory_bound.is_none_or(|m| sharded_total - sharded + full <= m);
            let u = &profile.units[unit];
            let recomputable =
                options.allow_recompute && u.checkpoint_activation_bytes < u.activation_bytes;
            let can_fsdp = timeline.window(unit, Op::GatherBackward.window_kind()).len > 0;
            let none = replicable.then(|| columns.binary());
            let sdp = columns.binary();
            let fsdp = can_fsdp.then(|| columns.binary());
            let recompute = recomputable.then(|| columns.binary());
            let ar =
                replicable.then(|| op_vars(columns, profile, timeline, unit, Op::AllReduce, shape));
            let rs = op_vars(columns, profile, timeline, unit, Op::ReduceScatter, shape);
            let fg = op_vars(columns, profile, timeline, unit, Op::GatherForward, shape);
            let bg = can_fsdp
                .then(|| op_vars(columns, profile, timeline, unit, Op::GatherBackward, shape));
            let first_gather = fg.positions[0];
            let last_reduction = *rs.positions.last().expect("RS has a position");
            let boundary = (first_gather..last_reduction)
                .map(|k| (k, columns.binary()))
                .collect();
            UnitVars {
                blocks: profile.blocks(unit),
                none,
                sdp,
                fsdp,
                recompute,
                ar,
                rs,
                fg,
                bg,
                boundary,
                persistent_full: full,
                persistent_sharded: sharded,
            }
        })
        .collect()
}
