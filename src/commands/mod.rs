//! One module per subcommand; each returns `anyhow::Result` and prints its own output.

mod baseline;
mod comm;
mod demo;
mod doctor;
mod export;
mod inspect;
mod measure;
mod profile;
mod run;
mod simulate;
pub mod solve;
mod sweep;

use crate::cli::{Cli, CommCommand, Command, ExportCommand, ProfileCommand};
use crate::failure::Failure;
use crate::output::Output;
use shardplan_runtime::backend::MpiUniverse;
use shardplan_runtime::launch::{abort_peers, job_rank};
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use std::path::Path;

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Profile(ProfileCommand::Analytic(args)) => profile::analytic(args),
        Command::Profile(ProfileCommand::Measure(args)) => measure::measure(args),
        Command::Run(args) => run::run(args),
        Command::Comm(CommCommand::Import(args)) => comm::import(args),
        Command::Export(ExportCommand::Fsdp2(args)) => export::fsdp2(args),
        Command::Solve(args) => solve::run(args),
        Command::Sweep(args) => sweep::run(args),
        Command::Baseline(args) => baseline::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Doctor(args) => doctor::run(args),
    }
}

/// Loads a profile and a plan and checks that they belong together.
pub fn load_plan(
    profile_path: &Path,
    plan_path: &Path,
) -> anyhow::Result<(Profile, Plan, Schedule)> {
    let profile = Profile::load(profile_path)?;
    let plan = Plan::load(plan_path)?;
    let schedule = plan.schedule(&profile, &plan_path.display().to_string())?;
    Ok((profile, plan, schedule))
}

/// A failed rank of a job of several ranks reports its failure and ends the job: its peers may be
/// waiting in a collective it will never join (returning would leave them, and this rank's
/// MPI_Finalize, waiting for ever). Under `--json` rank 0 alone prints the JSON object, so that
/// stdout holds one document; the other ranks print their line on stderr and give rank 0
/// [`REPORT_GRACE`] to print before they end the job. A rank alone returns the failure for `main`
/// to report.
pub(crate) fn end_job_on_failure<T>(
    universe: Option<&MpiUniverse>,
    result: anyhow::Result<T>,
    output: Output,
) -> anyhow::Result<T> {
    if let (Err(error), Some(universe)) = (&result, universe) {
        let (rank, ranks) = job_rank(universe);
        if ranks > 1 {
            let failure = Failure::of(error);
            report_for_job(&failure, rank, output);
            abort_peers(failure.code.into());
        }
    }
    result
}

/// Reports the failure of rank `rank` of a job of several ranks: rank 0's as the command's
/// (one JSON object under `--json`), the others' as a line on stderr, after which they give
/// rank 0 [`REPORT_GRACE`] to print under `--json`.
pub(crate) fn report_for_job(failure: &Failure, rank: usize, output: Output) {
    if rank == 0 {
        failure.report(output);
    } else {
        failure.report_from_rank(rank);
        if output == Output::Json {
            std::thread::sleep(REPORT_GRACE);
        }
    }
}

/// How long a failed rank other than 0 waits before it ends the job under `--json`: rank 0, when
/// it fails too (a plan for another world size fails on every rank at once), prints the one
/// JSON document meanwhile.
const REPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);
