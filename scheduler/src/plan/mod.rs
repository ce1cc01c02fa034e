//! The plan file: a versioned TOML document that fixes every unit's level, recompute flag and
//! launch slots, bound to one profile by its digest.
//!
//! What the tools write looks as below. A plan written by hand needs only `schema`, `world_size`
//! and the `[[units]]`: without `profile_digest` it is matched to a profile by world size and
//! unit names alone, without `[producer]` it is "hand-written", and `[predicted]` is only a record
//! (`simulate` computes the prediction of any plan).
//!
//! ```toml
//! schema = 1
//! profile_digest = "sha256:…"
//! world_size = 64
//! memory_cap_bytes = 85899345920
//! [producer]
//! name = "fsdp2"
//! [predicted]
//! iteration_time_us = 1234.5
//! peak_memory_bytes = 123456
//! peak_slot = "B3"
//! [[units]]
//! name = "block.1"
//! level = "fsdp"
//! recompute = false
//! rs = [["F1", 1]]          # (slot, blocks)
//! agf = [["E", 1]]
//! agb = [["B3", 1]]
//! ```
//!
//! On a profile with a topology (DESIGN §3.11) a sharded unit may carry `shard_group = S` (HSDP:
//! sharded over S < N ranks; each RS block's replica AllReduce follows in the next slot, so the
//! file lists no launches for it), and an fsdp
//! unit `secondary_group = H` (hpZ: a 1/H shard kept after its forward, its backward gather
//! inside the node's H ranks).
//!
//! With micro-batches (DESIGN §3.10) the file also carries `micro_batches = K` (the profile's),
//! and a unit `accumulate = true` (reduce once per step), `keep = true` (keep gathered parameters
//! between micro-batches) and the inner boundary's launches `ar_inner`, `rs_inner`, `ag_inner`,
//! `agf_inner` (slots F<i>, B<i> and I, the boundary between micro-batches), each present
//! exactly where the op runs there. A unit over a shard group that reduces every micro-batch may
//! carry `replica_reduce = "last"` (DESIGN §3.11.1: its replica AllReduce only after the step's
//! last ReduceScatter; absent: `"every"`, after each).
//!
//! On a profile with a `[host]` (DESIGN §3.13) a sharded unit may carry `offload = "optimizer"`
//! or `"full"`, and the plan `host_step = "after-backward"` (the frameworks' step after the whole
//! backward; `overlapped`, each unit's step as soon as its gradient is on the host, when left
//! out).

use crate::offload::{HostStep, Offload};
use crate::profile::Profile;
use crate::schedule::{Accumulation, Launch, ReplicaReduce, Schedule, UnitSchedule};
use crate::size::whole_bytes;
use crate::timeline::{Level, Op, Slot, Timeline};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The plan schema this build reads and writes.
pub const PLAN_SCHEMA: u32 = 1;

/// Who made the plan: a baseline's name or the solver, with free-form details (solver status,
/// gap, window limits, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Producer {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, toml::Value>,
}

impl Producer {
    /// A producer whose details are the fields of `details`, a struct of strings and numbers
    /// (their names as keys).
    pub fn with_details(name: &str, details: &impl Serialize) -> Producer {
        let details = toml::Table::try_from(details)
            .expect("a struct of strings and numbers serialises to a table");
        Producer {
            name: name.into(),
            details: details.into_iter().collect(),
        }
    }
}

impl Default for Producer {
    /// A plan file without a `[producer]` table.
    fn default() -> Self {
        Producer {
            name: "hand-written".into(),
            details: BTreeMap::new(),
        }
    }
}

/// What the strict simulator predicted when the plan was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicted {
    pub iteration_time_us: f64,
    pub peak_memory_bytes: u64,
    pub peak_slot: Slot,
    /// The peak slot's micro-batch, when the step has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_micro_batch: Option<u32>,
    /// The host memory of one node, when the plan offloads (DESIGN §3.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_bytes: Option<u64>,
}

