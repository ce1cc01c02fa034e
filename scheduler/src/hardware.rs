//! Hardware specs as data (`models/hardware.toml`): devices (peak FLOP/s, memory) and the
//! interconnects that set each collective's analytic time-vs-bytes curve.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One accelerator model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Dense bf16 peak, TFLOP/s.
    pub peak_bf16_tflops: f64,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// GPUs joined by the intra-node interconnect; larger world sizes are multi-node.
    pub gpus_per_node: u32,
    /// Interconnect key used when the world fits in one node.
    pub intra_node: String,
    /// Interconnect key used across nodes (per-GPU bandwidth).
    pub inter_node: String,
    /// The host the GPUs offload to (DESIGN §3.13); absent: no host link, offload refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSpec>,
}

/// A node's host as offload sees it (DESIGN §3.13).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Host link key (`[host_links]`).
    pub link: String,
    /// GPUs whose copies share one host link (one PCIe switch uplink).
    pub gpus_per_link: u32,
    /// Host memory per node, bytes.
    pub memory_bytes: u64,
    /// The whole host's optimizer step time per parameter, µs.
    pub optimizer_us_per_param: f64,
}

/// A GPU's link to its host: achieved copy bandwidths per direction and a copy's fixed cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLink {
    pub host_to_device_gbps: f64,
    pub device_to_host_gbps: f64,
    pub latency_us: f64,
}

impl Device {
    /// The key of the interconnect a world of `world_size` ranks communicates over on one link:
    /// the intra-node one while the world fits a node, else the inter-node one.
    pub fn interconnect_key_for(&self, world_size: u32) -> &str {
        if world_size > self.gpus_per_node {
            &self.inter_node
        } else {
            &self.intra_node
        }
    }
}

/// Bus bandwidths (nccl-tests `busbw`, GB/s = 1e9 B/s) and latencies of one interconnect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interconnect {
    pub all_gather_busbw_gbps: f64,
    pub reduce_scatter_busbw_gbps: f64,
    pub all_reduce_busbw_gbps: f64,
    /// Fixed cost of launching one collective, µs.
    pub base_latency_us: f64,
    /// Cost of one ring step, µs (a ring AllGather takes n−1 steps, an AllReduce 2(n−1)).
    pub step_latency_us: f64,
}

/// The whole catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub devices: BTreeMap<String, Device>,
    pub interconnects: BTreeMap<String, Interconnect>,
    /// The host links devices name (DESIGN §3.13); absent in a catalog without hosts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_links: BTreeMap<String, HostLink>,
}

/// The catalog shipped in `models/hardware.toml`, compiled in so every command works from any
/// directory.
pub const BUNDLED_CATALOG: &str = include_str!("../../models/hardware.toml");

impl Catalog {
    /// The bundled catalog.
    pub fn bundled() -> Result<Self> {
        let catalog: Catalog =
            crate::io::parse_toml(BUNDLED_CATALOG, "<bundled models/hardware.toml>")?;
        catalog.validate("<bundled models/hardware.toml>")?;
        Ok(catalog)
    }

    /// Loads a catalog file.
    pub fn load(path: &Path) -> Result<Self> {
        let catalog: Catalog = crate::io::read_toml(path)?;
        catalog.validate(&path.display().to_string())?;
        Ok(catalog)
    }

    fn validate(&self, origin: &str) -> Result<()> {
        for (name, d) in &self.devices {
            if !(d.peak_bf16_tflops > 0.0 && d.peak_bf16_tflops.is_finite()) {
                return Err(Error::invalid(
                    origin,
                    format!("devices.{name}.peak_bf16_tflops"),
                    "a positive number",
                ));
            }
            if d.memory_bytes == 0 || d.gpus_per_node == 0 {
                return Err(Error::invalid(
                    origin,
                    format!("devices.{name}"),
                    "positive memory_bytes and gpus_per_node",
                ));
            }
            for key in [&d.intra_node, &d.inter_node] {
                if !self.interconnects.contains_key(key) {
                    return Err(Error::invalid(
                        origin,
                        format!("devices.{name}"),
                        format!("an interconnect defined under [interconnects], got `{key}`"),
                    ));
                }
            }
        }
        self.validate_hosts(origin)?;
        for (name, ic) in &self.interconnects {
            let positive = [
                ic.all_gather_busbw_gbps,
                ic.reduce_scatter_busbw_gbps,
                ic.all_reduce_busbw_gbps,
            ]
            .iter()
            .all(|v| *v > 0.0 && v.is_finite());
            let latencies = [ic.base_latency_us, ic.step_latency_us]
                .iter()
                .all(|v| *v >= 0.0 && v.is_finite());
            if !positive || !latencies {
                return Err(Error::invalid(
                    origin,
                    format!("interconnects.{name}"),
                    "positive bandwidths and non-negative latencies",
                ));
            }
        }
        Ok(())
    }

