//! κ_c, κ_q and κ_u measured on slots as the executor runs them (DESIGN §6.6).
//!
//! A slot of a run is short (a unit's forward or backward, often under a millisecond on the CPU)
//! and starts with a hand-over between the two streams' threads: the compute thread signals the
//! slot and computes, the communication thread wakes and runs the slot's blocks, and the next
//! slot waits for both. Whether the two threads then overlap, time-slice or run one after the
//! other depends on that scale (an operating system lets a running thread finish its slice before
//! a woken one; a GPU's copy engine starts at once). So the factors are fitted to slots run the
//! same way: each unit's forward and backward, with block-sized AllReduces (or an optimizer step)
//! beside it, timed per slot alone and together, and κ chosen so that the model's slot duration
//! ([`Interference::slot_duration`]) matches the measured ones. Each kind of collective costs
//! compute differently (on the CPU a ReduceScatter's slots ran c + Q where an AllReduce's ran
//! c + 0.7·Q), so each has its own κ_c.

use super::median;
use crate::Result;
use crate::backend::{Backend, Stream, StreamWork, on_both_streams};
use crate::event::Event;
use shardplan_scheduler::cost::Interference;
use std::time::Duration;

/// The work of slot `s` on one stream.
pub type SlotWork<'a> = &'a (dyn Fn(usize) -> Result<()> + Sync);

/// Alone/together measurements taken in this many rounds; each value is the median over them
/// (this machine's speed drifts over seconds, DESIGN §6.6).
const ROUNDS: usize = 5;

/// The AllReduce slots' communication against their compute: compute-bound, balanced and
/// communication-bound (a plan's slots are all three; the model's max form errs most where the
/// two are equal). They fit κ_c and κ_q.
const ALL_REDUCES_AGAINST_COMPUTE: [f64; 3] = [0.5, 1.0, 2.0];

/// The ReduceScatter and AllGather slots' communication against their compute: each fits its own
/// κ_c with κ_q given, which the compute-bound and balanced slots pin.
const OTHERS_AGAINST_COMPUTE: [f64; 2] = [0.5, 1.0];

/// The most blocks beside one slot.
const MOST_BLOCKS: usize = 64;

/// How long a stream waits for the other before the measurement fails.
const PATIENCE: Duration = Duration::from_secs(600);

/// One slot's times: its compute alone, its communication-stream work alone, and the slot with
/// both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotSample {
    pub compute_us: f64,
    pub comm_us: f64,
    pub together_us: f64,
}

/// What the fit found: κ_c (AllReduces), κ_c,RS and κ_c,AG where they were measured apart
/// ([`Slots::others`]), κ_q and κ_u.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlotInterference {
    pub compute: f64,
    pub reduce_scatter: Option<f64>,
    pub all_gather: Option<f64>,
    pub comm: f64,
    pub update: f64,
    /// Mean |model − measured| / measured over the collective slots and the update slots.
    pub collective_error: f64,
    pub update_error: f64,
    /// Each slot's optimizer step alone, as the update slots timed it (its state cold, as in a
    /// run, where the step's bytes were last touched a step before).
    pub update_us: Vec<f64>,
}

/// One block-sized collective.
pub type BlockWork<'a> = &'a (dyn Fn() -> Result<()> + Sync);

/// The workload as slots: `slots` slots whose compute is `compute(s)` (each unit's forward, then
/// each backward); one block-sized AllReduce, and where their κ_c is measured apart, one
/// ReduceScatter and AllGather; `update(s)` an optimizer step that touches no byte of the compute.
pub struct Slots<'a> {
    pub slots: usize,
    pub compute: SlotWork<'a>,
    pub all_reduce: BlockWork<'a>,
    pub others: Option<OtherCollectives<'a>>,
    pub update: SlotWork<'a>,
}

/// The block-sized ReduceScatter and AllGather whose κ_c,RS and κ_c,AG are fitted apart from
/// the AllReduce's κ_c (DESIGN §6.6: on a GPU; on the CPU one κ_c serves all three).
pub struct OtherCollectives<'a> {
    pub reduce_scatter: BlockWork<'a>,
    pub all_gather: BlockWork<'a>,
}

/// The communication-stream work beside the slots, by what its samples fit.
#[derive(Clone, Copy, PartialEq)]
enum Fits {
    AllReduce,
    ReduceScatter,
    AllGather,
    Update,
}

