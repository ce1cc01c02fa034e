//! One run of a saved plan, end to end: the plan checked against the profile and the ranks, the
//! layout packed, the arena allocated and initialised, the executor run, and what rank 0 reports
//! (measured beside predicted time and memory, the trained weights). The CLI, the benches and the
//! tests all run plans through [`run_plan`].

use crate::backend::{Allocation, Backend, DeviceMemory, Stream};
use crate::checkpoint::{self, Checkpoints, Identity, Resumed};
use crate::executor::{RunOptions, RunReport, Span, final_params, groups, initialise, run};
use crate::layout::{Placement, place};
use crate::measure::median;
use crate::process::Oversubscribed;
use crate::train::Train;
use crate::workload::Workload;
use crate::{Error, Result};
use shardplan_scheduler::classes::simulate_strict;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::trace::{complete, thread_name, trace_file};
use shardplan_scheduler::sim::{Simulation, simulate};
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use std::path::PathBuf;

/// What a run of a plan gives back on every rank.
pub struct PlanRun {
    pub backend: &'static str,
    pub rank: usize,
    pub world_size: usize,
    pub report: RunReport,
    /// The device's memory readings (GPU backends).
    pub device_memory: Option<DeviceMemory>,
    /// This rank's peak resident memory after the steps (before the parameters are gathered for
    /// the report), where the system reports it.
    pub peak_resident_bytes: Option<u64>,
    /// Where the host computes and its ranks outnumber its cores.
    pub oversubscribed: Option<Oversubscribed>,
    /// The trained parameters, each unit's in full.
    pub params: Vec<Vec<f32>>,
    /// The simulation of the plan in the run's semantics.
    pub predicted: Simulation,
    /// The median step after the first (DESIGN §6.2).
    pub measured_iteration_us: f64,
    /// The training step this run started at (0, or the resumed checkpoint's).
    pub first_step: usize,
    /// The checkpoint it resumed from, and newer ones it refused (with why).
    pub resumed_from: Option<PathBuf>,
    pub refused_checkpoints: Vec<String>,
    pub checkpoints_written: usize,
}

/// A plan ready to run: checked against the profile and the ranks, its layout packed, the arena
/// allocated and initialised.
pub struct Prepared<B> {
    backend: B,
    profile: Profile,
    schedule: Schedule,
    placement: Placement,
}

impl<B: Backend> Prepared<B> {
    /// Prepares `plan` (named `origin` in errors) for `workload` and `steps` steps on `backend`.
    pub fn new<W: Train<B>>(
        mut backend: B,
        workload: &W,
        profile: &Profile,
        plan: &Plan,
        origin: &str,
        steps: usize,
    ) -> Result<Self> {
        let schedule = plan.schedule(profile, origin)?;
        if !backend.offloads()
            && let Some(unit) =
                (0..schedule.units().len()).find(|&u| !schedule.offload(u).is_none())
        {
            return Err(Error::Mismatch(format!(
                "{origin}: units[{unit}].offload is `{}`, and the {} backend does not run offload \
                 yet (DESIGN §6.12: run it with --backend cpu, simulate it, or plan without \
                 offload)",
                schedule.offload(unit).name(),
                backend.name()
            )));
        }
        let world = backend.world_size();
        if plan.world_size as usize != world {
            return Err(Error::Mismatch(format!(
                "{origin}: the plan is for {} ranks, this run has {world} (start it with mpirun -np {})",
                plan.world_size, plan.world_size
            )));
        }
        check_predicted_peak(profile, &schedule, plan, origin)?;
        let placement = place(workload, profile, &schedule)?;
        check_cap(&placement, plan, origin)?;
        // The shard, replica and secondary groups' communicators (DESIGN §6.11).
        backend
            .open_groups(&groups(&schedule, world))
            .map_err(|e| Error::Mismatch(format!("{origin}: {e}")))?;
        workload.load_kernels(&backend)?;
        backend.allocate(Allocation {
            arena_elements: (placement.arena.size_bytes / 4) as usize,
            host_arena_elements: (placement.host_arena_bytes / 4) as usize,
            largest_block: placement.for_step(0).largest_block,
            loss_slots: steps * workload.micro_batches(),
        })?;
        // State kept from step to step sits where every step's layout puts it.
        initialise(&backend, workload, placement.for_step(0))?;
        Ok(Prepared {
            backend,
            profile: profile.clone(),
            schedule,
            placement,
        })
    }

    /// Runs the steps (again: each call continues from the weights the last one left).
    pub fn execute<W: Train<B>>(&self, workload: &W, options: &RunOptions) -> Result<RunReport> {
        run(
            &self.backend,
            workload,
            &self.profile,
            &self.schedule,
            &self.placement,
            options,
        )
    }
}

/// Refuses a plan whose strict simulation peaks above its own memory cap (README: `run` of a plan
/// above its own cap exits 3), before anything is packed or allocated.
fn check_predicted_peak(
    profile: &Profile,
    schedule: &Schedule,
    plan: &Plan,
    origin: &str,
) -> Result<()> {
    let Some(cap) = plan.memory_cap_bytes else {
        return Ok(());
    };
    let peak = simulate_strict(profile, schedule).peak_memory_bytes;
    if peak <= cap as f64 {
        return Ok(());
    }
    Err(Error::OverCap(format!(
        "{origin}: the plan peaks at {} ({} bytes), above its own memory_cap_bytes {} ({cap} \
         bytes): it would not fit where it was planned for; solve or make a baseline under a \
         cap it fits",
        format_bytes(peak),
        whole_bytes(peak),
        format_bytes(cap as f64),
    )))
}

