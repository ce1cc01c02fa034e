//! Events: monotonic counters that streams signal and wait on. A waiter checks the count under
//! the same lock the signaller increments it under, so a signal can never be lost between the
//! check and the sleep; counts only grow, so a late waiter sees every earlier signal.

use crate::{Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A counter with blocking waits.
#[derive(Debug, Default)]
pub struct Event {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Event {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` and wakes every waiter.
    pub fn signal(&self, n: u64) {
        let mut count = self.count.lock().expect("event lock is never poisoned");
        *count += n;
        self.changed.notify_all();
    }

    /// The current count.
    pub fn count(&self) -> u64 {
        *self.count.lock().expect("event lock is never poisoned")
    }

    /// Blocks until the count reaches `target`, or fails after `timeout` naming `what`.
    pub fn wait(&self, target: u64, timeout: Duration, what: &dyn Fn() -> String) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut count = self.count.lock().expect("event lock is never poisoned");
        while *count < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "{} did not happen within {:?} ({} of {target})",
                    what(),
                    timeout,
                    *count
                )));
            }
            count = self
                .changed
                .wait_timeout(count, left)
                .expect("event lock is never poisoned")
                .0;
        }
        Ok(())
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
        let (ping, pong) = (Arc::new(Event::new()), Arc::new(Event::new()));
        let rounds = 200_000u64;
        let t = {
            let (ping, pong) = (ping.clone(), pong.clone());
            std::thread::spawn(move || {
                for k in 1..=rounds {
                    ping.wait(k, Duration::from_secs(20), &|| "ping".into())
                        .unwrap();
                    pong.signal(1);
                }
            })
        };
        for k in 1..=rounds {
            ping.signal(1);
            pong.wait(k, Duration::from_secs(20), &|| "pong".into())
                .unwrap();
        }
        t.join().unwrap();
        assert_eq!((ping.count(), pong.count()), (rounds, rounds));
    }

    /// Many waiters on staggered targets, one signaller: every waiter wakes.
    #[test]
    fn every_waiter_wakes() {
        let event = Arc::new(Event::new());
        let waiters: Vec<_> = (1..=16u64)
            .map(|target| {
                let e = event.clone();
                std::thread::spawn(move || {
                    e.wait(target * 1000, Duration::from_secs(20), &|| "w".into())
                })
            })
            .collect();
        for _ in 0..16_000 {
            event.signal(1);
        }
        for w in waiters {
            w.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_wait_that_never_completes_times_out_with_its_name() {
        let e = Event::new();
        let err = e
            .wait(1, Duration::from_millis(20), &|| "AG block.3".into())
            .unwrap_err();
        assert!(
            err.to_string().contains("AG block.3 did not happen"),
            "{err}"
        );
    }
}
