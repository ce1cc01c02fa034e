//! `shardplan demo`: the main job on a bundled profile — every baseline and the ILP under the
//! device's memory, side by side: Llama-2 70B on 8 nodes of 8 H100s (NVLink inside a node,
//! InfiniBand between), or with `--flat` on one link for every collective (DESIGN §3.11).

use crate::cli::DemoArgs;
use crate::output::{Table, ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::ilp::{Effort, SolveOptions, solve};
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sim::{Simulation, chrome_trace};
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use shardplan_scheduler::sweep::BaselineComparison;

/// The bundled default: Llama-2 70B on 64 H100s as 8 nodes of 8.
const DEMO_PROFILE: &str = include_str!("../../profiles/llama2-70b-h100-8x8.toml");
const DEMO_ORIGIN: &str = "<bundled profiles/llama2-70b-h100-8x8.toml>";
/// The same without a topology: every collective on the inter-node link.
const FLAT_PROFILE: &str = include_str!("../../profiles/llama2-70b-h100-n64.toml");
const FLAT_ORIGIN: &str = "<bundled profiles/llama2-70b-h100-n64.toml>";

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let (text, origin) = if args.flat {
        (FLAT_PROFILE, FLAT_ORIGIN)
    } else {
        (DEMO_PROFILE, DEMO_ORIGIN)
    };
    let mut profile = Profile::from_toml(text, origin)?;
    profile.micro_batches = args.micro_batches;
    let cap: u64 = profile
        .source
        .get("device_memory_bytes")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            shardplan_scheduler::Error::invalid(origin, "source.device_memory_bytes", "bytes")
        })?;
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", dir.display()))?;
    }
    let save = |name: &str, plan: &Plan, sim: &Simulation| -> anyhow::Result<()> {
        if let Some(dir) = &args.out_dir {
            plan.save(&dir.join(format!("{name}.plan.toml")))?;
            write_atomic(
                &dir.join(format!("{name}.trace.json")),
                &serde_json::to_vec(&chrome_trace(&profile, sim))?,
            )?;
        }
        Ok(())
    };
    // The node layout's baselines this profile does not offer (--flat, or micro-batches) are
    // left out, each with its reason.
    let comparison = BaselineComparison::at(&profile, cap);
    let mut rows = Vec::new();
    for chosen in &comparison.built {
        let (name, result) = (chosen.label(), &chosen.plan);
        save(&name, &result.plan, &result.simulation)?;
        rows.push(Row {
            method: name,
            simulation: result.simulation.clone(),
            note: String::new(),
        });
    }
    let options = SolveOptions {
        memory_cap_bytes: Some(cap),
        time_limit_s: args.time_limit,
        effort: args.effort.map_or(Effort::DEFAULT, Effort::new),
        relative_gap: 1e-3,
        ..SolveOptions::default()
    };
    let solved = solve(&profile, &options)?;
    save("ilp", &solved.plan(&profile, Some(cap)), &solved.simulation)?;
    let r = &solved.report;
    let window = r.window_depth;
    rows.push(Row {
        method: "ilp".into(),
        simulation: solved.simulation.clone(),
        note: format!(
            "gap {:.3}% ({window}), {:.1} s",
            r.gap * 100.0,
            r.solve_seconds
        ),
    });
    if args.json {
        let methods: Vec<_> = rows.iter().map(|row| row.json(cap)).collect();
        let left_out: Vec<_> = (comparison.left_out.iter())
            .map(|(kind, reason)| json!({"method": kind.name(), "reason": reason}))
            .collect();
        print_json(
            &json!({"profile": profile.name, "memory_cap_bytes": cap, "methods": methods,
                           "left_out": left_out}),
        );
        return Ok(());
    }
    outln!(
        "{}: memory cap {} per rank",
        profile.name,
        format_bytes(cap as f64)
    );
    let mut table = Table::new(&[
        "method",
        "iteration",
        "exposed comm",
        "peak memory",
        "fits",
        "solver",
    ]);
    for row in &rows {
        let sim = &row.simulation;
        table.row(vec![
            row.method.clone(),
            ms(sim.iteration_time_us),
            ms(sim.exposed_comm_us),
            format_bytes(whole_bytes(sim.peak_memory_bytes) as f64),
            if row.fits(cap) { "yes" } else { "no" }.to_string(),
            row.note.clone(),
        ]);
    }
    outln!("{}", table.render());
    for (_, reason) in &comparison.left_out {
        outln!("left out: {reason}");
    }
    if let Some(fastest) = comparison.fastest() {
        outln!(
            "\nILP vs the fastest baseline that fits ({}): {:.3}x faster",
            fastest.label(),
            fastest.plan.simulation.iteration_time_us / solved.simulation.iteration_time_us
        );
    }
    Ok(())
}

/// One method's line of the comparison.
struct Row {
    method: String,
    simulation: Simulation,
    /// The solver's account (the ILP), else empty.
    note: String,
}

impl Row {
    fn fits(&self, cap: u64) -> bool {
        self.simulation.peak_memory_bytes <= cap as f64
    }

    fn json(&self, cap: u64) -> serde_json::Value {
        let sim = &self.simulation;
        json!({
            "method": self.method,
            "iteration_time_us": sim.iteration_time_us,
            "exposed_comm_us": sim.exposed_comm_us,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "fits_cap": self.fits(cap),
            "note": self.note,
        })
    }
}
