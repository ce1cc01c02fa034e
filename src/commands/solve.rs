//! `shardplan solve`.

use crate::cli::{MemoryCap, ObjectiveArg, SolveArgs, TargetArg};
use crate::failure::flag_error;
use crate::output::{ms, outln, print_json};
use serde_json::json;
use shardplan_runtime::dispatch::{Data, Model};
use shardplan_runtime::fit::{Packing, solve_to_fit};
use shardplan_runtime::model_file::ModelFile;
use shardplan_scheduler::export::Fsdp2Plan;
use shardplan_scheduler::ilp::{
    Effort, Objective, OutsideTheSpace, SolveOptions, Solved, Target, WindowLimits,
    solve_naming_offload,
};
use shardplan_scheduler::io::check_outputs_distinct;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::size::{format_bytes, whole_bytes};
use shardplan_scheduler::timeline::Level;
use std::time::Instant;

pub fn run(args: SolveArgs) -> anyhow::Result<()> {
    // `--time-limit` bounds the whole command: reading the profile counts against it.
    let started = Instant::now();
    if args.objective == ObjectiveArg::Time && args.memory_cap.is_none() {
        return Err(flag_error(
            "--memory-cap",
            "a cap with --objective time (e.g. --memory-cap 78GiB, or --memory-cap unlimited)",
        ));
    }
    if args.max_iteration_time.is_some() && args.objective != ObjectiveArg::Memory {
        return Err(flag_error(
            "--max-iteration-time",
            "it only with --objective memory",
        ));
    }
    let mut inputs = vec![("--profile", args.profile.as_path())];
    inputs.extend(args.model.as_deref().map(|m| ("--model", m)));
    check_outputs_distinct(&[("--out", &args.out)], &inputs)?;
    let profile = Profile::load(&args.profile)?;
    let options = SolveOptions {
        objective: match args.objective {
            ObjectiveArg::Time => Objective::Time,
            ObjectiveArg::Memory => Objective::Memory {
                max_iteration_time_us: args.max_iteration_time,
            },
        },
        memory_cap_bytes: args.memory_cap.and_then(MemoryCap::bytes),
        time_limit_s: (args.time_limit - started.elapsed().as_secs_f64()).max(0.0),
        effort: args.effort.map_or(Effort::DEFAULT, Effort::new),
        relative_gap: args.gap,
        threads: args.threads,
        limits: WindowLimits {
            gather: args.window_depth.or(args.gather_depth),
            reduce: args.window_depth.or(args.reduce_depth),
        },
        allow_recompute: !args.no_recompute,
        two_phase: !args.single_phase,
        hint: None,
        target: args.target.into(),
    };
    if args.target == TargetArg::Fsdp2 && args.model.is_some() {
        return Err(flag_error(
            "--target",
            "runtime with --model (the packed arena is the runtime's, not FSDP2's)",
        ));
    }
    let (solved, packing) = match &args.model {
        None => (solve_naming_offload(&profile, &options)?, None),
        Some(path) => {
            let origin = path.display().to_string();
            let file = ModelFile::load(path)?;
            let ranks = (0, profile.world_size as usize);
            let model = Model::build(file, &origin, ranks, Data::Synthetic)?;
            let fitted = solve_to_fit(model.workload(), &profile, &options)?;
            (fitted.solved, Some(fitted.packing))
        }
    };
    let mut plan = solved.plan(&profile, options.memory_cap_bytes);
    plan.target = (options.target != Target::Runtime).then_some(options.target);
    plan.save(&args.out)?;
    let fsdp2 = fsdp2_export(&profile, &solved, options.target)?;
    report(&args, &solved, packing.as_ref(), fsdp2.as_ref());
    Ok(())
}

/// The FSDP2 target's plan as FSDP2 runs it (exact: its time is the plan's, DESIGN §4.9).
fn fsdp2_export(
    profile: &Profile,
    solved: &Solved,
    target: Target,
) -> anyhow::Result<Option<Fsdp2Plan>> {
    Ok(match target {
        Target::Runtime => None,
        Target::Fsdp2 => Some(shardplan_scheduler::export::fsdp2(
            profile,
            &solved.schedule,
        )?),
    })
}

