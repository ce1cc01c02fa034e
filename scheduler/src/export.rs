//! Export of a plan to PyTorch FSDP2 (`fully_shard`), unit by unit, with the exported settings'
//! time, peak and timeline under FSDP2's own semantics (DESIGN §3.12).
//!
//! FSDP2 decides per module: `reshard_after_forward` (fsdp → True, sdp → False, hpZ → H), and
//! which other modules' all-gathers to issue when a module's forward or backward starts
//! (`set_modules_to_forward_prefetch`, `set_modules_to_backward_prefetch`). A `none` unit is
//! replicated by `fully_shard` over a 2-D (replicate = N, shard = 1) mesh.
//!
//! Gathers: a forward gather the plan launches at F_j becomes an entry of unit j's forward list
//! (FSDP2 prefetches nothing in the forward by itself: a module's own pre-forward issues its
//! gather, exposed); a backward gather at B_j an entry of unit j's backward list, except that
//! unit j's default prefetch already issues unit j − 1 there, so a list that would hold only
//! j − 1 is left empty. Any other list switches that default off, and is listed as a change.
//!
//! What FSDP2 cannot express, and how the export rounds it (each rounding is listed in the
//! exported `approximations`; the settings' own time and peak are then what FSDP2 runs):
//! - blocks: a unit's parameters are gathered whole, at the slot of its earliest block;
//! - gathers launched in the previous iteration (slots B_k or E before F_i): FSDP2 prefetches only
//!   within an iteration, so they start at F_1 (the first module's forward);
//! - backward gathers launched in the forward (slots F_k after F_i): they start at B_L;
//! - reductions: FSDP2 reduce-scatters (or all-reduces) in the post-backward hook, i.e. in the
//!   slot after B_i, and an HSDP unit's replica AllReduce follows (one slot later, DESIGN §3.11).
//!
//! - micro-batches (DESIGN §3.10): a unit that accumulates skips gradient sync
//!   (`set_requires_gradient_sync(False)`) on every micro-batch but the last, one that keeps its
//!   parameters skips resharding after backward (`set_reshard_after_backward(False)`) likewise,
//!   and an HSDP unit whose replica AllReduce runs once skips it (`set_requires_all_reduce(False)`,
//!   DESIGN §3.11.1);
//!   FSDP2 prefetches alike in every micro-batch, so an inner boundary launching elsewhere than
//!   the step's is rounded to the step's.
//!
//! - offload (DESIGN §3.13, [`offload`]): an offloaded unit gets FSDP2's `CPUOffloadPolicy`, which
//!   offloads parameters, gradients and optimizer state together (an `optimizer` unit is
//!   exported as `full`) and steps after the backward (an overlapped `host_step` is exported as
//!   `after-backward`); the FSDP2 time and peak are then the settings' schedule with that offload;
//!
//! - precision: the profile's bytes per gathered parameter and per reduced gradient become
//!   FSDP2's `MixedPrecisionPolicy(param_dtype, reduce_dtype)` (2 bytes: bfloat16, 4: float32;
//!   any other width is exported in float32, noted).

mod offload;

pub use offload::OffloadPolicy;

use crate::Result;
use crate::fsdp2::evaluate::TimelineEntry;
use crate::fsdp2::{Reshard, Settings, Sharding, UnitSettings, evaluate};
use crate::profile::Profile;
use crate::schedule::{ReplicaReduce, Schedule};
use crate::sim::{Semantics, simulate};
use crate::size::whole_bytes;
use crate::timeline::{Level, Op, Slot};
use serde::Serialize;

/// One unit's FSDP2 settings, as `shardplan_torch.apply_plan` reads them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fsdp2Unit {
    pub name: String,
    pub level: &'static str,
    /// True: `fully_shard` over the shard mesh; false: over the (N, 1) replicate mesh.
    pub sharded: bool,
    /// FSDP2's `reshard_after_forward` (None for replicated units).
    pub reshard_after_forward: Option<bool>,
    /// S, the shard group of an HSDP unit (DESIGN §3.11): `fully_shard` over the 2-D (N/S, S)
    /// replicate × shard mesh; None: over the world.
    pub shard_group: Option<u32>,
    /// H, an hpZ unit's secondary group: FSDP2's `reshard_after_forward=H` in place of true.
    pub secondary_group: Option<u32>,
    /// Activation checkpointing (wrap the unit with `torch.utils.checkpoint`).
    pub recompute: bool,
    /// Units whose all-gather starts when this unit's forward starts.
    pub forward_prefetch: Vec<String>,
    /// Units whose all-gather starts when this unit's backward starts (non-empty: FSDP2's
    /// default prefetch of the previous unit is off).
    pub backward_prefetch: Vec<String>,
    /// Whether gradients are reduced after every micro-batch's backward (false: only the last's,
    /// the unsharded gradient accumulating before; FSDP2's `set_requires_gradient_sync`).
    pub requires_gradient_sync: bool,
    /// Whether parameters are resharded after every micro-batch's backward (false: kept until
    /// the next micro-batch's forward, resharded after the last; `set_reshard_after_backward`).
    pub reshard_after_backward: bool,
    /// Whether an HSDP unit all-reduces its reduced shard across replicas after every
    /// micro-batch (false: only after the last, FSDP2's `set_requires_all_reduce`).
    pub requires_all_reduce: bool,
    /// FSDP2's `offload_policy` where the plan offloads the unit (DESIGN §3.13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_policy: Option<OffloadPolicy>,
}

