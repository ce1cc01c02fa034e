//! The executor (DESIGN §6): a compute stream and a communication stream per rank (two threads),
//! synchronised by events at the plan's points, walking the plan's slots for K steps.
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

use crate::backend::{Backend, Region};
use crate::event::Event;
use crate::layout::Layout;
use crate::mlp::MlpSpec;
use crate::{Error, Result};
use shardplan_scheduler::plan::Schedule;
use shardplan_scheduler::sim::Semantics;
use shardplan_scheduler::timeline::{Level, Op, Timeline};
use std::time::{Duration, Instant};

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub steps: usize,
    pub semantics: Semantics,
    /// Longest wait on any event before the run fails (a dead peer, a stuck stream).
    pub timeout: Duration,
    pub trace: bool,
}

/// The communication kinds of the executor (RS serves both sharded levels; FG is AG or AGF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    AllReduce,
    ReduceScatter,
    ForwardGather,
    BackwardGather,
}

impl Kind {
    fn of(op: Op) -> Kind {
        match op {
            Op::AllReduce => Kind::AllReduce,
            Op::ReduceScatter => Kind::ReduceScatter,
            Op::Gather | Op::GatherForward => Kind::ForwardGather,
            Op::GatherBackward => Kind::BackwardGather,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        ["AR", "RS", "AG", "AGB"][self.index()]
    }
}

/// One block on the communication stream's queue for a slot.
#[derive(Debug, Clone, Copy)]
struct Block {
    unit: usize,
    kind: Kind,
    index: usize,
    /// Data step = iteration + offset.
    offset: i64,
}

/// A wait of the compute stream before a slot: event (unit, kind) must reach `per_step`·(step +
/// `shift`) blocks, or (fences) the count of blocks launched before the slot.
#[derive(Debug, Clone, Copy)]
struct Need {
    unit: usize,
    kind: Kind,
    shift: i64,
}

/// One timed operation of the trace.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// 0 compute, 1 communication.
    pub stream: u8,
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

/// The static program: per slot its queue, the relaxed waits and the fences.
struct Program {
    slots: usize,
    queues: Vec<Vec<Block>>,
    needs: Vec<Vec<Need>>,
    /// Per slot, the units whose reductions must have completed as far as launched.
    fences: Vec<Vec<usize>>,
}

fn program(schedule: &Schedule, layout: &Layout) -> Program {
    let timeline: Timeline = schedule.timeline();
    let slots = timeline.slot_count();
    let mut queues = vec![Vec::new(); slots];
    for (s, queue) in schedule.queues().into_iter().enumerate() {
        for q in queue {
            let window = timeline.window(q.unit, q.op.window_kind());
            let launches = &schedule.units[q.unit].launches[&q.op];
            let pos = window.position(s).expect("validated");
            let first: u32 = launches
                .iter()
                .filter(|l| window.position(l.slot).expect("validated") < pos)
                .map(|l| l.blocks)
                .sum();
            let (f, b) = (timeline.forward(q.unit), timeline.backward(q.unit));
            let offset = match Kind::of(q.op) {
                Kind::AllReduce | Kind::ReduceScatter => {
                    if s > b {
                        0
                    } else {
                        -1
                    }
                }
                Kind::ForwardGather => {
                    if s < f {
                        0
                    } else {
                        1
                    }
                }
                Kind::BackwardGather => 0,
            };
            for k in 0..q.blocks {
                queues[s].push(Block {
                    unit: q.unit,
                    kind: Kind::of(q.op),
                    index: (first + k) as usize,
                    offset,
                });
            }
        }
    }
    let needs = (0..slots)
        .map(|s| match timeline.compute_unit(s) {
            None => vec![],
            Some(i) => match (schedule.units[i].level, s == timeline.forward(i)) {
                (Level::None, true) => vec![Need {
                    unit: i,
                    kind: Kind::AllReduce,
                    shift: 0,
                }],
                (Level::None, false) | (Level::Sdp, false) => vec![],
                (_, true) => vec![Need {
                    unit: i,
                    kind: Kind::ForwardGather,
                    shift: 1,
                }],
                (Level::Fsdp, false) => vec![Need {
                    unit: i,
                    kind: Kind::BackwardGather,
                    shift: 1,
                }],
            },
        })
        .collect();
    let fences = (0..slots)
        .map(|s| {
            layout
                .units
                .iter()
                .enumerate()
                .filter_map(|(u, ul)| {
                    let grad = ul.full_grad?;
                    let (_, req) = layout.regions.iter().find(|(r, _)| *r == grad)?;
                    let reused = !req.alive[s]
                        && layout
                            .regions
                            .iter()
                            .any(|(r, q)| q.alive[s] && r.overlaps(grad));
                    reused.then_some(u)
                })
                .collect()
        })
        .collect();
    Program {
        slots,
        queues,
        needs,
        fences,
    }
}

/// Runs `options.steps` steps of `spec` under `schedule` on `backend` (its arena already
/// allocated with `layout`) and returns what it measured.
pub fn run<B: Backend>(
    backend: &B,
    spec: &MlpSpec,
    schedule: &Schedule,
    layout: &Layout,
    options: &RunOptions,
) -> Result<RunReport> {
    let world = backend.world_size();
    let rank = backend.rank();
    let steps = options.steps;
    let p = program(schedule, layout);
    let total = (steps + 2) * p.slots;
    let kinds = 4;
    let done: Vec<Event> = (0..layout.units.len() * kinds)
        .map(|_| Event::new())
        .collect();
    let event = |unit: usize, kind: Kind| &done[unit * kinds + kind.index()];
    let (slot_started, comm_done) = (Event::new(), Event::new());
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
    let teacher = spec.teacher();
    let mut x = vec![0.0f32; layout.rows * spec.input];
    let dl = *spec.widths.last().expect("validated");
    let mut y = vec![0.0f32; layout.rows * dl];
    let scale = 1.0 / (world * layout.rows * dl) as f32;
    let mut losses = vec![0.0f32; steps];
    let mut step_start = vec![Instant::now(); steps + 1];
    let span_capacity = if options.trace {
        total * 4 + p.queues.iter().map(Vec::len).sum::<usize>() * (steps + 2)
    } else {
        0
    };
    let mut compute_spans: Vec<Span> = Vec::with_capacity(span_capacity);
    let origin = Instant::now();
    let timeout = options.timeout;
    let l = layout.units.len();

    let comm_spans = std::thread::scope(|scope| -> Result<Vec<Span>> {
        let comm = scope.spawn(|| -> Result<Vec<Span>> {
            let mut spans = Vec::with_capacity(span_capacity);
            for g in 0..total {
                let (iter, s) = ((g / p.slots) as i64 - 1, g % p.slots);
                slot_started.wait(g as u64 + 1, timeout, &|| {
                    format!("the compute stream reaching global slot {g}")
                })?;
                for b in &p.queues[s] {
                    let d = iter + b.offset;
                    if d < 0 || d as usize >= steps {
                        continue;
                    }
                    let u = &layout.units[b.unit];
                    let start = origin.elapsed().as_secs_f64() * 1e6;
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
                        backend.adam(
                            u.params,
                            u.grads,
                            u.adam_m,
                            u.adam_v,
                            d as u32 + 1,
                            spec.learning_rate,
                        );
                    }
                    if options.trace {
                        spans.push(Span {
                            stream: 1,
                            what: b.kind.name(),
                            unit: b.unit,
                            step: d as usize,
                            start_us: start,
                            end_us: origin.elapsed().as_secs_f64() * 1e6,
                        });
                    }
                    event(b.unit, b.kind).signal(1);
                }
                comm_done.signal(1);
            }
            Ok(spans)
        });

        let mut compute = || -> Result<()> {
            let timeline = schedule.timeline();
            for (g, fences) in fence_targets.iter().enumerate() {
                let (iter, s) = ((g / p.slots) as i64 - 1, g % p.slots);
                let computing = iter >= 0 && (iter as usize) < steps;
                match options.semantics {
                    Semantics::Strict => comm_done.wait(g as u64, timeout, &|| {
                        format!("communication of global slot {}", g.saturating_sub(1))
                    })?,
                    Semantics::Relaxed if computing => {
                        for n in &p.needs[s] {
                            let target = (iter + n.shift).max(0) as u64 * blocks(n.unit);
                            event(n.unit, n.kind).wait(target, timeout, &|| {
                                format!(
                                    "{} of {} for step {iter}",
                                    n.kind.name(),
                                    spec.unit_name(n.unit)
                                )
                            })?;
                        }
                        for &(u, target) in fences {
                            event(u, Kind::ReduceScatter).wait(target, timeout, &|| {
                                format!("RS of {} (buffer reuse)", spec.unit_name(u))
                            })?;
                        }
                    }
                    Semantics::Relaxed => {}
                }
                if s == 0 && computing {
                    step_start[iter as usize] = Instant::now();
                }
                if iter as usize == steps && s == 0 {
                    step_start[steps] = Instant::now();
                }
                slot_started.signal(1);
                if !computing {
                    continue;
                }
                let step = iter as usize;
                let Some(i) = timeline.compute_unit(s) else {
                    continue;
                };
                let u = &layout.units[i];
                let start = origin.elapsed().as_secs_f64() * 1e6;
                let input = if i == 0 {
                    layout.input
                } else {
                    layout.units[i - 1].output
                };
                let forward = s == timeline.forward(i);
                if forward {
                    if i == 0 {
                        spec.batch(
                            step,
                            rank * layout.rows,
                            layout.rows,
                            &teacher,
                            &mut x,
                            &mut y,
                        );
                        backend.upload(layout.input, &x);
                    }
                    if i + 1 == l {
                        backend.upload(layout.targets, &y);
                    }
                    backend.linear_forward(
                        input,
                        u.forward_params(),
                        u.output,
                        layout.rows,
                        u.dims,
                        u.relu,
                    );
                } else {
                    if u.recompute {
                        backend.linear_forward(
                            input,
                            u.backward_params(),
                            u.output,
                            layout.rows,
                            u.dims,
                            u.relu,
                        );
                    }
                    let grad_out = if i + 1 == l {
                        losses[step] =
                            backend.mse_grad(u.output, layout.targets, layout.loss_grad, scale);
                        layout.loss_grad
                    } else {
                        layout.units[i + 1]
                            .grad_in
                            .expect("units after the first pass an input gradient")
                    };
                    backend.linear_backward(
                        input,
                        u.backward_params(),
                        u.output,
                        grad_out,
                        u.backward_grads(),
                        u.grad_in,
                        layout.rows,
                        u.dims,
                        u.relu,
                    );
                }
                if options.trace {
                    compute_spans.push(Span {
                        stream: 0,
                        what: if forward { "F" } else { "B" },
                        unit: i,
                        step,
                        start_us: start,
                        end_us: origin.elapsed().as_secs_f64() * 1e6,
                    });
                }
            }
            Ok(())
        };
        let computed = compute();
        if let Err(e) = computed {
            // The communication thread may be blocked in a collective with a dead peer: report
            // and leave without joining it.
            eprintln!("error: rank {rank}: {e}");
            std::process::exit(1);
        }
        comm.join()
            .map_err(|_| Error::Backend("the communication thread panicked".into()))?
    })?;
    backend.all_reduce_host(&mut losses)?;
    let step_us = (0..steps)
        .map(|k| (step_start[k + 1] - step_start[k]).as_secs_f64() * 1e6)
        .collect();
    let kernel_us: f64 = compute_spans.iter().map(|s| s.end_us - s.start_us).sum();
    let mut spans = compute_spans;
    spans.extend(comm_spans);
    let wall_us = (step_start[steps] - step_start[0]).as_secs_f64() * 1e6;
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
pub fn initialise<B: Backend>(backend: &B, spec: &MlpSpec, layout: &Layout) {
    let (rank, world) = (backend.rank(), backend.world_size());
    for (i, u) in layout.units.iter().enumerate() {
        let full = spec.initial_params(i, u.blocks * u.block_elements);
        if u.level == Level::None {
            backend.upload(u.params, &full);
        } else {
            let shard = u.block_elements / world;
            for j in 0..u.blocks {
                let start = j * u.block_elements + rank * shard;
                backend.upload(u.params.part(j, u.blocks), &full[start..start + shard]);
            }
        }
    }
}

/// The trained parameters of every unit (Ψ entries), gathered from the shards (collective: every
/// rank must call it).
pub fn final_params<B: Backend>(
    backend: &B,
    spec: &MlpSpec,
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
            backend.download(full, &mut out);
            out.truncate(spec.params(i));
            Ok(out)
        })
        .collect()
}
