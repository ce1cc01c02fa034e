//! The rows of the micro-batch MIP (DESIGN §4.8): the columns `super::columns` declares, one
//! configuration per unit, running sums, coverage, the step's RS→FG order per group, the
//! communicators in use, each unrolled slot's compute, communication per link, load and
//! duration; `super::memory` adds the memory rows.

use super::columns::{
    Boundary, Communicator, Config, Launches, OPS, Order, SetKey, UnitCols, Unrolled,
};
use super::linear::Linear;
use super::memory::memory_rows;
use crate::cost::{Among, Interference, block_time};
use crate::groups::{secondary_group, shard_groups};
use crate::ilp::WindowLimits;
use crate::ilp::variables::{Col, Columns};
use crate::profile::{Link, Profile};
use crate::schedule::{RecomputeChoice, ReplicaReduce};
use crate::target::Target;
use crate::timeline::{Op, Timeline, Window, WindowKind};
use good_lp::{Constraint, Expression, constraint};
use std::collections::{BTreeMap, BTreeSet};

/// Launch positions outside the window limits that get columns, per (unit, index of the column
/// set in `UnitCols::launches`).
pub(in crate::ilp) type Added = BTreeMap<(usize, usize), BTreeSet<usize>>;

/// A slot's terms: c_s, Q^ℓ_s per link in use (`Built::links`' order) and L_s.
#[derive(Debug, Clone, Default)]
pub(super) struct SlotTerms {
    pub compute: Linear,
    pub comm: Vec<Linear>,
    pub load: Linear,
}

impl SlotTerms {
    /// d_s at `values`: max(c + L, max_ℓ Q^ℓ + κ_q·c).
    pub fn duration(&self, interference: Interference, values: &[f64]) -> f64 {
        let (c, l) = (self.compute.eval(values), self.load.eval(values));
        self.comm
            .iter()
            .map(|q| interference.slot_duration(c, q.eval(values), l))
            .fold(c + l, f64::max)
    }
}

/// Everything a solve reads back: the units' columns and each slot's terms.
pub(super) struct Built {
    pub columns: Columns,
    pub units: Vec<UnitCols>,
    pub terms: Vec<SlotTerms>,
    pub durations: Vec<Col>,
    /// Per slot: its weight in the objective (1, or K − 2 for the steady micro-batch).
    pub weights: Vec<f64>,
    /// Per slot: M_s.
    pub memory: Vec<Linear>,
    pub communicators: Vec<Communicator>,
    /// The peak column of the memory objective (M_s / scale ≤ peak), and its scale.
    pub peak: Option<(Col, f64)>,
    pub constraints: Vec<Constraint>,
    /// Per unit, the rows the pricing keeps (`super::pricing`): its one-configuration row and
    /// each column set's coverage row (in `UnitCols::launches`' order).
    pub kept: Vec<KeptRows>,
}

impl Built {
    /// T = Σ weight·d_s: the step time.
    pub fn step_time(&self) -> Expression {
        self.durations
            .iter()
            .zip(&self.weights)
            .fold(Expression::from(0.0), |sum, (d, w)| sum + *w * d.var)
    }
}

/// A unit's one-configuration row and its column sets' coverage rows (`constraints` indices).
pub(super) struct KeptRows {
    pub one: usize,
    pub coverage: Vec<usize>,
}

/// Which launch positions get columns: those `limits` allow and those `added` names (column
/// generation's); with `left_out`, every other window position too, as a column fixed at 0 whose
/// reduced cost the LP reports (`super::pricing`), all columns relaxed; `target`'s positions,
/// whole launches and configurations only (DESIGN §4.9, `super::target`). With `fixed`, each
/// unit's configuration and recompute are held (a placement, `super::placement`).
#[derive(Clone, Copy)]
pub(super) struct Space<'a> {
    pub limits: WindowLimits,
    pub added: &'a Added,
    pub left_out: bool,
    pub target: Target,
    pub fixed: Option<&'a [Fixed]>,
}

