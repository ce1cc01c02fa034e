//! Timings through the [`Backend`] trait, between marks, so the same code times host kernels on
//! the CPU and device work on a GPU (CUDA events). Every function lays its buffers out from offset
//! 0 of the arena [`measurement_allocation`](super::measurement_allocation) sized; the collectives'
//! own timings are [`super::curves`].

use super::curves::every_rank;
use super::{DataSteps, UnitTime, UnitTimes, median};
use crate::Result;
use crate::backend::{Backend, Stream, StreamWork, on_both_streams};
use crate::gradients::{GradientStart, first_written_by};
use crate::layout::Layout;
use crate::train::{Train, optimize_unit};
use crate::workload::Pass;

/// The compute of slot `s` of a step without communication: unit s's forward for s < L, then the
/// backwards in reverse, unit 2L − 1 − s's, each with the gradient zeroing the executor does
/// before it (DESIGN §6.10); slot 0 takes the next of `steps`.
pub fn compute_slot<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    s: usize,
    steps: &DataSteps,
) -> Result<()> {
    let l = workload.unit_count();
    let step = steps.of_slot(s);
    if s < l {
        workload.forward(backend, layout, s, step, Pass::Forward)
    } else {
        let unit = 2 * l - 1 - s;
        for written in first_written_by(workload, unit) {
            GradientStart::Zero.prepare(backend, &layout.units[written])?;
        }
        workload.backward(backend, layout, unit, step)
    }
}

/// One compute round in slot order on the compute stream: every unit's forward, then every
/// backward, as a step runs them without communication; with `recompute`, each backward preceded
/// by its unit's recomputation, as a checkpointed unit's backward slot runs them. Returns the
/// marks around each unit's forward and backward, then around each recomputation (slot order:
/// the last unit's first).
fn compute_round_marks<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    steps: &DataSteps,
    recompute: bool,
) -> Result<Vec<[B::Mark; 2]>> {
    let (stream, l) = (Stream::Compute, workload.unit_count());
    let mut marks = Vec::with_capacity(3 * l);
    let mut recomputed = Vec::with_capacity(l);
    for s in 0..2 * l {
        if recompute && s >= l {
            let start = backend.mark(stream)?;
            let unit = 2 * l - 1 - s;
            workload.forward(backend, layout, unit, steps.current(), Pass::Recompute)?;
            recomputed.push([start, backend.mark(stream)?]);
        }
        let start = backend.mark(stream)?;
        compute_slot(backend, workload, layout, s, steps)?;
        marks.push([start, backend.mark(stream)?]);
    }
    marks.extend(recomputed);
    Ok(marks)
}

/// The layouts units are timed in ([`super::compute_placements`]): DDP's, and DDP's with every unit
/// checkpointed, each in its own part of the arena.
#[derive(Debug, Clone, Copy)]
pub struct TimedLayouts<'a> {
    pub plain: &'a Layout,
    pub checkpointed: &'a Layout,
}

