//! The columns and rows of the micro-batch MIP (DESIGN §4.8): configuration indicators, launch
//! columns per op and boundary kind with running sums, the step's RS→FG order, each unrolled
//! slot's compute, communication, load, duration and memory.

use super::linear::Linear;
use crate::cost::{Among, Interference, block_bytes, block_time, persistent_bytes};
use crate::ilp::WindowLimits;
use crate::ilp::variables::{Col, Columns};
use crate::profile::Profile;
use crate::schedule::RecomputeChoice;
use crate::timeline::{Level, Op, Timeline, Window, WindowKind};
use good_lp::{Constraint, Expression, constraint};

/// A unit's level with its choices across micro-batches (DESIGN §3.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Config {
    pub level: Level,
    pub accumulate: bool,
    pub keep: bool,
}

impl Config {
    /// Every configuration of `profile`'s unit `unit`; the last unit is never fsdp, and an fsdp
    /// unit whose parameters another unit reads never keeps them (DESIGN §3.10).
    fn all(profile: &Profile, unit: usize) -> Vec<Config> {
        let last = unit + 1 == profile.unit_count();
        let lender = profile.borrower(unit).is_some();
        let mut all = Vec::new();
        for level in Level::ALL {
            if last && level == Level::Fsdp {
                continue;
            }
            for accumulate in [false, true] {
                for keep in [false, true] {
                    // keep needs a sharded level, and an fsdp lender never keeps.
                    let kept_unsharded = level == Level::None;
                    let kept_fsdp_lender = lender && level == Level::Fsdp;
                    if !(keep && (kept_unsharded || kept_fsdp_lender)) {
                        all.push(Config {
                            level,
                            accumulate,
                            keep,
                        });
                    }
                }
            }
        }
        all
    }

    fn sharded(self) -> bool {
        self.level != Level::None
    }
}

/// Where an op's blocks go: the step boundary (BG: every micro-batch), or the inner one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Boundary {
    Step,
    Inner,
}

/// The ops of the MIP: AR, RS, FG (the forward gather, AG or AGF by level) and BG (AGB).
pub(super) const OPS: [Op; 4] = [
    Op::AllReduce,
    Op::ReduceScatter,
    Op::Gather,
    Op::GatherBackward,
];

/// One op's launch columns at one boundary kind over the positions of its window the limits
/// allow.
pub(super) struct Launches {
    pub op: Op,
    pub boundary: Boundary,
    pub window: Window,
    /// The allowed window positions, increasing.
    pub positions: Vec<usize>,
    /// x_p: blocks launched at each allowed position.
    pub x: Vec<Col>,
    /// C_p = Σ_{p' ≤ p} x_p' at each allowed position.
    pub running: Vec<Col>,
}

impl Launches {
    /// C at window position `pos`: the running sum at the last allowed position ≤ pos.
    pub fn running_at(&self, pos: usize) -> Option<Col> {
        let k = self.positions.partition_point(|&p| p <= pos);
        (k > 0).then(|| self.running[k - 1])
    }

    /// The column launching at window position `pos`, if it is allowed.
    pub fn x_at(&self, pos: usize) -> Option<Col> {
        self.positions.binary_search(&pos).ok().map(|k| self.x[k])
    }
}

/// One unit's columns.
pub(super) struct UnitCols {
    pub configs: Vec<(Config, Col)>,
    /// r_i, absent where recomputation is not allowed.
    pub recompute: Option<Col>,
    pub launches: Vec<Launches>,
    /// Z_p = [the step's RS→FG boundary ≤ p].
    pub order: Vec<Col>,
}

impl UnitCols {
    /// Σ y_c over the configurations `which` admits.
    pub fn y(&self, which: impl Fn(Config) -> bool) -> Linear {
        let mut sum = Linear::default();
        for &(c, col) in &self.configs {
            if which(c) {
                sum.add(col, 1.0);
            }
        }
        sum
    }

    pub fn launches(&self, op: Op, boundary: Boundary) -> &Launches {
        self.launches
            .iter()
            .find(|l| l.op == op && l.boundary == boundary)
            .expect("every op has columns at its boundaries")
    }

    fn recompute(&self) -> Linear {
        let mut r = Linear::default();
        if let Some(col) = self.recompute {
            r.add(col, 1.0);
        }
        r
    }
}

/// Whether configuration `c` runs `op` at `boundary`.
fn runs(c: Config, op: Op, boundary: Boundary) -> bool {
    let step = match op {
        Op::AllReduce => c.level == Level::None,
        Op::ReduceScatter | Op::Gather => c.sharded(),
        _ => c.level == Level::Fsdp,
    };
    match boundary {
        Boundary::Step => step,
        Boundary::Inner => match op {
            Op::AllReduce | Op::ReduceScatter => step && !c.accumulate,
            Op::Gather => step && !c.keep,
            _ => false,
        },
    }
}

