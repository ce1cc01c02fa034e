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
    /// A file is not well-formed TOML (or JSON) of the expected shape. `location` is
    /// `:LINE:COL` or empty; `field` the dotted path of the offending value when known.
    #[error("{origin}{location}: {}{message}", .field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Parse {
        origin: String,
        location: String,
        field: Option<String>,
        message: String,
    },
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
    /// A short name of the variant, for machine-readable errors (`--json`).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Write { .. } => "write",
            Error::Parse { .. } => "parse",
            Error::Invalid { .. } => "invalid",
            Error::Rule { .. } => "plan-rule",
            Error::Mismatch(_) => "mismatch",
            Error::Infeasible(_) => "infeasible",
            Error::Solver(_) => "solver",
        }
    }

    /// The input or output the error is about (a path, `path:LINE`, or a flag), when it names one.
    pub fn file(&self) -> Option<String> {
        match self {
            Error::Read { path, .. } | Error::Write { path, .. } => {
                Some(path.display().to_string())
            }
            Error::Parse { origin, .. } | Error::Invalid { origin, .. } => Some(origin.clone()),
            _ => None,
        }
    }

    /// The field (dotted path in the file, or flag) the error is about, when it names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Parse { field, .. } => field.as_deref(),
            Error::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Whether the error is the user's input (a file or flag that cannot be used as given), as
    /// opposed to a failure while working (a write, the solver) or an infeasible cap.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            Error::Write { .. } | Error::Infeasible(_) | Error::Solver(_)
        )
    }

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
