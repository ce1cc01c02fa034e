//! Which buffers a plan needs on a rank and when each is alive (DESIGN §3 lifetimes), placed in
//! the static arena.
//!
//! Per unit i (flat parameters padded to nb_i blocks of blk_i elements, blk_i a multiple of N):
//! persistent parameters, gradients and Adam m, v (full for `none`, the rank's shard of every
//! block for `sdp`/`fsdp`); for sharded units the full gradient (B_i to the last RS launch) and
//! the gathered parameters (first gather launch to F_i for fsdp's forward, to B_i for sdp; first
//! AGB launch to B_i for fsdp's backward); the unit's output (F_i to B_i); the gradient of its
//! input (B_i and B_{i−1}). Plus the input batch (F_1 to B_1), the targets and the loss gradient.
//! A region lives from its first block's launch: when an op's blocks launch in several slots the
//! arena holds the whole op from the first (the simulator counts each block from its own).

use crate::arena::{Arena, Request, pack};
use crate::backend::Region;
use crate::mlp::MlpSpec;
use crate::{Error, Result};
use shardplan_scheduler::plan::Schedule;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::timeline::{Level, Op, Timeline};

/// One unit's sizes and buffers; `R` is the buffer handle (an arena request index while the
/// layout is built, a [`Region`] after packing).
#[derive(Debug, Clone)]
pub struct UnitLayout<R = Region> {
    pub level: Level,
    pub recompute: bool,
    pub dims: (usize, usize),
    pub relu: bool,
    pub blocks: usize,
    /// Elements per block (a multiple of N).
    pub block_elements: usize,
    pub params: R,
    pub grads: R,
    pub adam_m: R,
    pub adam_v: R,
    pub full_grad: Option<R>,
    pub gathered_forward: Option<R>,
    pub gathered_backward: Option<R>,
    pub output: R,
    pub grad_in: Option<R>,
}

impl<R: Copy> UnitLayout<R> {
    fn map<S>(self, f: impl Fn(R) -> S) -> UnitLayout<S> {
        UnitLayout {
            level: self.level,
            recompute: self.recompute,
            dims: self.dims,
            relu: self.relu,
            blocks: self.blocks,
            block_elements: self.block_elements,
            params: f(self.params),
            grads: f(self.grads),
            adam_m: f(self.adam_m),
            adam_v: f(self.adam_v),
            full_grad: self.full_grad.map(&f),
            gathered_forward: self.gathered_forward.map(&f),
            gathered_backward: self.gathered_backward.map(&f),
            output: f(self.output),
            grad_in: self.grad_in.map(&f),
        }
    }
}

impl UnitLayout {
    /// The full parameters compute reads in the forward (gathered or replicated).
    pub fn forward_params(&self) -> Region {
        self.gathered_forward.unwrap_or(self.params)
    }

    /// The full parameters compute reads in the backward.
    pub fn backward_params(&self) -> Region {
        self.gathered_backward
            .or(self.gathered_forward)
            .unwrap_or(self.params)
    }

    /// Where the backward writes the full gradient.
    pub fn backward_grads(&self) -> Region {
        self.full_grad.unwrap_or(self.grads)
    }
}

/// All regions of a rank.
#[derive(Debug, Clone)]
pub struct Layout {
    pub units: Vec<UnitLayout>,
    pub input: Region,
    pub targets: Region,
    pub loss_grad: Region,
    pub rows: usize,
    pub arena: Arena,
    /// Every region with its lifetime (what the arena packed), in request order.
    pub regions: Vec<(Region, Request)>,
    /// The largest block, for the AllReduce scratch buffer.
    pub largest_block: usize,
}

/// Builds regions and lifetimes while walking the units.
struct Builder {
    slots: usize,
    requests: Vec<Request>,
}

impl Builder {
    fn add(&mut self, name: String, elements: usize, alive: impl Fn(usize) -> bool) -> usize {
        self.requests.push(Request {
            name,
            bytes: 4 * elements as u64,
            alive: (0..self.slots).map(alive).collect(),
        });
        self.requests.len() - 1
    }
}

/// The first and last window positions of an op's launches, if it has any.
fn launch_span(
    schedule: &Schedule,
    timeline: Timeline,
    unit: usize,
    op: Op,
) -> Option<(usize, usize)> {
    let window = timeline.window(unit, op.window_kind());
    let positions = schedule.units[unit]
        .launches
        .get(&op)?
        .iter()
        .filter_map(|l| window.position(l.slot));
    Some((positions.clone().min()?, positions.max()?))
}

