//! `shardplan sweep`: the ILP and the baselines across memory caps, as CSV, charts, a markdown
//! summary and (with --json) the summary as JSON.

use crate::cli::{CapsArg, SweepArgs};
use crate::failure::flag_error;
use crate::output::{ms, outln, print_json};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use shardplan_scheduler::Error;
use shardplan_scheduler::baselines::Preference;
use shardplan_scheduler::ilp::{Effort, SolveOptions, WindowLimits};
use shardplan_scheduler::io::{check_outputs_distinct, write_atomic};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::size::format_bytes;
use shardplan_scheduler::sweep::{
    Method, SweepRow, best_baseline_row, cap_range, even_caps, ilp_rows,
};
use std::time::Instant;

fn csv(rows: &[SweepRow]) -> String {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    let mut out = String::from(
        "cap_bytes,method,feasible,iteration_time_us,peak_memory_bytes,exposed_comm_us,units_none,units_sdp,units_fsdp,recomputed_units,gap,window_depth,solve_seconds,integer_variables,constraints,host_memory_bytes,fsdp2_iteration_time_us,fsdp2_peak_memory_bytes\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.cap_bytes,
            r.method,
            r.feasible,
            opt(r.iteration_time_us),
            r.peak_memory_bytes.map_or(String::new(), |v| v.to_string()),
            opt(r.exposed_comm_us),
            r.units_none,
            r.units_sdp,
            r.units_fsdp,
            r.recomputed_units,
            opt(r.gap),
            r.window_depth.map_or(String::new(), WindowLimits::short),
            opt(r.solve_seconds),
            r.integer_variables.map_or(String::new(), |v| v.to_string()),
            r.constraints.map_or(String::new(), |v| v.to_string()),
            r.host_memory_bytes.map_or(String::new(), |v| v.to_string()),
            opt(r.fsdp2_iteration_time_us),
            r.fsdp2_peak_memory_bytes
                .map_or(String::new(), |v| v.to_string()),
        ));
    }
    out
}

/// Per cap: the ILP, the fastest feasible baseline, the speed-up.
fn summary(caps: &[u64], rows: &[SweepRow]) -> Vec<serde_json::Value> {
    caps.iter()
        .map(|&cap| {
            let at: Vec<&SweepRow> = rows.iter().filter(|r| r.cap_bytes == cap).collect();
            let ilp = at.iter().find(|r| r.method == "ilp" && r.feasible);
            let baselines = at.iter().filter(|r| r.method != "ilp" && r.feasible);
            let best = Preference::Fastest.choose(baselines, Some(cap), |r| {
                let peak = r.peak_memory_bytes.unwrap_or(u64::MAX);
                (r.iteration_time_us.unwrap_or(f64::INFINITY), peak as f64)
            });
            let speedup = match (
                ilp.and_then(|r| r.iteration_time_us),
                best.and_then(|r| r.iteration_time_us),
            ) {
                (Some(i), Some(b)) => Some(b / i),
                _ => None,
            };
            json!({
                "cap_bytes": cap,
                "ilp_iteration_time_us": ilp.and_then(|r| r.iteration_time_us),
                "ilp_gap": ilp.and_then(|r| r.gap),
                "best_baseline": best.map(|r| r.method.clone()),
                "best_baseline_iteration_time_us": best.and_then(|r| r.iteration_time_us),
                "speedup": speedup,
            })
        })
        .collect()
}

fn markdown(profile: &Profile, table: &[serde_json::Value], seconds: f64) -> String {
    let mut out = format!(
        "# Sweep: {}\n\nILP against the fastest feasible baseline at each memory cap ({seconds:.1} s).\n\n\
         | cap | ILP iteration | ILP gap | best baseline | its iteration | speed-up |\n|---|---|---|---|---|---|\n",
        profile.name
    );
    let time = |v: &serde_json::Value| v.as_f64().map_or("infeasible".to_string(), ms);
    for row in table {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            format_bytes(row["cap_bytes"].as_f64().unwrap_or_default()),
            time(&row["ilp_iteration_time_us"]),
            row["ilp_gap"]
                .as_f64()
                .map_or("-".into(), |g| format!("{:.3}%", g * 100.0)),
            row["best_baseline"].as_str().unwrap_or("none fits"),
            time(&row["best_baseline_iteration_time_us"]),
            row["speedup"]
                .as_f64()
                .map_or("-".into(), |s| format!("{s:.3}x")),
        ));
    }
    out
}

