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
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::timeline::{Level, Op};
use shardplan_scheduler::unrolled::{Instance, Unrolled};

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
    /// The same for micro-batches after a step's first: an fsdp unit that keeps its parameters
    /// reads them in its forward from the backward's gathered buffer (DESIGN §3.10).
    later_micro_batches: Vec<Layout>,
}

impl Placement {
    /// The layout of data step `step`.
    pub fn for_step(&self, step: usize) -> &Layout {
        &self.steps[step % self.steps.len()]
    }

    /// The layout of micro-batch `micro_batch` (0-based) of data step `step`.
    pub fn for_micro_batch(&self, step: usize, micro_batch: usize) -> &Layout {
        match micro_batch {
            0 => self.for_step(step),
            _ => &self.later_micro_batches[step % self.steps.len()],
        }
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

    /// No slot alive.
    fn none(&self) -> Vec<bool> {
        vec![false; self.slots]
    }

    /// State kept from step to step, alive throughout.
    fn add_kept(&mut self, name: String, elements: usize) -> usize {
        let request = Request::whole(name, 4 * elements as u64, vec![true; self.slots]);
        self.push(request, Tenure::Kept, false)
    }

    /// A buffer of one step's contents, born in slot `birth` of the step's iteration, alive in
    /// `spans` (cyclic, inclusive).
    fn add(
        &mut self,
        name: String,
        elements: usize,
        birth: usize,
        spans: &[(usize, usize)],
    ) -> usize {
        let mut alive = self.none();
        for &(first, last) in spans {
            mark(&mut alive, first, last);
        }
        let request = Request::whole(name, 4 * elements as u64, alive);
        self.push(request, Tenure::Step { birth }, false)
    }

    /// A buffer of an op's blocks, block j alive in `alive[j]`; neighbouring blocks alive in the
    /// same slots form one part.
    fn add_blocks(
        &mut self,
        name: String,
        block_elements: usize,
        alive: Vec<Vec<bool>>,
        birth: Birth,
    ) -> usize {
        let mut parts: Vec<Part> = Vec::new();
        for block in alive {
            let bytes = 4 * block_elements as u64;
            match parts.last_mut() {
                Some(part) if part.alive == block => part.bytes += bytes,
                _ => parts.push(Part {
                    bytes,
                    alive: block,
                }),
            }
        }
        let tenure = Tenure::Step { birth: birth.slot };
        self.push(Request { name, parts }, tenure, birth.previous_iteration)
    }

    /// Packs the requests (by parity where one layout misses the live peak) and resolves each
    /// data step parity's layout from the units' request indices; `kept_fsdp` marks the fsdp
    /// units whose later micro-batches read the backward's gathered parameters.
    fn place(self, pending: &[UnitLayout<usize>], kept_fsdp: &[bool]) -> Placement {
        let packed = pack_by_parity(self.requests, &self.tenures);
        let offsets = &packed.arena.offsets;
        let region_of = |k: usize, request: &Request| Region {
            offset: (offsets[k] / 4) as usize,
            len: (request.bytes() / 4) as usize,
        };
        let region = |k: usize| region_of(k, &packed.requests[k]);
        let largest_block = pending.iter().map(|u| u.block_elements).max().unwrap_or(0);
        let steps: Vec<Layout> = (0..packed.parities())
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
        let later_micro_batches = steps
            .iter()
            .map(|layout| {
                let mut later = layout.clone();
                for (u, kept) in later.units.iter_mut().zip(kept_fsdp) {
                    if *kept {
                        u.gathered_forward = u.gathered_backward;
                    }
                }
                later
            })
            .collect();
        let regions = (packed.requests.into_iter().enumerate())
            .map(|(k, request)| (region_of(k, &request), request))
            .collect();
        Placement {
            arena: packed.arena,
            regions,
            steps,
            later_micro_batches,
        }
    }
}

/// Marks slots `first` … `last` alive, cyclically.
fn mark(alive: &mut [bool], first: usize, last: usize) {
    let n = alive.len();
    let mut s = first;
    loop {
        alive[s] = true;
        if s == last {
            break;
        }
        s = (s + 1) % n;
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
/// them, over the step's K micro-batches unrolled ([`Unrolled`]): a buffer of one micro-batch's
/// contents is alive in each micro-batch's span and sits at one offset for all of them.
pub fn place(workload: &dyn Workload, profile: &Profile, schedule: &Schedule) -> Result<Placement> {
    check_profile(workload, profile)?;
    if schedule.micro_batches() as usize != workload.micro_batches() {
        return Err(Error::Mismatch(format!(
            "the plan has {} micro-batches per step; the model `{}` trains {} (`[training] \
             micro_batches`)",
            schedule.micro_batches(),
            workload.name(),
            workload.micro_batches()
        )));
    }
    let world = profile.world_size as usize;
    let step = Unrolled::of(schedule);
    let (timeline, k) = (step.timeline, step.micro_batches);
    let slots = step.slot_count();
    let mut b = Builder {
        slots,
        requests: Vec::new(),
        tenures: Vec::new(),
        born_before_step: Vec::new(),
    };
    let instances = step.instances(schedule);
    let mut pending = Vec::new();
    let mut kept_fsdp = Vec::new();
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
        // The backward of the unit that borrows this unit's parameters, if any (the profile's
        // `reads_params_of`, which `check_profile` found equal to the workload's), writes its
        // gradient first and reads its forward parameters last.
        let borrower = profile.borrower(i).map(|j| timeline.backward(j));
        let first_use = borrower.unwrap_or(bw);
        let (accumulate, keep) = (u.accumulation.accumulate, u.accumulation.keep);
        // Per block of op `op`, the slots alive: `spans(instance, launch slot)` per launch.
        let blocks_alive = |op: Op, spans: &dyn Fn(Instance, usize) -> Vec<(usize, usize)>| {
            let mut alive = vec![vec![false; slots]; nb];
            let mut first_launch = None;
            for (instance, launches) in instances.iter().filter(|(x, _)| x.unit == i && x.op == op)
            {
                let mut block = 0;
                for l in *launches {
                    let (slot, iteration) = step.place(*instance, l.position);
                    if instance.boundary == 0 && first_launch.is_none() {
                        first_launch = Some(Birth {
                            slot,
                            previous_iteration: iteration < 0,
                        });
                    }
                    for _ in 0..l.blocks {
                        for (first, last) in spans(*instance, slot) {
                            mark(&mut alive[block], first, last);
                        }
                        block += 1;
                    }
                }
            }
            first_launch
                .map(|birth| (alive, birth))
                .ok_or_else(|| Error::Mismatch(format!("{name}: the schedule launches no {op}")))
        };
        let full_grad = if u.level == Level::None {
            None
        } else {
            let (alive, _) = blocks_alive(Op::ReduceScatter, &|instance, launch| {
                let from = if accumulate {
                    0
                } else {
                    instance.micro_batch(k)
                };
                vec![(step.at(from, first_use), launch)]
            })?;
            let birth = Birth {
                slot: step.at(0, first_use),
                previous_iteration: false,
            };
            Some(b.add_blocks(
                format!("{name} full gradient"),
                block_elements,
                alive,
                birth,
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
            let (alive, birth) = blocks_alive(gather_op, &|instance, launch| {
                let m = instance.boundary;
                let until = match u.level {
                    Level::Sdp if keep => step.at(k - 1, bw),
                    Level::Sdp => step.at(m, bw),
                    _ => step.at(m, borrower.unwrap_or(f)),
                };
                vec![(launch, until)]
            })?;
            Some(b.add_blocks(format!("{name} gathered"), block_elements, alive, birth))
        };
        let gathered_backward = if u.level == Level::Fsdp {
            let (alive, birth) = blocks_alive(Op::GatherBackward, &|instance, launch| {
                let m = instance.boundary;
                let mut spans = vec![(launch, step.at(m, bw))];
                if keep && m + 1 < k {
                    // Kept from B^m_i to the end of F^{m+1}_i.
                    spans.push((step.at(m, bw) + 1, step.at(m + 1, f)));
                }
                spans
            })?;
            Some(b.add_blocks(
                format!("{name} gathered for backward"),
                block_elements,
                alive,
                birth,
            ))
        } else {
            None
        };
        kept_fsdp.push(u.level == Level::Fsdp && keep);
        let sizes = workload.buffers(i);
        if u.recompute && sizes.forward_workspace < sizes.internals {
            return Err(Error::Mismatch(format!(
                "{name}: a recomputed unit's forward needs {} workspace elements, the model gives {}",
                sizes.internals, sizes.forward_workspace
            )));
        }
        // Each micro-batch's span from slot `first` to `last` of the flat timeline.
        let every = |first: usize, last: usize| -> Vec<(usize, usize)> {
            (0..k)
                .map(|m| (step.at(m, first), step.at(m, last)))
                .collect()
        };
        let saved = b.add(format!("{name} saved"), sizes.saved, f, &every(f, bw));
        let activations = if u.recompute {
            let elements = sizes.saved + sizes.internals;
            let name = format!("{name} recomputed");
            Activations::Recomputed(b.add(name, elements, bw, &every(bw, bw)))
        } else {
            let name = format!("{name} internals");
            Activations::Kept(b.add(name, sizes.internals, f, &every(f, bw)))
        };
        let forward_workspace = b.add(
            format!("{name} forward workspace"),
            sizes.forward_workspace,
            f,
            &every(f, f),
        );
        let backward_workspace = b.add(
            format!("{name} backward workspace"),
            sizes.backward_workspace,
            bw,
            &every(bw, bw),
        );
        let input_gradient = (i > 0).then(|| {
            let previous = timeline.backward(i - 1);
            b.add(
                format!("{name} input gradient"),
                sizes.input_gradient,
                bw,
                &every(bw, previous),
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
    Ok(b.place(&pending, &kept_fsdp))
}