impl Predicted {
    /// What a simulation predicts, as a plan file records it (the peak in whole bytes).
    pub fn of(sim: &crate::sim::Simulation) -> Self {
        Predicted {
            iteration_time_us: sim.iteration_time_us,
            peak_memory_bytes: whole_bytes(sim.peak_memory_bytes),
            peak_slot: sim.peak_slot,
            peak_micro_batch: sim.peak_micro_batch,
            host_memory_bytes: sim.host.as_ref().map(|h| whole_bytes(h.memory_bytes)),
        }
    }
}

/// One unit's entry; ops not used by its level are omitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitPlan {
    pub name: String,
    pub level: Level,
    #[serde(default)]
    pub recompute: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ar: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rs: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ag: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agf: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agb: Vec<(Slot, u32)>,
    /// S, a sharded unit's shard group when smaller than the world (DESIGN §3.11); absent: N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_group: Option<u32>,
    /// H, an fsdp unit's hpZ secondary group (DESIGN §3.11); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_group: Option<u32>,
    /// a_i (DESIGN §3.10): reduce once per step.
    #[serde(default, skip_serializing_if = "is_false")]
    pub accumulate: bool,
    /// k_i (DESIGN §3.10): keep gathered parameters between micro-batches.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep: bool,
    /// A shard-group unit's replica AllReduce after every micro-batch's ReduceScatter or only
    /// the step's (DESIGN §3.11.1); absent: every.
    #[serde(default, skip_serializing_if = "is_every")]
    pub replica_reduce: ReplicaReduce,
    /// The inner boundary's launches (slots F<i>, B<i>, I).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ar_inner: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rs_inner: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ag_inner: Vec<(Slot, u32)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agf_inner: Vec<(Slot, u32)>,
    /// Where the unit's state lives (DESIGN §3.13); none when left out.
    #[serde(default, skip_serializing_if = "Offload::is_none")]
    pub offload: Offload,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_every(value: &ReplicaReduce) -> bool {
    *value == ReplicaReduce::Every
}

impl UnitPlan {
    fn launches(&self, op: Op) -> &[(Slot, u32)] {
        match op {
            Op::AllReduce => &self.ar,
            Op::ReduceScatter => &self.rs,
            Op::Gather => &self.ag,
            Op::GatherForward => &self.agf,
            Op::GatherBackward => &self.agb,
            Op::ReplicaAllReduce => &[],
        }
    }

    /// The inner boundary's launches of `op` (AGB and RA never run there: none).
    fn inner_launches(&self, op: Op) -> &[(Slot, u32)] {
        match op {
            Op::AllReduce => &self.ar_inner,
            Op::ReduceScatter => &self.rs_inner,
            Op::Gather => &self.ag_inner,
            Op::GatherForward => &self.agf_inner,
            Op::GatherBackward | Op::ReplicaAllReduce => &[],
        }
    }

    fn inner_launches_mut(&mut self, op: Op) -> Option<&mut Vec<(Slot, u32)>> {
        match op {
            Op::AllReduce => Some(&mut self.ar_inner),
            Op::ReduceScatter => Some(&mut self.rs_inner),
            Op::Gather => Some(&mut self.ag_inner),
            Op::GatherForward => Some(&mut self.agf_inner),
            Op::GatherBackward | Op::ReplicaAllReduce => None,
        }
    }

    /// The list a schedule's launches of `op` are written to (None for RA, which follows RS).
    fn launches_mut(&mut self, op: Op) -> Option<&mut Vec<(Slot, u32)>> {
        match op {
            Op::AllReduce => Some(&mut self.ar),
            Op::ReduceScatter => Some(&mut self.rs),
            Op::Gather => Some(&mut self.ag),
            Op::GatherForward => Some(&mut self.agf),
            Op::GatherBackward => Some(&mut self.agb),
            Op::ReplicaAllReduce => None,
        }
    }
}

