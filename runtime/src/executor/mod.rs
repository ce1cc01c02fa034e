//! The executor (DESIGN §6): a compute stream and a communication stream per rank, each driven by
//! a host thread, synchronised by events at the plan's points, walking the plan's slots for the
//! run's steps. A step of K micro-batches is walked as the simulator unrolls it, K·(2L + 1) slots
//! (DESIGN §6.10); S below is the step's slot count.
//!
//! The timeline is cyclic, so the walk covers global slots g = 0 … (n+2)·S−1 for n steps:
//! iteration −1 (the prologue: only the gathers that the plan launches in the previous
//! iteration's backward for step 0), steps 0 … n−1, and iteration n (the epilogue: only the
//! reductions of step n−1 that the plan launches in the next iteration's forward). Each launch
//! belongs to a data step: a reduction launched before F_i serves the previous step, a forward
//! gather launched after B_i the next. Everything done for data step d reads d's layout
//! (`Placement::for_step`: the same for every step, or alternating by parity, DESIGN §6.5).
//!
//! Communication stream, per global slot: wait until compute has reached the slot, then run its
//! blocks in plan order; after a unit's last block of the step's reduction, the optimizer step on
//! its shard (or the whole unit when replicated); count every block on the (unit, op) event.
//! Compute stream, per global slot: strict — wait until all communication of earlier slots is
//! done; relaxed — wait only for the blocks this slot needs (its unit's gathers; a replicated
//! unit's previous AllReduce and update before its forward) and for reductions whose freed
//! gradient buffer the arena reuses for a buffer alive now. Then signal the slot and compute (a
//! backward after preparing the gradients it writes first, `gradients`).
//!
//! An offloading plan (DESIGN §6.12) adds two host threads: the copy thread, running the copies
//! between the device and the host arena in issue order, and the host thread, running the
//! offloaded units' optimizer steps ([`host`]).
//!
//! Every signal carries the backend's mark of the signalling stream, and every wait ends with the
//! waiting stream waiting on that mark: on the CPU (synchronous operations) the host wait is the
//! whole wait; on a GPU the host threads only enqueue, and the device stream waits on a CUDA
//! event. Step times and trace spans are measured between marks.

mod communicate;
mod host;
mod kind;
mod program;
mod state;
mod watchdog;

pub use program::groups;
pub use state::{final_params, initialise};

use crate::backend::{Backend, Stream, StreamWork, on_both_streams};
use crate::event::Event;
use crate::gradients::{GradientStart, first_written_by};
use crate::layout::{Layout, Placement};
use crate::train::Train;
use crate::workload::Pass;
use crate::{Error, Result};
use host::HostSide;
use kind::{Kind, PerUnitKind};
use program::{LinkChannels, Program, program};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::Semantics;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use watchdog::Watch;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub steps: usize,
    /// The index of the first of these steps in the whole training (a run continued from a
    /// checkpoint): it picks the data and counts Adam's steps; losses are this run's steps'.
    pub first_step: usize,
    pub semantics: Semantics,
    /// Longest wait on any event before the run fails (a dead peer, a stuck stream).
    pub timeout: Duration,
    pub trace: bool,
    /// Told each step's index as the compute stream finishes it (issues it, on a GPU).
    pub on_step: Option<OnStep>,
    /// Told of a collective that did not complete within `timeout` (a stopped or hung peer),
    /// by a watchdog thread, before the job ends ([`crate::launch::end_job`]); `None`: no
    /// watchdog (one rank, benches), the streams' own waits still time out.
    pub on_stall: Option<OnStall>,
}

/// The report of a stalled collective: called once, from the watchdog's thread, with the error
/// naming the collective and the peers it waited for; the job ends when it returns.
#[derive(Clone)]
pub struct OnStall(pub Arc<dyn Fn(&Error) + Send + Sync>);

impl std::fmt::Debug for OnStall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnStall(..)")
    }
}

