//! Per-slot memory of a rank (DESIGN §3):
//! M_s = Σ persistent_i + Σ gathered_i(s) + Σ grad_i(s) + Σ_{F_i ≤ s ≤ B_i} saved_i + ws(s),
//! with a lent unit's buffers extended to its borrower's backward B_j (DESIGN §3.9), an hpZ
//! unit's secondary shard from F_i to B_i and the communicators' buffers (DESIGN §3.11), and an
//! offloaded unit's terms (DESIGN §3.13): its persistent state on the device, its reduced
//! gradient shard until the end of its last RS launch slot (over a shard group, of its replica
//! AllReduce's), a `full` gather block's H2D shard.

use crate::cost::{block_bytes, communicator_bytes, saved_bytes, secondary_shard_bytes};
use crate::offload::{
    Offload, device_persistent_bytes, gather_shard_bytes, gradient_shard_bytes, shard_ranks,
};
use crate::profile::Profile;
use crate::schedule::{Recompute, Schedule};
use crate::timeline::{Level, Op};
use serde::Serialize;

/// What is alive during one slot, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemoryBreakdown {
    pub persistent: f64,
    pub gathered: f64,
    pub gradient: f64,
    pub activation: f64,
    pub workspace: f64,
    /// The communicators' buffers (DESIGN §3.11): 0 without a topology.
    pub communicators: f64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> f64 {
        self.persistent
            + self.gathered
            + self.gradient
            + self.activation
            + self.workspace
            + self.communicators
    }

    /// The component with the most bytes, by name.
    pub fn dominant(&self) -> (&'static str, f64) {
        [
            ("persistent state", self.persistent),
            ("gathered parameters", self.gathered),
            ("unreduced gradients", self.gradient),
            ("saved activations", self.activation),
            ("workspace", self.workspace),
            ("communicator buffers", self.communicators),
        ]
        .into_iter()
        .fold(("persistent state", f64::MIN), |best, c| {
            if c.1 > best.1 { c } else { best }
        })
    }
}

/// The memory breakdown of every slot index.
pub fn memory_by_slot(profile: &Profile, schedule: &Schedule) -> Vec<MemoryBreakdown> {
    let timeline = schedule.timeline();
    let communicators = MemoryBreakdown {
        communicators: communicator_bytes(profile, schedule),
        ..MemoryBreakdown::default()
    };
    let mut memory = vec![communicators; timeline.slot_count()];
    for (unit, u) in schedule.units().iter().enumerate() {
        let (forward, backward) = (timeline.forward(unit), timeline.backward(unit));
        let p = &profile.units[unit];
        let offload = schedule.offload(unit);
        let ranks = shard_ranks(profile, u.shard_group);
        let persistent = device_persistent_bytes(profile, unit, u, offload);
        for m in memory.iter_mut() {
            m.persistent += persistent;
        }
        let saved = saved_bytes(profile, unit, Recompute::of(u));
        for m in &mut memory[forward..=backward] {
            m.activation += saved;
        }
        if u.recompute {
            memory[backward].activation += p.activation_bytes as f64;
        }
        memory[forward].workspace += p.forward_workspace_bytes as f64;
        memory[backward].workspace += p.backward_workspace_bytes as f64;
        if let Some(h) = u.secondary_group {
            for m in &mut memory[forward..=backward] {
                m.gathered += secondary_shard_bytes(profile, unit, h);
            }
        }

        if let Some(borrower) = profile.borrower(unit) {
            let laid_out = profile.laid_out_params(unit);
            let borrower_backward = timeline.backward(borrower);
            if u.level == Level::Fsdp {
                // The forward gather stays until the borrower's backward: (F_i, B_j].
                for m in &mut memory[forward + 1..=borrower_backward] {
                    m.gathered += (laid_out * profile.bytes_per_param.param) as f64;
                }
            }
            if u.level != Level::None {
                // The full gradient is written from the borrower's backward: [B_j, B_i).
                for m in &mut memory[borrower_backward..backward] {
                    m.gradient += (laid_out * profile.bytes_per_param.grad) as f64;
                }
            }
        }
        for (op, launches) in schedule.ops(unit) {
            let window = timeline.window(unit, op.window_kind());
            let bytes = block_bytes(profile, unit, op);
            let shard = match offload {
                Offload::Full if !op.is_reduction() => gather_shard_bytes(profile, unit, ranks),
                _ => 0.0,
            };
            if op == Op::ReduceScatter
                && !offload.is_none()
                && let Some(last) = launches.last()
            {
                // The reduced shard waits on the device for its copy to the host, which follows
                // the last RS block (over a shard group, its replica AllReduce a slot later).
                let copied = last.position + usize::from(u.shard_group.is_some());
                let shard = gradient_shard_bytes(profile, unit, ranks);
                memory[backward].gradient += shard;
                for q in 0..=copied {
                    memory[window.slot_at(q)].gradient += shard;
                }
            }
            for l in launches {
                let amount = (bytes + shard) * f64::from(l.blocks);
                let pos = l.position;
                match op {
                    // RA reduces the persistent gradient shard in place.
                    Op::AllReduce | Op::ReplicaAllReduce => {}
                    Op::ReduceScatter => {
                        // From the start of B_i to the end of the launch slot.
                        memory[backward].gradient += amount;
                        for q in 0..=pos {
                            memory[window.slot_at(q)].gradient += amount;
                        }
                    }
                    Op::Gather | Op::GatherForward | Op::GatherBackward => {
                        // From the launch slot to the end of the window, then the consuming
                        // slots: F_i..B_i (sdp), F_i (fsdp forward), B_i (fsdp backward).
                        for q in pos..window.len {
                            memory[window.slot_at(q)].gathered += amount;
                        }
                        let consumers = match op {
                            Op::Gather => forward..=backward,
                            Op::GatherForward => forward..=forward,
                            _ => backward..=backward,
                        };
                        for m in &mut memory[consumers] {
                            m.gathered += amount;
                        }
                    }
                }
            }
        }
    }
    memory
}
