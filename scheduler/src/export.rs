//! Export of a plan to PyTorch FSDP2 (`fully_shard`), unit by unit.
//!
//! FSDP2 decides per module: `reshard_after_forward` (fsdp → True, sdp → False), and which other
//! modules' all-gathers to issue when a module's forward or backward starts
//! (`set_modules_to_forward_prefetch`, `set_modules_to_backward_prefetch`). A `none` unit is
//! replicated by `fully_shard` over a 2-D (replicate = N, shard = 1) mesh (HSDP with shard groups
//! of one: full parameters on every rank, gradients all-reduced).
//!
//! What FSDP2 cannot express, and how the export rounds it (each rounding is listed in the
//! exported `approximations`):
//! - blocks: a unit's parameters are gathered whole, at the slot of its earliest block;
//! - gathers launched in the previous iteration (slots B_k or E before F_i): FSDP2 prefetches only
//!   within an iteration, so they start at F_1 (the first module's forward);
//! - backward gathers launched in the forward (slots F_k after F_i): they start at B_L;
//! - reductions: FSDP2 reduce-scatters (or all-reduces) right after the unit's backward, i.e. in
//!   the slot after B_i, whatever the plan says.
//!
//! - micro-batches (DESIGN §3.10): a unit that accumulates skips gradient sync
//!   (`set_requires_gradient_sync(False)`) on every micro-batch but the last, one that keeps its
//!   parameters skips resharding after backward (`set_reshard_after_backward(False)`) likewise;
//!   FSDP2 prefetches alike in every micro-batch, so an inner boundary launching elsewhere than
//!   the step's is rounded to the step's.
//!
//! - precision: the profile's bytes per gathered parameter and per reduced gradient become
//!   FSDP2's `MixedPrecisionPolicy(param_dtype, reduce_dtype)` (2 bytes: bfloat16, 4: float32;
//!   any other width is exported in float32, noted).
//!
//! A plan is exactly expressible when every op launches whole in one slot, forward gathers in
//! F_1 … F_{i−1} (or implicitly at F_i's start, depth 1 in FSDP2's own order), backward gathers in
//! B_L … B_{i+1}, and reductions in the slot right after B_i.

use crate::profile::Profile;
use crate::schedule::Schedule;
use crate::timeline::{Level, Op, Slot};
use serde::Serialize;

/// One unit's FSDP2 settings.
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
    /// Units whose all-gather starts when this unit's backward starts.
    pub backward_prefetch: Vec<String>,
    /// Whether gradients are reduced after every micro-batch's backward (false: only the last's,
    /// the unsharded gradient accumulating before; FSDP2's `set_requires_gradient_sync`).
    pub requires_gradient_sync: bool,
    /// Whether parameters are resharded after every micro-batch's backward (false: kept until
    /// the next micro-batch's forward, resharded after the last; `set_reshard_after_backward`).
    pub reshard_after_backward: bool,
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
    pub approximations: Vec<String>,
}

/// Exports a validated schedule.
pub fn fsdp2(profile: &Profile, schedule: &Schedule) -> Fsdp2Plan {
    let timeline = schedule.timeline();
    let l = schedule.units().len();
    let name = |i: usize| profile.units[i].name.clone();
    let mut forward_prefetch: Vec<Vec<String>> = vec![Vec::new(); l];
    let mut backward_prefetch: Vec<Vec<String>> = vec![Vec::new(); l];
    let mut notes = Vec::new();
    for i in 0..l {
        for (op, launches) in schedule.ops(i) {
            let Some(first) = launches.first() else {
                continue;
            };
            if launches.len() > 1 {
                notes.push(format!(
                    "{}: {} launches {} blocks over {} slots; FSDP2 gathers the unit whole at {}",
                    name(i),
                    op,
                    launches.iter().map(|l| l.blocks).sum::<u32>(),
                    launches.len(),
                    timeline.slot(first.slot)
                ));
            }
            let slot = timeline.slot(first.slot);
            match op {
                Op::AllReduce | Op::ReduceScatter | Op::ReplicaAllReduce => {
                    if first.position != 0 || launches.len() > 1 {
                        notes.push(format!(
                            "{}: {} planned at {slot}; FSDP2 reduces right after B{}",
                            name(i),
                            op,
                            i + 1
                        ));
                    }
                }
                Op::Gather | Op::GatherForward => match slot {
                    // Depth 1 (FSDP2's own issue order), and unit 1's only slot E (its forward
                    // is the first of the iteration): nothing to set.
                    Slot::F(k) if k == i => {}
                    Slot::E if i == 0 => {}
                    Slot::F(k) => forward_prefetch[k - 1].push(name(i)),
                    _ => {
                        notes.push(format!("{}: {} planned at {slot} (previous iteration); FSDP2 prefetches within an iteration, so it starts at F1", name(i), op));
                        if i > 0 {
                            forward_prefetch[0].push(name(i));
                        }
                    }
                },
                Op::GatherBackward => match slot {
                    Slot::B(k) if k == i + 2 => {}
                    Slot::B(k) => backward_prefetch[k - 1].push(name(i)),
                    _ => {
                        notes.push(format!(
                            "{}: {} planned at {slot} (during the forward); it starts at B{l}",
                            name(i),
                            op
                        ));
                        backward_prefetch[l - 1].push(name(i));
                    }
                },
            }
        }
    }
    let units = schedule
        .units()
        .iter()
        .enumerate()
        .map(|(i, u)| Fsdp2Unit {
            name: name(i),
            level: u.level.name(),
            sharded: u.level != Level::None,
            reshard_after_forward: match u.level {
                Level::None => None,
                Level::Sdp => Some(false),
                Level::Fsdp => Some(true),
            },
            shard_group: u.shard_group,
            secondary_group: u.secondary_group,
            recompute: u.recompute,
            forward_prefetch: std::mem::take(&mut forward_prefetch[i]),
            backward_prefetch: std::mem::take(&mut backward_prefetch[i]),
            requires_gradient_sync: !u.accumulation.accumulate,
            reshard_after_backward: !u.accumulation.keep,
        })
        .collect();
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
    let bytes = &profile.bytes_per_param;
    let mixed_precision = MixedPrecision::of(bytes.param, bytes.grad).unwrap_or_else(|why| {
        notes.push(format!("{why}; exported in float32"));
        None
    });
    Fsdp2Plan {
        schema: 1,
        world_size: profile.world_size,
        micro_batches: schedule.micro_batches(),
        mixed_precision,
        profile_digest: profile.digest(),
        units,
        exact: notes.is_empty(),
        approximations: notes,
    }
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