/// A progress callback of [`RunOptions`], called from the compute stream's thread.
#[derive(Clone)]
pub struct OnStep(pub Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for OnStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnStep(..)")
    }
}

/// One timed operation of the trace.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub stream: Stream,
    /// The communication channel (0 on the compute stream; 1 for a plan's second link).
    pub channel: usize,
    pub what: &'static str,
    pub unit: usize,
    pub step: usize,
    /// The micro-batch (0-based) the operation serves.
    pub micro_batch: usize,
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
    /// 1, or 2 where even and odd steps alternate layouts of the arena (DESIGN §6.5).
    pub arena_layouts: usize,
    /// The host arena: an offloading plan's host state (DESIGN §6.12); 0 without offload.
    pub host_arena_bytes: u64,
    pub spans: Vec<Span>,
    /// Mean time per global slot the compute stream spent outside kernels and waits; measured
    /// only where the run is traced (its spans time the kernels), none otherwise.
    pub executor_overhead_us_per_slot: Option<f64>,
}

impl RunReport {
    /// The report of no steps on `placement` (a run resumed where its training ends).
    pub fn empty(placement: &Placement) -> RunReport {
        RunReport {
            losses: Vec::new(),
            step_us: Vec::new(),
            arena_bytes: placement.arena.size_bytes,
            live_peak_bytes: placement.arena.live_peak_bytes,
            arena_layouts: placement.parities(),
            host_arena_bytes: placement.host_arena_bytes,
            spans: Vec::new(),
            executor_overhead_us_per_slot: None,
        }
    }

    /// This run followed by `next`, a run of the steps after it on the same layout: losses and
    /// step times joined, spans shifted to start where this run's last step ended.
    pub fn followed_by(mut self, next: RunReport) -> RunReport {
        let offset = self.spans.iter().map(|s| s.end_us).fold(0.0, f64::max);
        self.spans.extend(next.spans.into_iter().map(|s| Span {
            start_us: s.start_us + offset,
            end_us: s.end_us + offset,
            ..s
        }));
        let (a, b) = (self.losses.len() as f64, next.losses.len() as f64);
        self.executor_overhead_us_per_slot = if a > 0.0 {
            self.executor_overhead_us_per_slot
                .zip(next.executor_overhead_us_per_slot)
                .map(|(mine, theirs)| (mine * a + theirs * b) / (a + b))
        } else {
            next.executor_overhead_us_per_slot
        };
        self.losses.extend(next.losses);
        self.step_us.extend(next.step_us);
        self
    }
}

/// A span while the run goes on: its marks are converted to µs at the end.
struct PendingSpan<M> {
    stream: Stream,
    channel: usize,
    what: &'static str,
    unit: usize,
    step: usize,
    micro_batch: usize,
    start: M,
    end: M,
}

/// Runs `options.steps` steps of `workload` under `schedule` on `backend` (its arena already
/// allocated for `placement` and at least `first_step + steps` loss slots) and returns what it
/// measured.
///
/// Phases: the static program and the fence targets; the two streams walking the global slots
/// (the communication stream on its own thread); the losses, step times and spans read back.
/// When one stream fails, the events the other waits on are abandoned, so it stops at its next
/// wait and the first failure is the one reported.
pub fn run<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    profile: &Profile,
    schedule: &Schedule,
    placement: &Placement,
    options: &RunOptions,
) -> Result<RunReport> {
    let walk = Walk::new(backend, workload, profile, schedule, placement, options);
    if let Some(host) = &walk.host {
        host.check_order(&walk.program, schedule)?;
    }
    backend.synchronize()?;
    let origin = backend.mark(Stream::Compute)?;
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        if let Some(on_stall) = &options.on_stall {
            scope.spawn(|| walk.watch_over(&finished, on_stall));
        }
        let walked = walk.both_streams(&origin);
        finished.store(true, Ordering::Release);
        walked
    })
}

