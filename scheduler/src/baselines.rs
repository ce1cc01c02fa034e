//! The baselines of DESIGN §5: what engineers run today, as plans in the same format.
//!
//! "Depth d" places a forward gather at F_{i−d} and a backward gather at B_{i+d}, walking back
//! cyclically (past F_1 to E, then B_1, …) and clamped to the op's window; reductions go in the
//! slot right after B_i; every op is launched whole (all blocks in one slot). With K ≥ 2
//! micro-batches (DESIGN §3.10) the inner boundary's ops take the same positions in their windows,
//! and each baseline accumulates and keeps as its framework does by default. The hierarchical
//! ones (hsdp, hpz and their micro-batch forms) are built in `hierarchical`, the offload
//! baselines (DESIGN §3.13) in `offload`.

mod hierarchical;
mod kind;
mod offload;

pub use kind::BaselineKind;
pub use offload::OffloadFallback;

use crate::offload::Offload;
use crate::plan::{Plan, Producer, plan_with_prediction};
use crate::profile::Profile;
use crate::schedule::{
    Accumulation, Launch, Recompute, RecomputeChoice, ReplicaReduce, Schedule, UnitSchedule,
};
use crate::sim::Simulation;
use crate::size::format_bytes;
use crate::timeline::{Level, Op, Timeline};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// DeepSpeed's default `stage3_prefetch_bucket_size` (elements).
pub const ZERO3_PREFETCH_BUCKET_PARAMS: u64 = 50_000_000;

/// A baseline plan and its strict simulation.
#[derive(Debug, Clone)]
pub struct BaselinePlan {
    pub plan: Plan,
    pub schedule: Schedule,
    pub simulation: Simulation,
}

/// The groups of ranks a baseline shards its units over (DESIGN §3.11): a shard group S < N for
/// every sharded unit whose window (B_i, F_i) holds RS, RA and a gather (the others stay over the
/// world), a secondary group for every fsdp unit; with micro-batches, when a shard-group unit
/// that reduces every micro-batch all-reduces across replicas.
#[derive(Debug, Clone, Copy, Default)]
struct Groups {
    shard: Option<u32>,
    secondary: Option<u32>,
    replica_reduce: ReplicaReduce,
}

/// Builds a schedule from per-unit levels and per-unit gather depths (forward, backward) over
/// `groups` (a shard group's forward gathers at least two slots after its RS, RA between);
/// with micro-batches, every unit accumulates and keeps as `choice` says (keep only
/// where the unit is sharded and, at fsdp, lends no parameters) and its inner boundary's ops take
/// their step positions.
fn depth_schedule(
    profile: &Profile,
    (levels, groups): (&[Level], Groups),
    depths: &[(usize, usize)],
    recompute: Recompute,
    choice: &Accumulation,
) -> Result<Schedule> {
    let timeline = Timeline::new(profile.unit_count());
    let units = levels
        .iter()
        .enumerate()
        .map(|(unit, &level)| {
            let nb = profile.blocks(unit);
            let after = timeline.window(unit, Op::ReduceScatter.window_kind()).len;
            let shard_group = groups.shard.filter(|_| level != Level::None && after >= 3);
            let gap = if shard_group.is_some() { 2 } else { 0 };
            let launches = level
                .ops()
                .iter()
                .map(|&op| {
                    let window = timeline.window(unit, op.window_kind());
                    let pos = if op.is_reduction() {
                        0
                    } else if op == Op::GatherBackward {
                        window.len.saturating_sub(depths[unit].1)
                    } else {
                        window.len.saturating_sub(depths[unit].0).max(gap)
                    };
                    (
                        op,
                        vec![Launch {
                            slot: window.slot_at(pos),
                            blocks: nb,
                        }],
                    )
                })
                .collect::<BTreeMap<_, _>>();
            let accumulation = if profile.micro_batches >= 2 {
                // An fsdp unit whose parameters another unit reads never keeps (DESIGN §3.10).
                let lender = level == Level::Fsdp && profile.borrower(unit).is_some();
                let mut accumulation = Accumulation {
                    accumulate: choice.accumulate,
                    keep: choice.keep && level != Level::None && !lender,
                    ..Accumulation::default()
                };
                accumulation.inner = accumulation
                    .inner_ops(level)
                    .into_iter()
                    .map(|op| (op, launches[&op].clone()))
                    .collect();
                if shard_group.is_some() && !accumulation.accumulate {
                    accumulation.replica_reduce = groups.replica_reduce;
                }
                accumulation
            } else {
                Accumulation::default()
            };
            UnitSchedule {
                level,
                recompute: recompute.is_on(),
                launches,
                accumulation,
                shard_group,
                secondary_group: groups.secondary.filter(|_| level == Level::Fsdp),
            }
        })
        .collect();
    Schedule::new(profile, units)
}

