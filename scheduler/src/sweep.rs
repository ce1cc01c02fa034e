//! Memory-budget sweeps: the ILP and the baselines across memory caps.
//!
//! The ILP caps run in two interleaved chains on two threads, each cap warm-started from the
//! previous cap of its chain; then a repair pass walks the caps upward and, where a smaller cap's
//! plan is faster, takes it (it fits the larger cap too). The ILP's time therefore never rises
//! with the cap, and each cap's bound still comes from its own solve.

use crate::baselines::{BaselineKind, ChosenBaseline, Preference, baselines_at, best_baseline};
use crate::classes::simulate_strict;
use crate::export::{Fsdp2Plan, fsdp2 as export_fsdp2};
use crate::ilp::{Objective, SolveOptions, WindowLimits, solve};
use crate::profile::Profile;
use crate::schedule::{RecomputeChoice, Schedule};
use crate::sim::Simulation;
use crate::size::whole_bytes;
use crate::target::Target;
use crate::timeline::Level;
use crate::{Error, Result};
use serde::Serialize;

/// A method compared in a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Ilp,
    Baseline(BaselineKind),
}

impl Method {
    /// Every method for `profile`: the ILP, then its baselines in [`BaselineKind::of`]'s order,
    /// then the offload baselines it offers ([`BaselineKind::offload_of`]).
    pub fn all(profile: &Profile) -> Vec<Method> {
        std::iter::once(Method::Ilp)
            .chain(BaselineKind::of(profile).into_iter().map(Method::Baseline))
            .chain(
                BaselineKind::offload_of(profile)
                    .into_iter()
                    .map(Method::Baseline),
            )
            .collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Ilp => "ilp",
            Method::Baseline(kind) => kind.name(),
        }
    }

    /// Why the method has no plan on `profile`, or None where it has: the baselines'
    /// [`BaselineKind::unavailable_on`]; the ILP runs on every profile.
    pub fn unavailable_on(self, profile: &Profile) -> Option<String> {
        match self {
            Method::Ilp => None,
            Method::Baseline(kind) => kind.unavailable_on(profile),
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "ilp" {
            return Ok(Method::Ilp);
        }
        s.parse::<BaselineKind>()
            .map(Method::Baseline)
            .map_err(|e| format!("{e}, or ilp"))
    }
}

/// One (cap, method) result. Baselines report the faster of checkpointing off and on that fits.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub cap_bytes: u64,
    pub method: String,
    pub feasible: bool,
    pub iteration_time_us: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    pub exposed_comm_us: Option<f64>,
    pub units_none: usize,
    pub units_sdp: usize,
    pub units_fsdp: usize,
    pub recomputed_units: usize,
    /// ILP: proven relative gap of the plan (within `window_depth`).
    pub gap: Option<f64>,
    pub window_depth: Option<WindowLimits>,
    pub solve_seconds: Option<f64>,
    /// ILP: integer columns and rows of the widest model solved.
    pub integer_variables: Option<usize>,
    pub constraints: Option<usize>,
    /// An offloading plan's host memory per node (DESIGN §3.13).
    pub host_memory_bytes: Option<u64>,
    /// Under `--target fsdp2` (DESIGN §4.9): the plan's exact FSDP2 export's time and peak (its
    /// copies beside the model's buffers), the peak the cap holds; None for the runtime target.
    pub fsdp2_iteration_time_us: Option<f64>,
    pub fsdp2_peak_memory_bytes: Option<u64>,
}