/// Every file a sweep may write into --out-dir.
const OUTPUTS: [&str; 6] = [
    "sweep.csv",
    "summary.md",
    "sweep.svg",
    "sweep.png",
    "levels.svg",
    "levels.png",
];

pub fn run(args: SweepArgs) -> anyhow::Result<()> {
    let outputs: Vec<_> = OUTPUTS.iter().map(|f| args.out_dir.join(f)).collect();
    check_outputs_distinct(
        &outputs
            .iter()
            .map(|p| ("--out-dir", p.as_path()))
            .collect::<Vec<_>>(),
        &[("--profile", &args.profile)],
    )?;
    let mut profile = Profile::load(&args.profile)?;
    if let Some(k) = args.micro_batches {
        profile.micro_batches = k;
    }
    let methods = args.methods.map_or_else(|| Method::all(&profile), |m| m.0);
    if let Some(reason) = methods.iter().find_map(|m| m.unavailable_on(&profile)) {
        return Err(flag_error(
            "--methods",
            format!(
                "methods that profile {} offers; {reason}",
                args.profile.display()
            ),
        ));
    }
    std::fs::create_dir_all(&args.out_dir).map_err(|source| Error::Write {
        path: args.out_dir.clone(),
        source,
    })?;
    if !methods.contains(&Method::Ilp) {
        let solver_flag = [
            ("--time-limit", args.time_limit.is_some()),
            ("--effort", args.effort.is_some()),
            ("--gap", args.gap.is_some()),
        ];
        if let Some((flag, _)) = solver_flag.into_iter().find(|(_, given)| *given) {
            return Err(flag_error(
                flag,
                "the ilp method among --methods: it sets the ILP's solves",
            ));
        }
    }
    let started = Instant::now();
    let template = SolveOptions {
        time_limit_s: args.time_limit.unwrap_or(60.0),
        effort: args.effort.map_or(Effort::DEFAULT, Effort::new),
        relative_gap: args.gap.unwrap_or(1e-3),
        target: args.target.into(),
        ..SolveOptions::default()
    };
    let points = args.points.unwrap_or(20) as usize;
    let caps = match args.caps {
        Some(CapsArg::List(_)) if args.points.is_some() => {
            return Err(flag_error(
                "--points",
                "a range of caps (--caps LOW..HIGH, or none): a list of caps is swept as given",
            ));
        }
        Some(CapsArg::List(caps)) => caps,
        Some(CapsArg::Range { low, high }) => even_caps(low, high, points),
        None => {
            let (low, high) = cap_range(&profile, &methods, &template)?;
            even_caps(low, high, points)
        }
    };
    let bar = ProgressBar::new(caps.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} caps, {elapsed}")
            .expect("valid template"),
    );
    bar.set_message("solving");
    let mut rows = Vec::new();
    if methods.contains(&Method::Ilp) {
        rows.extend(ilp_rows(&profile, &caps, &template, &|| bar.inc(1))?);
    }
    bar.finish_and_clear();
    for &cap in &caps {
        for method in &methods {
            if let Method::Baseline(kind) = method {
                rows.push(best_baseline_row(&profile, *kind, cap, template.target));
            }
        }
    }
    rows.sort_by_key(|r| {
        (
            r.cap_bytes,
            methods.iter().position(|m| m.name() == r.method),
        )
    });
    let seconds = started.elapsed().as_secs_f64();
    let table = summary(&caps, &rows);
    let names: Vec<String> = methods.iter().map(|m| m.name().to_string()).collect();
    write_atomic(&args.out_dir.join("sweep.csv"), csv(&rows).as_bytes())?;
    let charts = crate::plots::write_charts(&args.out_dir, &profile.name, &rows, &names)?;
    let md = markdown(&profile, &table, seconds);
    write_atomic(&args.out_dir.join("summary.md"), md.as_bytes())?;
    if args.json {
        print_json(&json!({"profile": profile.name, "wall_seconds": seconds, "caps": table}));
    } else {
        print!("{md}");
        outln!(
            "\nwrote sweep.csv, {}, summary.md into {}",
            charts.join(", "),
            args.out_dir.display()
        );
    }
    Ok(())
}
