//! The executor (DESIGN §6): a compute stream and a communication stream per rank, each driven by
//! a host thread, synchronised by events at the plan's points, walking the plan's slots for K
//! steps.
//!
//! The timeline is cyclic, so the walk covers global slots g = 0 … (K+2)·S−1: iteration −1 (the
//! prologue: only the gathers that the plan launches in the previous iteration's backward for
//! step 0), steps 0 … K−1, and iteration K (the epilogue: only the reductions of step K−1 that the
//! plan launches in the next iteration's forward). Each launch belongs to a data step: a
//! reduction launched before F_i serves the previous step, a forward gather launched after B_i the
//! next.
//!
//! Communication stream, per global slot: wait until compute has reached the slot, then run its
//! blocks in plan order; after a unit's last reduction block, the optimizer step on its shard (or
//! the whole unit when replicated); count every block on the (unit, op) event.
//! Compute stream, per global slot: strict — wait until all communication of earlier slots is
//! done; relaxed — wait only for the blocks this slot needs (its unit's gathers; a replicated
//! unit's previous AllReduce and update before its forward) and for reductions whose freed
//! gradient buffer the arena reuses for a buffer alive now. Then signal the slot and compute.
//!
//! Every signal carries the backend's mark of the signalling stream, and every wait ends with the
//! waiting stream waiting on that mark: on the CPU (synchronous operations) the host wait is the
//! whole wait; on a GPU the host threads only enqueue, and the device stream waits on a CUDA
//! event. Step times and trace spans are measured between marks.

mod program;

use crate::backend::{Backend, Region, Stream};
use crate::event::Event;
use crate::layout::Layout;
use crate::workload::{Pass, Train, Workload};
use crate::{Error, Result};
use program::{Kind, program};
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::Semantics;
use shardplan_scheduler::timeline::Level;
use std::time::Duration;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub steps: usize,
    pub semantics: Semantics,
    /// Longest wait on any event before the run fails (a dead peer, a stuck stream).
    pub timeout: Duration,
    pub trace: bool,
}

/// One timed operation of the trace.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub stream: Stream,
    pub what: &'static str,
    pub unit: usize,
    pub step: usize,
    pub start_us: f64,
    pub end_us: f64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Global mean-squared-error loss per step.
    pub losses: Vec<f32>,
    /// Wall time from the start of each step's first slot to the next step's.
    pub step_us: Vec<f64>,
    pub arena_bytes: u64,
    pub live_peak_bytes: u64,
    pub spans: Vec<Span>,
    /// Mean time per global slot the compute stream spent outside kernels and waits.
    pub executor_overhead_us_per_slot: f64,
}

/// A span while the run goes on: its marks are converted to µs at the end.
struct PendingSpan<M> {
    stream: Stream,
    what: &'static str,
    unit: usize,
    step: usize,
    start: M,
    end: M,
}

/// Waits for the `target`-th signal of `event`, then makes `stream` wait on its mark.
fn wait_for<B: Backend>(
    backend: &B,
    stream: Stream,
    event: &Event<B::Mark>,
    target: u64,
    timeout: Duration,
    what: &dyn Fn() -> String,
) -> Result<()> {
    match event.wait(target, timeout, what)? {
        Some(mark) => backend.wait_mark(stream, &mark),
        None => Ok(()),
    }
}

