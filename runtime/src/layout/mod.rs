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
//!
//! An offloaded unit (DESIGN §6.12) keeps its master, gradient shard and Adam moments (and with
//! `full` its parameter shard) in the host arena, after the device arena; on the device its
//! reduced gradient shard lives from B_i to its last RS launch slot, and `full` stages each
//! gather block's shard beside the gathered block.
//!
//! With K micro-batches per step the lifetimes are over the step unrolled to K·(2L + 1) slots
//! (DESIGN §6.10): a buffer of one micro-batch's contents is alive in every micro-batch's span
//! and sits at one offset (`place`).

mod place;

pub use place::place;

use crate::arena::{Arena, Request};
use crate::backend::Region;
use crate::workload::{Pass, Workload};
use crate::{Error, Result};
use shardplan_scheduler::offload::Offload;
use shardplan_scheduler::precision::Precision;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::timeline::Level;

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
    /// The ranks the kept state is sharded over: 1 (replicated), the shard group's S or N; rank
    /// r holds the (r mod S)-th part of every block (its shard group is the S consecutive ranks
    /// holding it, DESIGN §3.11).
    pub shard_ranks: usize,
    /// An hpZ unit's secondary group H and its secondary shard (the (r mod H)-th part of every
    /// gathered block, kept from F_i to B_i: its backward gather's source).
    pub secondary: Option<(usize, R)>,
    /// The parameters as gathered and computed with (bf16 under the bf16 policy).
    pub params: R,
    /// Under the bf16 policy, the fp32 master of `params` (same elements), which the optimizer
    /// updates and rounds into `params` (DESIGN §6.9).
    pub master: Option<R>,
    /// The gradient shard (or full gradient of a replicated unit) in the reduction's format.
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
    /// Where the unit offloads (DESIGN §6.12): `params` (with `full`), `master`, `adam_m` and
    /// `adam_v` are then host regions, and `grads` the device's reduced gradient shard, alive
    /// only until its copy to the host.
    pub offload: Option<Offloaded<R>>,
}

/// An offloaded unit's buffers besides the fields [`UnitLayout`] shares with every unit.
#[derive(Debug, Clone, Copy)]
pub struct Offloaded<R = Region> {
    /// `Optimizer` or `Full`.
    pub mode: Offload,
    /// The host's gradient shard: the D2H copy's target, the host step's gradient.
    pub host_grads: R,
    /// `full`: per gather op, the device shard of each gathered block, copied from the host's
    /// parameter shard before the block's gather (its source).
    pub staging_forward: Option<R>,
    pub staging_backward: Option<R>,
}

impl<R: Copy> Offloaded<R> {
    fn map<S>(self, f: impl Fn(R) -> S) -> Offloaded<S> {
        Offloaded {
            mode: self.mode,
            host_grads: f(self.host_grads),
            staging_forward: self.staging_forward.map(&f),
            staging_backward: self.staging_backward.map(&f),
        }
    }
}

impl<R: Copy> UnitLayout<R> {
    fn map<S>(self, f: impl Fn(R) -> S) -> UnitLayout<S> {
        UnitLayout {
            level: self.level,
            recompute: self.recompute,
            blocks: self.blocks,
            block_elements: self.block_elements,
            shard_ranks: self.shard_ranks,
            secondary: self.secondary.map(|(h, r)| (h, f(r))),
            params: f(self.params),
            master: self.master.map(&f),
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
            offload: self.offload.map(|o| o.map(&f)),
        }
    }
}

impl UnitLayout {
    /// Where rank `rank`'s part of each block begins in the unit's flat (padded) parameters, and
    /// the part's length: block j's part is j·blk + (r mod S)·blk/S, blk/S elements.
    pub fn shard_of(&self, rank: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let len = self.block_elements / self.shard_ranks;
        let place = rank % self.shard_ranks;
        (0..self.blocks).map(move |j| (j * self.block_elements + place * len, len))
    }