/// The step unrolled to K' = min(K, 3) micro-batches of 2L + 1 slots.
#[derive(Clone, Copy)]
pub(super) struct Unrolled {
    pub timeline: Timeline,
    /// K'.
    pub micro_batches: usize,
}

impl Unrolled {
    pub fn slots(self) -> usize {
        self.micro_batches * self.timeline.slot_count()
    }

    /// The slot of flat index `flat` in micro-batch `m`.
    pub fn at(self, m: usize, flat: usize) -> usize {
        m * self.timeline.slot_count() + flat
    }

    /// The micro-batches (source, target) each instance of a boundary kind joins: the step's
    /// last and first, or each consecutive pair; BG's runs inside each micro-batch.
    pub fn instances(self, op: Op, boundary: Boundary) -> Vec<(usize, usize)> {
        let k = self.micro_batches;
        match (op, boundary) {
            (Op::GatherBackward, _) => (0..k).map(|m| (m, m)).collect(),
            (_, Boundary::Step) => vec![(k - 1, 0)],
            (_, Boundary::Inner) => (0..k - 1).map(|m| (m, m + 1)).collect(),
        }
    }

    /// The slot of window position `pos` of an instance joining `source` to `target`.
    pub fn position(
        self,
        window: Window,
        kind: WindowKind,
        (source, target): (usize, usize),
        pos: usize,
    ) -> usize {
        let flat = window.slot_at(pos);
        match kind {
            WindowKind::AfterBackward if flat >= window.first => self.at(source, flat),
            _ => self.at(target, flat),
        }
    }
}

/// Everything a solve reads back: the units' columns and each slot's terms.
pub(super) struct Built {
    pub columns: Columns,
    pub units: Vec<UnitCols>,
    /// Per slot: (c_s, Q_s, L_s).
    pub terms: Vec<(Linear, Linear, Linear)>,
    pub durations: Vec<Col>,
    /// Per slot: its weight in the objective (1, or K − 2 for the steady micro-batch).
    pub weights: Vec<f64>,
    /// Per slot: M_s.
    pub memory: Vec<Linear>,
    /// The peak column of the memory objective (M_s / scale ≤ peak), and its scale.
    pub peak: Option<(Col, f64)>,
    pub constraints: Vec<Constraint>,
}

/// Declares the columns (launches at the positions `limits` allow) and builds every row family;
/// with `peak_scale`, a peak column above every slot's memory in units of that scale.
pub(super) fn build(
    profile: &Profile,
    limits: WindowLimits,
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
        relaxed: false,
    };
    let l = profile.unit_count();
    let units: Vec<UnitCols> = (0..l)
        .map(|i| {
            declare(
                &mut columns,
                profile,
                (timeline, limits),
                i,
                allow_recompute,
            )
        })
        .collect();
    let mut constraints = Vec::new();
    for (i, u) in units.iter().enumerate() {
        constraints.extend(unit_rows(profile, i, u));
    }
    let terms = slot_terms(profile, step, &units);
    let durations: Vec<Col> = (0..step.slots()).map(|_| columns.continuous()).collect();
    let interference = Interference::of(profile);
    for ((c, q, load), d) in terms.iter().zip(&durations) {
        // d_s ≥ c_s + L_s and d_s ≥ Q_s + κ_q·c_s.
        let compute = c.expression() + load.expression();
        constraints.push(constraint!(d.var >= compute));
        let comm = q.expression() + interference.comm * c.expression();
        constraints.push(constraint!(d.var >= comm));
    }
    let memory = memory_rows(profile, step, &units);
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
        peak,
        constraints,
    }
}

/// y, r, x and C, Z of unit `i`.
fn declare(
    columns: &mut Columns,
    profile: &Profile,
    (timeline, limits): (Timeline, WindowLimits),
    i: usize,
    allow_recompute: RecomputeChoice,
) -> UnitCols {
    let configs = Config::all(profile, i)
        .into_iter()
        .map(|c| (c, columns.binary()))
        .collect();
    let recompute = allow_recompute.is_allowed().then(|| columns.binary());
    let nb = profile.blocks(i);
    let mut launches = Vec::new();
    for op in OPS {
        let window = timeline.window(i, op.window_kind());
        if window.len == 0 {
            continue;
        }
        let boundaries: &[Boundary] = if op == Op::GatherBackward {
            &[Boundary::Step]
        } else {
            &[Boundary::Step, Boundary::Inner]
        };
        for &boundary in boundaries {
            let positions: Vec<usize> = limits.positions(op, window).collect();
            let x = positions.iter().map(|_| columns.integer(nb)).collect();
            let running = positions.iter().map(|_| columns.continuous()).collect();
            launches.push(Launches {
                op,
                boundary,
                window,
                positions,
                x,
                running,
            });
        }
    }
    let order_len = timeline.window(i, WindowKind::AfterBackward).len;
    let order = (0..order_len).map(|_| columns.binary()).collect();
    UnitCols {
        configs,
        recompute,
        launches,
        order,
    }
}