impl<B: Backend, W: Train<B>> Walk<'_, B, W> {
    /// Both streams on a thread each (and an offloading plan's copy and host threads), then the
    /// report (its wait for the device included, which the watchdog still watches).
    fn both_streams(&self, origin: &B::Mark) -> Result<RunReport> {
        let (computed, comm_spans) = match &self.host {
            None => self.streams()?,
            Some(host) => self.with_host(host)?,
        };
        self.report(origin, computed, comm_spans)
    }

    /// The two streams' threads; the first failure.
    fn streams(&self) -> Result<Streamed<B::Mark>> {
        let abandon_host = || {
            if let Some(host) = &self.host {
                host.abandon();
            }
        };
        let (computed, communicated) = on_both_streams(
            self.backend,
            StreamWork {
                work: || self.compute(),
                on_failure: || {
                    self.slot_started.abandon();
                    abandon_host();
                },
            },
            StreamWork {
                work: || self.communicate(),
                on_failure: || {
                    self.abandon_compute_waits();
                    abandon_host();
                },
            },
        );
        match (computed, communicated) {
            (Ok(c), Ok(spans)) => Ok((c, spans)),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            (Err(Error::Abandoned(_)), Err(e)) | (Err(e), Err(_)) => Err(e),
        }
    }
}

/// What the two streams recorded: the compute stream's, the communication stream's spans.
type Streamed<M> = (Computed<M>, Vec<PendingSpan<M>>);

/// What the compute stream recorded.
struct Computed<M> {
    /// The mark at the start of each step's first slot, and after the last step.
    step_marks: Vec<M>,
    spans: Vec<PendingSpan<M>>,
}

/// Everything both streams share during a run.
struct Walk<'a, B: Backend, W> {
    backend: &'a B,
    workload: &'a W,
    schedule: &'a Schedule,
    placement: &'a Placement,
    options: &'a RunOptions,
    program: Program,
    /// Global slots walked: (steps + 2)·S.
    total: usize,
    /// Per (unit, kind), one signal per block done.
    done: PerUnitKind<Event<B::Mark>>,
    /// One signal per global slot the compute stream reached.
    slot_started: Event<B::Mark>,
    /// Per communication channel, one signal per global slot whose blocks on it are done.
    comm_done: Vec<Event<B::Mark>>,
    /// The collectives the communication stream launched, for the watchdog.
    watch: Watch<B::Mark>,
    /// An offloading plan's copies and host steps (DESIGN §6.12).
    host: Option<HostSide<B::Mark>>,
}

impl<'a, B: Backend, W: Train<B>> Walk<'a, B, W> {
    fn new(
        backend: &'a B,
        workload: &'a W,
        profile: &Profile,
        schedule: &'a Schedule,
        placement: &'a Placement,
        options: &'a RunOptions,
    ) -> Self {
        let units = placement.for_step(0).units.len();
        let first_written = (0..units).map(|u| first_written_by(workload, u)).collect();
        let link_channels = if backend.concurrent_communicators() {
            LinkChannels::Separate
        } else {
            LinkChannels::Shared
        };
        let program = program(schedule, placement, first_written, profile, link_channels);
        let event = || Event::spinning(backend.host_wait_spin());
        Walk {
            total: (options.steps + 2) * program.slots,
            done: PerUnitKind::new(units, |_, _| event()),
            slot_started: event(),
            comm_done: program.channels.iter().map(|_| event()).collect(),
            watch: Watch::new(program.channels.len()),
            host: HostSide::of(schedule),
            program,
            backend,
            workload,
            schedule,
            placement,
            options,
        }
    }