impl<'a> Space<'a> {
    /// The columns `limits` allow and those `added` names, over `target`'s space: no left-out
    /// positions priced, no configuration held.
    pub fn within(limits: WindowLimits, added: &'a Added, target: Target) -> Self {
        Space {
            limits,
            added,
            left_out: false,
            target,
            fixed: None,
        }
    }
}

/// A unit's configuration and recompute flag, held by a placement (DESIGN §4.8: "placements fix
/// configurations").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fixed {
    pub config: Config,
    pub recompute: bool,
}

/// Declares the columns (launches at the positions `limits` allow) and builds every row family;
/// with `peak_scale`, a peak column above every slot's memory in units of that scale.
pub(super) fn build(
    profile: &Profile,
    space: Space,
    allow_recompute: RecomputeChoice,
    (cap, peak_scale): (Option<u64>, Option<f64>),
) -> Built {
    let timeline = Timeline::new(profile.unit_count());
    let k = profile.micro_batches as usize;
    let step = Unrolled {
        timeline,
        micro_batches: k.min(3),
    };
    let mut columns = Columns {
        problem: good_lp::ProblemVariables::new(),
        count: 0,
        integer: 0,
        relaxed: space.left_out,
    };
    let l = profile.unit_count();
    let units: Vec<UnitCols> = (0..l)
        .map(|i| declare(&mut columns, profile, (timeline, space), i, allow_recompute))
        .collect();
    let communicators = declare_communicators(&mut columns, profile, &units);
    let mut constraints = Vec::new();
    let mut kept = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let (rows, unit_kept) = unit_rows(profile, i, u);
        kept.push(KeptRows {
            one: constraints.len() + unit_kept.one,
            coverage: unit_kept
                .coverage
                .iter()
                .map(|row| constraints.len() + row)
                .collect(),
        });
        constraints.extend(rows);
        if let Some(fixed) = space.fixed {
            constraints.extend(fixed_rows(u, fixed[i]));
        }
        for c in &communicators {
            // u ≥ Σ y_c over the unit's configurations that use the communicator.
            let users = u.y(|config| c.used_by(config)).expression();
            constraints.push(constraint!(c.column.var >= users));
        }
    }
    let links = links_in_use(profile, &units);
    let terms = slot_terms(profile, step, &units, &links);
    let durations: Vec<Col> = (0..step.slots()).map(|_| columns.continuous()).collect();
    let interference = Interference::of(profile);
    for (t, d) in terms.iter().zip(&durations) {
        // d_s ≥ c_s + L_s and d_s ≥ Q^ℓ_s + κ_q·c_s per link.
        let compute = t.compute.expression() + t.load.expression();
        constraints.push(constraint!(d.var >= compute));
        for q in &t.comm {
            let comm = q.expression() + interference.comm * t.compute.expression();
            constraints.push(constraint!(d.var >= comm));
        }
    }
    let mut memory = memory_rows(profile, step, &units, &communicators);
    if space.target == Target::Fsdp2 {
        super::target::add_copies(&mut memory, profile, step, &units);
        constraints.extend(units.iter().flat_map(super::target::inner_gathers_as_step));
    }
    if let Some(cap) = cap {
        for m in &memory {
            // M_s ≤ M, in units of the cap.
            constraints.push(constraint!(m.expression() * (1.0 / cap as f64) <= 1.0));
        }
    }
    let peak = peak_scale.map(|scale| (columns.continuous(), scale));
    if let Some((peak, scale)) = peak {
        for m in &memory {
            // M_s ≤ peak, in units of the scale.
            constraints.push(constraint!(m.expression() * (1.0 / scale) <= peak.var));
        }
    }
    let width = timeline.slot_count();
    let weights = (0..step.slots())
        .map(|s| match (step.micro_batches, s / width) {
            (3, 1) => (k - 2) as f64,
            _ => 1.0,
        })
        .collect();
    Built {
        columns,
        units,
        terms,
        durations,
        weights,
        memory,
        communicators,
        peak,
        constraints,
        kept,
    }
}

