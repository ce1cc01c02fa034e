//! `shardplan demo`: the main job on a bundled profile — every baseline and the ILP under the
//! device's memory, side by side: Llama-2 70B on 8 nodes of 8 H100s (NVLink inside a node,
//! InfiniBand between), or with `--flat` on one link for every collective (DESIGN §3.11).

mod one_node;

use crate::cli::DemoArgs;
use crate::output::{Table, ms, outln, print_json};
use one_node::OneNode;
use serde_json::json;
use shardplan_scheduler::export::fsdp2 as export_fsdp2;
use shardplan_scheduler::ilp::{Effort, SolveOptions, solve};
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::plan::Plan;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Schedule;
use shardplan_scheduler::sim::{Simulation, chrome_trace};
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use shardplan_scheduler::sweep::BaselineComparison;
use shardplan_scheduler::target::Target;

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
        rows.push(Row::new(
            &profile,
            name,
            &result.schedule,
            &result.simulation,
        ));
    }
    let targets = match args.target {
        Some(t) => vec![Target::from(t)],
        None => Target::ALL.to_vec(),
    };
    let mut ilp_times = Vec::new();
    for target in targets {
        let options = SolveOptions {
            memory_cap_bytes: Some(cap),
            time_limit_s: args.time_limit,
            effort: args.effort.map_or(Effort::DEFAULT, Effort::new),
            relative_gap: 1e-3,
            target,
            ..SolveOptions::default()
        };
        let solved = solve(&profile, &options)?;
        let (name, method) = match target {
            Target::Runtime => ("ilp", "ilp".to_string()),
            Target::Fsdp2 => ("ilp-fsdp2", "ilp --target fsdp2".to_string()),
        };
        let mut plan = solved.plan(&profile, Some(cap));
        plan.target = (target != Target::Runtime).then_some(target);
        save(name, &plan, &solved.simulation)?;
        let r = &solved.report;
        let window = r.window_depth;
        let mut row = Row::new(&profile, method, &solved.schedule, &solved.simulation);
        row.note = format!(
            "gap {:.3}% ({window}), {:.1} s",
            r.gap * 100.0,
            r.solve_seconds
        );
        ilp_times.push((
            target,
            row.fsdp2.map(|f| f.time_us),
            solved.simulation.iteration_time_us,
        ));
        rows.push(row);
    }
    let one_node = OneNode::solve(&args)?;
    if args.json {
        let methods: Vec<_> = rows.iter().map(|row| row.json(cap)).collect();
        let left_out: Vec<_> = (comparison.left_out.iter())
            .map(|(kind, reason)| json!({"method": kind.name(), "reason": reason}))
            .collect();
        print_json(
            &json!({"profile": profile.name, "memory_cap_bytes": cap, "methods": methods,
                           "left_out": left_out, "one_node": one_node.json()}),
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
        "FSDP2 iteration",
        "FSDP2 peak",
        "FSDP2 fits",
        "solver",
    ]);
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    for row in &rows {
        let sim = &row.simulation;
        let (time, peak, fits) = match row.fsdp2 {
            Some(f) => (
                format!("{}{}", ms(f.time_us), if f.rounded > 0 { " ~" } else { "" }),
                format_bytes(f.peak_bytes as f64),
                yes(f.peak_bytes <= cap),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        table.row(vec![
            row.method.clone(),
            ms(sim.iteration_time_us),
            ms(sim.exposed_comm_us),
            format_bytes(whole_bytes(sim.peak_memory_bytes) as f64),
            yes(row.fits(cap)),
            time,
            peak,
            fits,
            row.note.clone(),
        ]);
    }
    outln!("{}", table.render());
    for (_, reason) in &comparison.left_out {
        outln!("left out: {reason}");
    }
    outln!(
        "FSDP2: the settings `export fsdp2` writes, run by FSDP2 (DESIGN §3.12); ~ marks an \
         export with approximations, - a plan it refuses to export"
    );
    let fastest = comparison.fastest();
    let fastest_fsdp2 = rows
        .iter()
        .filter(|row| !row.method.starts_with("ilp"))
        .filter_map(|row| Some((row.method.as_str(), row.fsdp2?)))
        .filter(|(_, f)| f.rounded == 0 && f.peak_bytes <= cap)
        .min_by(|a, b| a.1.time_us.total_cmp(&b.1.time_us));
    for (target, _, time) in ilp_times {
        match (target, fastest, fastest_fsdp2) {
            (Target::Runtime, Some(fastest), _) => outln!(
                "\nILP vs the fastest baseline that fits ({}): {:.3}x faster",
                fastest.label(),
                fastest.plan.simulation.iteration_time_us / time
            ),
            (Target::Fsdp2, _, Some((name, f))) => outln!(
                "ILP --target fsdp2 vs the fastest baseline FSDP2 runs exactly within the cap \
                 ({name}): {:.3}x faster",
                f.time_us / time
            ),
            _ => {}
        }
    }
    one_node.print();
    Ok(())
}

/// One method's line of the comparison.
struct Row {
    method: String,
    simulation: Simulation,
    /// Its FSDP2 export's figures; None where it does not export (offload).
    fsdp2: Option<Fsdp2Figures>,
    /// The solver's account (the ILP), else empty.
    note: String,
}

/// What FSDP2 runs for a plan's export (DESIGN §3.12).
#[derive(Clone, Copy)]
struct Fsdp2Figures {
    time_us: f64,
    peak_bytes: u64,
    /// The approximations the export lists (0: exact).
    rounded: usize,
}

impl Row {
    fn new(
        profile: &Profile,
        method: String,
        schedule: &Schedule,
        simulation: &Simulation,
    ) -> Self {
        let fsdp2 = export_fsdp2(profile, schedule).ok().map(|e| Fsdp2Figures {
            time_us: e.fsdp2_iteration_time_us,
            peak_bytes: e.fsdp2_peak_memory_bytes,
            rounded: e.approximations.len(),
        });
        Row {
            method,
            simulation: simulation.clone(),
            fsdp2,
            note: String::new(),
        }
    }

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
            "fsdp2_iteration_time_us": self.fsdp2.map(|f| f.time_us),
            "fsdp2_peak_memory_bytes": self.fsdp2.map(|f| f.peak_bytes),
            "fsdp2_approximations": self.fsdp2.map(|f| f.rounded),
            "note": self.note,
        })
    }
}
