//! The host side of an offloading run (DESIGN §6.12): the copy thread, which runs the copies
//! between the device and the host arena one at a time in the order they are issued, and the
//! host thread, which runs the offloaded units' optimizer steps on the host arena. The
//! communication stream issues a unit's gradient copy after its last RS block and the staging
//! copies before a `full` unit's gathers; the host thread issues `optimizer`'s parameter copy
//! after the step. Every copy and step is counted on an event per unit, which the streams wait
//! on where the plan's order needs it.

use super::kind::Kind;
use super::program::Program;
use super::{Streamed, Walk};
use crate::backend::{Backend, Region, Stream};
use crate::event::Event;
use crate::layout::Layout;
use crate::lock::recover;
use crate::train::{Train, optimize_unit};
use crate::{Error, Result};
use shardplan_scheduler::offload::{HostStep, Offload};
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::timeline::Timeline;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// The names of the host side's threads.
pub(super) const COPY_THREAD: &str = "copy";
pub(super) const HOST_STEP_THREAD: &str = "host-step";

/// What a copy's completion counts on.
#[derive(Debug, Clone, Copy)]
enum Done {
    /// A unit's gradient shard of a data step is on the host: its step may run.
    Gradient { unit: usize, step: usize },
    /// `optimizer`: the unit's updated parameter shard is on the device.
    Stepped { unit: usize },
    /// `full`: a gather block's shard is in its staging buffer.
    Staged { unit: usize },
}

/// One copy between the arenas, after `after` (the issuing stream's mark, where the copy reads
/// what that stream wrote).
struct Copy<M> {
    from: Region,
    to: Region,
    after: Option<M>,
    done: Done,
}

/// A FIFO between threads that a consumer waits on until an item comes or it is closed.
struct Queue<T> {
    state: Mutex<(VecDeque<T>, bool)>,
    changed: Condvar,
}

impl<T> Queue<T> {
    fn new() -> Self {
        Queue {
            state: Mutex::new((VecDeque::new(), false)),
            changed: Condvar::new(),
        }
    }

    fn push(&self, item: T) {
        recover(self.state.lock()).0.push_back(item);
        self.changed.notify_all();
    }

    /// No more items: the consumer takes those queued, then none.
    fn close(&self) {
        recover(self.state.lock()).1 = true;
        self.changed.notify_all();
    }

    /// The next item, or none once the queue is closed and empty.
    fn pop(&self) -> Option<T> {
        let mut state = recover(self.state.lock());
        loop {
            if let Some(item) = state.0.pop_front() {
                return Some(item);
            }
            if state.1 {
                return None;
            }
            state = recover(self.changed.wait(state));
        }
    }
}

/// The host side's queues and events.
pub(super) struct HostSide<M> {
    /// The offloaded units, in unit order.
    offloaded: Vec<usize>,
    modes: Vec<Offload>,
    host_step: HostStep,
    copies: Queue<Copy<M>>,
    /// (unit, data step, the copy's mark) of each gradient shard copied to the host, in arrival
    /// order; the host's step waits for the mark before it reads the shard.
    arrived: Queue<(usize, usize, M)>,
    /// Per unit: gradient copies done, host steps done (with `optimizer`, their parameter copy
    /// too), staging copies done.
    gradients: Vec<Event<M>>,
    stepped: Vec<Event<M>>,
    staged: Vec<Event<M>>,
    /// Per unit: gradient and staging copies issued (the count a wait for the latest targets).
    gradients_issued: Vec<AtomicU64>,
    staging_issued: Vec<AtomicU64>,
}

impl<M: Clone> HostSide<M> {
    /// The host side of `schedule`, none where it offloads nothing.
    pub(super) fn of(schedule: &Schedule) -> Option<HostSide<M>> {
        let units = schedule.units().len();
        let modes: Vec<Offload> = (0..units).map(|u| schedule.offload(u)).collect();
        let offloaded: Vec<usize> = (0..units).filter(|&u| !modes[u].is_none()).collect();
        if offloaded.is_empty() {
            return None;
        }
        let events = || (0..units).map(|_| Event::new()).collect();
        let counts = || (0..units).map(|_| AtomicU64::new(0)).collect();
        Some(HostSide {
            offloaded,
            modes,
            host_step: schedule.host_step(),
            copies: Queue::new(),
            arrived: Queue::new(),
            gradients: events(),
            stepped: events(),
            staged: events(),
            gradients_issued: counts(),
            staging_issued: counts(),
        })
    }

    pub(super) fn mode(&self, unit: usize) -> Offload {
        self.modes[unit]
    }

    /// Whether the next data step's compute waits for every host step (`after-backward`).
    pub(super) fn after_backward(&self) -> bool {
        self.host_step == HostStep::AfterBackward
    }

    pub(super) fn offloaded(&self) -> &[usize] {
        &self.offloaded
    }

    /// The host steps of `unit` done (with `optimizer`, their parameter copies too).
    pub(super) fn stepped(&self, unit: usize) -> &Event<M> {
        &self.stepped[unit]
    }

