//! The profile: everything the cost model needs about one training setup (DESIGN §3 inputs),
//! as a versioned, human-editable TOML file whose field names carry their units.

mod host;
mod topology;

pub use host::Host;
pub use topology::{Group, GroupCurves, Link, Topology, offered_groups};

use crate::curve::{CommCurve, MAX_TIME_US};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// The profile schema this build reads and writes.
pub const PROFILE_SCHEMA: u32 = 1;

/// Most parameters a unit may have (2^50: byte arithmetic stays exact in u64 and f64).
pub const MAX_UNIT_PARAMS: u64 = 1 << 50;
/// Most blocks a unit may be cut into (a smaller block size makes the ILP intractable).
pub const MAX_UNIT_BLOCKS: u64 = 100_000;
/// Most units a profile may have.
pub const MAX_UNITS: usize = 100_000;
/// Largest byte count of one field (1 PiB), and of a profile's memory added up over its units
/// (4 EiB): byte arithmetic stays exact in u64 and within 2^-10 relative in f64.
pub const MAX_FIELD_BYTES: u64 = 1 << 50;
pub const MAX_TOTAL_BYTES: u64 = 1 << 62;

/// Bytes per parameter of each kind of state (DESIGN: p, g, o).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BytesPerParam {
    /// Gathered parameter in the compute dtype (p).
    pub param: u64,
    /// Gradient (g).
    pub grad: u64,
    /// Optimizer state incl. master weights (o; Adam mixed precision: 12).
    pub optimizer: u64,
}

/// One sharding unit (an FSDP wrap unit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitProfile {
    pub name: String,
    /// Ψ_i.
    pub params: u64,
    /// f_i.
    pub forward_us: f64,
    /// f^c_i: the forward of a checkpointed unit, which writes the internals its backward would
    /// read into the reused forward workspace instead of a buffer kept until B_i. Absent means
    /// f_i (and absence is not written, so such profiles keep their digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_forward_us: Option<f64>,
    /// b_i.
    pub backward_us: f64,
    /// f'_i: what recomputation adds to a checkpointed unit's backward slot: the forward again,
    /// which does not redo what only the step's own forward does (take the step's batch, upload
    /// inputs and targets), less what the backward after it saves by reading what it just wrote.
    /// Absent means f_i (and absence is not written, so such profiles keep their digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_us: Option<f64>,
    /// o_i: the optimizer step over all Ψ_i parameters (a sharded unit's rank steps Ψ_i/N of
    /// them). The runtime runs it on the communication stream after the unit's last reduction
    /// block. Absent means 0 (and 0 is not written, so such profiles keep their digest).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub optimizer_us: f64,
    /// act_i: bytes saved from F_i to B_i without recompute.
    pub activation_bytes: u64,
    /// ckpt_i: bytes saved with recompute.
    pub checkpoint_activation_bytes: u64,
    /// ws_f_i.
    pub forward_workspace_bytes: u64,
    /// ws_b_i.
    pub backward_workspace_bytes: u64,
    /// The earlier unit whose full parameters this unit also reads (a head tied to the token
    /// embedding, DESIGN §3.9): they stay gathered until this unit's backward, and the lender's
    /// full gradient is alive from it. Absent (and not written) when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads_params_of: Option<String>,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

fn one() -> u64 {
    1
}

fn is_one(value: &u64) -> bool {
    *value == 1
}

/// K = 1, the default of every `micro_batches` field (profile, plan, `[training]`).
pub(crate) fn one_micro_batch() -> u32 {
    1
}

/// Whether a `micro_batches` field holds the default, which files leave out.
pub(crate) fn is_one_micro_batch(value: &u32) -> bool {
    *value == 1
}

/// The most micro-batches per step a profile may ask for.
pub const MAX_MICRO_BATCHES: u32 = 1 << 16;

/// A number as written in an error: plain, or in scientific notation when huge.
fn shown(value: f64) -> String {
    if value.abs() < 1e15 {
        value.to_string()
    } else {
        format!("{value:e}")
    }
}

impl UnitProfile {
    /// f^c_i: a checkpointed unit's forward µs, f_i where the profile does not give it.
    pub fn checkpointed_forward_time_us(&self) -> f64 {
        self.checkpointed_forward_us.unwrap_or(self.forward_us)
    }

    /// f'_i: the recomputation's µs, f_i where the profile does not give it.
    pub fn recompute_time_us(&self) -> f64 {
        self.recompute_us.unwrap_or(self.forward_us)
    }

