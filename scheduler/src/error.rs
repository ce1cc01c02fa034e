//! The one error type of the scheduler crate. Every variant renders as a single line that names
//! the file (or input), the field and what was expected.

use std::path::PathBuf;

/// Errors from reading, validating and evaluating profiles and plans.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file could not be written (or renamed into place).
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is not well-formed TOML of the expected shape.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// A field holds a value outside its domain.
    #[error("{origin}: field `{field}`: expected {expected}")]
    Invalid {
        origin: String,
        field: String,
        expected: String,
    },
    /// A plan breaks a window, coverage or order rule of DESIGN §3.
    #[error("plan rule broken: unit {unit} `{unit_name}`, op {op}{slot}: {rule}")]
    Rule {
        unit: usize,
        unit_name: String,
        op: String,
        slot: String,
        rule: String,
    },
    /// Two inputs that must belong together do not (plan vs profile, world sizes).
    #[error("{0}")]
    Mismatch(String),
    /// No schedule of the requested kind fits the memory cap (or the time ceiling).
    #[error("{0}")]
    Infeasible(String),
    /// The solver failed, or its answer failed the check against the simulator.
    #[error("solver: {0}")]
    Solver(String),
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(
        origin: impl Into<String>,
        field: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        Error::Invalid {
            origin: origin.into(),
            field: field.into(),
            expected: expected.into(),
        }
    }
}

/// Result with the scheduler's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