/// One communicator column per shard group size and per secondary group size some unit's
/// configurations use.
fn declare_communicators(
    columns: &mut Columns,
    profile: &Profile,
    units: &[UnitCols],
) -> Vec<Communicator> {
    let configs = || units.iter().flat_map(|u| u.configs.iter().map(|&(c, _)| c));
    let mut communicators = Vec::new();
    for s in shard_groups(profile) {
        if configs().any(|c| c.group == Some(s)) {
            communicators.push(Communicator {
                column: columns.fraction(),
                shard: Some(s),
                secondary: None,
                count: 2.0,
            });
        }
    }
    if let Some(h) = secondary_group(profile).filter(|&h| configs().any(|c| c.secondary == Some(h)))
    {
        communicators.push(Communicator {
            column: columns.fraction(),
            shard: None,
            secondary: Some(h),
            count: 1.0,
        });
    }
    communicators
}

/// The links the column sets' blocks and followers use, in [`Link::ALL`] order.
fn links_in_use(profile: &Profile, units: &[UnitCols]) -> Vec<Link> {
    let used: Vec<Link> = units
        .iter()
        .flat_map(|u| &u.launches)
        .flat_map(|l| std::iter::once(l.among).chain(l.follower))
        .map(|among| among.link(profile))
        .collect();
    Link::ALL
        .into_iter()
        .filter(|link| used.contains(link))
        .collect()
}

/// The column sets of a unit with configurations `configs`: per op, group of ranks and boundary kind whose configurations
/// the unit has (BG: one set, every micro-batch; an inner RS over a shard group one per replica
/// AllReduce choice).
fn set_keys(configs: &[Config]) -> Vec<SetKey> {
    let mut groups: Vec<(Option<u32>, Option<u32>)> = Vec::new();
    for c in configs.iter().filter(|c| c.sharded()) {
        if !groups.contains(&(c.group, None)) {
            groups.push((c.group, None));
        }
    }
    let mut keys = Vec::new();
    for op in OPS {
        let over: Vec<(Option<u32>, Option<u32>)> = match op {
            Op::AllReduce => vec![(None, None)],
            Op::GatherBackward => {
                let mut with_secondary = Vec::new();
                for &(g, _) in &groups {
                    with_secondary.push((g, None));
                    for c in configs
                        .iter()
                        .filter(|c| c.group == g && c.secondary.is_some())
                    {
                        if !with_secondary.contains(&(g, c.secondary)) {
                            with_secondary.push((g, c.secondary));
                        }
                    }
                }
                with_secondary
            }
            _ => groups.clone(),
        };
        for (group, secondary) in over {
            let boundaries: &[Boundary] = if op == Op::GatherBackward {
                &[Boundary::Step]
            } else {
                &[Boundary::Step, Boundary::Inner]
            };
            for &boundary in boundaries {
                let choices: &[Option<ReplicaReduce>] =
                    if op == Op::ReduceScatter && boundary == Boundary::Inner && group.is_some() {
                        &[Some(ReplicaReduce::Every), Some(ReplicaReduce::Last)]
                    } else {
                        &[None]
                    };
                for &replica_reduce in choices {
                    let key = SetKey {
                        op,
                        boundary,
                        group,
                        secondary,
                        replica_reduce,
                    };
                    if configs.iter().any(|&c| key.runs(c)) {
                        keys.push(key);
                    }
                }
            }
        }
    }
    keys
}

