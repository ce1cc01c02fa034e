//! The layout's construction: every buffer's request with its alive slots over the unrolled
//! step, packed into the arena ([`place`]).

mod offload;

use super::{Activations, Layout, Offloaded, Placement, UnitLayout, check_profile};
use crate::arena::{ALIGN, Part, Request, Tenure, pack_by_parity};
use crate::backend::{FloatFormat, Region};
use crate::workload::Workload;
use crate::{Error, Result};
use offload::HOST_INDEX;
use shardplan_scheduler::offload::Offload;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Placed, Schedule, UnitSchedule};
use shardplan_scheduler::timeline::{Level, Op};
use shardplan_scheduler::unrolled::{Instance, Unrolled};

/// Where a data step's contents are first written: a slot of the step's iteration, or of the
/// one before.
#[derive(Debug, Clone, Copy)]
struct Birth {
    slot: usize,
    previous_iteration: bool,
}

/// Builds regions, lifetimes and tenures while walking the units.
struct Builder {
    /// The host arena's buffers, in order: elements and format.
    host: Vec<(usize, FloatFormat)>,
    slots: usize,
    requests: Vec<Request>,
    /// Per request, its elements' format.
    formats: Vec<FloatFormat>,
    tenures: Vec<Tenure>,
    /// Per request, whether a data step's contents are born in the iteration before the step's
    /// (a forward gather launched after the unit's backward serves the next step).
    born_before_step: Vec<bool>,
}

impl Builder {
    fn push(
        &mut self,
        request: Request,
        format: FloatFormat,
        tenure: Tenure,
        born_before_step: bool,
    ) -> usize {
        self.requests.push(request);
        self.formats.push(format);
        self.tenures.push(tenure);
        self.born_before_step.push(born_before_step);
        self.requests.len() - 1
    }

    /// Alive in `spans` (cyclic, inclusive).
    fn alive(&self, spans: &[(usize, usize)]) -> Vec<bool> {
        let mut alive = vec![false; self.slots];
        for &(first, last) in spans {
            mark(&mut alive, first, last);
        }
        alive
    }

    /// State kept from step to step, alive throughout.
    fn add_kept(&mut self, name: String, elements: usize, format: FloatFormat) -> usize {
        let bytes = format.bytes() * elements as u64;
        let request = Request::whole(name, bytes, vec![true; self.slots]);
        self.push(request, format, Tenure::Kept, false)
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
        let alive = self.alive(spans);
        let request = Request::whole(name, 4 * elements as u64, alive);
        self.push(request, FloatFormat::Fp32, Tenure::Step { birth }, false)
    }

    /// A buffer of an op's blocks of `format`, block j alive in `alive[j]`; neighbouring blocks
    /// alive in the same slots form one part.
    fn add_blocks(
        &mut self,
        name: String,
        (block_elements, format): (usize, FloatFormat),
        alive: Vec<Vec<bool>>,
        birth: Birth,
    ) -> usize {
        let mut parts: Vec<Part> = Vec::new();
        for block in alive {
            let bytes = format.bytes() * block_elements as u64;
            match parts.last_mut() {
                Some(part) if part.alive == block => part.bytes += bytes,
                _ => parts.push(Part {
                    bytes,
                    alive: block,
                }),
            }
        }
        let tenure = Tenure::Step { birth: birth.slot };
        self.push(
            Request { name, parts },
            format,
            tenure,
            birth.previous_iteration,
        )
    }

