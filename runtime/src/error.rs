//! Runtime errors: one line each, naming what failed.

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Scheduler(#[from] shardplan_scheduler::Error),
    /// Inputs that must agree do not (world size, model vs profile).
    #[error("{0}")]
    Mismatch(String),
    /// A setting of the request (named as its command-line option) that cannot be used.
    #[error("{setting}: expected {expected}")]
    Setting {
        setting: &'static str,
        expected: String,
    },
    /// The plan does not fit its own memory cap on this backend.
    #[error("{0}")]
    OverCap(String),
    /// What a run would allocate is more than the host or the device has available (checked
    /// before allocating).
    #[error("{0}")]
    NotEnoughMemory(String),
    /// A wait outlived its deadline: a peer or a stream stopped making progress.
    #[error("{0}")]
    Timeout(String),
    /// A wait ended because the stream it waited on failed (its own error is the one reported).
    #[error("{0}")]
    Abandoned(String),
    /// The backend could not be set up or failed.
    #[error("{0}")]
    Backend(String),
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