impl SweepRow {
    fn new(cap: u64, method: Method, plan: Option<(&Schedule, &Simulation)>) -> Self {
        let count = |level| {
            plan.map_or(0, |(s, _)| {
                s.units().iter().filter(|u| u.level == level).count()
            })
        };
        SweepRow {
            cap_bytes: cap,
            method: method.name().to_string(),
            feasible: plan.is_some(),
            iteration_time_us: plan.map(|(_, sim)| sim.iteration_time_us),
            peak_memory_bytes: plan.map(|(_, sim)| whole_bytes(sim.peak_memory_bytes)),
            exposed_comm_us: plan.map(|(_, sim)| sim.exposed_comm_us),
            units_none: count(Level::None),
            units_sdp: count(Level::Sdp),
            units_fsdp: count(Level::Fsdp),
            recomputed_units: plan
                .map_or(0, |(s, _)| s.units().iter().filter(|u| u.recompute).count()),
            host_memory_bytes: plan
                .and_then(|(_, sim)| sim.host.as_ref())
                .map(|h| whole_bytes(h.memory_bytes)),
            gap: None,
            window_depth: None,
            solve_seconds: None,
            integer_variables: None,
            constraints: None,
            fsdp2_iteration_time_us: None,
            fsdp2_peak_memory_bytes: None,
        }
    }

    /// The row with `exported`'s FSDP2 time and peak.
    fn with_fsdp2(self, exported: Option<&Fsdp2Plan>) -> Self {
        SweepRow {
            fsdp2_iteration_time_us: exported.map(|e| e.fsdp2_iteration_time_us),
            fsdp2_peak_memory_bytes: exported.map(|e| e.fsdp2_peak_memory_bytes),
            ..self
        }
    }
}

/// The FSDP2 export of `schedule` where it is exact and FSDP2's peak fits `cap` (what a plan
/// for the fsdp2 target must meet); None otherwise.
fn exact_fsdp2_within(profile: &Profile, schedule: &Schedule, cap: u64) -> Option<Fsdp2Plan> {
    let exported = export_fsdp2(profile, schedule).ok()?;
    (exported.exact && exported.fsdp2_peak_memory_bytes <= cap).then_some(exported)
}

/// The fastest variant (checkpointing off or on) of a baseline that fits `cap`; for the fsdp2
/// target, that FSDP2 runs exactly within `cap` (its FSDP2 peak), with FSDP2's time and peak.
pub fn best_baseline_row(
    profile: &Profile,
    kind: BaselineKind,
    cap: u64,
    target: Target,
) -> SweepRow {
    if target == Target::Fsdp2 {
        let best = baselines_at(profile, &[kind], RecomputeChoice::Allowed, Some(cap))
            .filter_map(|b| {
                let exported = exact_fsdp2_within(profile, &b.plan.schedule, cap)?;
                Some((b, exported))
            })
            .min_by(|(_, a), (_, b)| {
                a.fsdp2_iteration_time_us
                    .total_cmp(&b.fsdp2_iteration_time_us)
            });
        let plan = best
            .as_ref()
            .map(|(b, _)| (&b.plan.schedule, &b.plan.simulation));
        return SweepRow::new(cap, Method::Baseline(kind), plan)
            .with_fsdp2(best.as_ref().map(|(_, e)| e));
    }
    let best = best_baseline(
        profile,
        &[kind],
        RecomputeChoice::Allowed,
        Some(cap),
        Preference::Fastest,
    );
    SweepRow::new(
        cap,
        Method::Baseline(kind),
        best.as_ref()
            .map(|b| (&b.plan.schedule, &b.plan.simulation)),
    )
}

/// Every baseline of a profile at one cap, beside the ILP (`demo`).
pub struct BaselineComparison {
    pub cap: u64,
    /// Each kind of [`BaselineKind::of`], then of [`BaselineKind::offload_of`], with
    /// checkpointing off, then on, that can be built at the cap ([`baselines_at`]).
    pub built: Vec<ChosenBaseline>,
    /// The node layout's baselines the profile does not offer, each with its reason
    /// ([`BaselineKind::unavailable_on`]); their micro-batch forms only where the profile has
    /// micro-batches.
    pub left_out: Vec<(BaselineKind, String)>,
}

