//! `shardplan`: plans and evaluates the communication of sharded data-parallel training.
//!
//! Exit codes: 0 success, 1 bad input or failure, 2 usage error, 3 no plan fits the memory cap.

mod cli;
mod commands;
mod output;
mod plots;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let infeasible = e
                .downcast_ref::<shardplan_scheduler::Error>()
                .is_some_and(|e| matches!(e, shardplan_scheduler::Error::Infeasible(_)));
            ExitCode::from(if infeasible { 3 } else { 1 })
        }
    }
}
