//! The MLP's data loader: a rank's share of each step's batch. Where a device computes, the batch
//! is made one step ahead on a background thread (as a framework's data-loader workers do), its
//! rows over the host's cores, so the timed first forward only uploads it. Where the host computes
//! (the CPU backend, a rank bound to one core), a background thread would take the compute
//! stream's own core, unseen by the model (about 220 µs a step on mlp-small, DESIGN §6.6), so the
//! batch is made on the calling thread when it is taken, inside the first forward's time in the
//! profile as in a run. A batch is made by [`MlpSpec::batch`] over row chunks; each row depends on
//! its sample alone, so the batch is the same whatever the chunks.

use super::MlpSpec;
use crate::lock::recover;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Inputs (rows × d_0) and targets (rows × d_L) of one step.
pub struct Batch {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
}

/// What every batch is made from.
struct Source {
    spec: MlpSpec,
    teacher: Vec<f32>,
    /// The rank's first sample and its number of samples per step.
    first: usize,
    rows: usize,
}

impl Source {
    /// Step `step`'s batch, its rows split over the machine's threads.
    fn make(&self, step: usize) -> Batch {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.make_on(step, threads)
    }

    /// Step `step`'s batch, its rows split over `threads` threads (one: the calling thread).
    fn make_on(&self, step: usize, threads: usize) -> Batch {
        let (d0, dl) = (self.spec.input, self.spec.output());
        let mut batch = Batch {
            x: vec![0.0; self.rows * d0],
            y: vec![0.0; self.rows * dl],
        };
        if threads <= 1 {
            let (x, y) = (&mut batch.x, &mut batch.y);
            self.spec
                .batch(step, self.first, self.rows, &self.teacher, x, y);
            return batch;
        }
        let chunk = self.rows.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for (k, (x, y)) in batch
                .x
                .chunks_mut(chunk * d0)
                .zip(batch.y.chunks_mut(chunk * dl))
                .enumerate()
            {
                let first = self.first + k * chunk;
                let rows = x.len() / d0;
                scope.spawn(move || {
                    self.spec.batch(step, first, rows, &self.teacher, x, y);
                });
            }
        });
        batch
    }
}

/// Hands out each step's batch, the next one already in the making.
pub struct Loader {
    source: Arc<Source>,
    /// The step whose batch is being made, and the thread making it.
    ahead: Mutex<Option<(usize, JoinHandle<Batch>)>>,
}

impl Loader {
    /// The loader of samples `first..first + rows` of each step.
    pub fn new(spec: MlpSpec, first: usize, rows: usize) -> Loader {
        let teacher = spec.teacher();
        Loader {
            source: Arc::new(Source {
                spec,
                teacher,
                first,
                rows,
            }),
            ahead: Mutex::new(None),
        }
    }

    /// Step `step`'s batch made now on the calling thread (the host computes: nothing ahead).
    pub fn make_now(&self, step: usize) -> Batch {
        self.source.make_on(step, 1)
    }

    /// Step `step`'s batch (made now unless it was made ahead); starts making step + 1's.
    pub fn take(&self, step: usize) -> Batch {
        let mut ahead = recover(self.ahead.lock());
        let made = match ahead.take() {
            Some((s, thread)) if s == step => thread.join().ok(),
            _ => None,
        };
        let batch = made.unwrap_or_else(|| self.source.make(step));
        let source = Arc::clone(&self.source);
        *ahead = Some((step + 1, std::thread::spawn(move || source.make(step + 1))));
        batch
    }
}