/// y, r, x and C, Z of unit `i`.
fn declare(
    columns: &mut Columns,
    profile: &Profile,
    (timeline, space): (Timeline, Space),
    i: usize,
    allow_recompute: RecomputeChoice,
) -> UnitCols {
    let all: Vec<Config> = Config::all(profile, i)
        .into_iter()
        .filter(|&c| super::target::offers(profile, space.target, i, c))
        .collect();
    let configs = all.iter().map(|&c| (c, columns.binary())).collect();
    let recompute = allow_recompute.is_allowed().then(|| columns.binary());
    let blocks_per_launch = space.target.blocks_per_launch(profile, i);
    let nb = profile.blocks(i) / blocks_per_launch;
    let mut launches = Vec::new();
    for (set, key) in set_keys(&all).into_iter().enumerate() {
        let mut window = timeline.window(i, key.op.window_kind());
        if window.len == 0 {
            continue;
        }
        let among = Among::of(key.op, profile.world_size, key.group, key.secondary);
        // RA follows an RS over a shard group at the step, and at inner boundaries where it
        // runs every micro-batch.
        let follower = key
            .group
            .filter(|_| key.op == Op::ReduceScatter)
            .filter(|_| key.replica_reduce != Some(ReplicaReduce::Last))
            .map(|s| Among::Replica(profile.world_size / s));
        if follower.is_some() {
            window.len -= 1;
        }
        let added = space.added.get(&(i, set));
        let restricted: Vec<bool> = (0..window.len)
            .map(|p| {
                (space.limits.positions(key.op, window).contains(&p)
                    || added.is_some_and(|a| a.contains(&p)))
                    && space.target.allows(timeline, (i, key.op), window, p)
            })
            .collect();
        let positions: Vec<usize> = (0..window.len)
            .filter(|&p| space.left_out || restricted[p])
            .collect();
        let x = positions
            .iter()
            .map(|&p| {
                if restricted[p] {
                    columns.integer(nb)
                } else {
                    columns.left_out()
                }
            })
            .collect();
        let running = positions.iter().map(|_| columns.continuous()).collect();
        launches.push(Launches {
            key,
            among,
            follower,
            window,
            restricted: positions.iter().map(|&p| restricted[p]).collect(),
            positions,
            x,
            running,
        });
    }
    let order_len = timeline.window(i, WindowKind::AfterBackward).len;
    let mut orders = Vec::new();
    for l in launches
        .iter()
        .filter(|l| l.key.op == Op::ReduceScatter && l.key.boundary == Boundary::Step)
    {
        let z = (0..order_len).map(|_| columns.binary()).collect();
        let gap = if l.key.group.is_some() { 2 } else { 0 };
        orders.push(Order {
            group: l.key.group,
            gap,
            z,
        });
    }
    UnitCols {
        configs,
        blocks_per_launch,
        recompute,
        launches,
        orders,
    }
}

/// One configuration per unit; running sums; coverage of every column set; RS before FG at the
/// step boundary per group (DESIGN §4.2's Z rows, with §3.11's gap). Beside the rows, where the
/// one-configuration row and each set's coverage row lie among them.
fn unit_rows(profile: &Profile, i: usize, u: &UnitCols) -> (Vec<Constraint>, KeptRows) {
    let nb = f64::from(profile.blocks(i) / u.blocks_per_launch);
    let mut rows = vec![constraint!(u.y(|_| true).expression() == 1.0)];
    let mut kept = KeptRows {
        one: 0,
        coverage: Vec::new(),
    };
    for l in &u.launches {
        for p in 0..l.x.len() {
            // C_p = C_{p−1} + x_p.
            let before: Expression = if p == 0 {
                0.into()
            } else {
                l.running[p - 1].var.into()
            };
            rows.push(constraint!(l.running[p].var == before + l.x[p].var));
        }
        // Σ_p x_p = nb·Σ y_c over the configurations that run the set (nb launches of the
        // target: blocks, or 1 where it launches the unit whole).
        let covered = u.y(|c| l.key.runs(c)).expression() * nb;
        let total = l.running[l.running.len() - 1].var;
        kept.coverage.push(rows.len());
        rows.push(constraint!(total == covered));
    }
    for order in &u.orders {
        let step = |op| SetKey {
            op,
            boundary: Boundary::Step,
            group: order.group,
            secondary: None,
            replica_reduce: None,
        };
        let (rs, fg) = (u.set(step(Op::ReduceScatter)), u.set(step(Op::Gather)));
        let z = |p: usize| -> Expression { order.z.get(p).map_or(0.into(), |c| c.var.into()) };
        for p in 0..order.z.len() {
            // Z_p ≥ Z_{p−1}; x_RS,p ≤ nb·(1 − Z_{p+γ−1}); x_FG,p ≤ nb·Z_p.
            let previous = p.checked_sub(1).map_or(0.into(), z);
            rows.push(constraint!(order.z[p].var >= previous));
            if let Some(x) = rs.and_then(|rs| rs.x_at(p)) {
                let bound = (p + order.gap).checked_sub(1).map_or(0.into(), z);
                rows.push(constraint!(x.var <= nb - nb * bound));
            }
            if let Some(x) = fg.and_then(|fg| fg.x_at(p)) {
                rows.push(constraint!(x.var <= nb * order.z[p].var));
            }
        }
    }
    (rows, kept)
}