/// FSDP2's `MixedPrecisionPolicy` for the profile's bytes per parameter (DESIGN §6.9): gathered
/// parameters in `param_dtype`, gradients reduced in `reduce_dtype`; torch's dtype names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MixedPrecision {
    pub param_dtype: &'static str,
    pub reduce_dtype: &'static str,
}

impl MixedPrecision {
    /// The policy of a profile with `param` bytes per gathered parameter and `grad` per reduced
    /// gradient: 2 is bf16 (§6.9's policy), 4 fp32; `None` for fp32 throughout (FSDP2's
    /// default), and an error naming the field for a width FSDP2 has no dtype for here.
    pub fn of(param: u64, grad: u64) -> Result<Option<Self>, String> {
        let dtype = |field: &str, bytes: u64| match bytes {
            2 => Ok("bfloat16"),
            4 => Ok("float32"),
            b => Err(format!(
                "bytes_per_param.{field} = {b}: FSDP2's policy takes 2 (bfloat16) or 4 (float32)"
            )),
        };
        let policy = MixedPrecision {
            param_dtype: dtype("param", param)?,
            reduce_dtype: dtype("grad", grad)?,
        };
        Ok((policy.param_dtype != "float32" || policy.reduce_dtype != "float32").then_some(policy))
    }
}

/// The exported plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fsdp2Plan {
    pub schema: u32,
    pub world_size: u32,
    /// K, micro-batches per optimizer step.
    pub micro_batches: u32,
    /// FSDP2's `mp_policy` for every `fully_shard` (None: fp32, its default).
    pub mixed_precision: Option<MixedPrecision>,
    pub profile_digest: String,
    /// Units in forward order.
    pub units: Vec<Fsdp2Unit>,
    /// True when nothing had to be rounded.
    pub exact: bool,
    /// Where the exported settings differ from the plan.
    pub approximations: Vec<String>,
    /// Every setting that departs from FSDP2's defaults (prefetch lists, the default backward
    /// prefetches they switch off).
    pub changes: Vec<String>,
    /// The plan's own strict time and peak (DESIGN §3).
    pub plan_iteration_time_us: f64,
    pub plan_peak_memory_bytes: u64,
    /// The exported settings' strict and relaxed time, peak and its slot under FSDP2's
    /// semantics (DESIGN §3.12).
    pub fsdp2_iteration_time_us: f64,
    pub fsdp2_relaxed_iteration_time_us: f64,
    pub fsdp2_peak_memory_bytes: u64,
    pub fsdp2_peak_slot: String,
    /// Where the plan offloads: one node's host memory under FSDP2's `CPUOffloadPolicy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsdp2_host_memory_bytes: Option<u64>,
    /// Every module boundary in execution order, with the units unsharded when its compute
    /// starts and the all-gathers its pre-hook issues.
    pub fsdp2_timeline: Vec<TimelineEntry>,
}