    /// Packs the requests (by parity where one layout misses the live peak) and resolves each
    /// data step parity's layout from the units' request indices; `kept_fsdp` marks the fsdp
    /// units whose later micro-batches read the backward's gathered parameters.
    fn place(self, pending: &[UnitLayout<usize>], kept_fsdp: &[bool]) -> Placement {
        let packed = pack_by_parity(self.requests, &self.tenures);
        let offsets = &packed.arena.offsets;
        // The host arena follows the device arena's words, each buffer from an aligned word.
        let mut host_words = (packed.arena.size_bytes / 4) as usize;
        let device_words = host_words;
        let host: Vec<Region> = (self.host.iter())
            .map(|&(len, format)| {
                let region = Region {
                    offset: host_words,
                    len,
                    format,
                };
                host_words += region.words().div_ceil(ALIGN as usize / 4) * (ALIGN as usize / 4);
                region
            })
            .collect();
        let host_arena_bytes = 4 * (host_words - device_words) as u64;
        // Each packed request's format: its buffer's (a buffer packed twice has two requests).
        let mut formats = vec![FloatFormat::Fp32; packed.requests.len()];
        for (copies, &format) in packed.copies.iter().zip(&self.formats) {
            copies.iter().for_each(|&c| formats[c] = format);
        }
        let formats = &formats;
        let region_of = |k: usize, request: &Request| Region {
            offset: (offsets[k] / 4) as usize,
            len: (request.bytes() / formats[k].bytes()) as usize,
            format: formats[k],
        };
        let region = |k: usize| match k.checked_sub(HOST_INDEX) {
            Some(h) => host[h],
            None => region_of(k, &packed.requests[k]),
        };
        let largest_block = pending.iter().map(|u| u.block_elements).max().unwrap_or(0);
        let steps: Vec<Layout> = (0..packed.parities())
            .map(|parity| {
                // Data step d's contents are born in iteration d or d − 1.
                let copy = |k: usize| {
                    if k >= HOST_INDEX {
                        return k;
                    }
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
            host_arena_bytes,
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

/// Places a validated schedule's buffers for `workload` on the profile's ranks, each unit's
/// parameters in the profile's padded blocks ([`Profile::block_params`]), as the model counts
/// them, over the step's K micro-batches unrolled ([`Unrolled`]): a buffer of one micro-batch's
/// contents is alive in each micro-batch's span and sits at one offset for all of them.
pub fn place(workload: &dyn Workload, profile: &Profile, schedule: &Schedule) -> Result<Placement> {
    check_profile(workload, profile)?;
    check_micro_batches(workload, schedule)?;
    let step = Unrolled::of(schedule);
    let mut b = Builder {
        host: Vec::new(),
        slots: step.slot_count(),
        requests: Vec::new(),
        formats: Vec::new(),
        tenures: Vec::new(),
        born_before_step: Vec::new(),
    };
    let instances = step.instances(schedule);
    let mut pending = Vec::new();
    let mut kept_fsdp = Vec::new();
    for (i, u) in schedule.units().iter().enumerate() {
        let timeline = step.timeline;
        let unit = UnitSlots {
            step,
            instances: &instances,
            unit: i,
            schedule: u,
            offload: schedule.offload(i),
            name: workload.unit_name(i),
            blocks: profile.blocks(i) as usize,
            forward: timeline.forward(i),
            backward: timeline.backward(i),
            // The backward of the unit that borrows this unit's parameters, if any (the
            // profile's `reads_params_of`, which `check_profile` found equal to the workload's),
            // writes its gradient first and reads its forward parameters last.
            borrower: profile.borrower(i).map(|j| timeline.backward(j)),
        };
        pending.push(unit.layout(&mut b, workload, profile)?);
        kept_fsdp.push(u.level == Level::Fsdp && u.accumulation.keep);
    }
    Ok(b.place(&pending, &kept_fsdp))
}

/// The plan's micro-batches per step must be the model's.
fn check_micro_batches(workload: &dyn Workload, schedule: &Schedule) -> Result<()> {
    if schedule.micro_batches() as usize != workload.micro_batches() {
        return Err(Error::Mismatch(format!(
            "the plan has {} micro-batches per step; the model `{}` trains {} (`[training] \
             micro_batches`)",
            schedule.micro_batches(),
            workload.name(),
            workload.micro_batches()
        )));
    }
    Ok(())
}

/// One unit of the schedule on the unrolled step: where its passes and op instances fall.
struct UnitSlots<'a> {
    step: Unrolled,
    instances: &'a [(Instance, &'a [Placed])],
    unit: usize,
    schedule: &'a UnitSchedule,
    offload: Offload,
    name: String,
    /// Its parameters' blocks (the profile's).
    blocks: usize,
    /// Its forward and backward slots on the flat timeline.
    forward: usize,
    backward: usize,
    /// The backward slot of the unit that borrows its parameters, if any.
    borrower: Option<usize>,
}

impl UnitSlots<'_> {
    /// The unit's requests, added to `b`, as its layout of request indices.
    fn layout(
        &self,
        b: &mut Builder,
        workload: &dyn Workload,
        profile: &Profile,
    ) -> Result<UnitLayout<usize>> {
        let (i, u, name) = (self.unit, self.schedule, &self.name);
        let block_elements = profile.block_params(i) as usize;
        let padded = profile.laid_out_params(i) as usize;
        let shard_ranks = match u.level {
            Level::None => 1,
            Level::Sdp | Level::Fsdp => u
                .shard_group
                .map_or(profile.world_size as usize, |s| s as usize),
        };
        let persistent = padded / shard_ranks;
        // `check_profile` found the profile's bytes per parameter to be this policy's.
        let precision = workload.precision();
        let (param, grad) = (precision.param(), precision.reduce());
        // An offloaded unit's kept state is the host's but a device parameter shard with
        // `optimizer`; its host keeps an fp32 master at either precision (DESIGN §6.12).
        let offloaded = !self.offload.is_none();
        let full = self.offload == Offload::Full;
        let params = b.add_kept_on(full, format!("{name} params"), persistent, param);
        let fp32 = FloatFormat::Fp32;
        let master = (precision.has_master() || self.offload == Offload::Optimizer)
            .then(|| b.add_kept_on(offloaded, format!("{name} master"), persistent, fp32));
        let grads = match offloaded {
            true => self.reduced_shard(b, persistent, grad)?,
            false => b.add_kept(format!("{name} grads"), persistent, grad),
        };
        let adam_m = b.add_kept_on(offloaded, format!("{name} adam m"), persistent, fp32);
        let adam_v = b.add_kept_on(offloaded, format!("{name} adam v"), persistent, fp32);
        let full_grad = self.full_gradient(b, (block_elements, grad))?;
        let staged = full.then_some(block_elements / shard_ranks);
        let (gathered_forward, staging_forward) =
            self.gathered_forward(b, (block_elements, param), staged)?;
        let (gathered_backward, staging_backward) =
            self.gathered_backward(b, (block_elements, param), staged)?;
        let offload = offloaded.then(|| Offloaded {
            mode: self.offload,
            host_grads: b.add_host(persistent, grad),
            staging_forward,
            staging_backward,
        });
        // An hpZ unit's secondary shard, written at F_i, read by its backward gather, in every
        // micro-batch (DESIGN §3.11.1).
        let secondary = u.secondary_group.map(|h| {
            let (h, name) = (h as usize, format!("{name} secondary shard"));
            let spans: Vec<(usize, usize)> = (0..self.step.micro_batches)
                .map(|m| {
                    (
                        self.step.at(m, self.forward),
                        self.step.at(m, self.backward),
                    )
                })
                .collect();
            let alive = b.alive(&spans);
            let request = Request::whole(name, param.bytes() * (padded / h) as u64, alive);
            let birth = self.forward;
            (h, b.push(request, param, Tenure::Step { birth }, false))
        });
        let passes = self.pass_buffers(b, workload)?;
        Ok(UnitLayout {
            level: u.level,
            recompute: u.recompute,
            blocks: self.blocks,
            block_elements,
            shard_ranks,
            secondary,
            params,
            master,
            grads,
            adam_m,
            adam_v,
            full_grad,
            gathered_forward,
            gathered_backward,
            saved: passes.saved,
            activations: passes.activations,
            forward_workspace: passes.forward_workspace,
            backward_workspace: passes.backward_workspace,
            input_gradient: passes.input_gradient,
            offload,
        })
    }

    /// Per block of op `op`, the slots alive (`spans(instance, launch slot)` per launch), and
    /// where the first micro-batch's first launch writes it.
    fn blocks_alive(
        &self,
        op: Op,
        spans: &dyn Fn(Instance, usize) -> Vec<(usize, usize)>,
    ) -> Result<(Vec<Vec<bool>>, Birth)> {
        let mut alive = vec![vec![false; self.step.slot_count()]; self.blocks];
        let mut first_launch = None;
        let of_op = |(x, _): &&(Instance, &[Placed])| x.unit == self.unit && x.op == op;
        for (instance, launches) in self.instances.iter().filter(of_op) {
            let mut block = 0;
            for l in *launches {
                let (slot, iteration) = self.step.place(*instance, l.position);
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
            .ok_or_else(|| Error::Mismatch(format!("{}: the schedule launches no {op}", self.name)))
    }

    /// A sharded unit's full gradient, block by block from its first write (the first
    /// micro-batch's where gradients accumulate) to its reduction's launch.
    fn full_gradient(&self, b: &mut Builder, block: (usize, FloatFormat)) -> Result<Option<usize>> {
        let u = self.schedule;
        if u.level == Level::None {
            return Ok(None);
        }
        let (step, k) = (self.step, self.step.micro_batches);
        let first_use = self.borrower.unwrap_or(self.backward);
        let (alive, _) = self.blocks_alive(Op::ReduceScatter, &|instance, launch| {
            let from = if u.accumulation.accumulate {
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
        let name = format!("{} full gradient", self.name);
        Ok(Some(b.add_blocks(name, block, alive, birth)))
    }

    /// A sharded unit's gathered parameters for the forward, block by block from their gather
    /// to their last read.
    fn gathered_forward(
        &self,
        b: &mut Builder,
        block: (usize, FloatFormat),
        staged: Option<usize>,
    ) -> Result<(Option<usize>, Option<usize>)> {
        let u = self.schedule;
        let gather_op = match u.level {
            Level::None => return Ok((None, None)),
            Level::Sdp => Op::Gather,
            Level::Fsdp => Op::GatherForward,
        };
        let (step, k) = (self.step, self.step.micro_batches);
        let (f, bw) = (self.forward, self.backward);
        // Until `forward` for fsdp: F_i, or the borrower's backward.
        let alive_until = |forward: usize| {
            self.blocks_alive(gather_op, &|instance, launch| {
                let m = instance.boundary;
                let until = match u.level {
                    Level::Sdp if u.accumulation.keep => step.at(k - 1, bw),
                    Level::Sdp => step.at(m, bw),
                    _ => step.at(m, forward),
                };
                vec![(launch, until)]
            })
        };
        let (alive, birth) = alive_until(self.borrower.unwrap_or(f))?;
        // A staging shard serves the gather, not the borrower (§3.13 counts it to F_i).
        let staging = match staged {
            Some(shard) => {
                let (staged_alive, _) = alive_until(f)?;
                Some(self.staging(b, (shard, block.1), staged_alive, birth, "the gather"))
            }
            None => None,
        };
        let name = format!("{} gathered", self.name);
        Ok((Some(b.add_blocks(name, block, alive, birth)), staging))
    }

    /// An fsdp unit's parameters gathered again for its backward, kept to the next
    /// micro-batch's forward where the plan keeps them.
    fn gathered_backward(
        &self,
        b: &mut Builder,
        block: (usize, FloatFormat),
        staged: Option<usize>,
    ) -> Result<(Option<usize>, Option<usize>)> {
        let u = self.schedule;
        if u.level != Level::Fsdp {
            return Ok((None, None));
        }
        let (step, k) = (self.step, self.step.micro_batches);
        let (f, bw) = (self.forward, self.backward);
        let (alive, birth) = self.blocks_alive(Op::GatherBackward, &|instance, launch| {
            let m = instance.boundary;
            let mut spans = vec![(launch, step.at(m, bw))];
            if u.accumulation.keep && m + 1 < k {
                // Kept from B^m_i to the end of F^{m+1}_i.
                spans.push((step.at(m, bw) + 1, step.at(m + 1, f)));
            }
            spans
        })?;
        let staging = staged.map(|shard| {
            self.staging(
                b,
                (shard, block.1),
                alive.clone(),
                birth,
                "the backward gather",
            )
        });
        let name = format!("{} gathered for backward", self.name);
        Ok((Some(b.add_blocks(name, block, alive, birth)), staging))
    }

    /// The buffers of each micro-batch's forward and backward: saved activations, internals or
    /// their recomputation, the workspaces and the input gradient.
    fn pass_buffers(&self, b: &mut Builder, workload: &dyn Workload) -> Result<PassBuffers> {
        let (i, name, step) = (self.unit, &self.name, self.step);
        let (f, bw) = (self.forward, self.backward);
        let sizes = workload.buffers(i);
        if self.schedule.recompute && sizes.forward_workspace < sizes.internals {
            return Err(Error::Mismatch(format!(
                "{name}: a recomputed unit's forward needs {} workspace elements, the model gives {}",
                sizes.internals, sizes.forward_workspace
            )));
        }
        // Each micro-batch's span from slot `first` to `last` of the flat timeline.
        let every = |first: usize, last: usize| -> Vec<(usize, usize)> {
            (0..step.micro_batches)
                .map(|m| (step.at(m, first), step.at(m, last)))
                .collect()
        };
        let saved = b.add(format!("{name} saved"), sizes.saved, f, &every(f, bw));
        let activations = if self.schedule.recompute {
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
            let previous = step.timeline.backward(i - 1);
            b.add(
                format!("{name} input gradient"),
                sizes.input_gradient,
                bw,
                &every(bw, previous),
            )
        });
        Ok(PassBuffers {
            saved,
            activations,
            forward_workspace,
            backward_workspace,
            input_gradient,
        })
    }
}

/// A unit's buffers of one micro-batch's passes, as request indices.
struct PassBuffers {
    saved: usize,
    activations: Activations<usize>,
    forward_workspace: usize,
    backward_workspace: usize,
    input_gradient: Option<usize>,
}
