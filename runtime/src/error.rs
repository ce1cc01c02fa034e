//! Runtime errors: one line each, naming what failed.

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Scheduler(#[from] shardplan_scheduler::Error),
    /// Inputs that must agree do not (world size, model vs profile).
    #[error("{0}")]
    Mismatch(String),
    /// A wait outlived its deadline: a peer or a stream stopped making progress.
    #[error("{0}")]
    Timeout(String),
    /// The backend could not be set up or failed.
    #[error("{0}")]
    Backend(String),
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
