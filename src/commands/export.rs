//! `shardplan export fsdp2`.

use crate::cli::ExportFsdp2Args;
use crate::output::print_json;
use serde_json::json;
use shardplan_scheduler::export::fsdp2 as export;
use shardplan_scheduler::io::write_atomic;

pub fn fsdp2(args: ExportFsdp2Args) -> anyhow::Result<()> {
    let (profile, _, schedule) = super::load_plan(&args.profile, &args.plan)?;
    let exported = export(&profile, &schedule);
    write_atomic(
        &args.out,
        serde_json::to_string_pretty(&exported)?.as_bytes(),
    )?;
    if args.json {
        print_json(
            &json!({"out": args.out, "exact": exported.exact, "approximations": exported.approximations}),
        );
    } else {
        println!(
            "wrote {}: {} units, {}",
            args.out.display(),
            exported.units.len(),
            if exported.exact {
                "exact".to_string()
            } else {
                format!("{} approximations", exported.approximations.len())
            }
        );
        for note in &exported.approximations {
            println!("  ~ {note}");
        }
    }
    Ok(())
}