/// Lays out a validated schedule for `spec` on `world` ranks.
pub fn layout(
    spec: &MlpSpec,
    profile: &Profile,
    schedule: &Schedule,
    world: usize,
) -> Result<Layout> {
    if profile.unit_count() != spec.units() {
        return Err(Error::Mismatch(format!(
            "the profile has {} units, the model `{}` {}",
            profile.unit_count(),
            spec.name,
            spec.units()
        )));
    }
    for u in 0..spec.units() {
        if profile.units[u].params != spec.params(u) as u64
            || profile.units[u].name != spec.unit_name(u)
        {
            return Err(Error::Mismatch(format!(
                "profile unit {} is `{}` with {} parameters; the model's is `{}` with {}",
                u + 1,
                profile.units[u].name,
                profile.units[u].params,
                spec.unit_name(u),
                spec.params(u)
            )));
        }
    }
    let timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let rows = spec.batch_per_rank;
    let l = spec.units();
    let mut b = Builder {
        slots,
        requests: Vec::new(),
    };
    let always = |_: usize| true;
    let mut pending = Vec::new();
    for (i, u) in schedule.units.iter().enumerate() {
        let (din, dout) = spec.dims(i);
        let nb = profile.blocks(i) as usize;
        let block_elements = spec.params(i).div_ceil(nb).div_ceil(world) * world;
        let padded = nb * block_elements;
        let persistent = if u.level == Level::None {
            padded
        } else {
            padded / world
        };
        let name = spec.unit_name(i);
        let params = b.add(format!("{name} params"), persistent, always);
        let grads = b.add(format!("{name} grads"), persistent, always);
        let adam_m = b.add(format!("{name} adam m"), persistent, always);
        let adam_v = b.add(format!("{name} adam v"), persistent, always);
        let (f, bw) = (timeline.forward(i), timeline.backward(i));
        let after = timeline.window(i, Op::ReduceScatter.window_kind());
        let full_grad = (u.level != Level::None).then(|| {
            let (_, last) = launch_span(schedule, timeline, i, Op::ReduceScatter)
                .expect("validated: sharded units reduce-scatter");
            b.add(format!("{name} full gradient"), padded, |s| {
                s == bw || after.position(s).is_some_and(|p| p <= last)
            })
        });
        let gather_op = if u.level == Level::Sdp {
            Op::Gather
        } else {
            Op::GatherForward
        };
        let gathered_forward = (u.level != Level::None).then(|| {
            let (first, _) = launch_span(schedule, timeline, i, gather_op)
                .expect("validated: sharded units gather");
            let until = if u.level == Level::Sdp { bw } else { f };
            b.add(format!("{name} gathered"), padded, |s| {
                (f..=until).contains(&s) || after.position(s).is_some_and(|p| p >= first)
            })
        });
        let gathered_backward = (u.level == Level::Fsdp).then(|| {
            let between = timeline.window(i, Op::GatherBackward.window_kind());
            let (first, _) = launch_span(schedule, timeline, i, Op::GatherBackward)
                .expect("validated: fsdp units gather twice");
            b.add(format!("{name} gathered for backward"), padded, |s| {
                s == bw || between.position(s).is_some_and(|p| p >= first)
            })
        });
        let output = b.add(format!("{name} output"), rows * dout, |s| {
            (f..=bw).contains(&s)
        });
        let grad_in = (i > 0).then(|| {
            let previous = timeline.backward(i - 1);
            b.add(format!("{name} input gradient"), rows * din, |s| {
                s == bw || s == previous
            })
        });
        pending.push(UnitLayout {
            level: u.level,
            recompute: u.recompute,
            dims: (din, dout),
            relu: spec.relu(i),
            blocks: nb,
            block_elements,
            params,
            grads,
            adam_m,
            adam_v,
            full_grad,
            gathered_forward,
            gathered_backward,
            output,
            grad_in,
        });
    }
    let (f1, b1) = (timeline.forward(0), timeline.backward(0));
    let (fl, bl) = (timeline.forward(l - 1), timeline.backward(l - 1));
    let dl = *spec.widths.last().expect("validated");
    let input = b.add("input batch".into(), rows * spec.input, |s| {
        (f1..=b1).contains(&s)
    });
    let targets = b.add("targets".into(), rows * dl, |s| (fl..=bl).contains(&s));
    let loss_grad = b.add("loss gradient".into(), rows * dl, |s| s == bl);
    let arena = pack(&b.requests);
    let region = |k: usize| Region {
        offset: (arena.offsets[k] / 4) as usize,
        len: (b.requests[k].bytes / 4) as usize,
    };
    let largest_block = pending.iter().map(|u| u.block_elements).max().unwrap_or(0);
    let units = pending.into_iter().map(|u| u.map(region)).collect();
    let regions = (0..b.requests.len())
        .map(|k| (region(k), b.requests[k].clone()))
        .collect();
    Ok(Layout {
        units,
        input: region(input),
        targets: region(targets),
        loss_grad: region(loss_grad),
        rows,
        arena,
        regions,
        largest_block,
    })
}
