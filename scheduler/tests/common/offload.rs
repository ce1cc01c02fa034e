//! The offload space enumerated (DESIGN §4.10): every schedule of [`super::unit_options`] within a
//! window limit, and for each, every unit that may offload (sharded, reducing whole at the first
//! position after B_i) on the device, `optimizer` or `full` (steps overlapped), judged by the
//! strict simulator only. `ilp_offload` (one link) and `ilp_offload_nodes` (every group on nodes)
//! compare the offload MIP with it.

use super::{every_schedule, unit_options};
use shardplan_scheduler::ilp::WindowLimits;
use shardplan_scheduler::offload::{HostStep, Offload, host_node_bytes};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::UnitSchedule;
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::{Level, Op, Timeline};

/// A plan of the space: its time, device peak and host bytes per node, and whether it offloads.
pub struct Judged {
    pub time: f64,
    pub peak: f64,
    pub host: f64,
    pub offloads: bool,
}

/// Every plan of the offload MIP's space within `limits`. A mode the schedule cannot take
/// (`full` at hpZ, DESIGN §3.13) is no plan and is skipped.
pub fn enumerate_offloads(profile: &Profile, recompute: bool, limits: WindowLimits) -> Vec<Judged> {
    let per_unit: Vec<Vec<UnitSchedule>> = (0..profile.unit_count())
        .map(|u| unit_options(profile, u, recompute))
        .collect();
    let timeline = Timeline::new(profile.unit_count());
    let mut judged = Vec::new();
    every_schedule(profile, &per_unit, |schedule| {
        if !limits.admit(&schedule) {
            return;
        }
        let may: Vec<usize> = (0..profile.unit_count())
            .filter(|&u| {
                let first = timeline
                    .window(u, Op::ReduceScatter.window_kind())
                    .slot_at(0);
                let rs = schedule.launches(u, Op::ReduceScatter);
                schedule.units()[u].level != Level::None && rs.len() == 1 && rs[0].slot == first
            })
            .collect();
        for mask in 0..3u32.pow(may.len() as u32) {
            let mut modes = vec![Offload::None; profile.unit_count()];
            let mut digits = mask;
            for &u in &may {
                modes[u] =
                    [Offload::None, Offload::Optimizer, Offload::Full][(digits % 3) as usize];
                digits /= 3;
            }
            let host = host_node_bytes(profile, schedule.units(), &modes);
            let Ok(s) =
                schedule
                    .clone()
                    .offloaded(profile, modes, HostStep::Overlapped, "enumerated")
            else {
                continue;
            };
            let sim = simulate(profile, &s, Semantics::Strict);
            judged.push(Judged {
                time: sim.iteration_time_us,
                peak: sim.peak_memory_bytes,
                host,
                offloads: mask != 0,
            });
        }
    });
    judged
}