/// The units an fsdp baseline keeps at sdp: the last (as FSDP keeps its root unit; the former
/// `first_sdp: bool`'s `false`), or, as `fsdp2` does, the first and the last (`true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeptSdp {
    Last,
    FirstAndLast,
}

/// fsdp2's plan over `groups`: every unit fsdp but the first and the last (sdp, not resharded
/// after forward), each gather at depth 1 (DESIGN §5).
fn fsdp2_over(
    profile: &Profile,
    groups: Groups,
    checkpoint: Recompute,
    accumulation: &Accumulation,
) -> Result<Schedule> {
    let l = profile.unit_count();
    depth_schedule(
        profile,
        (&levels(l, Level::Fsdp, KeptSdp::FirstAndLast), groups),
        &vec![(1, 1); l],
        checkpoint,
        accumulation,
    )
}

/// Every unit at `level`, except that the last unit cannot be fsdp and is kept sdp, with the
/// first too where `kept` says so.
fn levels(units: usize, level: Level, kept: KeptSdp) -> Vec<Level> {
    (0..units)
        .map(|u| {
            let first = kept == KeptSdp::FirstAndLast && u == 0;
            let keep = level == Level::Fsdp && (u + 1 == units || first);
            if keep { Level::Sdp } else { level }
        })
        .collect()
}

/// DeepSpeed-style depths: the most units (from this one on, in the pass's direction) whose
/// parameters fit in the prefetch bucket, at least 1.
fn zero3_depths(profile: &Profile) -> Vec<(usize, usize)> {
    let params: Vec<u64> = profile.units.iter().map(|u| u.params).collect();
    let depth = |order: &mut dyn Iterator<Item = &u64>| {
        let mut sum = 0;
        order
            .take_while(|&&p| {
                sum += p;
                sum <= ZERO3_PREFETCH_BUCKET_PARAMS
            })
            .count()
            .max(1)
    };
    (0..params.len())
        .map(|i| {
            (
                depth(&mut params[..=i].iter().rev()),
                depth(&mut params[i..].iter()),
            )
        })
        .collect()
}

fn finish(
    profile: &Profile,
    schedule: Schedule,
    name: &str,
    details: BTreeMap<String, toml::Value>,
    cap: Option<u64>,
) -> BaselinePlan {
    let producer = Producer {
        name: name.to_string(),
        details,
    };
    let (plan, simulation) = plan_with_prediction(profile, &schedule, producer, cap);
    BaselinePlan {
        plan,
        schedule,
        simulation,
    }
}

/// One uniform grid point: (level, depth) for every unit, and `accumulation`'s (accumulate,
/// keep).
fn grid_point(
    profile: &Profile,
    level: Level,
    depth: usize,
    recompute: Recompute,
    accumulation: &Accumulation,
) -> Result<Schedule> {
    let l = profile.unit_count();
    depth_schedule(
        profile,
        (&levels(l, level, KeptSdp::Last), Groups::default()),
        &vec![(depth, depth); l],
        recompute,
        accumulation,
    )
}

