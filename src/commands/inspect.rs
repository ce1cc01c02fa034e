//! `shardplan inspect`: a plan as a readable table.

use crate::cli::InspectArgs;
use crate::output::{Table, ms, outln, print_json};
use serde_json::json;
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::size::{format_bytes, whole_bytes};

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let (profile, plan, schedule) = super::load_plan(&args.profile, &args.plan)?;
    let sim = simulate(&profile, &schedule, Semantics::Strict);
    let peak = sim.peak();
    if args.json {
        print_json(&json!({
            "producer": plan.producer.name,
            "units": plan.units,
            "iteration_time_us": sim.iteration_time_us,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "peak_slot": sim.peak_slot,
            "peak_micro_batch": sim.peak_micro_batch,
            "peak_breakdown": peak.memory,
        }));
        return Ok(());
    }
    let mut table = Table::new(&[
        "unit",
        "name",
        "level",
        "recompute",
        "blocks",
        "launches (slot x blocks)",
    ]);
    for (k, u) in plan.units.iter().enumerate() {
        let launches: Vec<String> = [
            ("AR", &u.ar),
            ("RS", &u.rs),
            ("AG", &u.ag),
            ("AGF", &u.agf),
            ("AGB", &u.agb),
            ("AR inner", &u.ar_inner),
            ("RS inner", &u.rs_inner),
            ("AG inner", &u.ag_inner),
            ("AGF inner", &u.agf_inner),
        ]
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .map(|(op, l)| {
            format!(
                "{op} {}",
                l.iter()
                    .map(|(s, b)| format!("{s}x{b}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })
        .collect();
        table.row(vec![
            (k + 1).to_string(),
            u.name.clone(),
            level_text(u),
            if u.recompute { "yes" } else { "no" }.to_string(),
            profile.blocks(k).to_string(),
            launches.join("; "),
        ]);
    }
    outln!("{}", table.render());
    outln!();
    outln!(
        "plan by {}: iteration {} (strict)",
        plan.producer.name,
        ms(sim.iteration_time_us)
    );
    let m = &peak.memory;
    outln!(
        "memory peak {} at slot {}:",
        format_bytes(sim.peak_memory_bytes),
        sim.peak_at()
    );
    for (what, bytes) in [
        ("persistent", m.persistent),
        ("gathered", m.gathered),
        ("gradient", m.gradient),
        ("activation", m.activation),
        ("workspace", m.workspace),
    ] {
        outln!("  {what:<11} {:>12}", format_bytes(bytes));
    }
    Ok(())
}

/// The level, with the choices across micro-batches that are on (DESIGN §3.10).
fn level_text(u: &shardplan_scheduler::plan::UnitPlan) -> String {
    let choices: Vec<&str> = [(u.accumulate, "accumulate"), (u.keep, "keep")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    if choices.is_empty() {
        u.level.name().to_string()
    } else {
        format!("{} ({})", u.level.name(), choices.join(", "))
    }
}
