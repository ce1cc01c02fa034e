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
//! Each buffer but the kept state (parameters, gradients, Adam moments) holds one data
//! step's contents, born at its first write; where one offset per buffer cannot reach the live
//! peak, such buffers get one offset per parity of the iteration their contents are born in
//! ([`crate::arena::pack_by_parity`]).
//!
//! A unit that borrows an earlier unit's parameters (GPT-2's tied head) extends the lender's
//! lifetimes: the lender's full gradient is alive from the borrower's backward (which writes it
//! first), and an `fsdp` lender's forward gather stays until the borrower's backward.

use crate::arena::{Arena, Part, Request, Tenure, pack_by_parity};
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

/// The regions a rank's workload reads for one data step.
#[derive(Debug, Clone)]
pub struct Layout {
    pub units: Vec<UnitLayout>,
    /// Each unit's buffers as indices into [`Placement::regions`] (two buffers alive at different
    /// slots may share a region, so a region does not name its buffer).
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

    /// The same layout `elements` further into the arena: a second set of the same buffers.
    pub fn shifted(&self, elements: usize) -> Layout {
        let shift = |r: Region| Region {
            offset: r.offset + elements,
            ..r
        };
        Layout {
            units: self.units.iter().map(|u| u.clone().map(shift)).collect(),
            ..self.clone()
        }
    }
}

/// A plan's buffers placed in the static arena (DESIGN §6.5): one layout for every data step,
/// or, where that cannot reach the live peak, one for even and one for odd data steps (a buffer
/// holding one step's contents sits where the parity of the iteration its contents are born in
/// puts it; state kept from step to step sits at one offset in both).
#[derive(Debug, Clone)]
pub struct Placement {
    pub arena: Arena,
    /// Every region with its parts' lifetimes (what the arena packed), in request order: over one
    /// iteration's slots, or with two layouts over two iterations' (slot p·S + s is slot s of an
    /// iteration of parity p), each per-step buffer twice.
    pub regions: Vec<(Region, Request)>,
    /// The layout of even data steps, then that of odd ones where they differ.
    steps: Vec<Layout>,
}

impl Placement {
    /// The layout of data step `step`.
    pub fn for_step(&self, step: usize) -> &Layout {
        &self.steps[step % self.steps.len()]
    }

    /// 1 where every data step has the same layout, 2 where even and odd steps alternate.
    pub fn parities(&self) -> usize {
        self.steps.len()
    }

    /// The parts of region `k` as regions with the slots each is alive in.
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

    /// Whether, in slot `s` of `regions`' lifetimes, a part of region `k` that is not alive
    /// shares an element with a part of another region that is: the arena has lent that memory
    /// to another buffer.
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

/// Where a data step's contents are first written: a slot of the step's iteration, or of the
/// one before.
#[derive(Debug, Clone, Copy)]
struct Birth {
    slot: usize,
    previous_iteration: bool,
}

/// Builds regions, lifetimes and tenures while walking the units.
struct Builder {
    slots: usize,
    requests: Vec<Request>,
    tenures: Vec<Tenure>,
    /// Per request, whether a data step's contents are born in the iteration before the step's
    /// (a forward gather launched after the unit's backward serves the next step).
    born_before_step: Vec<bool>,
}

impl Builder {
    fn push(&mut self, request: Request, tenure: Tenure, born_before_step: bool) -> usize {
        self.requests.push(request);
        self.tenures.push(tenure);
        self.born_before_step.push(born_before_step);
        self.requests.len() - 1
    }

    /// State kept from step to step, alive throughout.
    fn add_kept(&mut self, name: String, elements: usize) -> usize {
        let request = Request::whole(name, 4 * elements as u64, vec![true; self.slots]);
        self.push(request, Tenure::Kept, false)
    }

    /// A buffer of one step's contents, born in slot `birth` of the step's iteration.
    fn add(
        &mut self,
        name: String,
        elements: usize,
        birth: usize,
        alive: impl Fn(usize) -> bool,
    ) -> usize {
        let alive = (0..self.slots).map(alive).collect();
        let request = Request::whole(name, 4 * elements as u64, alive);
        self.push(request, Tenure::Step { birth }, false)
    }

    /// A buffer of `launches`' blocks in launch order, each launch's blocks alive in the slots
    /// `alive(s, position)` accepts for the launch's window position.
    fn add_launched(
        &mut self,
        name: String,
        (block_elements, launches): (usize, &[Placed]),
        birth: Birth,
        alive: impl Fn(usize, usize) -> bool,
    ) -> usize {
        let parts = launches
            .iter()
            .map(|l| Part {
                bytes: 4 * (l.blocks as usize * block_elements) as u64,
                alive: (0..self.slots).map(|s| alive(s, l.position)).collect(),
            })
            .collect();
        let tenure = Tenure::Step { birth: birth.slot };
        self.push(Request { name, parts }, tenure, birth.previous_iteration)
    }