impl BaselineComparison {
    /// The comparison of `profile`'s baselines at `cap`.
    pub fn at(profile: &Profile, cap: u64) -> BaselineComparison {
        BaselineComparison {
            cap,
            built: baselines_at(
                profile,
                &every_baseline(profile),
                RecomputeChoice::Allowed,
                Some(cap),
            )
            .collect(),
            left_out: BaselineKind::HIERARCHICAL
                .into_iter()
                .filter(|kind| profile.micro_batches >= 2 || !kind.needs_micro_batches())
                .filter_map(|kind| Some((kind, kind.unavailable_on(profile)?)))
                .collect(),
        }
    }

    /// The fastest built baseline whose plan fits the cap.
    pub fn fastest(&self) -> Option<&ChosenBaseline> {
        Preference::Fastest.choose(&self.built, Some(self.cap), |b| {
            (
                b.plan.simulation.iteration_time_us,
                b.plan.simulation.peak_memory_bytes,
            )
        })
    }
}

/// The baselines of `profile` a comparison builds: [`BaselineKind::of`] and the offload ones.
fn every_baseline(profile: &Profile) -> Vec<BaselineKind> {
    let mut kinds = BaselineKind::of(profile);
    kinds.extend(BaselineKind::offload_of(profile));
    kinds
}

/// One solved cap of a chain.
#[derive(Clone)]
struct IlpPoint {
    schedule: Schedule,
    time_us: f64,
    /// The cap's own lower bound (None when the plan came from a smaller cap without a solve).
    bound_us: Option<f64>,
    window_depth: WindowLimits,
    seconds: f64,
    size: (usize, usize),
}

/// Solves the caps (ascending) of one chain, each warm-started from the previous plan.
fn ilp_chain(
    profile: &Profile,
    caps: &[u64],
    template: &SolveOptions,
    progress: &(dyn Fn() + Sync),
) -> Result<Vec<Option<IlpPoint>>> {
    let mut hint: Option<Schedule> = None;
    let mut points = Vec::with_capacity(caps.len());
    for &cap in caps {
        let options = SolveOptions {
            memory_cap_bytes: Some(cap),
            hint: hint.clone(),
            objective: Objective::Time,
            ..template.clone()
        };
        let point = match solve(profile, &options) {
            Ok(solved) => {
                hint = Some(solved.schedule.clone());
                let r = &solved.report;
                Some(IlpPoint {
                    time_us: solved.simulation.iteration_time_us,
                    bound_us: Some(r.best_bound),
                    window_depth: r.window_depth,
                    seconds: r.solve_seconds,
                    size: (r.integer_variables, r.constraints),
                    schedule: solved.schedule,
                })
            }
            Err(Error::Infeasible(_)) => None,
            Err(e) => return Err(e),
        };
        points.push(point);
        progress();
    }
    Ok(points)
}

/// The ILP at every cap (sorted ascending), monotone by the repair pass.
pub fn ilp_rows(
    profile: &Profile,
    caps: &[u64],
    template: &SolveOptions,
    progress: &(dyn Fn() + Sync),
) -> Result<Vec<SweepRow>> {
    let single = SolveOptions {
        threads: 1,
        ..template.clone()
    };
    let even: Vec<u64> = caps.iter().step_by(2).copied().collect();
    let odd: Vec<u64> = caps.iter().skip(1).step_by(2).copied().collect();
    let (a, b) = std::thread::scope(|scope| {
        let first = scope.spawn(|| ilp_chain(profile, &even, &single, progress));
        let second = ilp_chain(profile, &odd, &single, progress);
        (
            first.join().expect("the sweep thread does not panic"),
            second,
        )
    });
    let (a, b) = (a?, b?);
    let mut points: Vec<Option<IlpPoint>> = caps
        .iter()
        .enumerate()
        .map(|(k, _)| {
            if k % 2 == 0 {
                a[k / 2].clone()
            } else {
                b[k / 2].clone()
            }
        })
        .collect();
    for k in 1..points.len() {
        if let (Some(prev), Some(cur)) = (points[k - 1].clone(), points[k].as_mut())
            && prev.time_us < cur.time_us
        {
            cur.schedule = prev.schedule;
            cur.time_us = prev.time_us;
        } else if points[k].is_none() {
            points[k] = points[k - 1].clone().map(|p| IlpPoint {
                bound_us: None,
                ..p
            });
        }
    }
    Ok(caps
        .iter()
        .zip(points)
        .map(|(&cap, point)| match point {
            None => SweepRow::new(cap, Method::Ilp, None),
            Some(p) => {
                let sim = simulate_strict(profile, &p.schedule);
                let mut row = SweepRow::new(cap, Method::Ilp, Some((&p.schedule, &sim)));
                row.gap = p
                    .bound_us
                    .map(|bound| ((p.time_us - bound) / p.time_us).max(0.0));
                row.window_depth = Some(p.window_depth);
                row.solve_seconds = Some(p.seconds);
                row.integer_variables = Some(p.size.0);
                row.constraints = Some(p.size.1);
                match template.target {
                    Target::Fsdp2 => {
                        row.with_fsdp2(exact_fsdp2_within(profile, &p.schedule, cap).as_ref())
                    }
                    Target::Runtime => row,
                }
            }
        })
        .collect())
}