/// Exports a validated schedule: the FSDP2 settings nearest to it, their evaluation under
/// FSDP2's semantics, and every rounding and change; an error where those settings cannot be
/// evaluated.
pub fn fsdp2(profile: &Profile, schedule: &Schedule) -> Result<Fsdp2Plan> {
    let (units, mut notes, changes) = settings_of(profile, schedule);
    let settings = Settings::new(profile, units)?;
    let eval = evaluate(profile, &settings);
    let offloaded = offload::evaluate(profile, schedule, &settings, &eval)?;
    notes.extend(offload::notes(profile, schedule));
    let plan = simulate(profile, schedule, Semantics::Strict);
    let name = |i: usize| profile.units[i].name.clone();
    let names = |list: &[usize]| list.iter().map(|&t| name(t)).collect::<Vec<_>>();
    let exported = settings
        .units()
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let (sharded, reshard, shard_group, secondary_group) = match u.sharding {
                Sharding::Replicated => (false, None, None, None),
                Sharding::Sharded {
                    shard_group,
                    reshard_after_forward,
                } => match reshard_after_forward {
                    Reshard::Keep => (true, Some(false), shard_group, None),
                    Reshard::Free => (true, Some(true), shard_group, None),
                    Reshard::ToSecondary(h) => (true, Some(true), shard_group, Some(h)),
                },
            };
            Fsdp2Unit {
                name: name(i),
                level: schedule.units()[i].level.name(),
                sharded,
                reshard_after_forward: reshard,
                shard_group,
                secondary_group,
                recompute: u.recompute,
                forward_prefetch: names(&u.forward_prefetch),
                backward_prefetch: names(&u.backward_prefetch),
                requires_gradient_sync: u.requires_gradient_sync,
                reshard_after_backward: u.reshard_after_backward,
                requires_all_reduce: u.requires_all_reduce,
                offload_policy: offload::policy(schedule.offload(i)),
            }
        })
        .collect();
    let bytes = &profile.bytes_per_param;
    let mixed_precision = MixedPrecision::of(bytes.param, bytes.grad).unwrap_or_else(|why| {
        notes.push(format!("{why}; exported in float32"));
        None
    });
    Ok(Fsdp2Plan {
        schema: 1,
        world_size: profile.world_size,
        micro_batches: schedule.micro_batches(),
        mixed_precision,
        profile_digest: profile.digest(),
        units: exported,
        exact: notes.is_empty(),
        approximations: notes,
        changes,
        plan_iteration_time_us: plan.iteration_time_us,
        plan_peak_memory_bytes: whole_bytes(plan.peak_memory_bytes),
        fsdp2_iteration_time_us: (offloaded.as_ref())
            .map_or(eval.iteration_time_us(), |o| o.iteration_time_us),
        fsdp2_relaxed_iteration_time_us: (offloaded.as_ref())
            .map_or(eval.relaxed_iteration_time_us, |o| {
                o.relaxed_iteration_time_us
            }),
        fsdp2_peak_memory_bytes: (offloaded.as_ref())
            .map_or(eval.peak_memory_bytes, |o| o.peak_memory_bytes),
        fsdp2_peak_slot: (offloaded.as_ref())
            .map_or(eval.peak_slot.clone(), |o| o.peak_slot.clone()),
        fsdp2_host_memory_bytes: offloaded.as_ref().map(|o| o.host_memory_bytes),
        fsdp2_timeline: eval.timeline,
    })
}