/// κ_c and κ_q from slots with block-sized AllReduces beside compute, about half, once and twice
/// its time ([`ALL_REDUCES_AGAINST_COMPUTE`]); where `work.others` names them, κ_c,RS and κ_c,AG
/// from slots with ReduceScatters and AllGathers ([`OTHERS_AGAINST_COMPUTE`]), and κ_u from slots
/// with an optimizer step beside them, each with κ_q given; every value is the slowest rank's (a
/// slot whose collectives join the ranks ends with the slowest). Every rank must call it and gets
/// the same factors.
pub fn time_slot_interference<B: Backend>(backend: &B, work: &Slots) -> Result<SlotInterference> {
    let idle = |_: usize| Ok(());
    let slots = work.slots;
    run_slots(backend, slots, Some(work.compute), &idle)?;
    // The first timing sizes the blocks beside each slot (the same counts on every rank).
    let first_compute = slowest(
        backend,
        &run_slots(backend, slots, Some(work.compute), &idle)?,
    )?;
    let all_reduces = (
        Fits::AllReduce,
        work.all_reduce,
        &ALL_REDUCES_AGAINST_COMPUTE[..],
    );
    let others = work.others.iter().flat_map(|o| {
        [
            (
                Fits::ReduceScatter,
                o.reduce_scatter,
                &OTHERS_AGAINST_COMPUTE[..],
            ),
            (Fits::AllGather, o.all_gather, &OTHERS_AGAINST_COMPUTE[..]),
        ]
    });
    let kinds = std::iter::once(all_reduces).chain(others);
    let mut block_slots = Vec::new();
    for (fits, block, ratios) in kinds {
        let one_block = |_: usize| block();
        let block_us = median(slowest(
            backend,
            &run_slots(backend, slots, None, &one_block)?,
        )?);
        for &ratio in ratios {
            let counts: Vec<usize> = first_compute
                .iter()
                .map(|c| ((ratio * c / block_us.max(1e-3)).round() as usize).clamp(1, MOST_BLOCKS))
                .collect();
            block_slots.push((fits, move |s: usize| {
                (0..counts[s]).try_for_each(|_| block())
            }));
        }
    }
    let comm_works: Vec<(Fits, SlotWork)> = block_slots
        .iter()
        .map(|(fits, w)| (*fits, w as SlotWork))
        .chain([(Fits::Update, work.update)])
        .collect();
    // Per round: compute alone, then each work alone and beside compute.
    let mut computed = Vec::with_capacity(ROUNDS);
    let (mut alone, mut together) = (
        vec![Vec::new(); comm_works.len()],
        vec![Vec::new(); comm_works.len()],
    );
    for _ in 0..ROUNDS {
        computed.push(slowest(
            backend,
            &run_slots(backend, slots, Some(work.compute), &idle)?,
        )?);
        for (k, (_, comm)) in comm_works.iter().enumerate() {
            alone[k].push(slowest(backend, &run_slots(backend, slots, None, *comm)?)?);
            together[k].push(slowest(
                backend,
                &run_slots(backend, slots, Some(work.compute), *comm)?,
            )?);
        }
    }
    let per_slot = |rows: &[Vec<f64>], s: usize| median(rows.iter().map(|r| r[s]).collect());
    let compute: Vec<f64> = (0..slots).map(|s| per_slot(&computed, s)).collect();
    let samples = |fits: Fits| -> Vec<SlotSample> {
        let (compute, alone, together) = (&compute, &alone, &together);
        (0..comm_works.len())
            .filter(|&k| comm_works[k].0 == fits)
            .flat_map(|k| {
                (0..slots).map(move |s| SlotSample {
                    compute_us: compute[s],
                    comm_us: per_slot(&alone[k], s),
                    together_us: per_slot(&together[k], s),
                })
            })
            .collect()
    };
    let (all_reduces, reduce_scatters, all_gathers, updates) = (
        samples(Fits::AllReduce),
        samples(Fits::ReduceScatter),
        samples(Fits::AllGather),
        samples(Fits::Update),
    );
    let (kappa_c, kappa_q) = fit_collectives(&all_reduces);
    let apart = |samples: &[SlotSample]| (!samples.is_empty()).then(|| fit_load(samples, kappa_q));
    let (kappa_rs, kappa_ag) = (apart(&reduce_scatters), apart(&all_gathers));
    let fitted = [
        (kappa_c, &all_reduces),
        (kappa_rs.unwrap_or(kappa_c), &reduce_scatters),
        (kappa_ag.unwrap_or(kappa_c), &all_gathers),
    ];
    let kappa_u = fit_load(&updates, kappa_q);
    let collective_error = mean_error(
        fitted
            .iter()
            .flat_map(|(kappa, samples)| samples.iter().map(move |s| (*kappa, s))),
        kappa_q,
    );
    Ok(SlotInterference {
        compute: kappa_c,
        reduce_scatter: kappa_rs,
        all_gather: kappa_ag,
        comm: kappa_q,
        update: kappa_u,
        collective_error,
        update_error: mean_error(updates.iter().map(|s| (kappa_u, s)), kappa_q),
        update_us: updates.iter().map(|s| s.comm_us).collect(),
    })
}

