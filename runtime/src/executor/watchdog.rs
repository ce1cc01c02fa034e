//! A rank's watchdog: a thread of its own that watches the collectives the communication stream
//! launched, so that a peer that stops (a hung process, a stuck driver call, a paused node) is
//! detected within `--timeout` although the thread inside the collective never returns from it
//! (MPI cannot cancel a collective) or the device never completes it (NCCL's kernel waits on the
//! device while the host thread enqueues on). Past the timeout it
//! reports which collective waited for whom ([`RunOptions::on_stall`]) and ends the job
//! ([`crate::launch::end_job`]: MPI_Abort, so mpirun ends every rank; NCCL's communicator is
//! aborted first). A failure the communicator reports on its own (NCCL's asynchronous error)
//! ends the job the same way, without waiting for the timeout.

use super::Walk;
use super::kind::Kind;
use crate::Error;
use crate::backend::{Backend, Group};
use crate::lock::recover;
use crate::train::Train;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The collective a communication stream is in.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub kind: Kind,
    /// The ranks it runs among.
    pub group: Group,
    pub unit: usize,
    /// 0-based block of `blocks`.
    pub block: usize,
    pub blocks: usize,
    /// The data step it serves, and the global slot it was launched in.
    pub step: usize,
    pub slot: usize,
}

/// What the watchdog reads: per communication channel, the collectives it launched and has not
/// seen completed, oldest first, each with the channel's mark after it (once its call returned),
/// and when the channel last made progress.
pub(super) struct Watch<M> {
    channels: Vec<Mutex<Watched<M>>>,
}

struct Watched<M> {
    launched: VecDeque<Launched<M>>,
    progress: Instant,
}

struct Launched<M> {
    since: Instant,
    collective: InFlight,
    /// The communication stream's mark after it: reached when it completed on the device.
    done: Option<M>,
}

impl<M> Watch<M> {
    /// The watch of `channels` communication channels.
    pub fn new(channels: usize) -> Self {
        let watched = || {
            Mutex::new(Watched {
                launched: VecDeque::new(),
                progress: Instant::now(),
            })
        };
        Watch {
            channels: (0..channels).map(|_| watched()).collect(),
        }
    }
}

impl<M> Watch<M> {
    fn state(&self, channel: usize) -> std::sync::MutexGuard<'_, Watched<M>> {
        recover(self.channels[channel].lock())
    }

    /// Channel `channel` launches `collective`.
    pub fn enter(&self, channel: usize, collective: InFlight) {
        self.state(channel).launched.push_back(Launched {
            since: Instant::now(),
            collective,
            done: None,
        });
    }

    /// The call of the collective `channel` last entered returned; `done` is reached when it
    /// completes.
    pub fn launched(&self, channel: usize, done: M) {
        if let Some(last) = self.state(channel).launched.back_mut() {
            last.done = Some(done);
        }
    }

    /// The oldest collective of any channel not completed, if its channel has made no progress
    /// for longer than `timeout` since it was launched.
    fn overdue(&self, timeout: Duration, reached: impl Fn(&M) -> bool) -> Option<InFlight> {
        (0..self.channels.len()).find_map(|c| self.overdue_on(c, timeout, &reached))
    }

    /// Channel `channel`'s oldest collective not completed, if the channel has made no progress
    /// for longer than `timeout` since it was launched: collectives whose mark `reached` are
    /// dropped first (a host that enqueues ahead of its device is not stalled while the device
    /// progresses).
    fn overdue_on(
        &self,
        channel: usize,
        timeout: Duration,
        reached: impl Fn(&M) -> bool,
    ) -> Option<InFlight> {
        let mut state = self.state(channel);
        while state
            .launched
            .front()
            .is_some_and(|l| l.done.as_ref().is_some_and(&reached))
        {
            state.launched.pop_front();
            state.progress = Instant::now();
        }
        let progress = state.progress;
        state
            .launched
            .front()
            .filter(|l| l.since.max(progress).elapsed() > timeout)
            .map(|l| l.collective)
    }

    /// Until `finished`, checks every `timeout / 8` (at most 100 ms) whether the communicator
    /// has failed or the oldest collective is overdue; if so, the error goes to `on_stall`, the
    /// communicator is aborted and the job ends.
    pub fn guard(
        &self,
        timeout: Duration,
        finished: &AtomicBool,
        communication: &(impl Communication<M> + Sync),
        on_stall: &(dyn Fn(&Error) + Send + Sync),
    ) {
        let period = (timeout / 8).min(Duration::from_millis(100));
        while !finished.load(Ordering::Acquire) {
            std::thread::sleep(period);
            let failed = communication.failure().or_else(|| {
                self.overdue(timeout, |mark| communication.reached(mark))
                    .map(|collective| communication.overdue(collective, timeout))
            });
            if let Some(error) = failed {
                on_stall(&error);
                within(ABORT_WAIT, || communication.abort());
                crate::launch::end_job(1);
            }
        }
    }
}

/// How long the watchdog waits for the communicator's abort before it ends the job regardless:
/// an abort that waits for a device which never finishes must not keep the job alive.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// Runs `work` on a thread of its own and waits for it at most `limit`; past that the job ends
/// with `work` still running.
fn within(limit: Duration, work: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        let (done, finished) = std::sync::mpsc::channel();
        scope.spawn(move || {
            work();
            let _ = done.send(());
        });
        if finished.recv_timeout(limit).is_err() {
            crate::launch::end_job(1);
        }
    });
}

