//! The profile's `[host]` (DESIGN §3.13): each rank's copy curves to and from its host, the
//! node's host memory and a rank's host optimizer step time per parameter.

use crate::curve::{CommCurve, MAX_TIME_US};
use serde::{Deserialize, Serialize};

/// The host the ranks of a node offload to. Absent from a profile (and not written): no host
/// link, and a plan that offloads is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Ranks of one node: their offloaded state shares `memory_bytes`, their steps the host.
    pub ranks_per_node: u32,
    /// Ranks whose copies share one host link; the curves are each rank's with all of them
    /// copying at once (a record of how the curves were made).
    pub ranks_per_link: u32,
    /// The host memory of one node, bytes: the cap on the node's offloaded state.
    pub memory_bytes: u64,
    /// A rank's host optimizer step, µs per parameter of its shard, while every rank of the node
    /// steps at once.
    pub optimizer_us_per_param: f64,
    /// A rank's host-to-device copy time vs bytes.
    pub host_to_device: CommCurve,
    /// A rank's device-to-host copy time vs bytes.
    pub device_to_host: CommCurve,
}

impl Host {
    /// Checks every field; the error is the field (under `host.`) and what it expected.
    pub(super) fn check(&self, world_size: u32) -> Result<(), (String, String)> {
        let field = |f: &str| format!("host.{f}");
        if self.ranks_per_node == 0 || self.ranks_per_node > world_size {
            return Err((
                field("ranks_per_node"),
                format!(
                    "an integer from 1 to the world size {world_size}, got {}",
                    self.ranks_per_node
                ),
            ));
        }
        if self.ranks_per_link == 0 || self.ranks_per_link > self.ranks_per_node {
            return Err((
                field("ranks_per_link"),
                format!(
                    "an integer from 1 to ranks_per_node ({}), got {}",
                    self.ranks_per_node, self.ranks_per_link
                ),
            ));
        }
        if self.memory_bytes == 0 {
            return Err((field("memory_bytes"), "a positive byte count, got 0".into()));
        }
        let step = self.optimizer_us_per_param;
        if !(step > 0.0 && step <= MAX_TIME_US) {
            return Err((
                field("optimizer_us_per_param"),
                format!("a positive time up to {MAX_TIME_US:e} µs, got {step}"),
            ));
        }
        for (name, curve) in [
            ("host_to_device", &self.host_to_device),
            ("device_to_host", &self.device_to_host),
        ] {
            curve
                .check()
                .map_err(|why| (field(&format!("{name}.points")), why))?;
        }
        Ok(())
    }
}