/// One configuration per unit; running sums; coverage of every op at every boundary; RS before
/// FG at the step boundary (DESIGN §4.2's Z rows).
fn unit_rows(profile: &Profile, i: usize, u: &UnitCols) -> Vec<Constraint> {
    let nb = f64::from(profile.blocks(i));
    let mut rows = vec![constraint!(u.y(|_| true).expression() == 1.0)];
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
        // Σ_p x_p = nb·Σ y_c over the configurations that run the op there.
        let covered = u.y(|c| runs(c, l.op, l.boundary)).expression() * nb;
        let total = l.running[l.running.len() - 1].var;
        rows.push(constraint!(total == covered));
    }
    let (rs, fg) = (
        u.launches(Op::ReduceScatter, Boundary::Step),
        u.launches(Op::Gather, Boundary::Step),
    );
    for p in 0..u.order.len() {
        // Z_p ≥ Z_{p−1}; x_RS,p ≤ nb·(1 − Z_{p−1}); x_FG,p ≤ nb·Z_p.
        let previous: Expression = if p == 0 {
            0.into()
        } else {
            u.order[p - 1].var.into()
        };
        rows.push(constraint!(u.order[p].var >= previous.clone()));
        if let Some(x) = rs.x_at(p) {
            rows.push(constraint!(x.var <= nb - nb * previous));
        }
        if let Some(x) = fg.x_at(p) {
            rows.push(constraint!(x.var <= nb * u.order[p].var));
        }
    }
    rows
}

/// Per unrolled slot (c_s, Q_s, L_s): the unit's compute (none at I, the extra time at E), and
/// the time and compute load of the blocks launched there (an inner reduction carries no
/// optimizer step).
fn slot_terms(
    profile: &Profile,
    step: Unrolled,
    units: &[UnitCols],
) -> Vec<(Linear, Linear, Linear)> {
    let timeline = step.timeline;
    let interference = Interference::of(profile);
    let mut terms: Vec<(Linear, Linear, Linear)> =
        (0..step.slots()).map(|_| Default::default()).collect();
    for m in 0..step.micro_batches {
        terms[step.at(m, timeline.end())].0.constant = if m + 1 == step.micro_batches {
            profile.iteration_extra_us
        } else {
            0.0
        };
    }
    for (i, u) in units.iter().enumerate() {
        let p = &profile.units[i];
        for m in 0..step.micro_batches {
            let (f, b) = (
                step.at(m, timeline.forward(i)),
                step.at(m, timeline.backward(i)),
            );
            terms[f].0.constant += p.forward_us;
            terms[b].0.constant += p.backward_us;
            if let Some(r) = u.recompute {
                terms[f]
                    .0
                    .add(r, p.checkpointed_forward_time_us() - p.forward_us);
                terms[b].0.add(r, p.recompute_time_us());
            }
        }
        for l in &u.launches {
            let mut block = block_time(profile, i, l.op, Among::World);
            if l.boundary == Boundary::Inner {
                block.update_us = 0.0;
            }
            let load = interference.load_us(l.op, block);
            for instance in step.instances(l.op, l.boundary) {
                for (&pos, x) in l.positions.iter().zip(&l.x) {
                    let s = step.position(l.window, l.op.window_kind(), instance, pos);
                    terms[s].1.add(*x, block.total_us());
                    terms[s].2.add(*x, load);
                }
            }
        }
    }
    terms
}

