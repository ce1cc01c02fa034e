//! `demo`'s one-node part (issue 64): Llama-2 70B on one node of 8 H100s (one NVLink link, K = 1)
//! at the same cap, where no plan fits on the device alone — every baseline, the offload ones
//! with their host memory, and the ILP with its offload choices (DESIGN §3.13, §4.10).

use crate::cli::{DemoArgs, TargetArg};
use crate::output::{Table, ms, outln};
use serde_json::json;
use shardplan_scheduler::baselines::BaselineKind;
use shardplan_scheduler::ilp::{Effort, OutsideTheSpace, SolveOptions, Solved, solve};
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{HostStep, Offload, Schedule};
use shardplan_scheduler::sim::{Simulation, chrome_trace};
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use shardplan_scheduler::sweep::BaselineComparison;
use std::num::NonZeroU64;
use std::path::Path;

/// `profile analytic --model models/llama2-70b.toml --device h100-sxm --world-size 8`.
const PROFILE: &str = include_str!("../../../profiles/llama2-70b-h100-n8.toml");
const ORIGIN: &str = "<bundled profiles/llama2-70b-h100-n8.toml>";
/// The ILP's effort here unless `--effort` is given (thousands of LP iterations): the offload
/// MIP of this profile reaches at 2 the plan it reaches at 60 (10,412.9 ms, gap 8.46%, behind the
/// 9,262.9 ms warm start; docs/offload.md), in 6 s instead of 86 s.
const EFFORT: NonZeroU64 = NonZeroU64::new(2).unwrap();
/// The prefix of the one-node part's files under `--out-dir`.
pub const FILE_PREFIX: &str = "one-node-";

/// The one-node comparison, solved and ready to print.
pub struct OneNode {
    profile_name: String,
    cap: u64,
    host_memory_bytes: u64,
    effort: NonZeroU64,
    rows: Vec<Row>,
    left_out: Vec<String>,
    /// The demo's options that do not apply to this part, each with why.
    not_applied: Vec<String>,
    /// The fastest baseline that fits, and the fastest `fsdp2-offload` variant that fits.
    fastest: Option<(String, f64)>,
    fastest_fsdp2_offload: Option<(String, f64)>,
}

/// One method's line.
struct Row {
    method: String,
    simulation: Simulation,
    /// Units on the device, offloading `optimizer`, offloading `full`.
    offload_counts: [usize; 3],
    host_step: Option<HostStep>,
    /// The ILP's account, else None.
    solver: Option<SolverAccount>,
}

/// What the solve claims of its plan.
struct SolverAccount {
    /// The proven gap; None where the plan lies outside the offload MIP's space.
    gap: Option<f64>,
    /// The MIP's own best plan and gap (its first phase), where it found one.
    mip_best: Option<(f64, f64)>,
    solve_seconds: f64,
}