    /// Packs the requests (by parity where one layout misses the live peak) and resolves each
    /// data step parity's layout from the units' request indices.
    fn place(self, pending: &[UnitLayout<usize>]) -> Placement {
        let packed = pack_by_parity(self.requests, &self.tenures);
        let offsets = &packed.arena.offsets;
        let region_of = |k: usize, request: &Request| Region {
            offset: (offsets[k] / 4) as usize,
            len: (request.bytes() / 4) as usize,
        };
        let region = |k: usize| region_of(k, &packed.requests[k]);
        let largest_block = pending.iter().map(|u| u.block_elements).max().unwrap_or(0);
        let steps = (0..packed.parities())
            .map(|parity| {
                // Data step d's contents are born in iteration d or d − 1.
                let copy = |k: usize| {
                    let born = (parity + 2 - usize::from(self.born_before_step[k])) % 2;
                    packed.copies[k][born]
                };
                let requests: Vec<UnitLayout<usize>> =
                    pending.iter().map(|u| u.clone().map(copy)).collect();
                Layout {
                    units: requests.iter().map(|u| u.clone().map(region)).collect(),
                    requests,
                    largest_block,
                }
            })
            .collect();
        let regions = (packed.requests.into_iter().enumerate())
            .map(|(k, request)| (region_of(k, &request), request))
            .collect();
        Placement {
            arena: packed.arena,
            regions,
            steps,
        }
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

/// Places a validated schedule's buffers for `workload` on the profile's ranks, each unit's
/// parameters in the profile's padded blocks ([`Profile::block_params`]), as the model counts
/// them. One micro-batch per step: a schedule of several is refused.
pub fn place(workload: &dyn Workload, profile: &Profile, schedule: &Schedule) -> Result<Placement> {
    if schedule.micro_batches() >= 2 {
        return Err(Error::Mismatch(format!(
            "the plan has {} micro-batches per step; the runtime lays out and runs one so far \
             (DESIGN §3.10)",
            schedule.micro_batches()
        )));
    }
    check_profile(workload, profile)?;
    let world = profile.world_size as usize;
    let timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let mut b = Builder {
        slots,
        requests: Vec::new(),
        tenures: Vec::new(),
        born_before_step: Vec::new(),
    };
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
        let params = b.add_kept(format!("{name} params"), persistent);
        let grads = b.add_kept(format!("{name} grads"), persistent);
        let adam_m = b.add_kept(format!("{name} adam m"), persistent);
        let adam_v = b.add_kept(format!("{name} adam v"), persistent);
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
            let birth = Birth {
                slot: first_use,
                previous_iteration: false,
            };
            Some(b.add_launched(
                format!("{name} full gradient"),
                (block_elements, reductions),
                birth,
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
            // A gather launched after B_i (window slots above it) serves the next step.
            let birth = Birth {
                slot: gathers[0].slot,
                previous_iteration: gathers[0].slot > bw,
            };
            Some(b.add_launched(
                format!("{name} gathered"),
                (block_elements, gathers),
                birth,
                |s, launch| {
                    (f..=until).contains(&s) || after.position(s).is_some_and(|p| p >= launch)
                },
            ))
        };
        let gathered_backward = if u.level == Level::Fsdp {
            let between = timeline.window(i, Op::GatherBackward.window_kind());
            let gathers = launches(Op::GatherBackward)?;
            let birth = Birth {
                slot: gathers[0].slot,
                previous_iteration: false,
            };
            Some(b.add_launched(
                format!("{name} gathered for backward"),
                (block_elements, gathers),
                birth,
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
        let saved = b.add(format!("{name} saved"), sizes.saved, f, |s| {
            (f..=bw).contains(&s)
        });
        let activations = if u.recompute {
            let elements = sizes.saved + sizes.internals;
            Activations::Recomputed(b.add(format!("{name} recomputed"), elements, bw, |s| s == bw))
        } else {
            let alive = |s: usize| (f..=bw).contains(&s);
            Activations::Kept(b.add(format!("{name} internals"), sizes.internals, f, alive))
        };
        let forward_workspace = b.add(
            format!("{name} forward workspace"),
            sizes.forward_workspace,
            f,
            |s| s == f,
        );
        let backward_workspace = b.add(
            format!("{name} backward workspace"),
            sizes.backward_workspace,
            bw,
            |s| s == bw,
        );
        let input_gradient = (i > 0).then(|| {
            let previous = timeline.backward(i - 1);
            b.add(
                format!("{name} input gradient"),
                sizes.input_gradient,
                bw,
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
    Ok(b.place(&pending))
}