/// Builds the plan of a baseline. `checkpoint` turns recompute on for every unit; `cap` is
/// recorded in the plan, and `best-grid` chooses the fastest grid point whose peak fits it.
pub fn baseline(
    profile: &Profile,
    kind: BaselineKind,
    checkpoint: Recompute,
    cap: Option<u64>,
) -> Result<BaselinePlan> {
    let l = profile.unit_count();
    let mut details = BTreeMap::from([(
        "checkpoint".to_string(),
        toml::Value::Boolean(checkpoint.is_on()),
    )]);
    if let Some(reason) = kind.unavailable_on(profile) {
        return Err(Error::Mismatch(reason));
    }
    let accumulation = kind.accumulation();
    let schedule = match kind {
        BaselineKind::Ddp | BaselineKind::DdpNoSync => {
            grid_point(profile, Level::None, 1, checkpoint, &accumulation)?
        }
        BaselineKind::Zero2 => grid_point(profile, Level::Sdp, 1, checkpoint, &accumulation)?,
        BaselineKind::Fsdp1 => grid_point(profile, Level::Fsdp, 1, checkpoint, &accumulation)?,
        BaselineKind::Fsdp2 | BaselineKind::Fsdp2NoSync => {
            fsdp2_over(profile, Groups::default(), checkpoint, &accumulation)?
        }
        BaselineKind::Hpz | BaselineKind::HpzNoSync => {
            let (h, schedule) = hierarchical::hpz(profile, kind, checkpoint)?;
            details.insert("secondary_group".into(), toml::Value::Integer(h.into()));
            schedule
        }
        BaselineKind::Hsdp | BaselineKind::HsdpNoSync | BaselineKind::HsdpRaOnce => {
            let (s, schedule) = hierarchical::hsdp(profile, kind, checkpoint, cap)?;
            details.insert("shard_group".into(), toml::Value::Integer(s.into()));
            schedule
        }
        BaselineKind::Zero3 => depth_schedule(
            profile,
            (&levels(l, Level::Fsdp, KeptSdp::Last), Groups::default()),
            &zero3_depths(profile),
            checkpoint,
            &accumulation,
        )?,
        BaselineKind::Fsdp2Offload => {
            let schedule = fsdp2_over(profile, Groups::default(), checkpoint, &accumulation)?;
            offload::every_unit(profile, schedule, Offload::Full, kind.name())?
        }
        BaselineKind::Zero3Offload => {
            let schedule = depth_schedule(
                profile,
                (&levels(l, Level::Fsdp, KeptSdp::Last), Groups::default()),
                &offload::forward_prefetch_to_e(zero3_depths(profile)),
                checkpoint,
                &accumulation,
            )?;
            offload::every_unit(profile, schedule, Offload::Optimizer, kind.name())?
        }
        BaselineKind::BestGrid => {
            let (level, depth, schedule) = best_grid(profile, checkpoint, cap)?;
            details.insert(
                "grid_level".into(),
                toml::Value::String(level.name().into()),
            );
            details.insert("grid_depth".into(), toml::Value::Integer(depth as i64));
            schedule
        }
    };
    Ok(finish(profile, schedule, kind.name(), details, cap))
}

/// The fastest of {none} ∪ {sdp, fsdp} × {depth 1, 2, 3} whose strict peak fits `cap`; with
/// micro-batches, each also with every (accumulate, keep).
fn best_grid(
    profile: &Profile,
    checkpoint: Recompute,
    cap: Option<u64>,
) -> Result<(Level, usize, Schedule)> {
    let mut points = vec![(Level::None, 1)];
    for level in [Level::Sdp, Level::Fsdp] {
        points.extend((1..=3).map(|d| (level, d)));
    }
    let choices: &[(bool, bool)] = if profile.micro_batches >= 2 {
        &[(false, false), (true, false), (false, true), (true, true)]
    } else {
        &[(false, false)]
    };
    let accumulations: Vec<Accumulation> = (choices.iter())
        .map(|&(accumulate, keep)| Accumulation {
            accumulate,
            keep,
            ..Accumulation::default()
        })
        .collect();
    let mut best: Option<(f64, f64, Level, usize, Schedule)> = None;
    let mut smallest_peak = f64::INFINITY;
    for (level, depth) in points {
        for accumulation in &accumulations {
            if level == Level::None && accumulation.keep {
                continue;
            }
            let schedule = grid_point(profile, level, depth, checkpoint, accumulation)?;
            let sim = crate::classes::simulate_strict(profile, &schedule);
            smallest_peak = smallest_peak.min(sim.peak_memory_bytes);
            if cap.is_some_and(|c| sim.peak_memory_bytes > c as f64) {
                continue;
            }
            let key = (sim.iteration_time_us, sim.peak_memory_bytes);
            if best.as_ref().is_none_or(|b| key < (b.0, b.1)) {
                best = Some((key.0, key.1, level, depth, schedule));
            }
        }
    }
    best.map(|(_, _, level, depth, schedule)| (level, depth, schedule))
        .ok_or_else(|| {
            Error::Infeasible(format!(
                "best-grid: no grid point fits the memory cap of {}; the smallest grid peak is {}",
                format_bytes(cap.unwrap_or(0) as f64),
                format_bytes(smallest_peak)
            ))
        })
}