/// A placement's rows (DESIGN §4.8): the unit's configuration and recompute held,
///
/// ```text
/// y_{i,ĉ_i} = 1,   r_i = r̂_i
/// ```
///
/// (with the one-configuration row, every other y_{i,c} is 0); a unit without a recompute
/// column never recomputes, so r̂_i is false there.
fn fixed_rows(u: &UnitCols, fixed: Fixed) -> Vec<Constraint> {
    let held = u.y(|c| c == fixed.config).expression();
    let mut rows = vec![constraint!(held == 1.0)];
    if let Some(r) = u.recompute {
        rows.push(constraint!(r.var == f64::from(u8::from(fixed.recompute))));
    }
    rows
}

/// Per unrolled slot its terms: the unit's compute (none at I, the extra time at E), and the
/// time per link and compute load of the blocks launched there and of their followers (an inner
/// reduction and its replica AllReduce carry no optimizer step).
fn slot_terms(
    profile: &Profile,
    step: Unrolled,
    units: &[UnitCols],
    links: &[Link],
) -> Vec<SlotTerms> {
    let timeline = step.timeline;
    let interference = Interference::of(profile);
    let mut terms: Vec<SlotTerms> = (0..step.slots())
        .map(|_| SlotTerms {
            comm: vec![Linear::default(); links.len()],
            ..SlotTerms::default()
        })
        .collect();
    for m in 0..step.micro_batches {
        terms[step.at(m, timeline.end())].compute.constant = if m + 1 == step.micro_batches {
            profile.iteration_extra_us
        } else {
            0.0
        };
    }
    let link_index = |among: Among| {
        let link = among.link(profile);
        links
            .iter()
            .position(|&l| l == link)
            .expect("every set's link is in use")
    };
    for (i, u) in units.iter().enumerate() {
        let p = &profile.units[i];
        for m in 0..step.micro_batches {
            let (f, b) = (
                step.at(m, timeline.forward(i)),
                step.at(m, timeline.backward(i)),
            );
            terms[f].compute.constant += p.forward_us;
            terms[b].compute.constant += p.backward_us;
            if let Some(r) = u.recompute {
                terms[f]
                    .compute
                    .add(r, p.checkpointed_forward_time_us() - p.forward_us);
                terms[b].compute.add(r, p.recompute_time_us());
            }
        }
        for l in &u.launches {
            let op = l.key.op;
            let inner = l.key.boundary == Boundary::Inner;
            let parts = std::iter::once((0, op, l.among))
                .chain(l.follower.map(|f| (1, Op::ReplicaAllReduce, f)));
            for (offset, part_op, among) in parts {
                let mut block = block_time(profile, i, part_op, among);
                if inner {
                    block.update_us = 0.0;
                }
                // One column launches `blocks_per_launch` blocks.
                let per_launch = f64::from(u.blocks_per_launch);
                let load = interference.load_us(part_op, block) * per_launch;
                let link = link_index(among);
                // The follower's position may be the op's window's last, one past the set's.
                let window = Window {
                    len: l.window.len + offset,
                    ..l.window
                };
                for instance in step.instances(op, l.key.boundary) {
                    for (&pos, x) in l.positions.iter().zip(&l.x) {
                        let s = step.position(window, op.window_kind(), instance, pos + offset);
                        terms[s].comm[link].add(*x, block.total_us() * per_launch);
                        terms[s].load.add(*x, load);
                    }
                }
            }
        }
    }
    terms
}
