//! The runtime's one policy for a poisoned lock: the guard is taken as it is ([`recover`]).
//!
//! A lock is poisoned only by a panic inside the runtime (a bug, never an input) in a thread that
//! held it. That panic is already the failure reported: the stream threads' and the second
//! channel's joins turn it into the run's [`crate::Error`] ("the compute thread panicked"), and
//! the first failure is the one returned. Every lock here guards state that is whole between
//! statements (marks, a record of leases, caches of kernels, graphs and workload state, loss
//! slots, scratch and batches written before they are read), so the threads still running go on
//! with it and finish or fail on their own terms — abandoning an event, above all, must work on
//! a failing path — instead of panicking in turn or reporting a second error derived from the
//! first.

use std::sync::{LockResult, PoisonError};

/// The guard (or whatever else the lock returns) whether or not the lock is poisoned.
pub(crate) fn recover<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::recover;
    use std::sync::Mutex;

    /// A lock whose holder panicked still hands out its data, as the holder left it.
    #[test]
    fn a_poisoned_lock_is_recovered_with_its_data() {
        let marks = Mutex::new(vec![1]);
        let panicked = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut held = marks.lock().unwrap();
                    held.push(2);
                    panic!("a bug while the lock is held");
                })
                .join()
        });
        assert!(panicked.is_err());
        assert!(marks.is_poisoned());
        recover(marks.lock()).push(3);
        assert_eq!(*recover(marks.lock()), [1, 2, 3]);
    }
}