/// What makes one plan better than another when choosing among plans that fit a cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Preference {
    /// The shortest iteration.
    Fastest,
    /// The smallest peak among plans whose iteration is at most `max_iteration_time_us`.
    Smallest { max_iteration_time_us: Option<f64> },
}

impl Preference {
    /// The best of `candidates` whose peak fits `cap` (peak ≤ cap: the cap is inclusive) and
    /// whose time meets the preference's ceiling; `measure` gives a candidate's (iteration time
    /// µs, peak bytes). The first of equals wins. None when no candidate qualifies.
    pub fn choose<T>(
        self,
        candidates: impl IntoIterator<Item = T>,
        cap: Option<u64>,
        measure: impl Fn(&T) -> (f64, f64),
    ) -> Option<T> {
        let mut best: Option<(f64, T)> = None;
        for candidate in candidates {
            let (time, peak) = measure(&candidate);
            let score = match self {
                Preference::Fastest => time,
                Preference::Smallest {
                    max_iteration_time_us,
                } if max_iteration_time_us.is_none_or(|t| time <= t) => peak,
                Preference::Smallest { .. } => continue,
            };
            let fits = cap.is_none_or(|c| peak <= c as f64);
            if fits && best.as_ref().is_none_or(|(s, _)| score < *s) {
                best = Some((score, candidate));
            }
        }
        best.map(|(_, candidate)| candidate)
    }
}

/// A baseline with checkpointing on or off, and its plan.
#[derive(Debug, Clone)]
pub struct ChosenBaseline {
    pub kind: BaselineKind,
    pub checkpoint: Recompute,
    pub plan: BaselinePlan,
}

impl ChosenBaseline {
    pub fn label(&self) -> String {
        self.kind.label(self.checkpoint)
    }
}

/// Every baseline of `kinds`, each with checkpointing off and, where `checkpointing` allows it,
/// on, that can be built at `cap` (a baseline that cannot is left out).
pub fn baselines_at(
    profile: &Profile,
    kinds: &[BaselineKind],
    checkpointing: RecomputeChoice,
    cap: Option<u64>,
) -> impl Iterator<Item = ChosenBaseline> {
    kinds.iter().flat_map(move |&kind| {
        checkpointing
            .settings()
            .iter()
            .filter_map(move |&checkpoint| {
                let plan = baseline(profile, kind, checkpoint, cap).ok()?;
                Some(ChosenBaseline {
                    kind,
                    checkpoint,
                    plan,
                })
            })
    })
}

/// The best (by `preference`) of [`baselines_at`] whose plan fits `cap`.
pub fn best_baseline(
    profile: &Profile,
    kinds: &[BaselineKind],
    checkpointing: RecomputeChoice,
    cap: Option<u64>,
    preference: Preference,
) -> Option<ChosenBaseline> {
    let candidates = baselines_at(profile, kinds, checkpointing, cap);
    preference.choose(candidates, cap, |c| {
        (
            c.plan.simulation.iteration_time_us,
            c.plan.simulation.peak_memory_bytes,
        )
    })
}
