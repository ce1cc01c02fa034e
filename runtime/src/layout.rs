//! Which buffers a plan needs on a rank and when each is alive (DESIGN §3 lifetimes), placed in
//! the static arena.
//!
//! Per unit i (flat parameters padded to nb_i blocks of blk_i elements, blk_i a multiple of N):
//! persistent parameters, gradients and Adam m, v (full for `none`, the rank's shard of every
//! block for `sdp`/`fsdp`); for sharded units the full gradient (B_i to the last RS launch) and
//! the gathered parameters (first gather launch to F_i for fsdp's forward, to B_i for sdp; first
//! AGB launch to B_i for fsdp's backward); then the workload's activation and workspace buffers
//! ([`crate::workload`]). A gathered or full-gradient buffer is contiguous but alive in parts: the
//! blocks of each launch from that launch on (gathers) or until it (reductions), as the simulator
//! counts them, so the arena may lend a later launch's blocks to a buffer alive before it.
//!
//! A unit that borrows an earlier unit's parameters (GPT-2's tied head) extends the lender's
//! lifetimes: the lender's full gradient is alive from the borrower's backward (which writes it
//! first), and an `fsdp` lender's forward gather stays until the borrower's backward.

use crate::arena::{Arena, Part, Request, pack};
use crate::backend::Region;
use crate::workload::{Pass, Workload};
use crate::{Error, Result};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Placed, Schedule};
use shardplan_scheduler::timeline::{Level, Op};

/// Where a unit keeps what its forward saves besides `saved`.
#[derive(Debug, Clone, Copy)]
pub enum Activations<R = Region> {
    /// Without recompute: the internals buffer, alive from F_i to B_i.
    Kept(R),
    /// With recompute: a buffer of saved + internals elements alive at B_i only (what the model
    /// counts); the recomputation writes its internals after the first `saved` elements and
    /// rewrites `saved` itself with the same values.
    Recomputed(R),
}

/// One unit's sizes and buffers; `R` is the buffer handle (an arena request index while the
/// layout is built, a [`Region`] after packing).
#[derive(Debug, Clone)]
pub struct UnitLayout<R = Region> {
    pub level: Level,
    pub recompute: bool,
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
    pub saved: R,
    pub activations: Activations<R>,
    pub forward_workspace: R,
    pub backward_workspace: R,
    pub input_gradient: Option<R>,
}