/// Runs `options.steps` steps of `workload` under `schedule` on `backend` (its arena already
/// allocated with `layout` and at least `steps` loss slots) and returns what it measured.
pub fn run<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    schedule: &Schedule,
    layout: &Layout,
    options: &RunOptions,
) -> Result<RunReport> {
    let rank = backend.rank();
    let steps = options.steps;
    let p = program(schedule, layout);
    let total = (steps + 2) * p.slots;
    let kinds = 4;
    let done: Vec<Event<B::Mark>> = (0..layout.units.len() * kinds)
        .map(|_| Event::new())
        .collect();
    let event = |unit: usize, kind: Kind| &done[unit * kinds + kind.index()];
    let (slot_started, comm_done) = (Event::<B::Mark>::new(), Event::<B::Mark>::new());
    let blocks = |u: usize| layout.units[u].blocks as u64;
    // Reductions launched before each global slot, per unit (fence targets), counted up front.
    let mut launched_before = vec![0u64; layout.units.len()];
    let mut fence_targets: Vec<Vec<(usize, u64)>> = Vec::with_capacity(total);
    for g in 0..total {
        let (iter, s) = ((g / p.slots) as i64 - 1, g % p.slots);
        fence_targets.push(
            p.fences[s]
                .iter()
                .map(|&u| (u, launched_before[u]))
                .collect(),
        );
        for b in &p.queues[s] {
            let d = iter + b.offset;
            if matches!(b.kind, Kind::ReduceScatter) && d >= 0 && (d as usize) < steps {
                launched_before[b.unit] += 1;
            }
        }
    }
    let span_capacity = if options.trace {
        total * 4 + p.queues.iter().map(Vec::len).sum::<usize>() * (steps + 2)
    } else {
        0
    };
    let timeout = options.timeout;
    backend.synchronize()?;
    let origin = backend.mark(Stream::Compute)?;
    let mut step_marks: Vec<Option<B::Mark>> = vec![None; steps + 1];
    let mut compute_spans: Vec<PendingSpan<B::Mark>> = Vec::with_capacity(span_capacity);

    let comm_spans = std::thread::scope(|scope| -> Result<Vec<PendingSpan<B::Mark>>> {
        let comm = scope.spawn(|| -> Result<Vec<PendingSpan<B::Mark>>> {
            let mut spans = Vec::with_capacity(span_capacity);
            let stream = Stream::Communication;
            for g in 0..total {
                let (iter, s) = ((g / p.slots) as i64 - 1, g % p.slots);
                wait_for(
                    backend,
                    stream,
                    &slot_started,
                    g as u64 + 1,
                    timeout,
                    &|| format!("the compute stream reaching global slot {g}"),
                )?;
                for b in &p.queues[s] {
                    let d = iter + b.offset;
                    if d < 0 || d as usize >= steps {
                        continue;
                    }
                    let u = &layout.units[b.unit];
                    let start = if options.trace {
                        Some(backend.mark(stream)?)
                    } else {
                        None
                    };
                    let part = |r: Region| r.part(b.index, u.blocks);
                    match b.kind {
                        Kind::AllReduce => backend.all_reduce(part(u.grads))?,
                        Kind::ReduceScatter => backend
                            .reduce_scatter(part(u.full_grad.expect("sharded")), part(u.grads))?,
                        Kind::ForwardGather => backend.all_gather(
                            part(u.params),
                            part(u.gathered_forward.expect("sharded")),
                        )?,
                        Kind::BackwardGather => backend
                            .all_gather(part(u.params), part(u.gathered_backward.expect("fsdp")))?,
                    }
                    let last_reduction = matches!(b.kind, Kind::AllReduce | Kind::ReduceScatter)
                        && b.index + 1 == u.blocks;
                    if last_reduction {
                        workload.optimize(backend, layout, b.unit, d as u32 + 1)?;
                    }
                    let end = backend.mark(stream)?;
                    if let Some(start) = start {
                        spans.push(PendingSpan {
                            stream: Stream::Communication,
                            what: b.kind.name(),
                            unit: b.unit,
                            step: d as usize,
                            start,
                            end: end.clone(),
                        });
                    }
                    event(b.unit, b.kind).signal(end);
                }
                comm_done.signal(backend.mark(stream)?);
            }
            Ok(spans)
        });

        let mut compute = || -> Result<()> {
            let stream = Stream::Compute;
            let timeline = schedule.timeline();
            for (g, fences) in fence_targets.iter().enumerate() {
                let (iter, s) = ((g / p.slots) as i64 - 1, g % p.slots);
                let computing = iter >= 0 && (iter as usize) < steps;
                match options.semantics {
                    Semantics::Strict => {
                        wait_for(backend, stream, &comm_done, g as u64, timeout, &|| {
                            format!("communication of global slot {}", g.saturating_sub(1))
                        })?
                    }
                    Semantics::Relaxed if computing => {
                        for n in &p.needs[s] {
                            let target = (iter + n.shift).max(0) as u64 * blocks(n.unit);
                            wait_for(
                                backend,
                                stream,
                                event(n.unit, n.kind),
                                target,
                                timeout,
                                &|| {
                                    format!(
                                        "{} of {} for step {iter}",
                                        n.kind.name(),
                                        workload.unit_name(n.unit)
                                    )
                                },
                            )?;
                        }
                        for &(u, target) in fences {
                            let reductions = event(u, Kind::ReduceScatter);
                            wait_for(backend, stream, reductions, target, timeout, &|| {
                                format!("RS of {} (buffer reuse)", workload.unit_name(u))
                            })?;
                        }
                    }
                    Semantics::Relaxed => {}
                }
                let started = backend.mark(stream)?;
                if s == 0 && iter >= 0 && iter as usize <= steps {
                    step_marks[iter as usize] = Some(started.clone());
                }
                slot_started.signal(started);
                if !computing {
                    continue;
                }
                let step = iter as usize;
                let Some(i) = timeline.compute_unit(s) else {
                    continue;
                };
                let start = if options.trace {
                    Some(backend.mark(stream)?)
                } else {
                    None
                };
                let forward = s == timeline.forward(i);
                if forward {
                    workload.forward(backend, layout, i, step, Pass::Forward)?;
                } else {
                    if layout.units[i].recompute {
                        workload.forward(backend, layout, i, step, Pass::Recompute)?;
                    }
                    workload.backward(backend, layout, i, step)?;
                }
                if let Some(start) = start {
                    compute_spans.push(PendingSpan {
                        stream: Stream::Compute,
                        what: if forward { "F" } else { "B" },
                        unit: i,
                        step,
                        start,
                        end: backend.mark(stream)?,
                    });
                }
            }
            Ok(())
        };
        if let Err(e) = compute() {
            // The communication thread may be blocked in a collective with a dead peer: report
            // and leave without joining it.
            eprintln!("error: rank {rank}: {e}");
            std::process::exit(1);
        }
        comm.join()
            .map_err(|_| Error::Backend("the communication thread panicked".into()))?
    })?;
    backend.synchronize()?;
    let mut losses = backend.losses(steps)?;
    backend.all_reduce_host(&mut losses)?;
    let step_marks: Vec<B::Mark> = step_marks
        .into_iter()
        .map(|m| m.expect("every step's first slot was reached"))
        .collect();
    let step_us = step_marks
        .windows(2)
        .map(|w| backend.elapsed_us(&w[0], &w[1]))
        .collect::<Result<Vec<f64>>>()?;
    let mut spans = Vec::with_capacity(compute_spans.len() + comm_spans.len());
    for s in compute_spans.into_iter().chain(comm_spans) {
        spans.push(Span {
            stream: s.stream,
            what: s.what,
            unit: s.unit,
            step: s.step,
            start_us: backend.elapsed_us(&origin, &s.start)?,
            end_us: backend.elapsed_us(&origin, &s.end)?,
        });
    }
    let kernel_us: f64 = spans
        .iter()
        .filter(|s| s.stream == Stream::Compute)
        .map(|s| s.end_us - s.start_us)
        .sum();
    let wall_us = backend.elapsed_us(&step_marks[0], &step_marks[steps])?;
    Ok(RunReport {
        losses,
        step_us,
        arena_bytes: layout.arena.size_bytes,
        live_peak_bytes: layout.arena.live_peak_bytes,
        executor_overhead_us_per_slot: if options.trace {
            ((wall_us - kernel_us) / (steps * p.slots) as f64).max(0.0)
        } else {
            f64::NAN
        },
        spans,
    })
}

