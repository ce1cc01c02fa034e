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
use shardplan_runtime::backend::MpiUniverse;
use shardplan_runtime::launch::abort_peers;
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

/// A failed rank of a job reports its failure and ends the job: its peers may be waiting in a
/// collective it will never join (returning would leave them, and this rank's MPI_Finalize,
/// waiting for ever).
pub(crate) fn end_job_on_failure<T>(
    universe: Option<&MpiUniverse>,
    result: anyhow::Result<T>,
    json: bool,
) -> anyhow::Result<T> {
    if let (Err(error), Some(universe)) = (&result, universe) {
        let failure = Failure::of(error);
        failure.report(json);
        abort_peers(universe, failure.code.into());
    }
    result
}