impl<R: Copy> UnitLayout<R> {
    fn map<S>(self, f: impl Fn(R) -> S) -> UnitLayout<S> {
        UnitLayout {
            level: self.level,
            recompute: self.recompute,
            blocks: self.blocks,
            block_elements: self.block_elements,
            params: f(self.params),
            grads: f(self.grads),
            adam_m: f(self.adam_m),
            adam_v: f(self.adam_v),
            full_grad: self.full_grad.map(&f),
            gathered_forward: self.gathered_forward.map(&f),
            gathered_backward: self.gathered_backward.map(&f),
            saved: f(self.saved),
            activations: match self.activations {
                Activations::Kept(r) => Activations::Kept(f(r)),
                Activations::Recomputed(r) => Activations::Recomputed(f(r)),
            },
            forward_workspace: f(self.forward_workspace),
            backward_workspace: f(self.backward_workspace),
            input_gradient: self.input_gradient.map(&f),
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

    /// The full parameters compute reads in a forward of `pass`: a recomputation runs at B_i.
    pub fn params_for(&self, pass: Pass) -> Region {
        match pass {
            Pass::Forward => self.forward_params(),
            Pass::Recompute => self.backward_params(),
        }
    }

    /// Where a forward of `pass` writes what it saves besides `saved`: the internals buffer; with
    /// recompute, the forward workspace in the step's own forward (nothing of it is kept) and the
    /// recomputed buffer past its copy of `saved` in the recomputation.
    pub fn forward_internals(&self, pass: Pass) -> Region {
        match (self.activations, pass) {
            (Activations::Recomputed(_), Pass::Forward) => self.forward_workspace,
            _ => self.backward_internals(),
        }
    }

    /// Where the backward reads the internals.
    pub fn backward_internals(&self) -> Region {
        match self.activations {
            Activations::Kept(internals) => internals,
            Activations::Recomputed(r) => Region {
                offset: r.offset + self.saved.len,
                len: r.len - self.saved.len,
            },
        }
    }
}

/// All regions of a rank.
#[derive(Debug, Clone)]
pub struct Layout {
    pub units: Vec<UnitLayout>,
    pub arena: Arena,
    /// Every region with its parts' lifetimes (what the arena packed), in request order.
    pub regions: Vec<(Region, Request)>,
    /// Each unit's buffers as indices into `regions` (two buffers alive at different slots may
    /// share a region, so a region does not name its buffer).
    pub requests: Vec<UnitLayout<usize>>,
    /// The largest block, for the AllReduce scratch buffer.
    pub largest_block: usize,
}

impl Layout {
    /// dL/d(output) of unit `unit` below the last: the next unit's input gradient.
    pub fn output_gradient(&self, unit: usize) -> Region {
        self.units[unit + 1]
            .input_gradient
            .expect("units after the first pass an input gradient")
    }

    /// The parts of request `k` as regions with the slots each is alive in.
    pub fn parts(&self, k: usize) -> impl Iterator<Item = (Region, &[bool])> {
        let (region, request) = &self.regions[k];
        // The last part's padding is not part of the region.
        request.extents().map(|(start, end, alive)| {
            let region = Region {
                offset: region.offset + (start / 4) as usize,
                len: ((end.min(request.bytes()) - start) / 4) as usize,
            };
            (region, alive)
        })
    }

    /// The same layout `elements` further into the arena: a second set of the same buffers.
    pub fn shifted(&self, elements: usize) -> Layout {
        let shift = |r: Region| Region {
            offset: r.offset + elements,
            ..r
        };
        Layout {
            units: self.units.iter().map(|u| u.clone().map(shift)).collect(),
            regions: self
                .regions
                .iter()
                .map(|(r, request)| (shift(*r), request.clone()))
                .collect(),
            ..self.clone()
        }
    }

    /// Whether, in slot `s`, a part of request `k` that is not alive shares an element with a
    /// part of another request that is: the arena has lent that memory to another buffer.
    pub fn lent_in(&self, k: usize, s: usize) -> bool {
        self.parts(k)
            .filter(|(_, alive)| !alive[s])
            .any(|(mine, _)| {
                (0..self.regions.len())
                    .filter(|&other| other != k)
                    .flat_map(|other| self.parts(other))
                    .any(|(theirs, alive)| alive[s] && theirs.overlaps(mine))
            })
    }
}

/// Builds regions and lifetimes while walking the units.
struct Builder {
    slots: usize,
    requests: Vec<Request>,
}

impl Builder {
    fn add(&mut self, name: String, elements: usize, alive: impl Fn(usize) -> bool) -> usize {
        let alive = (0..self.slots).map(alive).collect();
        self.requests
            .push(Request::whole(name, 4 * elements as u64, alive));
        self.requests.len() - 1
    }

    /// A buffer of `launches`' blocks in launch order, each launch's blocks alive in the slots
    /// `alive(s, position)` accepts for the launch's window position.
    fn add_launched(
        &mut self,
        name: String,
        block_elements: usize,
        launches: &[Placed],
        alive: impl Fn(usize, usize) -> bool,
    ) -> usize {
        let parts = launches
            .iter()
            .map(|l| Part {
                bytes: 4 * (l.blocks as usize * block_elements) as u64,
                alive: (0..self.slots).map(|s| alive(s, l.position)).collect(),
            })
            .collect();
        self.requests.push(Request { name, parts });
        self.requests.len() - 1
    }
}

/// Checks that the profile describes `workload`: the same units, names and parameter counts.
pub fn check_profile(workload: &dyn Workload, profile: &Profile) -> Result<()> {
    if profile.unit_count() != workload.unit_count() {
        return Err(Error::Mismatch(format!(
            "the profile has {} units, the model `{}` {}: the profile was made for another model",
            profile.unit_count(),
            workload.name(),
            workload.unit_count()
        )));
    }
    for u in 0..workload.unit_count() {
        let lender = workload.reads_params_of(u);
        if profile.units[u].reads_params_of != lender {
            return Err(Error::Mismatch(format!(
                "profile unit {} (`{}`) has reads_params_of = {:?}; the model's unit reads the parameters of {:?}: measure the profile again",
                u + 1,
                profile.units[u].name,
                profile.units[u].reads_params_of,
                lender
            )));
        }
        if profile.units[u].params != workload.params(u) as u64
            || profile.units[u].name != workload.unit_name(u)
        {
            return Err(Error::Mismatch(format!(
                "profile unit {} is `{}` with {} parameters; the model's is `{}` with {}",
                u + 1,
                profile.units[u].name,
                profile.units[u].params,
                workload.unit_name(u),
                workload.params(u)
            )));
        }
    }
    Ok(())
}

/// Lays out a validated schedule for `workload` on the profile's ranks, each unit's parameters
/// in the profile's padded blocks ([`Profile::block_params`]), as the model counts them.
pub fn layout(workload: &dyn Workload, profile: &Profile, schedule: &Schedule) -> Result<Layout> {
    check_profile(workload, profile)?;
    let world = profile.world_size as usize;
    let timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let mut b = Builder {
        slots,
        requests: Vec::new(),
    };
    let always = |_: usize| true;
    // The backward slot of the unit that borrows each unit's parameters, if any (the profile's
    // `reads_params_of`, which `check_profile` found equal to the workload's).
    let borrower_backward = |lender: usize| profile.borrower(lender).map(|u| timeline.backward(u));
    let mut pending = Vec::new();
    for (i, u) in schedule.units().iter().enumerate() {
        let nb = profile.blocks(i) as usize;
        let block_elements = profile.block_params(i) as usize;
        let padded = profile.laid_out_params(i) as usize;
        let persistent = if u.level == Level::None {
            padded
        } else {
            padded / world
        };
        let name = workload.unit_name(i);
        let params = b.add(format!("{name} params"), persistent, always);
        let grads = b.add(format!("{name} grads"), persistent, always);
        let adam_m = b.add(format!("{name} adam m"), persistent, always);
        let adam_v = b.add(format!("{name} adam v"), persistent, always);
        let (f, bw) = (timeline.forward(i), timeline.backward(i));
        let first_use = borrower_backward(i).unwrap_or(bw);
        let after = timeline.window(i, Op::ReduceScatter.window_kind());
        // The launches of one of the unit's ops in window order (a valid schedule launches every
        // block of every op of the unit's level).
        let launches = |op: Op| match schedule.launches(i, op) {
            [] => Err(Error::Mismatch(format!(
                "{name}: the schedule launches no {op}"
            ))),
            launched => Ok(launched),
        };
        let full_grad = if u.level == Level::None {
            None
        } else {
            let reductions = launches(Op::ReduceScatter)?;
            Some(b.add_launched(
                format!("{name} full gradient"),
                block_elements,
                reductions,
                |s, launch| {
                    (first_use..=bw).contains(&s) || after.position(s).is_some_and(|p| p <= launch)
                },
            ))
        };
        let gather_op = if u.level == Level::Sdp {
            Op::Gather
        } else {
            Op::GatherForward
        };
        let gathered_forward = if u.level == Level::None {
            None
        } else {
            let gathers = launches(gather_op)?;
            let until = match (u.level, borrower_backward(i)) {
                (Level::Sdp, _) => bw,
                (_, Some(borrower)) => borrower,
                _ => f,
            };
            Some(b.add_launched(
                format!("{name} gathered"),
                block_elements,
                gathers,
                |s, launch| {
                    (f..=until).contains(&s) || after.position(s).is_some_and(|p| p >= launch)
                },
            ))
        };
        let gathered_backward = if u.level == Level::Fsdp {
            let between = timeline.window(i, Op::GatherBackward.window_kind());
            let gathers = launches(Op::GatherBackward)?;
            Some(b.add_launched(
                format!("{name} gathered for backward"),
                block_elements,
                gathers,
                |s, launch| s == bw || between.position(s).is_some_and(|p| p >= launch),
            ))
        } else {
            None
        };
        let sizes = workload.buffers(i);
        if u.recompute && sizes.forward_workspace < sizes.internals {
            return Err(Error::Mismatch(format!(
                "{name}: a recomputed unit's forward needs {} workspace elements, the model gives {}",
                sizes.internals, sizes.forward_workspace
            )));
        }
        let saved = b.add(format!("{name} saved"), sizes.saved, |s| {
            (f..=bw).contains(&s)
        });
        let activations = if u.recompute {
            let elements = sizes.saved + sizes.internals;
            Activations::Recomputed(b.add(format!("{name} recomputed"), elements, |s| s == bw))
        } else {
            let alive = |s: usize| (f..=bw).contains(&s);
            Activations::Kept(b.add(format!("{name} internals"), sizes.internals, alive))
        };
        let forward_workspace = b.add(
            format!("{name} forward workspace"),
            sizes.forward_workspace,
            |s| s == f,
        );
        let backward_workspace = b.add(
            format!("{name} backward workspace"),
            sizes.backward_workspace,
            |s| s == bw,
        );
        let input_gradient = (i > 0).then(|| {
            let previous = timeline.backward(i - 1);
            b.add(
                format!("{name} input gradient"),
                sizes.input_gradient,
                |s| s == bw || s == previous,
            )
        });
        pending.push(UnitLayout {
            level: u.level,
            recompute: u.recompute,
            blocks: nb,
            block_elements,
            params,
            grads,
            adam_m,
            adam_v,
            full_grad,
            gathered_forward,
            gathered_backward,
            saved,
            activations,
            forward_workspace,
            backward_workspace,
            input_gradient,
        });
    }
    let arena = pack(&b.requests);
    let region = |k: usize| Region {
        offset: (arena.offsets[k] / 4) as usize,
        len: (b.requests[k].bytes() / 4) as usize,
    };
    let largest_block = pending.iter().map(|u| u.block_elements).max().unwrap_or(0);
    let units = pending.iter().map(|u| u.clone().map(region)).collect();
    let regions = (0..b.requests.len())
        .map(|k| (region(k), b.requests[k].clone()))
        .collect();
    Ok(Layout {
        units,
        requests: pending,
        arena,
        regions,
        largest_block,
    })
}