/// M_s of every unrolled slot (DESIGN §3.5, §3.9, §3.10), linear in y, r and C.
fn memory_rows(profile: &Profile, step: Unrolled, units: &[UnitCols]) -> Vec<Linear> {
    let timeline = step.timeline;
    let last = step.micro_batches - 1;
    // The world's communicator (DESIGN §3.11); no other group is offered at K ≥ 2.
    let communicator = profile
        .topology
        .as_ref()
        .map_or(0.0, |t| t.communicator_bytes as f64);
    let mut memory: Vec<Linear> = (0..step.slots())
        .map(|_| {
            let mut m = Linear::default();
            m.constant += communicator;
            m
        })
        .collect();
    let bytes = profile.bytes_per_param;
    for (i, u) in units.iter().enumerate() {
        let p = &profile.units[i];
        let laid_out = profile.laid_out_params(i) as f64;
        let (param, grad) = (laid_out * bytes.param as f64, laid_out * bytes.grad as f64);
        let (forward, backward) = (timeline.forward(i), timeline.backward(i));
        for level in Level::ALL {
            let y = u.y(|c| c.level == level);
            let persistent = persistent_bytes(profile, i, level);
            for m in memory.iter_mut() {
                m.add_scaled(&y, persistent);
            }
        }
        let r = u.recompute();
        let (act, ckpt) = (
            p.activation_bytes as f64,
            p.checkpoint_activation_bytes as f64,
        );
        let sdp = |keep: bool| u.y(move |c| c.level == Level::Sdp && c.keep == keep);
        let fsdp = u.y(|c| c.level == Level::Fsdp);
        let sharded = u.y(Config::sharded);
        let accumulated = u.y(|c| c.sharded() && c.accumulate);
        let unreduced = u.y(|c| c.sharded() && !c.accumulate);
        let kept = u.y(|c| c.level == Level::Fsdp && c.keep);
        let saved = Linear {
            terms: r
                .terms
                .iter()
                .map(|&(col, c)| (col, c * (ckpt - act)))
                .collect(),
            constant: act,
        };
        for m in 0..step.micro_batches {
            let (f, b) = (step.at(m, forward), step.at(m, backward));
            // act − (act − ckpt)·r from F_i to before B_i.
            over(&mut memory[f..b], &saved, 1.0);
            memory[b].constant += act;
            memory[b].add_scaled(&r, ckpt);
            memory[f].constant += p.forward_workspace_bytes as f64;
            memory[b].constant += p.backward_workspace_bytes as f64;
            // sdp re-gathering: Ψp over F^m..B^m; fsdp: Ψp at F^m and B^m.
            over(&mut memory[f..=b], &sdp(false), param);
            memory[f].add_scaled(&fsdp, param);
            memory[b].add_scaled(&fsdp, param);
            // Every B^m: the full gradient of a sharded unit reducing every micro-batch.
            memory[b].add_scaled(&unreduced, grad);
            if m < last {
                // fsdp keeping: Ψp from after B^m to F^{m+1}, which counts it already.
                over(&mut memory[b + 1..step.at(m + 1, forward)], &kept, param);
            }
        }
        // sdp keeping: Ψp from F^1 to B^K; accumulating: Ψg from B^1 to B^K.
        let whole = step.at(0, forward)..=step.at(last, backward);
        over(&mut memory[whole], &sdp(true), param);
        let accumulating = step.at(0, backward)..=step.at(last, backward);
        over(&mut memory[accumulating], &accumulated, grad);
        for l in &u.launches {
            let block = block_bytes(profile, i, l.op);
            let kind = l.op.window_kind();
            for instance in step.instances(l.op, l.boundary) {
                for pos in 0..l.window.len {
                    let s = step.position(l.window, kind, instance, pos);
                    match l.op {
                        Op::AllReduce => {}
                        Op::ReduceScatter => {
                            // Ψg·y − blk_g·C_{q−1}: what is not yet launched by position q.
                            let owed = match l.boundary {
                                Boundary::Step => &sharded,
                                Boundary::Inner => &unreduced,
                            };
                            memory[s].add_scaled(owed, grad);
                            if let Some(c) = pos.checked_sub(1).and_then(|q| l.running_at(q)) {
                                memory[s].add(c, -block);
                            }
                        }
                        _ => {
                            if let Some(c) = l.running_at(pos) {
                                memory[s].add(c, block);
                            }
                        }
                    }
                }
            }
        }
        if let Some(j) = profile.borrower(i) {
            let borrower_backward = timeline.backward(j);
            for m in 0..step.micro_batches {
                let (lent, written) = (
                    step.at(m, forward) + 1..=step.at(m, borrower_backward),
                    step.at(m, borrower_backward)..step.at(m, backward),
                );
                over(&mut memory[lent], &fsdp, param);
                over(&mut memory[written.clone()], &unreduced, grad);
                if m == 0 {
                    over(&mut memory[written], &accumulated, grad);
                }
            }
        }
    }
    memory
}

/// Adds `factor` times `term` to every slot of `slots`.
fn over(slots: &mut [Linear], term: &Linear, factor: f64) {
    for m in slots {
        m.add_scaled(term, factor);
    }
}