/// A whole plan file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub schema: u32,
    /// The profile the plan was made for; None (hand-written): any profile with the plan's world
    /// size and unit names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_digest: Option<String>,
    pub world_size: u32,
    /// K, micro-batches per step (the profile's; 1 when left out).
    #[serde(
        default = "crate::profile::one_micro_batch",
        skip_serializing_if = "crate::profile::is_one_micro_batch"
    )]
    pub micro_batches: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap_bytes: Option<u64>,
    /// When the host's optimizer steps run (DESIGN §3.13); overlapped when left out.
    #[serde(default, skip_serializing_if = "HostStep::is_overlapped")]
    pub host_step: HostStep,
    #[serde(default)]
    pub producer: Producer,
    /// Whose execution the plan was made for (DESIGN §4.9); the runtime's when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::target::Target>,
    /// The strict simulation when the plan was written (a record; never read back as truth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<Predicted>,
    pub units: Vec<UnitPlan>,
}

impl Plan {
    /// Reads and parses a plan file (not yet checked against a profile).
    pub fn load(path: &Path) -> Result<Self> {
        let plan: Plan = crate::io::read_toml(path)?;
        if plan.schema != PLAN_SCHEMA {
            return Err(Error::invalid(
                path.display().to_string(),
                "schema",
                format!("{PLAN_SCHEMA}, got {}", plan.schema),
            ));
        }
        Ok(plan)
    }

