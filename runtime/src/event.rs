//! Events: monotonic counters that streams signal and wait on. Each signal carries a mark `M` (a
//! backend's point in a stream: a CUDA event, or an instant on the CPU), so a waiter learns both
//! that the n-th signal happened and where in the signalling stream it was. A waiter checks the
//! count under the same lock the signaller increments it under, so a signal can never be lost
//! between the check and the sleep; counts only grow, so a late waiter sees every earlier signal.
//!
//! A spinning event ([`Event::spinning`]) first polls an atomic copy of the count for a while
//! before it sleeps: a thread that sleeps on a condition variable wakes tens of microseconds after
//! the signal, which is the pace of a GPU run whose host threads only enqueue microsecond kernels.

use crate::lock::recover;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A counter with blocking waits; the n-th signal's mark is kept for waiters on count n.
#[derive(Debug)]
pub struct Event<M = ()> {
    state: Mutex<State<M>>,
    changed: Condvar,
    /// The count, stored after each signal's mark is kept: what a spinning wait polls.
    count: AtomicU64,
    /// How long a wait polls `count` before it sleeps on `changed` (zero: it sleeps at once).
    spin: Duration,
}

#[derive(Debug)]
struct State<M> {
    marks: Vec<M>,
    /// The signaller gave up: waits for counts not yet reached fail at once.
    abandoned: bool,
}

impl<M: Clone> Default for Event<M> {
    fn default() -> Self {
        Event {
            state: Mutex::new(State {
                marks: Vec::new(),
                abandoned: false,
            }),
            changed: Condvar::new(),
            count: AtomicU64::new(0),
            spin: Duration::ZERO,
        }
    }
}

impl<M: Clone> Event<M> {
    /// An event whose waits sleep at once: where host threads share the cores with the work
    /// (the CPU backend), a polling thread would take a core from it.
    pub fn new() -> Self {
        Self::default()
    }

    /// An event whose waits poll the count for up to `spin` before they sleep.
    pub fn spinning(spin: Duration) -> Self {
        Event {
            spin,
            ..Self::default()
        }
    }

    /// Counts one signal at `mark` and wakes every waiter.
    pub fn signal(&self, mark: M) {
        let mut state = recover(self.state.lock());
        state.marks.push(mark);
        self.count
            .store(state.marks.len() as u64, Ordering::Release);
        self.changed.notify_all();
    }

    /// No more signals will come (the signalling stream failed): every wait for a count not yet
    /// reached fails now instead of at its timeout.
    pub fn abandon(&self) {
        let mut state = recover(self.state.lock());
        state.abandoned = true;
        self.changed.notify_all();
    }

    /// The current count.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Blocks until the count reaches `target`, or fails after `timeout` naming `what`. Returns
    /// the mark of the `target`-th signal (none for a target of 0).
    pub fn wait(
        &self,
        target: u64,
        timeout: Duration,
        what: &dyn Fn() -> String,
    ) -> Result<Option<M>> {
        let now = Instant::now();
        let deadline = now + timeout;
        self.poll(target, now + self.spin.min(timeout));
        let mut state = recover(self.state.lock());
        while (state.marks.len() as u64) < target {
            if state.abandoned {
                return Err(Error::Abandoned(format!(
                    "{} will not happen: the other stream failed",
                    what()
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "{} did not happen within {:?} ({} of {target})",
                    what(),
                    timeout,
                    state.marks.len()
                )));
            }
            state = recover(self.changed.wait_timeout(state, left)).0;
        }
        Ok(target
            .checked_sub(1)
            .map(|k| state.marks[k as usize].clone()))
    }

    /// Polls the count until it reaches `target` or `until` passes (the caller then takes the
    /// lock either way: this only saves the sleep).
    fn poll(&self, target: u64, until: Instant) {
        while self.count.load(Ordering::Acquire) < target {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            if Instant::now() >= until {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Two threads ping-pong 200,000 times through two events, sleeping or spinning; a lost
    /// wake-up would hang one of them until the timeout fails the test.
    #[test]
    fn no_lost_wake_ups_under_ping_pong() {
        ping_pong(Duration::ZERO);
        ping_pong(Duration::from_micros(50));
    }

    fn ping_pong(spin: Duration) {
        let (ping, pong) = (
            Arc::new(Event::<()>::spinning(spin)),
            Arc::new(Event::<()>::spinning(spin)),
        );
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

    /// An abandoned event fails a blocked waiter at once (not at its 60 s timeout), while a count
    /// already reached still succeeds.
    #[test]
    fn abandon_wakes_a_blocked_waiter_with_an_error() {
        let event = Arc::new(Event::<u64>::new());
        event.signal(7);
        let waiter = {
            let e = event.clone();
            std::thread::spawn(move || e.wait(2, Duration::from_secs(60), &|| "the second".into()))
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        event.abandon();
        let result = waiter.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        match result {
            Err(Error::Abandoned(why)) => assert!(why.contains("the second"), "{why}"),
            other => panic!("expected an abandoned wait, got {other:?}"),
        }
        assert_eq!(
            event
                .wait(1, Duration::from_secs(1), &|| "the first".into())
                .unwrap(),
            Some(7)
        );
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
