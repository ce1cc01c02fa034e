//! Simulator speed on the largest zoo model (GPT-3 175B, 98 units, N = 64): one fsdp2 plan,
//! strict and relaxed.

use criterion::{Criterion, criterion_group, criterion_main};
use shardplan_scheduler::analytic::{AnalyticOptions, analytic_profile};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::hardware::Catalog;
use shardplan_scheduler::model::ModelSpec;
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::sim::{Semantics, simulate};
use std::hint::black_box;
use std::path::Path;

fn simulator(c: &mut Criterion) {
    let model =
        ModelSpec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt3-175b.toml"))
            .unwrap();
    let profile = analytic_profile(
        &model,
        &Catalog::bundled().unwrap(),
        &AnalyticOptions::new("h100-sxm", 64),
    )
    .unwrap();
    let plan = baseline(&profile, BaselineKind::Fsdp2, Recompute::Off, None).unwrap();
    c.bench_function("simulate gpt3-175b fsdp2 strict", |b| {
        b.iter(|| {
            simulate(
                black_box(&profile),
                black_box(&plan.schedule),
                Semantics::Strict,
            )
        })
    });
    c.bench_function("simulate gpt3-175b fsdp2 relaxed", |b| {
        b.iter(|| {
            simulate(
                black_box(&profile),
                black_box(&plan.schedule),
                Semantics::Relaxed,
            )
        })
    });
}

criterion_group! {
    name = benches;
    // Criterion's HTML plots need a system font; the numbers are what we report.
    config = Criterion::default().without_plots();
    targets = simulator
}
criterion_main!(benches);
