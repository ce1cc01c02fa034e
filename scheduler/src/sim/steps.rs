//! The step of K ≥ 2 micro-batches unrolled (DESIGN §3.10): K copies of F_1 … F_L, B_L … B_1,
//! each followed by its boundary (I between micro-batches, E after the last), K·(2L + 1) slots.
//! Every op instance is placed by its assignment — the step boundary's `launches`, the inner
//! boundaries' `accumulation.inner`, AGB's launches in every micro-batch — so the simulator needs
//! no slot classes: it checks the ILP's compression instead of sharing it. A shard group's replica
//! AllReduce follows its ReduceScatter at the boundaries where it runs (DESIGN §3.11.1).

use super::{Entry, MemoryBreakdown, StepInputs, op_index};
use crate::cost::{
    Interference, among, block_bytes, block_time, communicator_bytes, compute_us,
    persistent_bytes_over, saved_bytes, secondary_shard_bytes,
};
use crate::profile::Profile;
use crate::schedule::{
    QueueKey, Recompute, ReplicaReduce, Schedule, in_canonical_order, queue_key,
};
use crate::timeline::{Level, Op, Slot};
use crate::unrolled::{Instance, Unrolled, first_gradient_writer};

/// Adds `bytes` of `part` to every unrolled slot from `first` to `last` inclusive, cyclically.
fn add(
    step: Unrolled,
    memory: &mut [MemoryBreakdown],
    first: usize,
    last: usize,
    bytes: f64,
    part: fn(&mut MemoryBreakdown) -> &mut f64,
) {
    let n = step.slot_count();
    let mut s = first;
    loop {
        *part(&mut memory[s]) += bytes;
        if s == last {
            break;
        }
        s = (s + 1) % n;
    }
}

fn gathered(m: &mut MemoryBreakdown) -> &mut f64 {
    &mut m.gathered
}

fn gradient(m: &mut MemoryBreakdown) -> &mut f64 {
    &mut m.gradient
}

fn activation(m: &mut MemoryBreakdown) -> &mut f64 {
    &mut m.activation
}

/// The step's inputs, unrolled.
pub(super) fn unrolled(profile: &Profile, schedule: &Schedule) -> StepInputs {
    let timeline = schedule.timeline();
    let k = schedule.micro_batches() as usize;
    let step = Unrolled::of(schedule);
    let (n, width, units) = (step.slot_count(), step.width(), schedule.units());
    let id = |i: Instance| (i.boundary * units.len() + i.unit) * Op::ALL.len() + op_index(i.op);
    let interference = Interference::of(profile);
    let labels = (0..n)
        .map(|s| {
            let (m, flat) = (s / width, s % width);
            let name = match timeline.slot(flat) {
                Slot::E if m + 1 < k => Slot::I,
                name => name,
            };
            (name, Some(m as u32 + 1))
        })
        .collect();
    let compute = (0..n)
        .map(|s| {
            let (m, flat) = (s / width, s % width);
            if flat == timeline.end() && m + 1 < k {
                0.0
            } else {
                compute_us(profile, timeline, flat, |u| units[u].recompute)
            }
        })
        .collect();
    let communicators = MemoryBreakdown {
        communicators: communicator_bytes(profile, schedule),
        ..MemoryBreakdown::default()
    };
    let mut memory = vec![communicators; n];
    let mut keyed: Vec<Vec<(QueueKey, Entry)>> = vec![Vec::new(); n];
    let mut needs = vec![Vec::new(); n];
    let mut opens = vec![Vec::new(); n];
    for (unit, u) in units.iter().enumerate() {
        let (forward, backward) = (timeline.forward(unit), timeline.backward(unit));
        let (accumulate, keep) = (u.accumulation.accumulate, u.accumulation.keep);
        per_unit_memory(profile, schedule, step, unit, &mut memory);
        for op in u.ops() {
            let kind = op.window_kind();
            let window = timeline.window(unit, kind);
            for boundary in 0..k {
                let launches = if boundary == 0 || op == Op::GatherBackward {
                    schedule.launches(unit, op)
                } else {
                    schedule.inner_launches(unit, op)
                };
                if launches.is_empty() {
                    continue;
                }
                let instance = Instance { unit, op, boundary };
                opens[step.position(window, kind, boundary, 0)].push(id(instance));
                // What a block waits for across links (relaxed, DESIGN §3.11): a replica
                // AllReduce its ReduceScatter, the step's forward gather of a shard-group unit
                // its replica AllReduce (the optimizer step between); inside the step the
                // parameters do not change, so an inner gather waits for nothing.
                let after = match op {
                    Op::ReplicaAllReduce => Some(Op::ReduceScatter),
                    op if op.is_forward_gather() && u.shard_group.is_some() && boundary == 0 => {
                        Some(Op::ReplicaAllReduce)
                    }
                    _ => None,
                };
                let among = among(profile, u, op);
                let mut block = block_time(profile, unit, op, among);
                if boundary != 0 {
                    // Only the step's reduction is followed by the optimizer step.
                    block.update_us = 0.0;
                }
                let bytes = block_bytes(profile, unit, op);
                let entry = Entry {
                    unit,
                    op,
                    instance: id(instance),
                    link: among.link(profile),
                    after: after.map(|op| id(Instance { unit, op, boundary })),
                    time_us: block.total_us(),
                    load_us: interference.load_us(op, block),
                };
                let last = step.position(window, kind, boundary, window.len - 1);
                let reduced = boundary + k - 1;
                for l in launches {
                    let slot = step.position(window, kind, boundary, l.position);
                    let key = queue_key(op, l.position, window.len, unit);
                    keyed[slot].extend(std::iter::repeat_n((key, entry), l.blocks as usize));
                    let amount = bytes * f64::from(l.blocks);
                    match op {
                        Op::AllReduce | Op::ReplicaAllReduce => {}
                        Op::ReduceScatter if accumulate => {
                            // The accumulated gradient, from B^1_i to the launch slot.
                            add(
                                step,
                                &mut memory,
                                step.at(0, backward),
                                slot,
                                amount,
                                gradient,
                            );
                        }
                        Op::ReduceScatter => {
                            let from = step.at(reduced, backward);
                            add(step, &mut memory, from, slot, amount, gradient);
                        }
                        Op::Gather | Op::GatherForward | Op::GatherBackward => {
                            add(step, &mut memory, slot, last, amount, gathered);
                            let (from, to) = match op {
                                // ZeRO-2 with keep: gathered once, alive to the last B_i.
                                Op::Gather if keep => (0, k - 1),
                                _ => (boundary, boundary),
                            };
                            let (first_use, last_use) = match op {
                                Op::Gather => (step.at(from, forward), step.at(to, backward)),
                                Op::GatherForward => {
                                    (step.at(from, forward), step.at(from, forward))
                                }
                                _ => (step.at(from, backward), step.at(from, backward)),
                            };
                            add(step, &mut memory, first_use, last_use, amount, gathered);
                            if op == Op::GatherBackward && keep && boundary + 1 < k {
                                // Kept from B^m_i to the end of F^{m+1}_i.
                                let (after, until) = (
                                    step.at(boundary, backward) + 1,
                                    step.at(boundary + 1, forward),
                                );
                                add(step, &mut memory, after, until, amount, gathered);
                            }
                        }
                    }
                }
            }
        }
        let reduction = u.level.ops()[0];
        let replica_every =
            u.shard_group.is_some() && u.accumulation.replica_reduce == ReplicaReduce::Every;
        let writer = timeline.backward(first_gradient_writer(profile, unit));
        for m in 0..k {
            let needed = match u.level {
                Level::None if m == 0 => Some(Op::AllReduce),
                Level::Sdp if m == 0 || !keep => Some(Op::Gather),
                Level::Fsdp if m == 0 || !keep => Some(Op::GatherForward),
                _ => None,
            };
            let instance = |op, boundary| id(Instance { unit, op, boundary });
            if let Some(op) = needed {
                needs[step.at(m, forward)].push(instance(op, m));
            }
            if u.level == Level::Fsdp {
                needs[step.at(m, backward)].push(instance(Op::GatherBackward, m));
            }
            if m > 0 && !accumulate {
                // The gradient's first writer in micro-batch m prepares the buffer the previous
                // micro-batch's reduction reads and writes (DESIGN §6.10), and the shard its
                // replica AllReduce reduces in place.
                needs[step.at(m, writer)].push(instance(reduction, m));
                if replica_every {
                    needs[step.at(m, writer)].push(instance(Op::ReplicaAllReduce, m));
                }
            }
        }
    }
    let queue = in_canonical_order(keyed);
    StepInputs {
        labels,
        compute_us: compute,
        queue,
        comm_us: Vec::new(),
        link_comm_us: Vec::new(),
        load_us: Vec::new(),
        memory,
        needs,
        opens,
        instances: k * units.len() * Op::ALL.len(),
        host: None,
    }
    .with_totals()
}

