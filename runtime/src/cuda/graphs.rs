//! CUDA graphs per operation (`--cuda-graphs`, DESIGN §6.9): an operation that runs a fixed list
//! of launches on one stream (a unit's forward, backward or recompute) is captured into a graph
//! the second time the backend is asked for the same list, and replayed from then on; the first
//! time it runs as launches. Its key is the list itself, written out by the workload. The marks
//! around an operation stay outside its graph, so the executor's order is untouched.

use super::CudaBackend;
use crate::Result;
use crate::backend::Stream;
use crate::lock::recover;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The most operations the cache remembers (keys that never repeat, such as AdamW's, whose
/// scalars change every step, fill it no further).
const CAPACITY: usize = 1024;

/// What to do with an operation, from its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Run it as launches (first seen, or the cache is full).
    Launch,
    /// Capture it, then replay the graph (seen once before).
    Capture,
    /// Replay its graph.
    Replay,
}

/// The operations seen, each with its graph once captured: the cache's policy, apart from the
/// GPU (`G` is the graph).
struct Keys<G> {
    entries: HashMap<String, Option<G>>,
    capacity: usize,
}

impl<G> Keys<G> {
    fn new(capacity: usize) -> Self {
        Keys {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// What to do with the operation `key` names; a key seen for the first time is remembered
    /// while the cache has room.
    fn decide(&mut self, key: &str) -> Decision {
        match self.entries.get(key) {
            Some(Some(_)) => Decision::Replay,
            Some(None) => Decision::Capture,
            None => {
                if self.entries.len() < self.capacity {
                    self.entries.insert(key.to_string(), None);
                }
                Decision::Launch
            }
        }
    }

    fn graph(&self, key: &str) -> Option<&G> {
        self.entries.get(key)?.as_ref()
    }

    fn store(&mut self, key: &str, graph: G) {
        if let Some(entry) = self.entries.get_mut(key) {
            *entry = Some(graph);
        }
    }
}

/// A backend's graphs: on while `enabled` (the run asked for them and no capture has failed).
pub(super) struct Graphs {
    enabled: AtomicBool,
    keys: Mutex<Keys<CudaGraph>>,
}

impl Graphs {
    pub(super) fn new(enabled: bool) -> Self {
        Graphs {
            enabled: AtomicBool::new(enabled),
            keys: Mutex::new(Keys::new(CAPACITY)),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }
}

impl CudaBackend {
    /// Runs `enqueue` — one operation's launches, all on `stream`, fixed by what `key` writes out
    /// — as a graph when graphs are on and the launch clock is not running: as launches the
    /// first time, captured the second, replayed after. A capture that fails turns graphs off
    /// for the run, says why once on stderr, and runs the operation as launches.
    pub fn graphed(
        &self,
        stream: Stream,
        key: impl FnOnce() -> String,
        enqueue: impl Fn() -> Result<()>,
    ) -> Result<()> {
        if !self.graphs.enabled() || self.clock.running() {
            return enqueue();
        }
        let key = format!("{} {}", stream.name(), key());
        let mut keys = recover(self.graphs.keys.lock());
        match keys.decide(&key) {
            Decision::Launch => {
                drop(keys);
                enqueue()
            }
            Decision::Replay => {
                let graph = keys
                    .graph(&key)
                    .expect("Replay is decided for a stored graph");
                graph
                    .launch()
                    .map_err(super::driver_error("launching a CUDA graph"))
            }
            Decision::Capture => match capture(self.stream(stream), &enqueue) {
                Ok(graph) => {
                    graph
                        .launch()
                        .map_err(super::driver_error("launching a CUDA graph"))?;
                    keys.store(&key, graph);
                    Ok(())
                }
                Err(why) => {
                    drop(keys);
                    self.graphs.enabled.store(false, Ordering::Relaxed);
                    eprintln!(
                        "CUDA graphs are off for the rest of this run: {why}; operations run as \
                         launches"
                    );
                    enqueue()
                }
            },
        }
    }
}

/// `enqueue`'s launches on `stream` captured into an instantiated graph (nothing runs), or why
/// not; the capture is ended on every path.
fn capture(
    stream: &Arc<CudaStream>,
    enqueue: &impl Fn() -> Result<()>,
) -> std::result::Result<CudaGraph, String> {
    let thread_local = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream
        .begin_capture(thread_local)
        .map_err(|e| format!("beginning a capture: {e}"))?;
    let enqueued = enqueue();
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    enqueued.map_err(|e| format!("an operation under capture: {e}"))?;
    match ended {
        Ok(Some(graph)) => Ok(graph),
        Ok(None) => Err("the capture made no graph".into()),
        Err(e) => Err(format!("ending a capture: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation runs as launches the first time, is captured the second, replayed after;
    /// a full cache remembers no new key, so those run as launches for good.
    #[test]
    fn an_operation_is_captured_the_second_time_and_replayed_after() {
        let mut keys: Keys<u32> = Keys::new(2);
        assert_eq!(keys.decide("block.1 forward"), Decision::Launch);
        assert_eq!(keys.decide("block.1 forward"), Decision::Capture);
        keys.store("block.1 forward", 7);
        assert_eq!(keys.decide("block.1 forward"), Decision::Replay);
        assert_eq!(keys.graph("block.1 forward"), Some(&7));
        assert_eq!(keys.decide("adamw step 1"), Decision::Launch);
        assert_eq!(keys.decide("adamw step 2"), Decision::Launch);
        assert_eq!(
            keys.decide("adamw step 2"),
            Decision::Launch,
            "the cache is full"
        );
        assert_eq!(keys.decide("adamw step 1"), Decision::Capture);
        assert_eq!(keys.graph("adamw step 1"), None);
    }

    /// A capture that failed stores nothing: the key is asked to capture again, never replayed.
    #[test]
    fn a_key_without_a_graph_is_never_replayed() {
        let mut keys: Keys<u32> = Keys::new(4);
        keys.decide("head");
        assert_eq!(keys.decide("head"), Decision::Capture);
        assert_eq!(keys.decide("head"), Decision::Capture);
        keys.store("unseen", 1);
        assert_eq!(keys.graph("unseen"), None);
    }
}
