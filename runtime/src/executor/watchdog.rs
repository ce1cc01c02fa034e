//! A rank's watchdog: a thread of its own that watches the collective the communication stream
//! is in, so that a peer that stops (a hung process, a stuck driver call, a paused node) is
//! detected within `--timeout` although the thread inside the collective never returns from it
//! (MPI cannot cancel a collective; NCCL's kernel waits on the device). Past the timeout it
//! reports which collective waited for whom ([`RunOptions::on_stall`]) and ends the job
//! ([`crate::launch::end_job`]: MPI_Abort, so mpirun ends every rank; NCCL's communicator is
//! aborted first).

use super::program::Kind;
use crate::Error;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The collective a communication stream is in.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub kind: Kind,
    pub unit: usize,
    /// 0-based block of `blocks`.
    pub block: usize,
    pub blocks: usize,
    /// The data step it serves, and the global slot it was launched in.
    pub step: usize,
    pub slot: usize,
}

/// What the watchdog reads: the communication stream's collective and since when.
#[derive(Default)]
pub(super) struct Watch(Mutex<Option<(Instant, InFlight)>>);

impl Watch {
    /// The stream enters `collective`.
    pub fn enter(&self, collective: InFlight) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), collective));
    }

    /// The stream left its collective.
    pub fn leave(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The collective the stream has been in for longer than `timeout`, if any.
    fn overdue(&self, timeout: Duration) -> Option<InFlight> {
        let entered = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        entered
            .filter(|(since, _)| since.elapsed() > timeout)
            .map(|(_, collective)| collective)
    }

    /// Until `finished`, checks every `timeout / 8` (at most 100 ms) whether the collective is
    /// overdue; if it is, the error `describe` makes of it goes to `on_stall` and the job ends.
    pub fn guard(
        &self,
        timeout: Duration,
        finished: &AtomicBool,
        describe: impl Fn(InFlight) -> Error,
        on_stall: &(dyn Fn(&Error) + Send + Sync),
        abort_communication: impl Fn(),
    ) {
        let period = (timeout / 8).min(Duration::from_millis(100));
        while !finished.load(Ordering::Acquire) {
            std::thread::sleep(period);
            if let Some(collective) = self.overdue(timeout) {
                on_stall(&describe(collective));
                abort_communication();
                crate::launch::end_job(1);
            }
        }
    }
}

/// "ranks 0, 2 and 3" of `world` ranks but `rank`.
pub(super) fn peers(rank: usize, world: usize) -> String {
    let others: Vec<String> = (0..world)
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
        assert_eq!(peers(0, 2), "rank 1");
        assert_eq!(peers(1, 4), "ranks 0, 2 and 3");
        assert_eq!(peers(0, 1), "none (one rank)");
    }

    #[test]
    fn a_collective_is_overdue_only_past_the_timeout_and_until_it_leaves() {
        let watch = Watch::default();
        let collective = InFlight {
            kind: Kind::AllReduce,
            unit: 1,
            block: 0,
            blocks: 2,
            step: 3,
            slot: 40,
        };
        assert!(watch.overdue(Duration::ZERO).is_none());
        watch.enter(collective);
        assert!(watch.overdue(Duration::from_secs(60)).is_none());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            watch.overdue(Duration::from_millis(1)).map(|c| c.slot),
            Some(40)
        );
        watch.leave();
        assert!(watch.overdue(Duration::ZERO).is_none());
    }
}