    /// An hpZ unit's copies after its forward on rank `rank` (from, to): the rank's part of each
    /// gathered block into the secondary shard; none for any other unit.
    pub fn secondary_copies(&self, rank: usize) -> Vec<(Region, Region)> {
        let (Some((h, secondary)), Some(gathered)) = (self.secondary, self.gathered_forward) else {
            return Vec::new();
        };
        (0..self.blocks)
            .map(|j| {
                let full = gathered.part(j, self.blocks);
                (full.part(rank % h, h), secondary.part(j, self.blocks))
            })
            .collect()
    }

    /// The persistent parameters the optimizer updates: the fp32 master where there is one.
    pub fn trained(&self) -> Region {
        self.master.unwrap_or(self.params)
    }

    /// The host step's view of an offloaded unit: its gradient the host's shard.
    pub fn on_host(&self) -> Option<UnitLayout> {
        self.offload.map(|o| UnitLayout {
            grads: o.host_grads,
            ..self.clone()
        })
    }

    /// The source of block `block`'s gather (`backward`: of the backward gather): the rank's
    /// part of the parameter shard, or a `full` unit's staging shard of the block.
    pub fn gather_source(&self, block: usize, backward: bool) -> Region {
        let staging = self.offload.and_then(|o| match backward {
            false => o.staging_forward,
            true => o.staging_backward.or(o.staging_forward),
        });
        staging.unwrap_or(self.params).part(block, self.blocks)
    }

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
            Activations::Recomputed(r) => r.sub(self.saved.len, r.len - self.saved.len),
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
    /// The host arena's bytes (DESIGN §6.12): the offloaded state, after the device arena's
    /// words; 0 without offload.
    pub host_arena_bytes: u64,
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
            let element = region.format.bytes();
            let len = (end.min(request.bytes()) - start) / element;
            (region.sub((start / element) as usize, len as usize), alive)
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

/// What names a model and its profile in [`check_training`]'s errors: their files, or their
/// names where there are none.
#[derive(Debug, Clone, Copy)]
pub struct Origins<'a> {
    pub model: &'a str,
    pub profile: &'a str,
}

/// Checks that `profile` was made for the `[training]` settings `workload` trains with: its
/// micro-batches per step and its precision policy's bytes per parameter (DESIGN §6.9). An error
/// names the model's file and field.
pub fn check_training(workload: &dyn Workload, profile: &Profile, origins: Origins) -> Result<()> {
    let k = workload.micro_batches();
    if profile.micro_batches as usize != k {
        return Err(shardplan_scheduler::Error::invalid(
            origins.model,
            "training.micro_batches",
            format!(
                "{} (the micro-batches per step of profile {}), got {k}",
                profile.micro_batches, origins.profile
            ),
        )
        .into());
    }
    check_precision(workload, profile, origins)
}

/// Checks that the profile counts the bytes per parameter of `workload`'s precision policy.
fn check_precision(workload: &dyn Workload, profile: &Profile, origins: Origins) -> Result<()> {
    let (b, precision) = (profile.bytes_per_param, workload.precision());
    if b == precision.bytes_per_param() {
        return Ok(());
    }
    let counted = match Precision::of_bytes(b) {
        Ok(policy) => policy.describe(),
        Err(_) => "no policy the runtime trains".into(),
    };
    Err(shardplan_scheduler::Error::invalid(
        origins.model,
        "training.precision",
        format!(
            "{counted} (profile {} counts ({}, {}, {}) bytes per parameter), got {}",
            origins.profile,
            b.param,
            b.grad,
            b.optimizer,
            precision.describe()
        ),
    )
    .into())
}

/// Checks that the profile describes `workload`: the same precision policy, units, names and
/// parameter counts.
pub fn check_profile(workload: &dyn Workload, profile: &Profile) -> Result<()> {
    let origins = Origins {
        model: workload.name(),
        profile: &profile.name,
    };
    check_precision(workload, profile, origins)?;
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
