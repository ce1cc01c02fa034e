//! `shardplan demo`: the main job on a bundled profile.

use crate::cli::DemoArgs;
use crate::output::{Table, ms, print_json};
use serde_json::json;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::io::write_atomic;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::sim::chrome_trace;
use shardplan_scheduler::size::format_bytes;

/// The bundled default: Llama-2 70B on 64 H100s.
const DEMO_PROFILE: &str = include_str!("../../profiles/llama2-70b-h100-n64.toml");
const DEMO_ORIGIN: &str = "<bundled profiles/llama2-70b-h100-n64.toml>";

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let profile = Profile::from_toml(DEMO_PROFILE, DEMO_ORIGIN)?;
    let cap: u64 = profile
        .source
        .get("device_memory_bytes")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            anyhow::anyhow!("{DEMO_ORIGIN}: field `source.device_memory_bytes`: expected bytes")
        })?;
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", dir.display()))?;
    }
    let mut rows = Vec::new();
    for kind in BaselineKind::ALL {
        for checkpoint in [false, true] {
            let result = match baseline(&profile, kind, checkpoint, Some(cap)) {
                Ok(r) => r,
                Err(shardplan_scheduler::Error::Infeasible(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            let sim = &result.simulation;
            let name = format!("{}{}", kind.name(), if checkpoint { "+ckpt" } else { "" });
            if let Some(dir) = &args.out_dir {
                result.plan.save(&dir.join(format!("{name}.plan.toml")))?;
                write_atomic(
                    &dir.join(format!("{name}.trace.json")),
                    &serde_json::to_vec(&chrome_trace(&profile, sim))?,
                )?;
            }
            rows.push(json!({
                "method": name,
                "iteration_time_us": sim.iteration_time_us,
                "exposed_comm_us": sim.exposed_comm_us,
                "peak_memory_bytes": sim.peak_memory_bytes.ceil() as u64,
                "fits_cap": sim.peak_memory_bytes <= cap as f64,
            }));
        }
    }
    if args.json {
        print_json(&json!({"profile": profile.name, "memory_cap_bytes": cap, "methods": rows}));
        return Ok(());
    }
    println!(
        "{}: memory cap {} per rank",
        profile.name,
        format_bytes(cap as f64)
    );
    let mut table = Table::new(&["method", "iteration", "exposed comm", "peak memory", "fits"]);
    for r in &rows {
        table.row(vec![
            r["method"].as_str().unwrap_or_default().to_string(),
            ms(r["iteration_time_us"].as_f64().unwrap_or_default()),
            ms(r["exposed_comm_us"].as_f64().unwrap_or_default()),
            format_bytes(r["peak_memory_bytes"].as_f64().unwrap_or_default()),
            if r["fits_cap"].as_bool().unwrap_or(false) {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ]);
    }
    println!("{}", table.render());
    Ok(())
}