fn report(args: &SolveArgs, solved: &Solved, packing: Option<&Packing>, fsdp2: Option<&Fsdp2Plan>) {
    let r = &solved.report;
    let sim = &solved.simulation;
    let count = |level: Level| {
        solved
            .schedule
            .units()
            .iter()
            .filter(|u| u.level == level)
            .count()
    };
    let units = solved.schedule.units();
    let recomputed = units.iter().filter(|u| u.recompute).count();
    let over_shard_groups = units.iter().filter(|u| u.shard_group.is_some()).count();
    let hpz = units.iter().filter(|u| u.secondary_group.is_some()).count();
    let bound_key = match args.objective {
        ObjectiveArg::Time => "best_bound_us",
        ObjectiveArg::Memory => "best_bound_bytes",
    };
    if args.json {
        print_json(&json!({
            "out": args.out,
            "status": solved.report.status.name(),
            "objective": if args.objective == ObjectiveArg::Time { "time" } else { "memory" },
            "iteration_time_us": sim.iteration_time_us,
            bound_key: r.best_bound,
            "gap": r.gap,
            "solve_seconds": r.solve_seconds,
            "peak_memory_bytes": whole_bytes(sim.peak_memory_bytes),
            "memory_cap_bytes": args.memory_cap.and_then(MemoryCap::bytes),
            "variables": r.variables,
            "integer_variables": r.integer_variables,
            "constraints": r.constraints,
            "levels": {"none": count(Level::None), "sdp": count(Level::Sdp), "fsdp": count(Level::Fsdp)},
            "recomputed_units": recomputed,
            "units_over_shard_groups": over_shard_groups,
            "units_hpz": hpz,
            "outside_ilp_space": r.outside_the_space.is_some(),
            "warm_start": r.warm_start.as_ref().map(|(name, time)| json!({"name": name, "iteration_time_us": time})),
            "window_depth": r.window_depth,
            "phases": r.phases,
            "arena_bytes": packing.map(|p| p.arena_bytes),
            "live_peak_bytes": packing.map(|p| p.live_peak_bytes),
            "solved_again": packing.map(|p| p.refused.iter().map(|(cap, arena)| json!({"memory_cap_bytes": cap, "arena_bytes": arena})).collect::<Vec<_>>()),
            "baseline": packing.and_then(|p| p.baseline.as_ref()),
            "target": Target::from(args.target).name(),
            "fsdp2_exact": fsdp2.map(|e| e.exact),
            "fsdp2_iteration_time_us": fsdp2.map(|e| e.fsdp2_iteration_time_us),
            "fsdp2_peak_memory_bytes": fsdp2.map(|e| e.fsdp2_peak_memory_bytes),
            "fsdp2_peak_slot": fsdp2.map(|e| e.fsdp2_peak_slot.clone()),
        }));
    } else {
        outln!(
            "wrote {}: {} — iteration {}, peak {} at {}, gap {:.2e} (bound {}, {}), {:.2} s",
            args.out.display(),
            solved.report.status.name(),
            ms(sim.iteration_time_us),
            format_bytes(sim.peak_memory_bytes),
            sim.peak_at(),
            r.gap,
            if args.objective == ObjectiveArg::Time {
                ms(r.best_bound)
            } else {
                format_bytes(r.best_bound)
            },
            if r.window_depth.is_full() {
                "over every plan".to_string()
            } else {
                format!("over plans within {}", r.window_depth)
            },
            r.solve_seconds
        );
        if let Some(e) = fsdp2 {
            outln!(
                "  target fsdp2: FSDP2 runs it as planned ({}), {}, peak {} at {} with FSDP2's \
                 buffers (DESIGN §3.12)",
                if e.exact {
                    "exact export"
                } else {
                    "export NOT exact"
                },
                ms(e.fsdp2_iteration_time_us),
                format_bytes(e.fsdp2_peak_memory_bytes as f64),
                e.fsdp2_peak_slot
            );
        }
        match r.outside_the_space {
            Some(OutsideTheSpace::BeyondTheBound) => outln!(
                "  the plan is a warm start outside the ILP's plan space (launches outside its \
                 windows, DESIGN §4.5): the bound is over that space, not over this plan"
            ),
            Some(OutsideTheSpace::OffloadBeyondTheMip) => outln!(
                "  the plan is an offloading warm start outside the offload ILP's plan space \
                 (`full` offload or host steps after the backward, DESIGN §4.10): no bound is \
                 claimed for it"
            ),
            None => {}
        }
        let hierarchical = if over_shard_groups + hpz > 0 {
            format!(" ({over_shard_groups} over a shard group, {hpz} hpz)")
        } else {
            String::new()
        };
        outln!(
            "  levels: {} none, {} sdp, {} fsdp{hierarchical}; {} recomputed; warm start {}",
            count(Level::None),
            count(Level::Sdp),
            count(Level::Fsdp),
            recomputed,
            r.warm_start
                .as_ref()
                .map_or("none".to_string(), |(n, t)| format!("{n} ({})", ms(*t)))
        );
        if let Some(p) = packing {
            outln!(
                "  packed for --model: arena {} (live peak {}){}",
                format_bytes(p.arena_bytes as f64),
                format_bytes(p.live_peak_bytes as f64),
                p.refused
                    .iter()
                    .map(|(cap, arena)| format!(
                        "; under {} it packed into {}",
                        format_bytes(*cap as f64),
                        format_bytes(*arena as f64)
                    ))
                    .collect::<String>()
            );
            if let Some(label) = &p.baseline {
                outln!(
                    "  returned the baseline {label}: no plan the solves found packs within the cap and does better"
                );
            }
        }
    }
}