/// Initialises every rank's persistent state: full parameters for replicated units, this rank's
/// shard of every block for sharded ones (gradients and Adam state start at zero).
pub fn initialise<B: Backend>(backend: &B, workload: &dyn Workload, layout: &Layout) -> Result<()> {
    let (rank, world) = (backend.rank(), backend.world_size());
    for (i, u) in layout.units.iter().enumerate() {
        let mut full = workload.initial_params(i)?;
        full.resize(u.blocks * u.block_elements, 0.0);
        if u.level == Level::None {
            backend.upload(u.params, &full)?;
        } else {
            let shard = u.block_elements / world;
            for j in 0..u.blocks {
                let start = j * u.block_elements + rank * shard;
                backend.upload(u.params.part(j, u.blocks), &full[start..start + shard])?;
            }
        }
    }
    Ok(())
}

/// The trained parameters of every unit (Ψ entries), gathered from the shards (collective: every
/// rank must call it).
pub fn final_params<B: Backend>(
    backend: &B,
    workload: &dyn Workload,
    layout: &Layout,
) -> Result<Vec<Vec<f32>>> {
    layout
        .units
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let full = match u.gathered_forward {
                None => u.params,
                Some(gathered) => {
                    for j in 0..u.blocks {
                        backend
                            .all_gather(u.params.part(j, u.blocks), gathered.part(j, u.blocks))?;
                    }
                    gathered
                }
            };
            let mut out = vec![0.0; full.len];
            backend.download(full, &mut out)?;
            out.truncate(workload.params(i));
            Ok(out)
        })
        .collect()
}