/// Forward, checkpointed forward, backward, recompute and optimizer µs of each unit. First plain
/// rounds (forwards and backwards) alternating with rounds whose backwards are each preceded by
/// the unit's recomputation, in the plain layout: f_i and b_i from the plain rounds (a
/// recomputation just before a backward warms the caches it reads), and what recomputation adds
/// to the unit's backward slot, f'_i = (the recomputation + the backward right after it) − b_i,
/// at least 0, from the others: the backward reads what the recomputation just wrote (DESIGN
/// §6.6). Then rounds in the checkpointed layout, each backward preceded by the unit's
/// recomputation as a checkpointed unit's slots run them, whose forwards write their internals
/// into the reused forward workspace: f^c_i. The layouts do not alternate round by round: right
/// after a round of the other layout, gpt2-tiny's forwards and backwards measured 5–20% slower
/// than a run's, whose step follows a step of its own layout. Each kind of round: 3 warm-up
/// rounds, then the median over `repeats` rounds of each span's slowest rank's time (a slot
/// whose collectives join the ranks ends with the slowest; on gpt2-tiny at N = 2 its median is
/// 0.4–3.5% above one rank's own). The first unit's forward includes taking and uploading the
/// batch, as in a run; a recomputation takes nothing. After each round every unit takes an
/// optimizer step on the communication stream (with the gradients the round left), as the
/// executor does after a unit's last reduction; the streams wait for each other in between, so
/// no step is timed beside other work.
pub fn time_units<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layouts: TimedLayouts,
    repeats: usize,
    steps: &DataSteps,
) -> Result<UnitTimes> {
    const WARM_UP: usize = 3;
    let l = workload.unit_count();
    let round = |layout: &Layout, recompute: bool| -> Result<Vec<[B::Mark; 2]>> {
        let mut marks = compute_round_marks(backend, workload, layout, steps, recompute)?;
        let computed = backend.mark(Stream::Compute)?;
        backend.wait_mark(Stream::Communication, &computed)?;
        for i in 0..l {
            let start = backend.mark(Stream::Communication)?;
            optimize_unit(workload, backend, layout, i, 1)?;
            marks.push([start, backend.mark(Stream::Communication)?]);
        }
        let updated = backend.mark(Stream::Communication)?;
        backend.wait_mark(Stream::Compute, &updated)?;
        Ok(marks)
    };
    let (mut plain, mut recomputing) = (Vec::with_capacity(repeats), Vec::new());
    for k in 0..2 * (repeats + WARM_UP) {
        let recompute = k % 2 == 1;
        let mut marks = round(layouts.plain, recompute)?;
        if k >= 2 * WARM_UP {
            if recompute {
                recomputing.push(marks.drain(l..3 * l).collect::<Vec<_>>());
            } else {
                plain.push(marks);
            }
        }
    }
    let mut checkpointed = Vec::with_capacity(repeats);
    for k in 0..repeats + WARM_UP {
        let mut forwards = round(layouts.checkpointed, true)?;
        if k >= WARM_UP {
            forwards.truncate(l);
            checkpointed.push(forwards);
        }
    }
    backend.synchronize()?;
    let checkpointed = slowest_spans(backend, &checkpointed)?;
    let plain = slowest_spans(backend, &plain)?;
    // Per recomputing round: the backwards after their recomputations, then the recomputations
    // (each in slot order: the last unit's first).
    let recomputing = slowest_spans(backend, &recomputing)?;
    Ok((0..l)
        .map(|i| {
            let backward_us = plain[2 * l - 1 - i];
            let recomputed_backward_us = recomputing[l - 1 - i] + recomputing[2 * l - 1 - i];
            UnitTime {
                forward_us: plain[i],
                checkpointed_forward_us: checkpointed[i],
                backward_us,
                recompute_us: (recomputed_backward_us - backward_us).max(0.0),
                optimizer_us: plain[2 * l + i],
            }
        })
        .collect())
}

/// Per span of the rounds (each round the same spans), the median over the rounds of the slowest
/// rank's time.
fn slowest_spans<B: Backend>(backend: &B, rounds: &[Vec<[B::Mark; 2]>]) -> Result<Vec<f64>> {
    let spans = rounds.first().map_or(0, Vec::len);
    let mine = rounds
        .iter()
        .flat_map(|m| m.iter().map(|[start, end]| backend.elapsed_us(start, end)))
        .collect::<Result<Vec<f64>>>()?;
    let ranks = every_rank(backend, &mine)?;
    let slowest = |r: usize, k: usize| {
        ranks
            .iter()
            .map(|times| times[r * spans + k])
            .fold(0.0, f64::max)
    };
    Ok((0..spans)
        .map(|k| median((0..rounds.len()).map(|r| slowest(r, k)).collect()))
        .collect())
}

/// Alone/together pairs of the interference measurement: the machine's speed drifts over
/// seconds, so each pair's rates come from timings taken moments apart, and κ from their medians.
const INTERFERENCE_PAIRS: usize = 5;

/// Compute rounds timed alone in each pair.
const ALONE_ROUNDS: usize = 3;