/// The candidate factors: 0, 0.01, …, 1.
fn grid() -> impl Iterator<Item = f64> + Clone {
    (0..=100).map(|k| f64::from(k) / 100.0)
}

/// The model's duration of a slot whose communication-stream work (Q) costs compute κ·Q:
/// max(c + κ·Q, Q + κ_q·c).
fn load_model(kappa: f64, comm: f64, s: &SlotSample) -> f64 {
    Interference::uniform(kappa, comm, kappa).slot_duration(
        s.compute_us,
        s.comm_us,
        kappa * s.comm_us,
    )
}

/// Σ (model − measured)² over the samples, in µs²: a step is the sum of its slots, so an error
/// counts by its µs (relative errors let the noise of the shortest slots, tens of µs, decide).
fn squared_error(samples: &[SlotSample], model: impl Fn(&SlotSample) -> f64) -> f64 {
    samples
        .iter()
        .map(|s| (model(s) - s.together_us).powi(2))
        .sum()
}

/// Mean |model − measured| / measured over the slots, each with the κ its model charges
/// ([`load_model`], κ_q given).
fn mean_error<'a>(samples: impl IntoIterator<Item = (f64, &'a SlotSample)>, comm: f64) -> f64 {
    let (total, count) = samples
        .into_iter()
        .fold((0.0, 0usize), |(total, count), (kappa, s)| {
            let error = (load_model(kappa, comm, s) - s.together_us) / s.together_us.max(1e-9);
            (total + error.abs(), count + 1)
        });
    total / count.max(1) as f64
}

/// (κ_c, κ_q) on the grid with the least squared error of
/// d = max(c + κ_c·Q, Q + κ_q·c); among equal errors the smallest factors (a factor the samples
/// do not constrain stays as low as they allow).
pub fn fit_collectives(samples: &[SlotSample]) -> (f64, f64) {
    let mut best = (f64::INFINITY, 0.0, 0.0);
    for compute in grid() {
        for comm in grid() {
            let error = squared_error(samples, |s| load_model(compute, comm, s));
            if error < best.0 {
                best = (error, compute, comm);
            }
        }
    }
    (best.1, best.2)
}

/// κ on the grid with the least squared error of d = max(c + κ·Q, Q + κ_q·c), κ_q given: κ_u of
/// optimizer steps, κ_c,RS and κ_c,AG of the other collectives; the smallest among equal errors.
pub fn fit_load(samples: &[SlotSample], comm: f64) -> f64 {
    let mut best = (f64::INFINITY, 0.0);
    for kappa in grid() {
        let error = squared_error(samples, |s| load_model(kappa, comm, s));
        if error < best.0 {
            best = (error, kappa);
        }
    }
    best.1
}

/// Each slot's value, the largest over the ranks (every rank gets the same).
fn slowest<B: Backend>(backend: &B, values: &[f64]) -> Result<Vec<f64>> {
    let ranks = super::timing::every_rank(backend, values)?;
    Ok((0..values.len())
        .map(|s| ranks.iter().map(|r| r[s]).fold(0.0, f64::max))
        .collect())
}

