//! The measuring profiler, for any backend and workload (`timing`), a workload's profile, and
//! `profile measure` end to end (`profile_run`); on a GPU, where a step's time goes (`launches`).
//!
//! A unit's bytes in the profile are exactly the runtime's buffers (fp32; [`crate::workload`]):
//! activations = 4·(saved + internals), with recompute 4·saved; forward workspace as the workload
//! says; backward workspace = its own plus the gradients of its input and of its output (the next
//! unit's input gradient). p = g = 4, o = 8 (Adam m and v; the fp32 parameters are the master
//! copy). Units are timed in compute-only rounds of a DDP layout (and of one with every unit
//! checkpointed, for f^c_i), in slot order, each round followed by every unit's optimizer step on
//! the communication stream, where a run takes it.

mod host_link;
mod interference;
mod launches;
mod profile_run;
mod slots;
mod timing;

pub use host_link::{CopyRoom, measure_host};
pub use interference::{Slowdowns, time_interference};
pub use launches::{LaunchCategory, LaunchRow, by_category, time_launches};
pub use profile_run::{MeasureOptions, Measured, measure_model, measure_workload};
pub use timing::{
    TimedLayouts, block_collectives, compute_slot, measurement_allocation, time_collectives,
    time_units,
};

use crate::Result;
use crate::backend::{Backend, Stream};
use crate::layout::{Placement, place};
use crate::workload::Workload;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::profile::{CommCurves, PROFILE_SCHEMA, Profile, UnitProfile};
use shardplan_scheduler::schedule::Recompute;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Measured µs of one unit.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct UnitTime {
    pub forward_us: f64,
    /// The forward of a checkpointed unit: its internals go to the reused forward workspace.
    pub checkpointed_forward_us: f64,
    pub backward_us: f64,
    /// What recomputation adds to a checkpointed backward's slot: the forward again (it takes
    /// no batch) and the backward after it, less the plain backward.
    pub recompute_us: f64,
    /// The optimizer step over all the unit's parameters.
    pub optimizer_us: f64,
}

/// Measured times of each unit.
pub type UnitTimes = Vec<UnitTime>;

/// The profile of `workload` on `world` ranks from unit times and collective curves.
pub fn workload_profile(
    workload: &dyn Workload,
    world: u32,
    times: &UnitTimes,
    comm: CommCurves,
    block_size_bytes: Option<u64>,
    source: BTreeMap<String, String>,
) -> Result<Profile> {
    let l = workload.unit_count();
    let bytes = |words: usize| 4 * words as u64;
    let units = (0..l)
        .map(|i| {
            let b = workload.buffers(i);
            let next_gradient = if i + 1 < l {
                workload.buffers(i + 1).input_gradient
            } else {
                0
            };
            UnitProfile {
                name: workload.unit_name(i),
                params: workload.params(i) as u64,
                forward_us: times[i].forward_us,
                checkpointed_forward_us: Some(times[i].checkpointed_forward_us),
                backward_us: times[i].backward_us,
                recompute_us: Some(times[i].recompute_us),
                optimizer_us: times[i].optimizer_us,
                activation_bytes: bytes(b.saved + b.internals),
                checkpoint_activation_bytes: bytes(b.saved),
                forward_workspace_bytes: bytes(b.forward_workspace),
                backward_workspace_bytes: bytes(
                    b.backward_workspace + b.input_gradient + next_gradient,
                ),
                reads_params_of: workload.reads_params_of(i),
            }
        })
        .collect();
    let block = block_size_bytes.unwrap_or_else(|| comm.block_size());
    let profile = Profile {
        schema: PROFILE_SCHEMA,
        name: format!("{} x{world}", workload.name()),
        source,
        world_size: world,
        block_size_bytes: block,
        overlap_slowdown: 0.0,
        overlap_slowdown_reduce_scatter: None,
        overlap_slowdown_all_gather: None,
        comm_slowdown: 0.0,
        update_slowdown: None,
        iteration_extra_us: 0.0,
        bytes_per_param: workload.precision().bytes_per_param(),
        micro_batches: workload.micro_batches() as u32,
        // Parameters per shard quantum of the runtime's buffers: the arena's 64-byte alignment.
        shard_quantum_params: crate::arena::ALIGN / workload.precision().param().bytes(),
        units,
        comm,
        topology: None,
        host: None,
    };
    profile.validate("measured profile")?;
    Ok(profile)
}

/// The placements units are timed in: DDP (every unit replicated, one block per unit) on `world`
/// ranks, without recompute and with every unit checkpointed, so a compute round touches the
/// buffers a run does.
pub fn compute_placements(workload: &dyn Workload, world: u32) -> Result<[Placement; 2]> {
    let flat = CommCurve {
        points: vec![(1, 1.0), (1 << 40, 2.0)],
    };
    let comm = CommCurves {
        all_gather: flat.clone(),
        reduce_scatter: flat.clone(),
        all_reduce: flat,
    };
    let largest = (0..workload.unit_count())
        .map(|i| workload.precision().param().bytes() * workload.params(i) as u64)
        .max()
        .unwrap_or(4);
    let times = vec![
        UnitTime {
            forward_us: 1.0,
            checkpointed_forward_us: 1.0,
            backward_us: 1.0,
            recompute_us: 1.0,
            optimizer_us: 0.0,
        };
        workload.unit_count()
    ];
    let provisional = workload_profile(
        workload,
        world,
        &times,
        comm,
        Some(largest),
        BTreeMap::new(),
    )?;
    let placed = |checkpointed: Recompute| {
        let ddp = baseline(&provisional, BaselineKind::Ddp, checkpointed, None)?;
        place(workload, &provisional, &ddp.schedule)
    };
    Ok([placed(Recompute::Off)?, placed(Recompute::On)?])
}

