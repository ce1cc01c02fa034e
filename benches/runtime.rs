//! Executor overhead: 5 steps of mlp-small (one rank, loopback collectives) run by the executor
//! under the ddp plan (strict), against a hand-written loop doing the same kernels, AllReduces and
//! Adam steps in the same order with no executor. And the hand-off between two host threads
//! that the executor makes at every slot: 1,000 round trips through two events that sleep at
//! once (the CPU backend's) and through two that poll first (a GPU backend's).

use criterion::{Criterion, criterion_group, criterion_main};
use shardplan_runtime::backend::{CpuBackend, ENQUEUE_SPIN, Loopback};
use shardplan_runtime::event::Event;
use shardplan_runtime::executor::RunOptions;
use shardplan_runtime::measure::{UnitTime, workload_profile};
use shardplan_runtime::mlp::{Mlp, MlpSpec, adam, linear_backward, linear_forward, mse_grad};
use shardplan_runtime::session::Prepared;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::curve::CommCurve;
use shardplan_scheduler::profile::CommCurves;
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::sim::Semantics;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const STEPS: usize = 5;

/// The same work as the executor's ddp steps, written as one loop.
fn hand_written(spec: &MlpSpec, params: &mut [Vec<f32>], m: &mut [Vec<f32>], v: &mut [Vec<f32>]) {
    let rows = spec.batch_per_rank;
    let l = spec.units();
    let teacher = spec.teacher();
    let dl = *spec.widths.last().unwrap();
    let mut x = vec![0.0; rows * spec.input];
    let mut y = vec![0.0; rows * dl];
    let mut outputs: Vec<Vec<f32>> = (0..l).map(|u| vec![0.0; rows * spec.dims(u).1]).collect();
    let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut grad_in: Vec<Vec<f32>> = (0..l).map(|u| vec![0.0; rows * spec.dims(u).0]).collect();
    let mut loss_grad = vec![0.0; rows * dl];
    let mut scratch = vec![0.0; params.iter().map(Vec::len).max().unwrap()];
    for step in 0..STEPS {
        spec.batch(step, 0, rows, &teacher, &mut x, &mut y);
        for u in 0..l {
            let (before, rest) = outputs.split_at_mut(u);
            linear_forward(
                if u == 0 { &x } else { &before[u - 1] },
                &params[u],
                &mut rest[0],
                rows,
                spec.dims(u),
                spec.activation(u),
            );
        }
        mse_grad(
            &outputs[l - 1],
            &y,
            &mut loss_grad,
            1.0 / (rows * dl) as f32,
        );
        for u in (0..l).rev() {
            let (lower, upper) = grad_in.split_at_mut(u + 1);
            let grad_out: &mut [f32] = if u + 1 == l {
                &mut loss_grad
            } else {
                &mut upper[0]
            };
            let input: &[f32] = if u == 0 { &x } else { &outputs[u - 1] };
            linear_backward(
                input,
                &params[u],
                &outputs[u],
                grad_out,
                &mut grads[u],
                (u > 0).then_some(lower[u].as_mut_slice()),
                rows,
                spec.dims(u),
                spec.activation(u),
            );
            let n = grads[u].len();
            scratch[..n].copy_from_slice(&grads[u]);
            grads[u].copy_from_slice(&scratch[..n]);
            adam(
                &mut params[u],
                &grads[u],
                &mut m[u],
                &mut v[u],
                step as u32 + 1,
                spec.learning_rate,
            );
        }
    }
}

fn overhead(c: &mut Criterion) {
    let spec = MlpSpec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/mlp-small.toml"))
        .unwrap();
    let flat = CommCurve {
        points: vec![(1, 1.0), (1 << 40, 1.0)],
    };
    let comm = CommCurves {
        all_gather: flat.clone(),
        reduce_scatter: flat.clone(),
        all_reduce: flat,
    };
    let times = vec![
        UnitTime {
            forward_us: 100.0,
            checkpointed_forward_us: 90.0,
            backward_us: 200.0,
            recompute_us: 100.0,
            optimizer_us: 10.0,
        };
        spec.units()
    ];
    let mlp = Mlp::new(spec.clone(), 0, 1);
    let profile =
        workload_profile(&mlp, 1, &times, comm, Some(1 << 30), Default::default()).unwrap();
    let plan = baseline(&profile, BaselineKind::Ddp, Recompute::Off, None)
        .unwrap()
        .plan;
    let prepared = Prepared::new(
        CpuBackend::new(Loopback),
        &mlp,
        &profile,
        &plan,
        "ddp plan",
        STEPS,
    )
    .unwrap();
    let options = RunOptions {
        first_step: 0,
        steps: STEPS,
        semantics: Semantics::Strict,
        timeout: Duration::from_secs(30),
        trace: false,
        on_step: None,
        on_stall: None,
    };
    let mut group = c.benchmark_group("mlp-small 5 steps, 1 rank");
    group.bench_function("executor (ddp plan, strict)", |b| {
        b.iter(|| prepared.execute(&mlp, &options).unwrap())
    });
    let mut params: Vec<Vec<f32>> = (0..spec.units())
        .map(|u| spec.initial_params(u, spec.params(u)))
        .collect();
    let mut m: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v = m.clone();
    group.bench_function("hand-written loop", |b| {
        b.iter(|| hand_written(&spec, &mut params, &mut m, &mut v))
    });
    group.finish();
}

/// `rounds` round trips between this thread and another through two events polling for `spin`.
fn round_trips(spin: Duration, rounds: u64) {
    let (ping, pong) = (
        Arc::new(Event::<()>::spinning(spin)),
        Arc::new(Event::<()>::spinning(spin)),
    );
    let patience = Duration::from_secs(30);
    let echo = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::spawn(move || {
            for k in 1..=rounds {
                ping.wait(k, patience, &|| "ping".into()).unwrap();
                pong.signal(());
            }
        })
    };
    for k in 1..=rounds {
        ping.signal(());
        pong.wait(k, patience, &|| "pong".into()).unwrap();
    }
    echo.join().unwrap();
}

fn hand_off(c: &mut Criterion) {
    let mut group = c.benchmark_group("1,000 round trips between two threads");
    group.bench_function("sleeping waits", |b| {
        b.iter(|| round_trips(Duration::ZERO, 1000))
    });
    group.bench_function("polling waits", |b| {
        b.iter(|| round_trips(ENQUEUE_SPIN, 1000))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Criterion's HTML plots need a system font; the numbers are what we report.
    config = Criterion::default().without_plots();
    targets = overhead, hand_off
}
criterion_main!(benches);
