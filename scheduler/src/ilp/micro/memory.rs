//! The memory rows of the micro-batch MIP (DESIGN §3.5, §3.9, §3.10, §3.11.1): M_s of every
//! unrolled slot, linear in the configuration indicators, r and the running sums C.

use super::columns::{Communicator, Config, UnitCols, Unrolled};
use super::linear::Linear;
use crate::cost::{block_bytes, persistent_bytes_over, secondary_shard_bytes};
use crate::profile::Profile;
use crate::timeline::{Level, Op};

/// M_s of every unrolled slot: per unit its persistent state over its configuration's group,
/// activations, gathered parameters, gradients, hpz's secondary shard, tied lenders' terms, and
/// the communicators in use.
pub(super) fn memory_rows(
    profile: &Profile,
    step: Unrolled,
    units: &[UnitCols],
    communicators: &[Communicator],
) -> Vec<Linear> {
    let timeline = step.timeline;
    let last = step.micro_batches - 1;
    // The world's communicator, and each shard or secondary group's in use (DESIGN §3.11).
    let communicator = profile
        .topology
        .as_ref()
        .map_or(0.0, |t| t.communicator_bytes as f64);
    let mut memory: Vec<Linear> = (0..step.slots())
        .map(|_| {
            let mut m = Linear::default();
            m.constant += communicator;
            for c in communicators {
                m.add(c.column, c.count * communicator);
            }
            m
        })
        .collect();
    let bytes = profile.bytes_per_param;
    for (i, u) in units.iter().enumerate() {
        let p = &profile.units[i];
        let laid_out = profile.laid_out_params(i) as f64;
        let (param, grad) = (laid_out * bytes.param as f64, laid_out * bytes.grad as f64);
        let (forward, backward) = (timeline.forward(i), timeline.backward(i));
        for &(c, y) in &u.configs {
            let persistent = persistent_bytes_over(profile, i, c.level, c.group);
            for m in memory.iter_mut() {
                m.add(y, persistent);
            }
            // hpz: the secondary shard from F^m to B^m, both included.
            if let Some(h) = c.secondary {
                let shard = secondary_shard_bytes(profile, i, h);
                for m in 0..step.micro_batches {
                    for s in &mut memory[step.at(m, forward)..=step.at(m, backward)] {
                        s.add(y, shard);
                    }
                }
            }
        }
        let r = u.recompute();
        let (act, ckpt) = (
            p.activation_bytes as f64,
            p.checkpoint_activation_bytes as f64,
        );
        let sdp = |keep: bool| u.y(move |c| c.level == Level::Sdp && c.keep == keep);
        let fsdp = u.y(|c| c.level == Level::Fsdp);
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
            let block = block_bytes(profile, i, l.key.op) * f64::from(u.blocks_per_launch);
            let kind = l.key.op.window_kind();
            // Ψg·y − blk_g·C_{q−1}: what the set's configurations have not yet launched.
            let owed = u.y(|c: Config| l.key.runs(c));
            for instance in step.instances(l.key.op, l.key.boundary) {
                for pos in 0..l.window.len {
                    let s = step.position(l.window, kind, instance, pos);
                    match l.key.op {
                        Op::AllReduce => {}
                        Op::ReduceScatter => {
                            memory[s].add_scaled(&owed, grad);
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
