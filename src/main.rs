//! `shardplan`: plans and evaluates the communication of sharded data-parallel training.
//!
//! Exit codes (see `failure`): 0 success, 1 a failure while working, 2 bad input or usage,
//! 3 no plan fits the memory cap.

mod cli;
mod commands;
mod failure;
mod output;
mod plots;

use clap::Parser;
use failure::Failure;
use output::Output;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let json = std::env::args_os().any(|a| a == "--json");
            if json {
                Failure::usage(&e).report_once(Output::Json);
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let output = args.command.output();
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let failure = Failure::of(&e);
            failure.report_once(output);
            ExitCode::from(failure.code)
        }
    }
}
