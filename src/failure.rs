//! How a failed command ends: its exit code, and its message as one line on stderr or, under
//! `--json`, as one JSON object on stdout.
//!
//! Exit codes: 1 a failure while working (a write, the solver, a backend, a timeout), 2 bad input
//! (a file, a field or a flag that cannot be used as given, or a usage error), 3 no plan fits the
//! memory cap (or the time ceiling).

use crate::output::Output;
use serde_json::json;

/// A flag whose value clap accepted but the command cannot use (out of range, or in conflict with
/// another flag).
#[derive(Debug, thiserror::Error)]
#[error("{flag}: expected {expected}")]
pub struct FlagError {
    pub flag: &'static str,
    pub expected: String,
}

/// Shorthand for a [`FlagError`] as an `anyhow::Error`.
pub fn flag_error(flag: &'static str, expected: impl Into<String>) -> anyhow::Error {
    FlagError {
        flag,
        expected: expected.into(),
    }
    .into()
}

/// A failure sorted for reporting.
pub struct Failure {
    pub code: u8,
    kind: &'static str,
    message: String,
    file: Option<String>,
    field: Option<String>,
}

impl Failure {
    /// Sorts an error by what it is about: the scheduler's and runtime's error kinds, flags, or
    /// anything else (a failure while working).
    pub fn of(error: &anyhow::Error) -> Failure {
        let message = one_line(error);
        let scheduler = error
            .downcast_ref::<shardplan_scheduler::Error>()
            .or_else(|| match error.downcast_ref::<shardplan_runtime::Error>() {
                Some(shardplan_runtime::Error::Scheduler(e)) => Some(e),
                _ => None,
            });
        if let Some(e) = scheduler {
            let code = match e {
                shardplan_scheduler::Error::Infeasible(_) => 3,
                e if e.is_bad_input() => 2,
                _ => 1,
            };
            return Failure {
                code,
                kind: e.kind(),
                message,
                file: e.file(),
                field: e.field().map(str::to_string),
            };
        }
        if let Some(shardplan_runtime::Error::Setting { setting, .. }) =
            error.downcast_ref::<shardplan_runtime::Error>()
        {
            return Failure {
                code: 2,
                kind: "usage",
                message,
                file: None,
                field: Some(setting.to_string()),
            };
        }
        if let Some(e) = error.downcast_ref::<FlagError>() {
            return Failure {
                code: 2,
                kind: "usage",
                message,
                file: None,
                field: Some(e.flag.to_string()),
            };
        }
        let (code, kind) = match error.downcast_ref::<shardplan_runtime::Error>() {
            Some(shardplan_runtime::Error::Mismatch(_)) => (2, "mismatch"),
            Some(shardplan_runtime::Error::OverCap(_)) => (3, "infeasible"),
            Some(shardplan_runtime::Error::NotEnoughMemory(_)) => (3, "memory"),
            Some(shardplan_runtime::Error::Timeout(_)) => (1, "timeout"),
            Some(shardplan_runtime::Error::Backend(_)) => (1, "backend"),
            _ => (1, "failure"),
        };
        Failure {
            code,
            kind,
            message,
            file: None,
            field: None,
        }
    }

    /// A command line clap refused (unknown flag, missing value, a value its parser refused).
    pub fn usage(error: &clap::Error) -> Failure {
        // The message is everything before clap's usage line, on one line (a missing argument
        // is named on the line after "the following required arguments were not provided:").
        let rendered = error.to_string();
        let message = rendered
            .lines()
            .take_while(|line| !line.starts_with("Usage:"))
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
            .trim_start_matches("error: ")
            .to_string();
        // The flag of the (first) argument clap names, without its value placeholder.
        let field = match error.get(clap::error::ContextKind::InvalidArg) {
            Some(clap::error::ContextValue::String(arg)) => Some(arg),
            Some(clap::error::ContextValue::Strings(args)) => args.first(),
            _ => None,
        }
        .and_then(|arg| arg.split_whitespace().next());
        Failure {
            code: 2,
            kind: "usage",
            message,
            file: None,
            field: field.map(str::to_string),
        }
    }

    /// Prints the failure as [`Failure::report`] does, except on a rank other than 0 of a job
    /// an MPI launcher started (every rank failing alike before or without MPI), which prints it
    /// as a line on stderr: under `--json` stdout holds one document, rank 0's.
    pub fn report_once(&self, output: Output) {
        match shardplan_runtime::launch::launcher_rank() {
            Some(rank) if rank > 0 => self.report_from_rank(rank),
            _ => self.report(output),
        }
    }

    /// Prints the failure of rank `rank` of a job as `error: rank R: …` on stderr (rank 0 alone
    /// prints the job's JSON object).
    pub fn report_from_rank(&self, rank: usize) {
        let line = format!("error: rank {rank}: {}\n", self.message);
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }

    /// Prints the failure: one JSON object on stdout, or `error: …` on stderr.
    pub fn report(&self, output: Output) {
        match output {
            Output::Json => crate::output::print_json(&json!({
                "error": self.message,
                "kind": self.kind,
                "file": self.file,
                "field": self.field,
                "exit_code": self.code,
            })),
            Output::Text => {
                // One write, so that the lines of ranks failing together under mpirun never
                // interleave.
                let line = format!("error: {}\n", self.message);
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            }
        }
    }
}

/// The error and its causes on one line, each cause once: a cause whose text the message already
/// carries (`path: cannot read: <os error>` over the OS error itself) is not repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut message = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
    }
    message.replace('\n', " ")
}
