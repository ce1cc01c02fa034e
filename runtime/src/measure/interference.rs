//! How compute and the communication stream's work slow each other (DESIGN §3.4): the alone and
//! together timings of κ_c and κ_q (κ_u for optimizer steps), through [`Backend`] marks, so the
//! same code measures the CPU and a GPU.

use super::median;
use crate::Result;
use crate::backend::{Backend, Stream, StreamWork, on_both_streams};

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