/// Refuses a plan whose buffers fit its memory cap (the profile describes this backend's buffers
/// and the plan was solved under the cap) but whose packed arena does not: a static packing of
/// cyclic lifetimes can leave gaps (DESIGN §6.5), and the cap is a promise.
fn check_cap(placement: &Placement, plan: &Plan, origin: &str) -> Result<()> {
    let (arena, live) = (placement.arena.size_bytes, placement.arena.live_peak_bytes);
    match plan.memory_cap_bytes {
        Some(cap) if live <= cap && arena > cap => Err(Error::OverCap(format!(
            "{origin}: the arena packs this plan's buffers into {arena} bytes, {} above its memory \
             cap of {cap} bytes (their live peak, {live} bytes, fits; the packing leaves gaps): \
             solve again under --memory-cap {}",
            arena - cap,
            cap.saturating_sub(arena - cap)
        ))),
        _ => Ok(()),
    }
}

/// Where a run's checkpoints go and where it resumes from (`--checkpoint-every`,
/// `--checkpoint-dir`, `--resume`); the default: neither.
#[derive(Debug, Clone, Default)]
pub struct Durability {
    pub checkpoints: Option<Checkpoints>,
    pub resume: Option<PathBuf>,
}

/// Runs `plan` (named `origin` in errors) for `workload` on `backend` until `options.steps`
/// steps of training are done: from the start, or from the newest checkpoint under
/// `durability.resume`; in spans of `--checkpoint-every` steps, each followed by a checkpoint,
/// when asked.
pub fn run_plan<B: Backend, W: Train<B>>(
    backend: B,
    workload: &W,
    profile: &Profile,
    plan: &Plan,
    origin: &str,
    options: &RunOptions,
    durability: &Durability,
) -> Result<PlanRun> {
    let prepared = Prepared::new(backend, workload, profile, plan, origin, options.steps)?;
    let identity = Identity {
        plan: checkpoint::plan_digest(plan),
        world_size: prepared.backend.world_size(),
        rank: prepared.backend.rank(),
    };
    let kept = prepared.placement.for_step(0);
    let resumed = match &durability.resume {
        Some(dir) => checkpoint::resume(&prepared.backend, kept, dir, &identity)?,
        None => Resumed::default(),
    };
    if let Some(from) = &resumed.from
        && resumed.step > options.steps
    {
        return Err(Error::Mismatch(format!(
            "{}: the checkpoint is after step {}, past --steps {}",
            from.display(),
            resumed.step,
            options.steps
        )));
    }
    let span = durability
        .checkpoints
        .as_ref()
        .map_or(options.steps, |c| c.every.get());
    let mut report = RunReport::empty(&prepared.placement);
    let mut done = resumed.step;
    let mut checkpoints = 0;
    while done < options.steps {
        let steps = span.min(options.steps - done);
        let part = prepared.execute(
            workload,
            &RunOptions {
                steps,
                first_step: done,
                ..options.clone()
            },
        )?;
        done += steps;
        if let Some(c) = &durability.checkpoints {
            checkpoint::save(&prepared.backend, kept, &c.dir, done, &identity)?;
            checkpoints += 1;
        }
        report = report.followed_by(part);
    }
    let Prepared {
        backend,
        schedule,
        placement,
        ..
    } = prepared;
    Ok(PlanRun {
        first_step: resumed.step,
        resumed_from: resumed.from,
        refused_checkpoints: resumed.refused,
        checkpoints_written: checkpoints,
        backend: backend.name(),
        rank: backend.rank(),
        world_size: backend.world_size(),
        measured_iteration_us: steady_median(&report.step_us),
        device_memory: backend.device_memory()?,
        peak_resident_bytes: crate::process::peak_resident_bytes(),
        oversubscribed: Oversubscribed::here().filter(|_| backend.host_computes()),
        params: final_params(&backend, workload, placement.for_step(0))?,
        report,
        predicted: simulate(profile, &schedule, options.semantics),
    })
}

/// The median step time after the first step (which sets up buffers, communicators and caches;
/// the second of a sharded plan on a GPU still does, so a median rather than a mean).
fn steady_median(step_us: &[f64]) -> f64 {
    let tail = if step_us.len() > 1 {
        &step_us[1..]
    } else {
        step_us
    };
    median(tail.to_vec())
}

/// The Chrome/Perfetto trace of a run's spans: one track per stream, and one more for a plan's
/// second communication channel (its second link, DESIGN §6.11); with several micro-batches per
/// step, each name carries its micro-batch (1-based) as the simulator's trace labels slots.
pub fn chrome_trace(workload: &dyn Workload, spans: &[Span]) -> serde_json::Value {
    let second_channel = Stream::BOTH.len() as u32;
    let mut events: Vec<_> = Stream::BOTH
        .iter()
        .map(|&s| thread_name(s.track(), s.name()))
        .collect();
    if spans.iter().any(|s| s.channel > 0) {
        events.push(thread_name(second_channel, "communication (second link)"));
    }
    let several = workload.micro_batches() > 1;
    events.extend(spans.iter().map(|s| {
        let micro_batch = if several {
            format!(" [{}]", s.micro_batch + 1)
        } else {
            String::new()
        };
        let track = match s.channel {
            0 => s.stream.track(),
            _ => second_channel,
        };
        complete(
            format!("{}{micro_batch} {}", s.what, workload.unit_name(s.unit)),
            track,
            s.start_us,
            s.end_us - s.start_us,
            serde_json::json!({"step": s.step, "micro_batch": s.micro_batch + 1}),
        )
    }));
    trace_file(events)
}