/// The duration of each of `slots` slots run as the executor runs strict slots (DESIGN §6.3):
/// the compute thread waits until the communication of the slot before is done, signals the
/// slot and runs `compute(s)` (none: nothing); the communication thread waits for the signal,
/// runs `comm(s)` and signals it done. A slot lasts from its signal to the next slot's (the last
/// one until both streams are done). Each thread enters its stream as in a run.
fn run_slots<B: Backend>(
    backend: &B,
    slots: usize,
    compute: Option<SlotWork>,
    comm: SlotWork,
) -> Result<Vec<f64>> {
    let started: Event<B::Mark> = Event::spinning(backend.host_wait_spin());
    let done: Event<B::Mark> = Event::spinning(backend.host_wait_spin());
    let wait = |stream: Stream, event: &Event<B::Mark>, target: usize, what: &str| match event
        .wait(target as u64, PATIENCE, &|| {
            format!("{what} of slot {target}")
        })? {
        Some(mark) => backend.wait_mark(stream, &mark),
        None => Ok(()),
    };
    let communicate = || -> Result<()> {
        let stream = Stream::Communication;
        for s in 0..slots {
            wait(stream, &started, s + 1, "the start")?;
            comm(s)?;
            done.signal(backend.mark(stream)?);
        }
        Ok(())
    };
    let run_compute = || -> Result<Vec<B::Mark>> {
        let stream = Stream::Compute;
        let mut marks = Vec::with_capacity(slots + 1);
        for s in 0..slots {
            wait(stream, &done, s, "the communication")?;
            let mark = backend.mark(stream)?;
            started.signal(mark.clone());
            marks.push(mark);
            if let Some(compute) = compute {
                compute(s)?;
            }
        }
        wait(stream, &done, slots, "the communication")?;
        marks.push(backend.mark(stream)?);
        Ok(marks)
    };
    let (marks, communicated) = on_both_streams(
        backend,
        StreamWork {
            work: run_compute,
            on_failure: || started.abandon(),
        },
        StreamWork {
            work: communicate,
            on_failure: || done.abandon(),
        },
    );
    let (marks, ()) = (marks?, communicated?);
    backend.synchronize()?;
    marks
        .windows(2)
        .map(|w| backend.elapsed_us(&w[0], &w[1]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples_of(kappa: f64, comm: f64, shapes: &[(f64, f64)]) -> Vec<SlotSample> {
        shapes
            .iter()
            .map(|&(c, q)| SlotSample {
                compute_us: c,
                comm_us: q,
                together_us: load_model(
                    kappa,
                    comm,
                    &SlotSample {
                        compute_us: c,
                        comm_us: q,
                        together_us: 0.0,
                    },
                ),
            })
            .collect()
    }

    /// Compute-bound and communication-bound slots (c, Q).
    const SHAPES: [(f64, f64); 4] = [
        (300.0, 150.0),
        (900.0, 450.0),
        (200.0, 600.0),
        (500.0, 1500.0),
    ];

    /// Slots on both sides of c = Q pin both factors: the fit recovers them to the grid.
    #[test]
    fn the_fit_recovers_the_factors_that_made_the_slots() {
        for (c, q) in [(0.37, 0.12), (0.9, 0.8), (0.0, 0.0), (0.6, 0.66)] {
            let (fc, fq) = fit_collectives(&samples_of(c, q, &SHAPES));
            assert!(
                (fc - c).abs() < 0.006 && (fq - q).abs() < 0.006,
                "{c},{q} -> {fc},{fq}"
            );
        }
    }

    /// Streams that run one after the other (d = c + Q) are κ_q = 1 with any κ_c: the fit
    /// reproduces every slot and keeps κ_c at 0.
    #[test]
    fn serial_streams_fit_exactly() {
        let samples = samples_of(1.0, 1.0, &SHAPES);
        let (fc, fq) = fit_collectives(&samples);
        assert_eq!((fc, fq), (0.0, 1.0));
        assert_eq!(mean_error(samples.iter().map(|s| (fc, s)), fq), 0.0);
    }

    /// A compute-bound sample says nothing of κ_q: the fit keeps it at 0, not anywhere on the
    /// flat stretch of the error.
    #[test]
    fn an_unconstrained_factor_stays_at_zero() {
        let samples = samples_of(0.5, 0.5, &[(1000.0, 100.0), (800.0, 200.0)]);
        assert_eq!(fit_collectives(&samples), (0.5, 0.0));
    }

    /// κ_u (or κ_c,RS, κ_c,AG) from its own slots, κ_q given: a collective that runs beside
    /// compute one after the other (κ = 1, the CPU's ReduceScatters) is told from one that
    /// overlaps it, with the same κ_q.
    #[test]
    fn a_load_fit_recovers_its_factor() {
        let shapes = [(400.0, 250.0), (900.0, 260.0), (100.0, 250.0)];
        for kappa in [0.83, 1.0, 0.0] {
            let fitted = fit_load(&samples_of(kappa, 0.2, &shapes), 0.2);
            assert!((fitted - kappa).abs() < 0.006, "{kappa} -> {fitted}");
        }
    }
}