impl OneNode {
    /// Builds every baseline and solves the ILP (runtime target) on the bundled one-node profile.
    pub fn solve(args: &DemoArgs) -> anyhow::Result<OneNode> {
        let profile = Profile::from_toml(PROFILE, ORIGIN)?;
        let cap: u64 = profile
            .source
            .get("device_memory_bytes")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                shardplan_scheduler::Error::invalid(ORIGIN, "source.device_memory_bytes", "bytes")
            })?;
        let host_memory_bytes = profile.host.as_ref().map_or(0, |h| h.memory_bytes);
        let save = |name: &str, plan: &Plan, sim: &Simulation| -> anyhow::Result<()> {
            if let Some(dir) = &args.out_dir {
                save_files(dir, &profile, name, plan, sim)?;
            }
            Ok(())
        };
        let comparison = BaselineComparison::at(&profile, cap);
        let mut rows = Vec::new();
        for chosen in &comparison.built {
            let result = &chosen.plan;
            save(&chosen.label(), &result.plan, &result.simulation)?;
            rows.push(Row::new(
                chosen.label(),
                &result.schedule,
                &result.simulation,
            ));
        }
        let effort = args.effort.unwrap_or(EFFORT);
        let options = SolveOptions {
            memory_cap_bytes: Some(cap),
            time_limit_s: args.time_limit,
            effort: Effort::new(effort),
            relative_gap: 1e-3,
            ..SolveOptions::default()
        };
        let solved = solve(&profile, &options)?;
        save("ilp", &solved.plan(&profile, Some(cap)), &solved.simulation)?;
        let mut ilp = Row::new("ilp".into(), &solved.schedule, &solved.simulation);
        ilp.solver = Some(SolverAccount::of(&solved));
        rows.push(ilp);
        let fastest_fsdp2_offload = (comparison.built.iter())
            .filter(|b| b.kind == BaselineKind::Fsdp2Offload)
            .filter(|b| b.plan.simulation.peak_memory_bytes <= cap as f64)
            .map(|b| (b.label(), b.plan.simulation.iteration_time_us))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let fastest = comparison
            .fastest()
            .map(|b| (b.label(), b.plan.simulation.iteration_time_us));
        Ok(OneNode {
            profile_name: profile.name.clone(),
            cap,
            host_memory_bytes,
            effort,
            rows,
            left_out: comparison
                .left_out
                .into_iter()
                .map(|(_, why)| why)
                .collect(),
            not_applied: not_applied(args),
            fastest,
            fastest_fsdp2_offload,
        })
    }

    fn ilp_time(&self) -> Option<f64> {
        (self.rows.iter())
            .find(|row| row.solver.is_some())
            .map(|row| row.simulation.iteration_time_us)
    }

    /// The part of `demo --json`'s document under `one_node`.
    pub fn json(&self) -> serde_json::Value {
        let speedup = |best: &Option<(String, f64)>| {
            best.as_ref().zip(self.ilp_time()).map(
                |((name, time), ilp)| json!({"baseline": name, "iteration_time_us": time, "speedup": time / ilp}),
            )
        };
        json!({
            "profile": self.profile_name,
            "memory_cap_bytes": self.cap,
            "host_memory_cap_bytes": self.host_memory_bytes,
            "micro_batches": 1,
            "effort": self.effort,
            "methods": self.rows.iter().map(|row| row.json(self.cap)).collect::<Vec<_>>(),
            "left_out": self.left_out,
            "not_applied": self.not_applied,
            "ilp_vs_fastest_fitting_baseline": speedup(&self.fastest),
            "ilp_vs_fsdp2_offload": speedup(&self.fastest_fsdp2_offload),
        })
    }

    /// The part of `demo`'s text after the 8 × 8 table.
    pub fn print(&self) {
        outln!(
            "\nOne node: {}, one link (NVLink), K = 1: memory cap {} per GPU, host {} per node; \
             nothing fits on the device alone, so the offload baselines and the ILP's offload \
             choices (DESIGN §3.13, §4.10; ILP effort {})",
            self.profile_name,
            format_bytes(self.cap as f64),
            format_bytes(self.host_memory_bytes as f64),
            self.effort
        );
        let mut table = Table::new(&[
            "method",
            "iteration",
            "device peak",
            "fits",
            "host per node",
            "on device/optimizer/full",
            "host step",
            "solver",
        ]);
        for row in &self.rows {
            let sim = &row.simulation;
            let [device, optimizer, full] = row.offload_counts;
            table.row(vec![
                row.method.clone(),
                ms(sim.iteration_time_us),
                format_bytes(whole_bytes(sim.peak_memory_bytes) as f64),
                if row.fits(self.cap) {
                    "yes"
                } else {
                    "does not fit"
                }
                .into(),
                sim.host
                    .as_ref()
                    .map_or("-".into(), |h| format_bytes(h.memory_bytes)),
                format!("{device}/{optimizer}/{full}"),
                row.host_step.map_or("-", host_step_name).into(),
                row.solver
                    .as_ref()
                    .map_or(String::new(), SolverAccount::note),
            ]);
        }
        outln!("{}", table.render());
        for reason in &self.left_out {
            outln!("one node: left out: {reason}");
        }
        for line in &self.not_applied {
            outln!("one node: {line}");
        }
        let Some(ilp) = self.ilp_time() else { return };
        if let Some((name, time)) = &self.fastest {
            outln!(
                "ILP vs the fastest baseline that fits ({name}): {:.3}x faster",
                time / ilp
            );
        }
        if let Some((name, time)) = &self.fastest_fsdp2_offload {
            outln!(
                "ILP vs fsdp2-offload (its fastest variant that fits, {name}): {:.3}x faster",
                time / ilp
            );
        }
    }
}

impl Row {
    fn new(method: String, schedule: &Schedule, simulation: &Simulation) -> Self {
        let count = |mode: Offload| {
            (schedule.offload_modes().iter())
                .filter(|&&m| m == mode)
                .count()
        };
        Row {
            method,
            simulation: simulation.clone(),
            offload_counts: [
                count(Offload::None),
                count(Offload::Optimizer),
                count(Offload::Full),
            ],
            host_step: schedule.offloads().then(|| schedule.host_step()),
            solver: None,
        }
    }

    fn fits(&self, cap: u64) -> bool {
        self.simulation.peak_memory_bytes <= cap as f64
    }

