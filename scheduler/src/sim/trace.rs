//! Chrome trace JSON (opens in Perfetto and chrome://tracing): a slot track, a compute track, a
//! communication track with one event per block, a stacked memory counter per slot, and where the
//! plan offloads the host's D2H, step and H2D tracks.

use super::{HostTrack, Simulation};
use crate::profile::Profile;
use crate::timeline::Slot;
use serde_json::{Value, json};

const PID: u32 = 1;
const SLOTS_TID: u32 = 1;
const COMPUTE_TID: u32 = 2;
const COMM_TID: u32 = 3;
/// The host's tracks (DESIGN §3.13): D2H copies, host steps, H2D copies.
const HOST_TIDS: [(HostTrack, u32); 3] = [
    (HostTrack::DeviceToHost, 4),
    (HostTrack::Step, 5),
    (HostTrack::HostToDevice, 6),
];

/// A complete event ("X") on track `tid`: `name` from `ts` for `dur` µs.
pub fn complete(name: String, tid: u32, ts: f64, dur: f64, args: Value) -> Value {
    json!({"name": name, "ph": "X", "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args})
}

/// The metadata event that names track `tid`.
pub fn thread_name(tid: u32, name: &str) -> Value {
    json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}})
}

/// The trace file around its events.
pub fn trace_file(events: Vec<Value>) -> Value {
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// The trace of one simulated iteration (timestamps in µs from its start).
pub fn chrome_trace(profile: &Profile, sim: &Simulation) -> Value {
    let mut events = vec![
        json!({"name": "process_name", "ph": "M", "pid": PID,
               "args": {"name": format!("{} ({})", profile.name, sim.semantics.name())}}),
        thread_name(SLOTS_TID, "slots"),
        thread_name(COMPUTE_TID, "compute"),
        thread_name(COMM_TID, "communication"),
    ];
    for s in &sim.slots {
        events.push(complete(s.label(), SLOTS_TID, s.start_us, s.duration_us,
            json!({"compute_us": s.compute_us, "comm_us": s.comm_us, "memory_bytes": s.memory_bytes})));
        if s.compute_us > 0.0 {
            let name = match s.slot {
                Slot::E | Slot::I => s.label(),
                Slot::F(unit) | Slot::B(unit) => {
                    format!("{} {}", s.label(), profile.units[unit - 1].name)
                }
            };
            let busy = s.compute_us + profile.overlap_slowdown * s.comm_us;
            events.push(complete(
                name,
                COMPUTE_TID,
                s.compute_start_us,
                busy,
                json!({"compute_us": s.compute_us}),
            ));
        }
        let m = &s.memory;
        events.push(
            json!({"name": "memory (bytes)", "ph": "C", "pid": PID, "ts": s.start_us, "args": {
            "persistent": m.persistent, "gathered": m.gathered, "gradient": m.gradient,
            "activation": m.activation, "workspace": m.workspace}}),
        );
    }
    for b in &sim.blocks {
        events.push(complete(
            format!("{} {}", b.op, profile.units[b.unit].name),
            COMM_TID,
            b.start_us,
            b.end_us - b.start_us,
            json!({"launched_at": b.launched_at()}),
        ));
    }
    if !sim.host_events.is_empty() {
        events.extend(HOST_TIDS.map(|(track, tid)| thread_name(tid, track.name())));
    }
    for h in &sim.host_events {
        let tid = HOST_TIDS
            .iter()
            .find(|(track, _)| *track == h.track)
            .map_or(COMM_TID, |&(_, tid)| tid);
        events.push(complete(
            format!("{} {}", h.track.name(), profile.units[h.unit].name),
            tid,
            h.start_us,
            h.end_us - h.start_us,
            json!({}),
        ));
    }
    trace_file(events)
}
