//! The offload MIP's plan space on tiny instances (DESIGN §4.10, §3.13), judged by the strict
//! simulator only: the exhaustive searches of `ilp_offload` and `ilp_offload_nodes`.

use super::every_schedule;
use shardplan_scheduler::offload::{HostStep, Offload, host_node_bytes};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::{Schedule, UnitSchedule};
use shardplan_scheduler::sim::{Semantics, simulate};
use shardplan_scheduler::timeline::{Level, Op, Timeline};

/// A plan of the space: its time, device peak and host bytes per node, and what it offloads.
#[derive(Clone, Copy)]
pub struct Judged {
    pub time: f64,
    pub peak: f64,
    pub host: f64,
    pub offloads: bool,
}

/// One enumeration of the plan space: the offload MIP's space within the limits asked for, and
/// every schedule without offload, within no limits (the device-only plans, whose smallest peak
/// is the device-only minimum).
pub struct OffloadSpace {
    /// Every plan within the limits: each schedule they admit with each way of offloading it.
    pub plans: Vec<Judged>,
    /// Every schedule of the options, none offloading.
    pub device_only: Vec<Judged>,
}

impl OffloadSpace {
    /// The smallest device peak of a plan that offloads nothing.
    pub fn device_only_minimum(&self) -> f64 {
        self.device_only
            .iter()
            .map(|j| j.peak)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Every schedule made of one option per unit (`per_unit`), each judged without offload; those
/// `admit` admits (a window limit's `WindowLimits::admit`) also with every unit that may offload (sharded, reducing whole at the first
/// position after B_i) kept on the device, or offloading `optimizer` or `full` (host steps
/// overlapped) — a combination that `offloaded` refuses (`full` at hpZ) is no plan.
pub fn offload_space(
    profile: &Profile,
    per_unit: &[Vec<UnitSchedule>],
    admit: &dyn Fn(&Schedule) -> bool,
) -> OffloadSpace {
    let mut space = OffloadSpace {
        plans: Vec::new(),
        device_only: Vec::new(),
    };
    every_schedule(profile, per_unit, |schedule| {
        let admitted = admit(&schedule);
        let may = may_offload(profile, &schedule);
        let masks = if admitted {
            3u32.pow(may.len() as u32)
        } else {
            1
        };
        for mask in 0..masks {
            let Some(plan) = judge(profile, &schedule, &may, mask) else {
                continue;
            };
            if mask == 0 {
                space.device_only.push(plan);
            }
            if admitted {
                space.plans.push(plan);
            }
        }
    });
    space
}

/// The units of `schedule` that may offload: sharded, reducing whole right after B_i.
fn may_offload(profile: &Profile, schedule: &Schedule) -> Vec<usize> {
    let timeline = Timeline::new(profile.unit_count());
    (0..profile.unit_count())
        .filter(|&u| {
            let first = timeline
                .window(u, Op::ReduceScatter.window_kind())
                .slot_at(0);
            let rs = schedule.launches(u, Op::ReduceScatter);
            schedule.units()[u].level != Level::None && rs.len() == 1 && rs[0].slot == first
        })
        .collect()
}

/// `schedule` with the units of `may` offloading as the base-3 digits of `mask` say (0: none,
/// 1: `optimizer`, 2: `full`), judged by the strict simulator; `None` where it is no plan.
fn judge(profile: &Profile, schedule: &Schedule, may: &[usize], mask: u32) -> Option<Judged> {
    let mut modes = vec![Offload::None; profile.unit_count()];
    let mut digits = mask;
    for &u in may {
        modes[u] = [Offload::None, Offload::Optimizer, Offload::Full][(digits % 3) as usize];
        digits /= 3;
    }
    let host = host_node_bytes(profile, schedule.units(), &modes);
    let offloaded = schedule
        .clone()
        .offloaded(profile, modes, HostStep::Overlapped, "enumerated")
        .ok()?;
    let sim = simulate(profile, &offloaded, Semantics::Strict);
    Some(Judged {
        time: sim.iteration_time_us,
        peak: sim.peak_memory_bytes,
        host,
        offloads: mask != 0,
    })
}