/// What the watchdog reads of, and does to, a rank's communication.
pub(super) trait Communication<M> {
    /// Whether the work before `mark` has completed (a mark that cannot be read counts as
    /// reached: the stream reports its own error).
    fn reached(&self, mark: &M) -> bool;
    /// The error of a communicator that failed on its own, if it did.
    fn failure(&self) -> Option<Error>;
    /// The error naming `collective`, overdue past `timeout`, and the peers it waits for.
    fn overdue(&self, collective: InFlight, timeout: Duration) -> Error;
    /// Abandons the communicator before the job ends.
    fn abort(&self);
}

impl<B: Backend, W: Train<B>> Communication<B::Mark> for Walk<'_, B, W> {
    fn reached(&self, mark: &B::Mark) -> bool {
        self.backend.reached(mark).unwrap_or(true)
    }

    fn failure(&self) -> Option<Error> {
        let rank = self.backend.rank();
        self.backend.communication_failure().map(|why| {
            Error::Backend(format!(
                "{why} on rank {rank} (its peers {}); ending the job",
                peers(rank, Group::World.members(rank, self.backend.world_size()))
            ))
        })
    }

    fn overdue(&self, c: InFlight, timeout: Duration) -> Error {
        let rank = self.backend.rank();
        Error::Timeout(format!(
            "the {} of {} (block {} of {}, step {}) launched in global slot {} did not complete within {:.1} s on rank {rank}: waiting for its peers, {} (stopped, hung or unreachable); ending the job",
            c.kind.described(),
            self.workload.unit_name(c.unit),
            c.block + 1,
            c.blocks,
            c.step,
            c.slot,
            timeout.as_secs_f64(),
            peers(rank, c.group.members(rank, self.backend.world_size())),
        ))
    }

    fn abort(&self) {
        self.backend.abort_communication();
    }
}

/// "ranks 0, 2 and 3": the `members` of a group but `rank`.
pub(super) fn peers(rank: usize, members: Vec<usize>) -> String {
    let others: Vec<String> = (members.into_iter())
        .filter(|&r| r != rank)
        .map(|r| r.to_string())
        .collect();
    match others.as_slice() {
        [] => "none (one rank)".into(),
        [one] => format!("rank {one}"),
        [rest @ .., last] => format!("ranks {} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_every_other_rank() {
        assert_eq!(peers(0, vec![0, 1]), "rank 1");
        assert_eq!(peers(1, (0..4).collect()), "ranks 0, 2 and 3");
        assert_eq!(peers(0, vec![0]), "none (one rank)");
        // Rank 6's replica group of 8 ranks as 2 nodes of 4.
        assert_eq!(peers(6, Group::Across(4).members(6, 8)), "rank 2");
    }

    fn collective(slot: usize) -> InFlight {
        InFlight {
            kind: Kind::AllReduce,
            group: Group::World,
            unit: 1,
            block: 0,
            blocks: 2,
            step: 3,
            slot,
        }
    }

    /// A collective inside its call (no mark yet) or not reached is overdue past the timeout;
    /// once its mark is reached it is dropped.
    #[test]
    fn a_collective_is_overdue_past_the_timeout_until_it_completes() {
        let watch = Watch::<bool>::new(1);
        let reached = |done: &bool| *done;
        assert!(watch.overdue(Duration::ZERO, reached).is_none());
        watch.enter(0, collective(40));
        assert!(watch.overdue(Duration::from_secs(60), reached).is_none());
        std::thread::sleep(Duration::from_millis(5));
        let overdue = watch.overdue(Duration::from_millis(1), reached);
        assert_eq!(overdue.map(|c| c.slot), Some(40));
        watch.launched(0, false);
        assert!(watch.overdue(Duration::from_millis(1), reached).is_some());
        watch.state(0).launched[0].done = Some(true);
        assert!(watch.overdue(Duration::ZERO, reached).is_none());
    }

    /// Each channel is watched on its own: one channel's progress does not hide the other's
    /// stalled collective.
    #[test]
    fn a_stalled_channel_is_seen_beside_a_progressing_one() {
        let watch = Watch::<bool>::new(2);
        let reached = |done: &bool| *done;
        watch.enter(1, collective(7));
        watch.launched(1, false);
        std::thread::sleep(Duration::from_millis(20));
        watch.enter(0, collective(8));
        watch.launched(0, true);
        let overdue = watch.overdue(Duration::from_millis(10), reached);
        assert_eq!(overdue.map(|c| c.slot), Some(7));
    }

    /// Work that ends within the limit has run when `within` returns (past the limit the job
    /// ends, which a test process cannot watch).
    #[test]
    fn work_within_its_limit_runs_to_the_end() {
        let ran = std::sync::atomic::AtomicBool::new(false);
        within(Duration::from_secs(5), || {
            std::thread::sleep(Duration::from_millis(20));
            ran.store(true, Ordering::SeqCst);
        });
        assert!(ran.load(Ordering::SeqCst));
    }

    /// A host far ahead of its device is not stalled while the device completes collectives:
    /// the time counts from the last completion.
    #[test]
    fn time_counts_from_the_last_progress() {
        let watch = Watch::<bool>::new(1);
        watch.enter(0, collective(1));
        watch.launched(0, true);
        watch.enter(0, collective(2));
        watch.launched(0, false);
        std::thread::sleep(Duration::from_millis(20));
        let reached = |done: &bool| *done;
        assert!(watch.overdue(Duration::from_millis(10), reached).is_none());
        std::thread::sleep(Duration::from_millis(20));
        let overdue = watch.overdue(Duration::from_millis(10), reached);
        assert_eq!(overdue.map(|c| c.slot), Some(2));
    }
}