    /// Every device's host names a defined link, shares it among at least one GPU, has memory and
    /// a positive step time; every host link has positive bandwidths and a non-negative latency.
    fn validate_hosts(&self, origin: &str) -> Result<()> {
        for (name, d) in &self.devices {
            let Some(host) = &d.host else { continue };
            let field = |f: &str| format!("devices.{name}.host.{f}");
            if !self.host_links.contains_key(&host.link) {
                return Err(Error::invalid(
                    origin,
                    field("link"),
                    format!("a link defined under [host_links], got `{}`", host.link),
                ));
            }
            if host.gpus_per_link == 0 || host.memory_bytes == 0 {
                return Err(Error::invalid(
                    origin,
                    format!("devices.{name}.host"),
                    "positive gpus_per_link and memory_bytes",
                ));
            }
            if !(host.optimizer_us_per_param > 0.0 && host.optimizer_us_per_param.is_finite()) {
                return Err(Error::invalid(
                    origin,
                    field("optimizer_us_per_param"),
                    format!("a positive number, got {}", host.optimizer_us_per_param),
                ));
            }
        }
        for (name, link) in &self.host_links {
            let bandwidths = [link.host_to_device_gbps, link.device_to_host_gbps]
                .iter()
                .all(|v| *v > 0.0 && v.is_finite());
            let latency = link.latency_us >= 0.0 && link.latency_us.is_finite();
            if !(bandwidths && latency) {
                return Err(Error::invalid(
                    origin,
                    format!("host_links.{name}"),
                    "positive bandwidths and a non-negative latency",
                ));
            }
        }
        Ok(())
    }

    /// Looks a device up by name; the error lists the known ones.
    pub fn device(&self, name: &str) -> Result<&Device> {
        self.devices.get(name).ok_or_else(|| {
            Error::invalid(
                "--device",
                "device",
                format!(
                    "one of {}, got `{name}`",
                    self.devices.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// The interconnect a world of `world_size` ranks of `device` communicates over.
    pub fn interconnect_for(&self, device: &Device, world_size: u32) -> &Interconnect {
        &self.interconnects[device.interconnect_key_for(world_size)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_catalog_has_the_three_devices() {
        let c = Catalog::bundled().unwrap();
        for d in ["h100-sxm", "h200", "a100-80g"] {
            assert!(c.device(d).is_ok(), "{d}");
        }
        let e = c.device("tpu").unwrap_err().to_string();
        assert!(
            e.contains("a100-80g, h100-sxm, h200") && e.contains("`tpu`"),
            "{e}"
        );
    }

    #[test]
    fn h100_hosts_pair_two_gpus_on_pcie5() {
        let c = Catalog::bundled().unwrap();
        let host = c.device("h100-sxm").unwrap().host.as_ref().unwrap();
        assert_eq!(host.gpus_per_link, 2);
        assert_eq!(c.host_links[&host.link].host_to_device_gbps, 55.0);
    }

    #[test]
    fn a_host_naming_an_undefined_link_is_refused() {
        let text = BUNDLED_CATALOG.replace("link = \"pcie5-x16\"", "link = \"pcie9\"");
        let c: Catalog = crate::io::parse_toml(&text, "cat.toml").unwrap();
        let e = c.validate("cat.toml").unwrap_err().to_string();
        assert!(
            e.contains("cat.toml") && e.contains("host.link") && e.contains("`pcie9`"),
            "{e}"
        );
    }

    #[test]
    fn world_sizes_above_a_node_use_the_inter_node_link() {
        let c = Catalog::bundled().unwrap();
        let d = c.device("h100-sxm").unwrap();
        assert!(
            c.interconnect_for(d, 8).all_gather_busbw_gbps
                > c.interconnect_for(d, 16).all_gather_busbw_gbps
        );
    }
}