/// The FSDP2 settings nearest to `schedule`, the roundings they make and the changes from
/// FSDP2's defaults they set.
fn settings_of(
    profile: &Profile,
    schedule: &Schedule,
) -> (Vec<UnitSettings>, Vec<String>, Vec<String>) {
    let timeline = schedule.timeline();
    let l = schedule.units().len();
    let name = |i: usize| profile.units[i].name.clone();
    let mut forward: Vec<Vec<usize>> = vec![Vec::new(); l];
    let mut backward: Vec<Vec<usize>> = vec![Vec::new(); l];
    let mut notes = Vec::new();
    for i in 0..l {
        let tied_fsdp = tied_fsdp_lender(profile, schedule, i);
        if let Some(j) = tied_fsdp {
            notes.push(format!(
                "{}: fsdp, but one FSDP2 group with {}'s tied module (DESIGN §3.12): FSDP2 holds \
                 it unsharded from F{} until {}'s forward ends, and freed there would gather it \
                 again, exposed, at its pre-backward; exported with reshard_after_forward=False \
                 (sdp), without its backward gather",
                name(i),
                name(j),
                i + 1,
                name(j)
            ));
        }
        for (op, launches) in schedule.ops(i) {
            let Some(first) = launches.first() else {
                continue;
            };
            if op == Op::GatherBackward && tied_fsdp.is_some() {
                continue;
            }
            let slot = timeline.slot(first.slot);
            if launches.len() > 1 {
                notes.push(format!(
                    "{}: {} launches {} blocks over {} slots; FSDP2 gathers the unit whole at {slot}",
                    name(i),
                    op,
                    launches.iter().map(|l| l.blocks).sum::<u32>(),
                    launches.len(),
                ));
            }
            match op {
                Op::AllReduce | Op::ReduceScatter => {
                    if first.position != 0 || launches.len() > 1 {
                        notes.push(format!(
                            "{}: {op} planned at {slot}; FSDP2 reduces right after B{}",
                            name(i),
                            i + 1
                        ));
                    }
                }
                Op::ReplicaAllReduce => {
                    if first.position != 1 || launches.len() > 1 {
                        notes.push(format!(
                            "{}: {op} planned at {slot}; FSDP2 all-reduces right after the \
                             reduce-scatter (one slot after B{})",
                            name(i),
                            i + 1
                        ));
                    }
                }
                Op::Gather | Op::GatherForward => match slot {
                    Slot::E if i == 0 => {}
                    Slot::F(k) => forward[k - 1].push(i),
                    _ => {
                        notes.push(format!(
                            "{}: {op} planned at {slot} (previous iteration); FSDP2 prefetches \
                             within an iteration, so it starts at F1",
                            name(i)
                        ));
                        forward[0].push(i);
                    }
                },
                Op::GatherBackward => match slot {
                    Slot::B(k) => backward[k - 1].push(i),
                    _ => {
                        notes.push(format!(
                            "{}: {op} planned at {slot} (during the forward); it starts at B{l}",
                            name(i)
                        ));
                        backward[l - 1].push(i);
                    }
                },
            }
        }
    }
    for i in 0..l {
        for (op, step) in schedule.ops(i) {
            // Placed launches, in window order: the first is the earliest.
            let inner = schedule.inner_launches(i, op);
            if !inner.is_empty() && inner[0].slot != step[0].slot {
                notes.push(format!(
                    "{}: {} launched at {} between micro-batches; FSDP2 issues it as in the \
                     step's, at {}",
                    name(i),
                    op,
                    timeline.inner_slot(inner[0].slot),
                    timeline.slot(step[0].slot)
                ));
            }
        }
    }
    let mut changes = Vec::new();
    let listed = |list: &[usize]| list.iter().map(|&t| name(t)).collect::<Vec<_>>().join(", ");
    for j in 0..l {
        // Nearest deadline first, FSDP2's issue order (and the canonical queue's, DESIGN §3.7).
        forward[j].sort_unstable();
        backward[j].sort_unstable_by(|a, b| b.cmp(a));
        if !forward[j].is_empty() {
            changes.push(format!(
                "{}.forward_prefetch = [{}]",
                name(j),
                listed(&forward[j])
            ));
        }
        if j > 0 && backward[j] == [j - 1] {
            // FSDP2's default prefetch at B_j issues unit j − 1: nothing to set.
            backward[j].clear();
        } else if !backward[j].is_empty() {
            let mut change = format!("{}.backward_prefetch = [{}]", name(j), listed(&backward[j]));
            if j > 0 {
                change.push_str(&format!(
                    "; switches off FSDP2's default prefetch of {} at {}'s pre-backward",
                    name(j - 1),
                    name(j)
                ));
            }
            changes.push(change);
        }
    }
    let units = schedule
        .units()
        .iter()
        .enumerate()
        .map(|(i, u)| UnitSettings {
            sharding: match u.level {
                Level::None => Sharding::Replicated,
                level => Sharding::Sharded {
                    shard_group: u.shard_group,
                    reshard_after_forward: match (level, u.secondary_group) {
                        _ if tied_fsdp_lender(profile, schedule, i).is_some() => Reshard::Keep,
                        (Level::Sdp, _) => Reshard::Keep,
                        (_, Some(h)) => Reshard::ToSecondary(h),
                        _ => Reshard::Free,
                    },
                },
            },
            recompute: u.recompute,
            forward_prefetch: std::mem::take(&mut forward[i]),
            backward_prefetch: std::mem::take(&mut backward[i]),
            requires_gradient_sync: !u.accumulation.accumulate,
            reshard_after_backward: !u.accumulation.keep,
            requires_all_reduce: u.accumulation.replica_reduce == ReplicaReduce::Every,
        })
        .collect();
    (units, notes, changes)
}

/// The borrower of unit `i` when `i` is an fsdp unit whose parameters it reads (DESIGN §3.9):
/// FSDP2 cannot free such a unit between the two (its module and the borrower's tied one are
/// one group), so the export keeps it unsharded after the forward.
fn tied_fsdp_lender(profile: &Profile, schedule: &Schedule, i: usize) -> Option<usize> {
    profile
        .borrower(i)
        .filter(|_| schedule.units()[i].level == Level::Fsdp)
}

#[cfg(test)]
mod tests {
    use super::MixedPrecision;

    #[test]
    fn bytes_per_parameter_are_fsdp2s_policy() {
        let policy = |param_dtype, reduce_dtype| {
            Some(MixedPrecision {
                param_dtype,
                reduce_dtype,
            })
        };
        assert_eq!(MixedPrecision::of(4, 4), Ok(None));
        assert_eq!(MixedPrecision::of(2, 4), Ok(policy("bfloat16", "float32")));
        assert_eq!(MixedPrecision::of(2, 2), Ok(policy("bfloat16", "bfloat16")));
        assert_eq!(MixedPrecision::of(4, 2), Ok(policy("float32", "bfloat16")));
        let why = MixedPrecision::of(1, 4).unwrap_err();
        assert!(why.contains("bytes_per_param.param = 1"), "{why}");
        assert!(
            MixedPrecision::of(2, 8)
                .unwrap_err()
                .contains("bytes_per_param.grad = 8")
        );
    }
}