    /// Issues the copy of `unit`'s reduced gradient shard of data step `step` to the host, after
    /// `after` (the communication stream's mark past its last RS block); returns the count of the
    /// unit's gradient copies that includes it.
    pub(super) fn issue_gradient(
        &self,
        unit: usize,
        step: usize,
        [from, to]: [Region; 2],
        after: M,
    ) -> u64 {
        let done = Done::Gradient { unit, step };
        let after = Some(after);
        self.copies.push(Copy {
            from,
            to,
            after,
            done,
        });
        self.gradients_issued[unit].fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(super) fn gradients(&self, unit: usize) -> &Event<M> {
        &self.gradients[unit]
    }

    /// Issues the copy of a `full` unit's gather block shard into its staging shard, after
    /// `after` (the communication stream's mark: the staging buffer's earlier readers); returns
    /// the count of the unit's staging copies that includes it.
    pub(super) fn issue_staging(&self, unit: usize, [from, to]: [Region; 2], after: M) -> u64 {
        let done = Done::Staged { unit };
        let after = Some(after);
        self.copies.push(Copy {
            from,
            to,
            after,
            done,
        });
        self.staging_issued[unit].fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(super) fn staged(&self, unit: usize) -> &Event<M> {
        &self.staged[unit]
    }

    /// A stream or a host thread failed: every wait on the host side fails at once, and the
    /// host threads stop at their next wait.
    pub(super) fn abandon(&self) {
        for events in [&self.gradients, &self.stepped, &self.staged] {
            events.iter().for_each(Event::abandon);
        }
        self.arrived.close();
        self.copies.close();
    }

    /// Refuses a plan in which an offloaded unit gathers its parameters for a data step before
    /// its last reduction block of the step before has run: the gather waits for the host's step
    /// of that reduction's gradient, so the walk would wait until its timeout (DESIGN §6.12).
    /// Blocks run in the order (iteration, slot, place in the slot's queue), and a block of data
    /// step d with offset o runs in iteration d − o.
    pub(super) fn check_order(&self, program: &Program, schedule: &Schedule) -> Result<()> {
        let timeline = Timeline::new(schedule.units().len());
        for &unit in &self.offloaded {
            let blocks = (program.queues.iter().enumerate()).flat_map(|(s, queue)| {
                (queue.iter().enumerate())
                    .filter(move |(_, b)| b.unit == unit)
                    .map(move |(k, b)| (b, (s, k)))
            });
            // The latest reduction block of a step, as (iteration − step, slot, place).
            let reduced = (blocks.clone())
                .filter(|(b, _)| b.step_reduction)
                .map(|(b, at)| (-b.offset, at))
                .max();
            let Some((after, at)) = reduced else {
                continue;
            };
            let gathers = blocks
                .filter(|(b, _)| matches!(b.kind, Kind::ForwardGather | Kind::BackwardGather));
            for (gather, place) in gathers {
                // The gather of step d runs in iteration d − o_g; step d − 1's reduction in
                // iteration d − 1 + after.
                if (after - 1 + gather.offset, at) < (0, place) {
                    continue;
                }
                return Err(Error::Mismatch(format!(
                    "units[{unit}].offload is `{}`, and the unit gathers its parameters for a \
                     step ({} at {}) before its reduction of the step before has run (at {}{}): \
                     the gather waits for the host's step of that reduction's gradient (DESIGN \
                     §6.12); plan the gather after the reduction, or without offload",
                    self.modes[unit].name(),
                    gather.kind.name(),
                    timeline.slot(place.0),
                    timeline.slot(at.0),
                    if after > 0 {
                        " of the next iteration"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(())
    }

    /// No more copies will be issued (the streams and the host thread are done).
    pub(super) fn close_copies(&self) {
        self.copies.close();
    }
}

impl<B: Backend, W: Train<B>> Walk<'_, B, W> {
    /// The copy thread: each issued copy, in issue order, counted when done (on a GPU: enqueued
    /// on the copy stream, counted with its mark).
    pub(super) fn copy_thread(&self, host: &HostSide<B::Mark>) -> Result<()> {
        while let Some(copy) = host.copies.pop() {
            let mark = (self.backend).copy_across(copy.from, copy.to, copy.after.as_ref())?;
            match copy.done {
                Done::Gradient { unit, step } => {
                    host.gradients[unit].signal(mark.clone());
                    host.arrived.push((unit, step, mark));
                }
                Done::Stepped { unit } => host.stepped[unit].signal(mark),
                Done::Staged { unit } => host.staged[unit].signal(mark),
            }
        }
        Ok(())
    }

    /// The host thread: every offloaded unit's step of every data step, as the gradients
    /// arrive (`overlapped`), or once a data step's have all arrived (`after-backward`).
    pub(super) fn host_thread(&self, host: &HostSide<B::Mark>) -> Result<()> {
        let per_step = host.offloaded.len();
        let mut waiting = Vec::with_capacity(per_step);
        for _ in 0..self.options.steps * per_step {
            let arrived = host.arrived.pop().ok_or_else(|| {
                Error::Abandoned("the host's steps will not happen: a stream failed".into())
            })?;
            waiting.push(arrived);
            if host.after_backward() && waiting.len() < per_step {
                continue;
            }
            for (unit, step, copied) in waiting.drain(..) {
                self.backend.wait_on_host(&copied)?;
                self.host_step(host, unit, step)?;
            }
        }
        Ok(())
    }

    /// Unit `unit`'s step of data step `step` on the host arena; with `optimizer`, then the
    /// copy of its updated master into the device's parameter shard (rounded where bf16).
    fn host_step(&self, host: &HostSide<B::Mark>, unit: usize, step: usize) -> Result<()> {
        let layout = self.layout(step);
        let u = &layout.units[unit];
        let on_host = u.on_host().ok_or_else(|| {
            Error::Backend(format!(
                "{} has no host state in the layout",
                self.workload.unit_name(unit)
            ))
        })?;
        let mut view = Layout::clone(layout);
        view.units[unit] = on_host;
        let trained = (self.options.first_step + step + 1) as u32;
        match host.mode(unit) {
            Offload::Optimizer => {
                self.workload.optimize(self.backend, &view, unit, trained)?;
                // After the step on this thread; on the copy stream after the unit's gradient copy.
                let done = Done::Stepped { unit };
                host.copies.push(Copy {
                    from: u.trained(),
                    to: u.params,
                    after: None,
                    done,
                });
            }
            _ => {
                optimize_unit(self.workload, self.backend, &view, unit, trained)?;
                host.stepped[unit].signal(self.backend.mark(Stream::Communication)?);
            }
        }
        Ok(())
    }
}

impl<B: Backend, W: Train<B>> Walk<'_, B, W> {
    /// A host thread's end: where it failed, every wait of the streams and the host side fails
    /// at once.
    fn host_side_done(&self, host: &HostSide<B::Mark>, result: Result<()>) -> Result<()> {
        if result.is_err() {
            host.abandon();
            self.abandon_compute_waits();
            self.slot_started.abandon();
        }
        result
    }

    /// The streams beside the copy and the host thread (DESIGN §6.12): the copy thread takes
    /// copies until the streams and the host thread are done; a failure anywhere abandons the
    /// host side's waits, and the first failure that is not an abandoned wait is returned.
    pub(super) fn with_host(&self, host: &HostSide<B::Mark>) -> Result<Streamed<B::Mark>> {
        std::thread::scope(|scope| {
            let named = |name: &str| std::thread::Builder::new().name(name.to_string());
            let copier = named(COPY_THREAD)
                .spawn_scoped(scope, || self.host_side_done(host, self.copy_thread(host)));
            let stepper = named(HOST_STEP_THREAD)
                .spawn_scoped(scope, || self.host_side_done(host, self.host_thread(host)));
            let streamed = self.streams();
            if streamed.is_err() {
                host.abandon();
            }
            let stepped = joined(HOST_STEP_THREAD, stepper);
            host.close_copies();
            let copied = joined(COPY_THREAD, copier);
            match (streamed, stepped, copied) {
                (Ok(streams), Ok(()), Ok(())) => Ok(streams),
                (streamed, stepped, copied) => Err(first_failure(
                    [streamed.err(), stepped.err(), copied.err()]
                        .into_iter()
                        .flatten(),
                )),
            }
        })
    }

    /// With `host_step = "after-backward"`, the first slot of data step d ≥ 1 waits until every
    /// offloaded unit has stepped d times (DESIGN §6.12).
    pub(super) fn wait_for_host_steps(&self, step: Option<usize>, slot: usize) -> Result<()> {
        let (Some(host), Some(step), 0) = (&self.host, step, slot) else {
            return Ok(());
        };
        if !host.after_backward() {
            return Ok(());
        }
        for &u in host.offloaded() {
            self.wait(Stream::Compute, host.stepped(u), step as u64, &|| {
                format!("the host's step {step} of {}", self.workload.unit_name(u))
            })?;
        }
        Ok(())
    }
}

/// A host thread's result: its work's, or why it did not start or finish.
fn joined(
    thread: &str,
    spawned: std::io::Result<std::thread::ScopedJoinHandle<'_, Result<()>>>,
) -> Result<()> {
    let failed = |why: String| Error::Backend(format!("the {thread} thread {why}"));
    spawned
        .map_err(|e| failed(format!("could not start: {e}")))?
        .join()
        .map_err(|_| failed("panicked".into()))?
}

/// The first of `errors` that is not an abandoned wait (the failure that abandoned the others),
/// else the first.
fn first_failure(errors: impl Iterator<Item = Error>) -> Error {
    let errors: Vec<Error> = errors.collect();
    let cause = errors
        .iter()
        .position(|e| !matches!(e, Error::Abandoned(_)));
    (errors.into_iter().nth(cause.unwrap_or(0)))
        .unwrap_or_else(|| Error::Backend("a stream or host thread failed without an error".into()))
}