/// How compute and the work of the communication stream slow each other (DESIGN §3.4). A compute
/// round (`compute_round` enqueues it on the compute stream, touching no byte that `comm_work`
/// touches) is timed alone (t_alone), and `comm_work` alone (Q); then `comm_work` starts together
/// with as many compute rounds as cover Q, each round taking t_with and the work D. Both streams
/// are busy throughout, so each progresses at a rate: compute r_c = t_alone/t_with,
/// communication r_q = Q/D. A slot with compute c and communication Q then lasts
/// max(c + κ_c·Q, Q + κ_q·c) with κ_c = (1 − r_c)/r_q and κ_q = (1 − r_q)/r_c (whichever stream
/// finishes first, the other runs on alone at full rate). The form holds while r_c + r_q ≥ 1,
/// i.e. both factors ≤ 1; they are clamped to [0, 1]. The alone and together timings are taken
/// in [`INTERFERENCE_PAIRS`] pairs, alternating which comes first, and each rate is the median
/// of the pairs' (a drift between two timings seconds apart would otherwise read as
/// interference). Every rank must call it.
pub fn time_interference<B: Backend>(
    backend: &B,
    compute_round: &(dyn Fn() -> Result<()> + Sync),
    comm_work: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Slowdowns> {
    compute_round()?;
    let alone = || -> Result<Timing> {
        let compute = timed(backend, Stream::Compute, &|| {
            (0..ALONE_ROUNDS).try_for_each(|_| compute_round())
        })? / ALONE_ROUNDS as f64;
        let comm = timed(backend, Stream::Communication, comm_work)?;
        Ok(Timing { compute, comm })
    };
    // Together: as many compute rounds as cover the work alone (the estimate's).
    let together = |estimate: &Timing| -> Result<Timing> {
        let rounds =
            ((estimate.comm / estimate.compute.max(1e-3)).ceil() as usize).clamp(1, 100_000);
        let (compute, comm) = overlap(backend, compute_round, comm_work, rounds)?;
        Ok(Timing {
            compute: compute / rounds as f64,
            comm,
        })
    };
    let mut pairs: Vec<(Timing, Timing)> = Vec::with_capacity(INTERFERENCE_PAIRS);
    for pair in 0..INTERFERENCE_PAIRS {
        pairs.push(match pairs.last() {
            Some((previous, _)) if pair % 2 == 1 => {
                let with = together(previous)?;
                (alone()?, with)
            }
            _ => {
                let by_itself = alone()?;
                let with = together(&by_itself)?;
                (by_itself, with)
            }
        });
    }
    let rate = |side: fn(&Timing) -> f64| {
        median(
            pairs
                .iter()
                .map(|(by_itself, with)| (side(by_itself) / side(with).max(1e-9)).clamp(1e-9, 1.0))
                .collect(),
        )
    };
    let compute_rate = rate(|t| t.compute);
    let comm_rate = rate(|t| t.comm);
    Ok(Slowdowns {
        compute: ((1.0 - compute_rate) / comm_rate).clamp(0.0, 1.0),
        comm: ((1.0 - comm_rate) / compute_rate).clamp(0.0, 1.0),
    })
}

/// How compute and one kind of communication-stream work slow each other: µs lost per µs of the
/// other running beside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdowns {
    /// Compute µs lost per µs of the work beside it (κ_c for collectives, κ_u for optimizer steps).
    pub compute: f64,
    /// The work's µs lost per µs of compute beside it (κ_q for collectives).
    pub comm: f64,
}

/// One timing of the interference measurement: a compute round's µs and the communication work's.
struct Timing {
    compute: f64,
    comm: f64,
}

/// µs of `work` enqueued on `stream`, waited for.
fn timed<B: Backend>(backend: &B, stream: Stream, work: &dyn Fn() -> Result<()>) -> Result<f64> {
    let before = backend.mark(stream)?;
    work()?;
    let after = backend.mark(stream)?;
    backend.synchronize()?;
    backend.elapsed_us(&before, &after)
}

/// `comm_work` on the communication stream (its own thread) started together with
/// `compute_rounds` rounds on the compute stream: the µs of each side.
fn overlap<B: Backend>(
    backend: &B,
    compute_round: &(dyn Fn() -> Result<()> + Sync),
    comm_work: &(dyn Fn() -> Result<()> + Sync),
    compute_rounds: usize,
) -> Result<(f64, f64)> {
    let go = backend.mark(Stream::Compute)?;
    backend.wait_mark(Stream::Communication, &go)?;
    let nothing = || {};
    let (with, comm_with) = on_both_streams(
        backend,
        StreamWork {
            work: || {
                timed(backend, Stream::Compute, &|| {
                    (0..compute_rounds).try_for_each(|_| compute_round())
                })
            },
            on_failure: nothing,
        },
        StreamWork {
            work: || timed(backend, Stream::Communication, comm_work),
            on_failure: nothing,
        },
    );
    Ok((with?, comm_with?))
}