    /// The byte fields with their names.
    fn byte_fields(&self) -> [(&'static str, u64); 4] {
        [
            ("activation_bytes", self.activation_bytes),
            (
                "checkpoint_activation_bytes",
                self.checkpoint_activation_bytes,
            ),
            ("forward_workspace_bytes", self.forward_workspace_bytes),
            ("backward_workspace_bytes", self.backward_workspace_bytes),
        ]
    }
}

/// Time-vs-bytes curves of the three collectives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommCurves {
    pub all_gather: CommCurve,
    pub reduce_scatter: CommCurve,
    pub all_reduce: CommCurve,
}

impl CommCurves {
    /// The block size (DESIGN §1): the largest of the three ops' smallest power-of-two sizes that
    /// reach 90% of their best bandwidth (DESIGN §7).
    pub fn block_size(&self) -> u64 {
        [&self.all_gather, &self.reduce_scatter, &self.all_reduce]
            .iter()
            .map(|c| c.block_size(crate::curve::BLOCK_BANDWIDTH_FRACTION))
            .max()
            .expect("three curves")
    }
}

/// A whole profile file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub schema: u32,
    pub name: String,
    /// Free-form provenance (generator, model, device, flags); part of the digest.
    #[serde(default)]
    pub source: BTreeMap<String, String>,
    /// N.
    pub world_size: u32,
    /// K: micro-batches per optimizer step (DESIGN §3.10), each of the units' measured or modelled
    /// pass. 1, the default and left out of the file, is one pass per step.
    #[serde(
        default = "one_micro_batch",
        skip_serializing_if = "is_one_micro_batch"
    )]
    pub micro_batches: u32,
    /// B: the unit of communication.
    pub block_size_bytes: u64,
    /// κ (κ_c): compute slowdown per µs of concurrent communication (of AllReduces, and of the
    /// other collectives where the profile gives no factor of their own).
    pub overlap_slowdown: f64,
    /// κ_c of ReduceScatters (DESIGN §3.4). Absent (and not written), it is κ_c.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_slowdown_reduce_scatter: Option<f64>,
    /// κ_c of AllGathers (DESIGN §3.4). Absent (and not written), it is κ_c.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_slowdown_all_gather: Option<f64>,
    /// κ_q: communication slowdown per µs of concurrent compute, in [0, 1] (0, the default and
    /// left out of the file, is the one-sided model; DESIGN §3.4).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_slowdown: f64,
    /// κ_u: compute slowdown per µs of a concurrent optimizer step (DESIGN §3.4). Absent (and not
    /// written), it is κ_c: the optimizer step slows compute as the collectives do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_slowdown: Option<f64>,
    /// Compute time of slot E (other per-iteration work).
    pub iteration_extra_us: f64,
    pub bytes_per_param: BytesPerParam,
    /// A shard of a block holds a multiple of this many parameters: what the runtime's arena
    /// alignment asks of the buffers it lays out (16 fp32 = 64 bytes, in every measured
    /// profile). 1, the default and left out of the file, where no runtime lays the profile out
    /// (analytic profiles): blocks are then padded to a whole number of parameters per rank only.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub shard_quantum_params: u64,
    pub units: Vec<UnitProfile>,
    /// The world's curves (and, without a topology, every collective's).
    pub comm: CommCurves,
    /// G ranks per node and the curves of the groups besides the world (DESIGN §3.11). Absent
    /// (and not written): one link, the model of §3.1–3.10, digests unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// The host the ranks offload to (DESIGN §3.13). Absent (and not written): no host link,
    /// offload refused, digests unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
}