    /// The layout of data step `step`.
    fn layout(&self, step: usize) -> &'a Layout {
        self.placement.for_step(step)
    }

    fn event(&self, unit: usize, kind: Kind) -> &Event<B::Mark> {
        &self.done[(unit, kind)]
    }

    /// Waits for the `target`-th signal of `event`, then makes `stream` wait on its mark.
    fn wait(
        &self,
        stream: Stream,
        event: &Event<B::Mark>,
        target: u64,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        match event.wait(target, self.options.timeout, what)? {
            Some(mark) => self.backend.wait_mark(stream, &mark),
            None => Ok(()),
        }
    }

    fn mark_if_tracing(&self, stream: Stream) -> Result<Option<B::Mark>> {
        if self.options.trace {
            self.backend.mark(stream).map(Some)
        } else {
            Ok(None)
        }
    }

    fn span_capacity(&self) -> usize {
        if !self.options.trace {
            return 0;
        }
        let blocks: usize = self.program.queues.iter().map(Vec::len).sum();
        self.total * 4 + blocks * (self.options.steps + 2)
    }

    /// The watchdog's thread: until `finished`, a collective in flight longer than the timeout,
    /// or a failure the communicator reports on its own, goes to `on_stall` and ends the job.
    fn watch_over(&self, finished: &AtomicBool, on_stall: &OnStall) {
        self.watch
            .guard(self.options.timeout, finished, self, &*on_stall.0);
    }

    /// The communication stream failed: its signals will not come, so every wait of the compute
    /// stream on them fails at once.
    fn abandon_compute_waits(&self) {
        self.comm_done.iter().for_each(Event::abandon);
        self.done.iter().for_each(Event::abandon);
    }

    /// The compute stream's waits before global slot g (DESIGN §6.3): strict, all communication
    /// of earlier slots; relaxed, the blocks the slot needs and the buffer-reuse fences.
    fn wait_before_slot(&self, g: usize, fences: &[(usize, u64)]) -> Result<()> {
        let stream = Stream::Compute;
        let (iter, s) = self.program.split(g);
        match (self.options.semantics, iter.below(self.options.steps)) {
            (Semantics::Strict, _) => self.comm_done.iter().try_for_each(|done| {
                self.wait(stream, done, g as u64, &|| {
                    format!("communication of global slot {}", g.saturating_sub(1))
                })
            }),
            (Semantics::Relaxed, Some(step)) => {
                for n in &self.program.needs[s] {
                    let per_step = self.program.per_step[(n.unit, n.kind)];
                    let target = step as u64 * per_step + n.through;
                    self.wait(stream, self.event(n.unit, n.kind), target, &|| {
                        format!(
                            "{} of {} for step {step}",
                            n.kind.name(),
                            self.workload.unit_name(n.unit)
                        )
                    })?;
                }
                for &(u, target) in fences {
                    let kind = self.program.fence_kinds[u];
                    let reductions = self.event(u, kind);
                    self.wait(stream, reductions, target, &|| {
                        let name = self.workload.unit_name(u);
                        format!("{} of {name} (buffer reuse)", kind.name())
                    })?;
                }
                Ok(())
            }
            (Semantics::Relaxed, None) => Ok(()),
        }
    }

    /// The compute stream: per global slot, its waits, the slot's signal, then the unit's
    /// forward, or its recompute and backward.
    fn compute(&self) -> Result<Computed<B::Mark>> {
        let (backend, stream, steps) = (self.backend, Stream::Compute, self.options.steps);
        let timeline = self.schedule.timeline();
        let mut step_marks = Vec::with_capacity(steps + 1);
        let mut spans = Vec::with_capacity(self.span_capacity());
        let units = self.placement.for_step(0).units.len();
        let mut fences = self.program.fence_walk(steps, units);
        for g in 0..self.total {
            self.wait_before_slot(g, &fences.next_slot())?;
            let (iter, s) = self.program.split(g);
            self.wait_for_host_steps(iter.below(steps), s)?;
            let started = backend.mark(stream)?;
            // Iterations 0 … steps begin at the step marks; each after the first ends a step.
            if let (0, Some(begun)) = (s, iter.below(steps + 1)) {
                step_marks.push(started.clone());
                if let (Some(on_step), Some(done)) = (&self.options.on_step, begun.checked_sub(1)) {
                    (on_step.0)(done);
                }
            }
            self.slot_started.signal(started);
            let (m, flat) = self.program.unrolled.split(s);
            let Some(i) = timeline.compute_unit(flat) else {
                continue;
            };
            let Some(step) = iter.below(steps) else {
                continue;
            };
            let layout = self.placement.for_micro_batch(step, m);
            let data = (self.options.first_step + step) * self.program.unrolled.micro_batches + m;
            let start = self.mark_if_tracing(stream)?;
            let forward = flat == timeline.forward(i);
            if forward {
                self.workload
                    .forward(backend, layout, i, data, Pass::Forward)?;
                for (from, to) in layout.units[i].secondary_copies(backend.rank()) {
                    backend.copy(from, to)?;
                }
            } else {
                if layout.units[i].recompute {
                    self.workload
                        .forward(backend, layout, i, data, Pass::Recompute)?;
                }
                self.prepare_gradients(layout, i, m)?;
                self.workload.backward(backend, layout, i, data)?;
            }
            if let Some(start) = start {
                spans.push(PendingSpan {
                    stream,
                    channel: 0,
                    what: if forward { "F" } else { "B" },
                    unit: i,
                    step: self.options.first_step + step,
                    micro_batch: m,
                    start,
                    end: backend.mark(stream)?,
                });
            }
        }
        Ok(Computed { step_marks, spans })
    }

    /// Before unit `unit`'s backward in micro-batch `micro_batch`, the gradient buffers it writes
    /// first (DESIGN §6.10).
    fn prepare_gradients(&self, layout: &Layout, unit: usize, micro_batch: usize) -> Result<()> {
        let rank = self.backend.rank();
        for &w in &self.program.first_written[unit] {
            let u = &self.schedule.units()[w];
            let start = GradientStart::of(u, micro_batch, rank).across_replicas(u, rank);
            start.prepare(self.backend, &layout.units[w])?;
        }
        Ok(())
    }

    /// The losses (summed over ranks and over each step's micro-batches), step times and spans,
    /// once both streams are done.
    fn report(
        &self,
        origin: &B::Mark,
        computed: Computed<B::Mark>,
        comm_spans: Vec<PendingSpan<B::Mark>>,
    ) -> Result<RunReport> {
        let (backend, steps) = (self.backend, self.options.steps);
        backend.synchronize()?;
        let (first, k) = (self.options.first_step, self.program.unrolled.micro_batches);
        let mut partial = backend.losses(k * (first + steps))?.split_off(k * first);
        backend.all_reduce_host(&mut partial)?;
        // Each micro-batch's loss is scaled by 1/K: their sum is the step's mean.
        let losses = partial.chunks(k).map(|c| c.iter().sum()).collect();
        let marks = &computed.step_marks;
        let step_us = marks
            .windows(2)
            .map(|w| backend.elapsed_us(&w[0], &w[1]))
            .collect::<Result<Vec<f64>>>()?;
        let spans = computed
            .spans
            .into_iter()
            .chain(comm_spans)
            .map(|s| {
                Ok(Span {
                    stream: s.stream,
                    channel: s.channel,
                    what: s.what,
                    unit: s.unit,
                    step: s.step,
                    micro_batch: s.micro_batch,
                    start_us: backend.elapsed_us(origin, &s.start)?,
                    end_us: backend.elapsed_us(origin, &s.end)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let kernel_us: f64 = spans
            .iter()
            .filter(|s| s.stream == Stream::Compute)
            .map(|s| s.end_us - s.start_us)
            .sum();
        let wall_us = backend.elapsed_us(&marks[0], &marks[steps])?;
        let slots = (steps * self.program.slots) as f64;
        Ok(RunReport {
            losses,
            step_us,
            arena_bytes: self.placement.arena.size_bytes,
            live_peak_bytes: self.placement.arena.live_peak_bytes,
            arena_layouts: self.placement.parities(),
            host_arena_bytes: self.placement.host_arena_bytes,
            executor_overhead_us_per_slot: self
                .options
                .trace
                .then(|| ((wall_us - kernel_us) / slots).max(0.0)),
            spans,
        })
    }
}