    fn json(&self, cap: u64) -> serde_json::Value {
        let sim = &self.simulation;
        let [device, optimizer, full] = self.offload_counts;
        json!({
            "method": self.method,
            "iteration_time_us": sim.iteration_time_us,
            "exposed_comm_us": sim.exposed_comm_us,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "fits_cap": self.fits(cap),
            "host_memory_bytes": sim.host.as_ref().map(|h| whole_bytes(h.memory_bytes)),
            "units_on_device": device,
            "units_offload_optimizer": optimizer,
            "units_offload_full": full,
            "host_step": self.host_step.map(host_step_name),
            "gap": self.solver.as_ref().and_then(|s| s.gap),
            "mip_iteration_time_us": self.solver.as_ref().and_then(|s| s.mip_best).map(|b| b.0),
            "mip_gap": self.solver.as_ref().and_then(|s| s.mip_best).map(|b| b.1),
            "solve_seconds": self.solver.as_ref().map(|s| s.solve_seconds),
        })
    }
}

impl SolverAccount {
    fn of(solved: &Solved) -> Self {
        let r = &solved.report;
        let outside = r.outside_the_space == Some(OutsideTheSpace::OffloadBeyondTheMip);
        SolverAccount {
            gap: (!outside && r.gap.is_finite()).then_some(r.gap),
            mip_best: (r.phases.first())
                .filter(|p| p.objective.is_finite() && p.gap.is_finite())
                .map(|p| (p.objective, p.gap)),
            solve_seconds: r.solve_seconds,
        }
    }

    fn note(&self) -> String {
        let claim = match (self.gap, self.mip_best) {
            (Some(gap), _) => format!("gap {:.3}%", gap * 100.0),
            (None, Some((time, gap))) => format!(
                "no gap: outside the MIP's space (its own best {}, gap {:.3}%)",
                ms(time),
                gap * 100.0
            ),
            (None, None) => "no gap: outside the MIP's space".into(),
        };
        format!("{claim}, {:.1} s", self.solve_seconds)
    }
}

fn host_step_name(step: HostStep) -> &'static str {
    match step {
        HostStep::Overlapped => "overlapped",
        HostStep::AfterBackward => "after backward",
    }
}

/// The demo's options this part does not take, each with why (issue 67: none silently ignored).
fn not_applied(args: &DemoArgs) -> Vec<String> {
    let mut lines = Vec::new();
    if args.flat {
        lines.push("--flat does not apply: its 8 GPUs share one link already".to_string());
    }
    if args.micro_batches >= 2 {
        lines.push(format!(
            "--micro-batches {} does not apply: offload is modelled at one micro-batch per step \
             (DESIGN §3.13), so this part is K = 1",
            args.micro_batches
        ));
    }
    lines.push(
        match args.target {
            Some(TargetArg::Fsdp2) => {
                "--target fsdp2 does not apply: the FSDP2 target plans no \
                                       offload and nothing fits on the device alone; the ILP \
                                       row is the runtime target's"
            }
            _ => {
                "the ILP for the runtime target only: the FSDP2 target plans no offload and \
                  nothing fits on the device alone"
            }
        }
        .to_string(),
    );
    lines
}

/// Writes `name`'s plan and trace under `dir`, prefixed [`FILE_PREFIX`].
fn save_files(
    dir: &Path,
    profile: &Profile,
    name: &str,
    plan: &Plan,
    sim: &Simulation,
) -> anyhow::Result<()> {
    plan.save(&dir.join(format!("{FILE_PREFIX}{name}.plan.toml")))?;
    write_atomic(
        &dir.join(format!("{FILE_PREFIX}{name}.trace.json")),
        &serde_json::to_vec(&chrome_trace(profile, sim))?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flat: bool, micro_batches: u32, target: Option<TargetArg>) -> DemoArgs {
        DemoArgs {
            out_dir: None,
            micro_batches,
            flat,
            effort: None,
            time_limit: 1.0,
            target,
            json: false,
        }
    }

    /// Each of `--flat`, `--micro-batches K ≥ 2` and `--target fsdp2` is named with why it does
    /// not apply, and only when given; the runtime-only ILP is said either way.
    #[test]
    fn options_that_do_not_apply_are_named() {
        let plain = not_applied(&args(false, 1, None));
        assert_eq!(plain.len(), 1, "{plain:?}");
        assert!(plain[0].contains("runtime target only"), "{plain:?}");
        let all = not_applied(&args(true, 4, Some(TargetArg::Fsdp2)));
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all[0].starts_with("--flat does not apply"), "{all:?}");
        assert!(
            all[1].starts_with("--micro-batches 4 does not apply"),
            "{all:?}"
        );
        assert!(
            all[2].starts_with("--target fsdp2 does not apply"),
            "{all:?}"
        );
        let runtime = not_applied(&args(false, 1, Some(TargetArg::Runtime)));
        assert_eq!(runtime, plain);
    }
}