impl Profile {
    /// Reads, parses and validates a profile file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::io::read_text(path)?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Parses and validates profile text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self> {
        let profile: Profile = crate::io::parse_toml(text, origin)?;
        profile.validate(origin)?;
        Ok(profile)
    }

    /// Serialises to TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serialises")
    }

    /// Writes the profile atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::write_atomic(path, self.to_toml().as_bytes())
    }

    /// sha256 of the canonical content (the parsed profile as compact JSON, fields in declaration
    /// order), so comments and formatting of the file do not change it.
    pub fn digest(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a profile always serialises");
        let hash = Sha256::digest(&canonical);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// L, the number of units.
    pub fn unit_count(&self) -> usize {
        self.units.len()
    }

    /// The unit that reads unit `lender`'s full parameters (`reads_params_of`), if any; a valid
    /// profile has at most one, after the lender.
    pub fn borrower(&self, lender: usize) -> Option<usize> {
        let name = &self.units[lender].name;
        (lender + 1..self.units.len())
            .find(|&u| self.units[u].reads_params_of.as_ref() == Some(name))
    }

    /// nb_i = ceil(Ψ_i·p / B): blocks of unit `i` (0-based).
    pub fn blocks(&self, i: usize) -> u32 {
        let bytes = self.units[i].params * self.bytes_per_param.param;
        bytes.div_ceil(self.block_size_bytes).max(1) as u32
    }

    /// Parameters of one block of unit `i` as laid out: ceil(Ψ_i / nb_i) rounded up to a multiple
    /// of q·N (q = `shard_quantum_params`), so that each rank's shard of a block is whole and
    /// every buffer made of blocks or shards keeps the runtime's alignment.
    pub fn block_params(&self, i: usize) -> u64 {
        let quantum = self.shard_quantum_params * u64::from(self.world_size);
        self.units[i]
            .params
            .div_ceil(u64::from(self.blocks(i)))
            .div_ceil(quantum)
            * quantum
    }

    /// Ψ'_i = nb_i · block_params(i): the parameters of unit `i` with its blocks' padding, what a
    /// rank holds of the unit in full (the model counts these, as the runtime allocates them).
    pub fn laid_out_params(&self, i: usize) -> u64 {
        u64::from(self.blocks(i)) * self.block_params(i)
    }

    /// Checks every field's domain; errors name the field (`units[3].forward_us`).
    pub fn validate(&self, origin: &str) -> Result<()> {
        self.check_counts()
            .and_then(|()| self.check_slowdowns())
            .and_then(|()| self.check_byte_sizes())
            .and_then(|()| self.check_units())
            .and_then(|()| self.check_total_bytes())
            .and_then(|()| self.check_curves_and_topology())
            .map_err(|(field, expected)| Error::invalid(origin, field, expected))
    }

    /// The schema and the step's counts: ranks, micro-batches, the shard quantum, a block's
    /// bytes.
    fn check_counts(&self) -> FieldCheck {
        if self.schema != PROFILE_SCHEMA {
            return bad(
                "schema".into(),
                format!("{PROFILE_SCHEMA}, got {}", self.schema),
            );
        }
        if self.world_size == 0 {
            return bad("world_size".into(), "a positive integer, got 0".into());
        }
        if !(1..=MAX_MICRO_BATCHES).contains(&self.micro_batches) {
            return bad(
                "micro_batches".into(),
                format!(
                    "an integer in 1..={MAX_MICRO_BATCHES}, got {}",
                    self.micro_batches
                ),
            );
        }
        if !(1..=1 << 20).contains(&self.shard_quantum_params) {
            return bad(
                "shard_quantum_params".into(),
                format!(
                    "an integer in 1..=1048576, got {}",
                    self.shard_quantum_params
                ),
            );
        }
        if self.block_size_bytes == 0 {
            return bad(
                "block_size_bytes".into(),
                "a positive integer, got 0".into(),
            );
        }
        Ok(())
    }

    /// The interference factors and the iteration's fixed extra time.
    fn check_slowdowns(&self) -> FieldCheck {
        if !(self.overlap_slowdown >= 0.0 && self.overlap_slowdown.is_finite()) {
            return bad(
                "overlap_slowdown".into(),
                format!("a finite number >= 0, got {}", self.overlap_slowdown),
            );
        }
        for (field, factor) in [
            (
                "overlap_slowdown_reduce_scatter",
                self.overlap_slowdown_reduce_scatter,
            ),
            (
                "overlap_slowdown_all_gather",
                self.overlap_slowdown_all_gather,
            ),
            ("update_slowdown", self.update_slowdown),
        ] {
            if let Some(factor) = factor
                && !(factor >= 0.0 && factor.is_finite())
            {
                return bad(field.into(), format!("a finite number >= 0, got {factor}"));
            }
        }
        if !(0.0..=1.0).contains(&self.comm_slowdown) {
            return bad(
                "comm_slowdown".into(),
                format!("a number from 0 to 1, got {}", shown(self.comm_slowdown)),
            );
        }
        if !(0.0..=MAX_TIME_US).contains(&self.iteration_extra_us) {
            return bad(
                "iteration_extra_us".into(),
                format!(
                    "a time of 0 to {MAX_TIME_US:e} µs, got {}",
                    shown(self.iteration_extra_us)
                ),
            );
        }
        Ok(())
    }

    /// The block size's and the bytes per parameter's ranges.
    fn check_byte_sizes(&self) -> FieldCheck {
        if self.block_size_bytes > MAX_FIELD_BYTES {
            return bad(
                "block_size_bytes".into(),
                format!(
                    "at most {MAX_FIELD_BYTES} bytes (1 PiB), got {}",
                    self.block_size_bytes
                ),
            );
        }
        let b = self.bytes_per_param;
        if b.param == 0 || b.grad == 0 || b.param > 64 || b.grad > 64 || b.optimizer > 256 {
            return bad(
                "bytes_per_param".into(),
                "param and grad of 1 to 64 bytes, optimizer of at most 256".into(),
            );
        }
        Ok(())
    }

    /// The units: their count, and each unit's fields ([`Profile::check_unit`]) with the names
    /// unique and every lender an earlier unit no other reads.
    fn check_units(&self) -> FieldCheck {
        if self.units.is_empty() || self.units.len() > MAX_UNITS {
            return bad(
                "units".into(),
                format!(
                    "1 to {MAX_UNITS} [[units]] tables, got {}",
                    self.units.len()
                ),
            );
        }
        let mut names = std::collections::HashSet::new();
        let mut lenders = std::collections::HashSet::new();
        for (k, u) in self.units.iter().enumerate() {
            if !names.insert(u.name.as_str()) {
                return bad(
                    format!("units[{k}].name"),
                    format!("a unique name, `{}` appears twice", u.name),
                );
            }
            if let Some(lender) = &u.reads_params_of {
                let earlier = self.units[..k].iter().any(|e| &e.name == lender);
                if !earlier || !lenders.insert(lender.as_str()) {
                    return bad(
                        format!("units[{k}].reads_params_of"),
                        format!(
                            "the name of an earlier unit that no other unit reads, got `{lender}`"
                        ),
                    );
                }
            }
            self.check_unit(k, u)?;
        }
        Ok(())
    }

    /// Unit `k`'s own fields: its parameters (and the blocks the block size cuts them into),
    /// times and bytes.
    fn check_unit(&self, k: usize, u: &UnitProfile) -> FieldCheck {
        let b = self.bytes_per_param;
        if u.params > MAX_UNIT_PARAMS {
            return bad(
                format!("units[{k}].params"),
                format!(
                    "at most {MAX_UNIT_PARAMS} parameters for unit `{}`, got {}",
                    u.name, u.params
                ),
            );
        }
        let blocks = (u.params * b.param).div_ceil(self.block_size_bytes);
        if blocks > MAX_UNIT_BLOCKS {
            return bad(
                "block_size_bytes".into(),
                format!(
                    "a block size that cuts unit `{}` into at most {MAX_UNIT_BLOCKS} blocks, got {blocks} blocks of {} bytes",
                    u.name, self.block_size_bytes
                ),
            );
        }
        if u.params == 0 {
            return bad(
                format!("units[{k}].params"),
                format!("a positive parameter count for unit `{}`, got 0", u.name),
            );
        }
        for (field, value) in [
            ("forward_us", u.forward_us),
            ("checkpointed_forward_us", u.checkpointed_forward_time_us()),
            ("backward_us", u.backward_us),
            ("recompute_us", u.recompute_time_us()),
            ("optimizer_us", u.optimizer_us),
        ] {
            if !(0.0..=MAX_TIME_US).contains(&value) {
                return bad(
                    format!("units[{k}].{field}"),
                    format!(
                        "a time of 0 to {MAX_TIME_US:e} µs for unit `{}`, got {}",
                        u.name,
                        shown(value)
                    ),
                );
            }
        }
        for (field, value) in u.byte_fields() {
            if value > MAX_FIELD_BYTES {
                return bad(
                    format!("units[{k}].{field}"),
                    format!(
                        "at most {MAX_FIELD_BYTES} bytes (1 PiB) for unit `{}`, got {value}",
                        u.name
                    ),
                );
            }
        }
        Ok(())
    }

    /// Every byte the units hold, added up, within the model's range.
    fn check_total_bytes(&self) -> FieldCheck {
        let b = self.bytes_per_param;
        let total: u128 = self
            .units
            .iter()
            .map(|u| {
                u128::from(u.params) * u128::from(b.param + b.grad + b.optimizer)
                    + u.byte_fields()
                        .iter()
                        .map(|&(_, v)| u128::from(v))
                        .sum::<u128>()
            })
            .sum();
        if total > u128::from(MAX_TOTAL_BYTES) {
            return bad(
                "units".into(),
                format!(
                    "parameters, gradients, optimizer state, activations and workspaces adding up \
                     to at most {MAX_TOTAL_BYTES} bytes (4 EiB), got {total}"
                ),
            );
        }
        Ok(())
    }

    /// The collectives' curves and the topology.
    fn check_curves_and_topology(&self) -> FieldCheck {
        for (op, curve) in [
            ("all_gather", &self.comm.all_gather),
            ("reduce_scatter", &self.comm.reduce_scatter),
            ("all_reduce", &self.comm.all_reduce),
        ] {
            if let Err(why) = curve.check() {
                return bad(format!("comm.{op}.points"), why);
            }
        }
        if let Some(Err((field, expected))) =
            self.topology.as_ref().map(|t| t.check(self.world_size))
        {
            return bad(field, expected);
        }
        if let Some(Err((field, expected))) = self.host.as_ref().map(|h| h.check(self.world_size)) {
            return bad(field, expected);
        }
        Ok(())
    }
}

/// A field's check: `Err((field, expected))` where it fails.
type FieldCheck = std::result::Result<(), (String, String)>;

/// The failure of `field`, which expected `expected`.
fn bad(field: String, expected: String) -> FieldCheck {
    Err((field, expected))
}