/// A unit's memory that does not follow its launches: persistent state, saved activations and
/// workspaces of every micro-batch, and a tied lender's extensions (DESIGN §3.9, §3.10).
fn per_unit_memory(
    profile: &Profile,
    schedule: &Schedule,
    step: Unrolled,
    unit: usize,
    memory: &mut [MemoryBreakdown],
) {
    let (timeline, k) = (step.timeline, step.micro_batches);
    let u = &schedule.units()[unit];
    let p = &profile.units[unit];
    let (forward, backward) = (timeline.forward(unit), timeline.backward(unit));
    let persistent = persistent_bytes_over(profile, unit, u.level, u.shard_group);
    for m in memory.iter_mut() {
        m.persistent += persistent;
    }
    let saved = saved_bytes(profile, unit, Recompute::of(u));
    for m in 0..k {
        let (f, b) = (step.at(m, forward), step.at(m, backward));
        add(step, memory, f, b, saved, activation);
        if u.recompute {
            memory[b].activation += p.activation_bytes as f64;
        }
        memory[f].workspace += p.forward_workspace_bytes as f64;
        memory[b].workspace += p.backward_workspace_bytes as f64;
        if let Some(h) = u.secondary_group {
            // hpZ's secondary shard, from F^m_i to B^m_i (DESIGN §3.11).
            add(
                step,
                memory,
                f,
                b,
                secondary_shard_bytes(profile, unit, h),
                gathered,
            );
        }
    }
    let Some(borrower) = profile.borrower(unit) else {
        return;
    };
    let laid_out = profile.laid_out_params(unit) as f64;
    let borrower_backward = timeline.backward(borrower);
    let bytes = profile.bytes_per_param;
    for m in 0..k {
        if u.level == Level::Fsdp {
            // The forward's parameters stay until the borrower's backward: (F^m_i, B^m_j].
            let (after, until) = (step.at(m, forward) + 1, step.at(m, borrower_backward));
            add(
                step,
                memory,
                after,
                until,
                laid_out * bytes.param as f64,
                gathered,
            );
        }
        let accumulated_already = u.accumulation.accumulate && m > 0;
        if u.level != Level::None && !accumulated_already {
            // The full gradient is written from the borrower's backward: [B^m_j, B^m_i).
            let (from, before) = (step.at(m, borrower_backward), step.at(m, backward) - 1);
            add(
                step,
                memory,
                from,
                before,
                laid_out * bytes.grad as f64,
                gradient,
            );
        }
    }
}