    /// Serialises to TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a plan always serialises")
    }

    /// Writes the plan atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::write_atomic(path, self.to_toml().as_bytes())
    }

    /// Checks that the plan belongs to `profile` (digest, world size, unit names) and converts it
    /// into a validated [`Schedule`]. `origin` names the plan in errors.
    pub fn schedule(&self, profile: &Profile, origin: &str) -> Result<Schedule> {
        let digest = profile.digest();
        if let Some(planned_for) = &self.profile_digest
            && *planned_for != digest
        {
            return Err(Error::Mismatch(format!(
                "{origin}: the plan was made for profile {planned_for}, but the given profile is {digest} (`{}`); \
                 re-plan for this profile",
                profile.name
            )));
        }
        if self.world_size != profile.world_size {
            return Err(Error::invalid(
                origin,
                "world_size",
                format!(
                    "{} (the profile's), got {}",
                    profile.world_size, self.world_size
                ),
            ));
        }
        if self.micro_batches != profile.micro_batches {
            return Err(Error::invalid(
                origin,
                "micro_batches",
                format!(
                    "{} (the profile's micro-batches per step), got {}: the plan was made for \
                     another number of micro-batches",
                    profile.micro_batches, self.micro_batches
                ),
            ));
        }
        if self.units.len() != profile.unit_count() {
            return Err(Error::invalid(
                origin,
                "units",
                format!(
                    "{} [[units]] tables (the profile's), got {}",
                    profile.unit_count(),
                    self.units.len()
                ),
            ));
        }
        let timeline = Timeline::new(profile.unit_count());
        let mut units = Vec::with_capacity(self.units.len());
        for (k, (u, p)) in self.units.iter().zip(&profile.units).enumerate() {
            if u.name != p.name {
                return Err(Error::invalid(
                    origin,
                    format!("units[{k}].name"),
                    format!(
                        "`{}` (the profile's unit {}), got `{}`",
                        p.name,
                        k + 1,
                        u.name
                    ),
                ));
            }
            let convert =
                |list: &[(Slot, u32)],
                 field: String,
                 index: &dyn Fn(Slot) -> std::result::Result<usize, String>| {
                    list.iter()
                        .map(|&(slot, blocks)| {
                            index(slot)
                                .map(|slot| Launch { slot, blocks })
                                .map_err(|why| Error::invalid(origin, field.clone(), why))
                        })
                        .collect::<Result<Vec<_>>>()
                };
            let mut launches = BTreeMap::new();
            let mut inner = BTreeMap::new();
            for op in Op::ALL {
                let (step, between) = (u.launches(op), u.inner_launches(op));
                if !step.is_empty() {
                    let field = format!("units[{k}].{}", op.key());
                    launches.insert(op, convert(step, field, &|s| timeline.index(s))?);
                }
                if !between.is_empty() {
                    let field = format!("units[{k}].{}_inner", op.key());
                    inner.insert(op, convert(between, field, &|s| timeline.inner_index(s))?);
                }
            }
            units.push(UnitSchedule {
                level: u.level,
                recompute: u.recompute,
                launches,
                accumulation: Accumulation {
                    accumulate: u.accumulate,
                    keep: u.keep,
                    inner,
                    replica_reduce: u.replica_reduce,
                },
                shard_group: u.shard_group,
                secondary_group: u.secondary_group,
            });
        }
        let schedule = Schedule::new(profile, units)?;
        let offload: Vec<Offload> = self.units.iter().map(|u| u.offload).collect();
        if offload.iter().all(Offload::is_none) && self.host_step.is_overlapped() {
            return Ok(schedule);
        }
        schedule.offloaded(profile, offload, self.host_step, origin)
    }

    /// Builds the plan file of a schedule; `predicted` comes from the strict simulator.
    pub fn from_schedule(
        profile: &Profile,
        schedule: &Schedule,
        producer: Producer,
        memory_cap_bytes: Option<u64>,
        predicted: Predicted,
    ) -> Self {
        let timeline = schedule.timeline();
        let units = schedule
            .units()
            .iter()
            .zip(&profile.units)
            .enumerate()
            .map(|(unit, (u, p))| {
                let mut plan = UnitPlan {
                    name: p.name.clone(),
                    level: u.level,
                    recompute: u.recompute,
                    ar: vec![],
                    rs: vec![],
                    ag: vec![],
                    agf: vec![],
                    agb: vec![],
                    shard_group: u.shard_group,
                    secondary_group: u.secondary_group,
                    accumulate: u.accumulation.accumulate,
                    keep: u.accumulation.keep,
                    replica_reduce: u.accumulation.replica_reduce,
                    ar_inner: vec![],
                    rs_inner: vec![],
                    ag_inner: vec![],
                    agf_inner: vec![],
                    offload: schedule.offload(unit),
                };
                for (&op, launches) in &u.launches {
                    if let Some(list) = plan.launches_mut(op) {
                        *list = launches
                            .iter()
                            .map(|l| (timeline.slot(l.slot), l.blocks))
                            .collect();
                    }
                }
                for (&op, launches) in &u.accumulation.inner {
                    if let Some(list) = plan.inner_launches_mut(op) {
                        *list = launches
                            .iter()
                            .map(|l| (timeline.inner_slot(l.slot), l.blocks))
                            .collect();
                    }
                }
                plan
            })
            .collect();
        Plan {
            schema: PLAN_SCHEMA,
            profile_digest: Some(profile.digest()),
            world_size: profile.world_size,
            micro_batches: profile.micro_batches,
            memory_cap_bytes,
            host_step: schedule.host_step(),
            producer,
            target: None,
            predicted: Some(predicted),
            units,
        }
    }
}

/// The strict simulation of `schedule` (by its micro-batch classes, `classes`) and the plan file
/// that records it as the prediction.
pub fn plan_with_prediction(
    profile: &Profile,
    schedule: &Schedule,
    producer: Producer,
    memory_cap_bytes: Option<u64>,
) -> (Plan, crate::sim::Simulation) {
    let sim = crate::classes::simulate_strict(profile, schedule);
    (
        Plan::from_schedule(
            profile,
            schedule,
            producer,
            memory_cap_bytes,
            Predicted::of(&sim),
        ),
        sim,
    )
}