/// The median of `samples` (the upper one of an even count); NaN for none.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One end of a span of work that runs alone on the thread that reads it: the backend's mark on
/// `stream` and, where the host computes, the thread's CPU time.
pub(crate) struct Reading<M> {
    mark: M,
    cpu_us: Option<f64>,
}

impl<M> Reading<M> {
    /// The point `backend`'s `stream` has reached, read on the thread that runs its work.
    pub(crate) fn now<B: Backend<Mark = M>>(backend: &B, stream: Stream) -> Result<Self> {
        Ok(Reading {
            mark: backend.mark(stream)?,
            cpu_us: backend.thread_cpu_us(),
        })
    }

    /// The work's µs from `self` to `to`: the thread's CPU time where the host computes, else the
    /// time between the marks. A compute round timed by the wall clock on a core shared with other
    /// processes counts their slices as its own, and not evenly: a thread that computes without
    /// pause is preempted about every scheduler slice, and with rounds of a fixed length the
    /// preemptions fall on the same spans round after round, so that the median over rounds keeps
    /// them (mlp-small at N = 2 beside other processes' builds: a backward of 0.8 ms timed at 15–25
    /// ms, docs/runtime-results.md).
    pub(crate) fn until<B: Backend<Mark = M>>(&self, backend: &B, to: &Reading<M>) -> Result<f64> {
        match (self.cpu_us, to.cpu_us) {
            (Some(from), Some(to)) => Ok(to - from),
            _ => backend.elapsed_us(&self.mark, &to.mark),
        }
    }
}

/// The most timed runs of a curve's point in one visit.
pub(crate) const TIMINGS_PER_VISIT: usize = 2;

/// The timed runs of each visit to every point of the curves, `repeats` in all (at least one):
/// visits of [`TIMINGS_PER_VISIT`], the last one the rest.
pub(crate) fn visits(repeats: usize) -> Vec<usize> {
    let repeats = repeats.max(1);
    (0..repeats.div_ceil(TIMINGS_PER_VISIT))
        .map(|v| TIMINGS_PER_VISIT.min(repeats - v * TIMINGS_PER_VISIT))
        .collect()
}

/// Message sizes of the measured curves: 4 KiB … `max_bytes`, powers of two.
pub(crate) fn sizes(max_bytes: u64) -> Vec<u64> {
    (12..=40)
        .map(|e| 1u64 << e)
        .take_while(|&s| s <= max_bytes)
        .collect()
}

/// The data steps the measurement's compute rounds take, numbered as a run numbers its steps: a
/// round's first slot starts the next step, so a loader that makes step k + 1's batch while step
/// k computes (the MLP's on a GPU) has it ready, as in a run. Rounds that all took step 0 found
/// step 1's batch made instead and made step 0's again inside the first forward's time: on the
/// H100, mlp-small's forwards measured about twice a run's. The steps wrap at
/// [`DataSteps::COUNT`], the loss slots [`measurement_allocation`] makes.
#[derive(Debug, Default)]
pub struct DataSteps(AtomicUsize);

impl DataSteps {
    /// The data steps taken before they wrap (the loader then makes one batch on the spot).
    pub const COUNT: usize = 1024;

    /// The data step of slot `s`: a new one where `s` starts a round, else the round's.
    pub(crate) fn of_slot(&self, s: usize) -> usize {
        if s == 0 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        self.current()
    }

    /// The data step of the round under way.
    pub(crate) fn current(&self) -> usize {
        self.0.load(Ordering::Relaxed) % Self::COUNT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point's samples as `schedule` takes them, the visit `stalled` (if any) every one of
    /// them stalled by a descheduled rank: 100 µs clean, 1,000 stalled.
    fn sampled(schedule: &[usize], stalled: usize) -> Vec<f64> {
        (schedule.iter().enumerate())
            .flat_map(|(v, &timed)| vec![if v == stalled { 1000.0 } else { 100.0 }; timed])
            .collect()
    }

    /// Every point gets exactly its `repeats` timings, at most [`TIMINGS_PER_VISIT`] a visit;
    /// a stall as long as one visit takes the median of back-to-back timings (one visit of all
    /// ten) but not of the visits' from 5 repeats up.
    #[test]
    fn a_stall_of_one_visit_leaves_the_median_clean() {
        assert_eq!(visits(10), vec![2, 2, 2, 2, 2]);
        assert_eq!(visits(5), vec![2, 2, 1]);
        assert_eq!(visits(0), vec![1]);
        for repeats in 1..40 {
            let v = visits(repeats);
            assert_eq!(v.iter().sum::<usize>(), repeats);
            assert!(v.iter().all(|&t| (1..=TIMINGS_PER_VISIT).contains(&t)));
            if repeats >= 5 {
                for stalled in 0..v.len() {
                    assert_eq!(median(sampled(&v, stalled)), 100.0, "{repeats}, {stalled}");
                }
            }
        }
        assert_eq!(median(sampled(&[10], 0)), 1000.0);
    }
}
