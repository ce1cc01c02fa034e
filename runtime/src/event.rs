//! Events: monotonic counters that streams signal and wait on. Each signal carries a mark `M` (a
//! backend's point in a stream: a CUDA event, or an instant on the CPU), so a waiter learns both
//! that the n-th signal happened and where in the signalling stream it was. A waiter checks the
//! count under the same lock the signaller increments it under, so a signal can never be lost
//! between the check and the sleep; counts only grow, so a late waiter sees every earlier signal.

use crate::{Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A counter with blocking waits; the n-th signal's mark is kept for waiters on count n.
#[derive(Debug)]
pub struct Event<M = ()> {
    marks: Mutex<Vec<M>>,
    changed: Condvar,
}

impl<M: Clone> Default for Event<M> {
    fn default() -> Self {
        Event {
            marks: Mutex::new(Vec::new()),
            changed: Condvar::new(),
        }
    }
}

impl<M: Clone> Event<M> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one signal at `mark` and wakes every waiter.
    pub fn signal(&self, mark: M) {
        let mut marks = self.marks.lock().expect("event lock is never poisoned");
        marks.push(mark);
        self.changed.notify_all();
    }

    /// The current count.
    pub fn count(&self) -> u64 {
        self.marks
            .lock()
            .expect("event lock is never poisoned")
            .len() as u64
    }

    /// Blocks until the count reaches `target`, or fails after `timeout` naming `what`. Returns
    /// the mark of the `target`-th signal (none for a target of 0).
    pub fn wait(
        &self,
        target: u64,
        timeout: Duration,
        what: &dyn Fn() -> String,
    ) -> Result<Option<M>> {
        let deadline = Instant::now() + timeout;
        let mut marks = self.marks.lock().expect("event lock is never poisoned");
        while (marks.len() as u64) < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "{} did not happen within {:?} ({} of {target})",
                    what(),
                    timeout,
                    marks.len()
                )));
            }
            marks = self
                .changed
                .wait_timeout(marks, left)
                .expect("event lock is never poisoned")
                .0;
        }
        Ok(target.checked_sub(1).map(|k| marks[k as usize].clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Two threads ping-pong 200,000 times through two events; a lost wake-up would hang one of
    /// them until the timeout fails the test.
    #[test]
    fn no_lost_wake_ups_under_ping_pong() {
        let (ping, pong) = (Arc::new(Event::<()>::new()), Arc::new(Event::<()>::new()));
        let rounds = 200_000u64;
        let t = {
            let (ping, pong) = (ping.clone(), pong.clone());
            std::thread::spawn(move || {
                for k in 1..=rounds {
                    ping.wait(k, Duration::from_secs(20), &|| "ping".into())
                        .unwrap();
                    pong.signal(());
                }
            })
        };
        for k in 1..=rounds {
            ping.signal(());
            pong.wait(k, Duration::from_secs(20), &|| "pong".into())
                .unwrap();
        }
        t.join().unwrap();
        assert_eq!((ping.count(), pong.count()), (rounds, rounds));
    }

    /// Many waiters on staggered targets, one signaller: every waiter wakes.
    #[test]
    fn every_waiter_wakes() {
        let event = Arc::new(Event::<u64>::new());
        let waiters: Vec<_> = (1..=16u64)
            .map(|target| {
                let e = event.clone();
                std::thread::spawn(move || {
                    e.wait(target * 1000, Duration::from_secs(20), &|| "w".into())
                })
            })
            .collect();
        for k in 1..=16_000 {
            event.signal(k);
        }
        for (target, w) in (1..=16u64).zip(waiters) {
            assert_eq!(
                w.join().unwrap().unwrap(),
                Some(target * 1000),
                "the mark of the target-th signal"
            );
        }
    }

    #[test]
    fn a_wait_that_never_completes_times_out_with_its_name() {
        let e = Event::<()>::new();
        let err = e
            .wait(1, Duration::from_millis(20), &|| "AG block.3".into())
            .unwrap_err();
        assert!(
            err.to_string().contains("AG block.3 did not happen"),
            "{err}"
        );
    }
}