/// The default caps of a sweep, `(low, high)`. With the ILP among `methods`: from the smallest
/// feasible cap (the memory objective's optimum, rounded up to a MiB) to the peak of the fastest
/// plan when memory is unlimited (the zero2 or ddp plan, whichever is faster). Without it (no
/// solve at all): from the smallest peak of any method's plan (checkpointing off or on) to the
/// largest peak of each method's fastest plan, so every method fits the top cap.
pub fn cap_range(
    profile: &Profile,
    methods: &[Method],
    template: &SolveOptions,
) -> Result<(u64, u64)> {
    let mib = 1u64 << 20;
    let up_to_mib = |bytes: f64| whole_bytes(bytes / mib as f64) * mib;
    // The peak of the plan `preference` picks among `kinds`, checkpointing off and on, uncapped.
    let peak_of = |kinds: &[BaselineKind], preference| {
        best_baseline(profile, kinds, RecomputeChoice::Allowed, None, preference)
            .map(|b| b.plan.simulation.peak_memory_bytes)
            .ok_or_else(|| Error::invalid("sweep", "methods", "baselines that build without a cap"))
    };
    let smallest = Preference::Smallest {
        max_iteration_time_us: None,
    };
    let (low, high) = if methods.contains(&Method::Ilp) {
        let memory = SolveOptions {
            objective: Objective::Memory {
                max_iteration_time_us: None,
            },
            memory_cap_bytes: None,
            ..template.clone()
        };
        let low = solve(profile, &memory)?.simulation.peak_memory_bytes;
        let mut fastest = vec![BaselineKind::Ddp, BaselineKind::Zero2];
        if profile.micro_batches >= 2 {
            fastest.push(BaselineKind::DdpNoSync);
        }
        (low, peak_of(&fastest, Preference::Fastest)?)
    } else {
        let kinds: Vec<BaselineKind> = methods
            .iter()
            .filter_map(|m| match m {
                Method::Baseline(kind) => Some(*kind),
                Method::Ilp => None,
            })
            .collect();
        let low = peak_of(&kinds, smallest)?;
        let mut high: f64 = 0.0;
        for kind in kinds {
            high = high.max(peak_of(&[kind], Preference::Fastest)?);
        }
        (low, high)
    };
    let (low, high) = (up_to_mib(low), whole_bytes(high));
    Ok((low, high.max(low + mib)))
}

/// `points` caps evenly spaced from `low` to `high` inclusive.
pub fn even_caps(low: u64, high: u64, points: usize) -> Vec<u64> {
    if points <= 1 {
        return vec![high];
    }
    (0..points)
        .map(|k| low + ((high - low) as f64 * k as f64 / (points - 1) as f64).round() as u64)
        .collect()
}
