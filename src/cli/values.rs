//! Value parsers of the command line: sizes, caps, bounded numbers, lists.

use shardplan_scheduler::analytic::NodeLayout;
use shardplan_scheduler::sweep::Method;

/// Parses a byte size for clap.
pub fn bytes_arg(text: &str) -> Result<u64, String> {
    shardplan_scheduler::size::parse_bytes(text)
}

/// A per-rank memory cap: bytes, or no cap at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCap {
    Bytes(u64),
    Unlimited,
}

impl MemoryCap {
    /// The cap in bytes; None when unlimited.
    pub fn bytes(self) -> Option<u64> {
        match self {
            MemoryCap::Bytes(bytes) => Some(bytes),
            MemoryCap::Unlimited => None,
        }
    }
}

/// `80GiB`, `85899345920`, `1.5e15`, … or `unlimited`.
pub(super) fn memory_cap_arg(text: &str) -> Result<MemoryCap, String> {
    if text.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(MemoryCap::Unlimited);
    }
    bytes_arg(text)
        .map(MemoryCap::Bytes)
        .map_err(|e| format!("{e} (or `unlimited`)"))
}

/// A number for clap that must be finite and within `range` (`what` says the range in words).
fn number_in(
    text: &str,
    range: impl std::ops::RangeBounds<f64>,
    what: &str,
) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && range.contains(&v) => Ok(v),
        _ => Err(format!("expected {what}, got `{text}`")),
    }
}

/// Seconds > 0 (time limits, timeouts).
pub(super) fn seconds_arg(text: &str) -> Result<f64, String> {
    number_in(
        text,
        f64::MIN_POSITIVE..=1e9,
        "a positive number of seconds",
    )
}

/// A solver's time limit: seconds > 0, however many (a huge limit means none), or `unlimited`.
pub(super) fn time_limit_arg(text: &str) -> Result<f64, String> {
    if text.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(f64::INFINITY);
    }
    number_in(
        text,
        f64::MIN_POSITIVE..,
        "a positive number of seconds or `unlimited`",
    )
}

/// A solver's effort: a positive whole number (thousands of LP iterations per search).
pub(super) fn effort_arg(text: &str) -> Result<std::num::NonZeroU64, String> {
    text.trim().parse().map_err(|_| {
        format!("expected a positive whole number (thousands of LP iterations), got `{text}`")
    })
}

/// A relative MIP gap in [0, 1).
pub(super) fn gap_arg(text: &str) -> Result<f64, String> {
    number_in(text, 0.0..1.0, "a relative gap in [0, 1)")
}

/// A model FLOP utilisation in (0, 1].
pub(super) fn mfu_arg(text: &str) -> Result<f64, String> {
    number_in(text, f64::MIN_POSITIVE..=1.0, "a utilisation in (0, 1]")
}

/// κ, a finite slowdown factor ≥ 0.
pub(super) fn slowdown_arg(text: &str) -> Result<f64, String> {
    number_in(text, 0.0..=1e6, "a finite number >= 0")
}

pub(super) fn comm_slowdown_arg(text: &str) -> Result<f64, String> {
    number_in(text, 0.0..=1.0, "a number from 0 to 1")
}

/// The caps of a sweep: `LOW..HIGH` (spread over --points) or a list.
#[derive(Debug, Clone)]
pub enum CapsArg {
    Range { low: u64, high: u64 },
    List(Vec<u64>),
}

pub(super) fn caps_arg(text: &str) -> Result<CapsArg, String> {
    if let Some((low, high)) = text.split_once("..") {
        let (low, high) = (bytes_arg(low)?, bytes_arg(high)?);
        if low >= high {
            return Err(format!("LOW..HIGH with LOW < HIGH, got `{text}`"));
        }
        return Ok(CapsArg::Range { low, high });
    }
    let mut caps = text
        .split(',')
        .map(bytes_arg)
        .collect::<Result<Vec<u64>, String>>()?;
    caps.sort_unstable();
    caps.dedup();
    Ok(CapsArg::List(caps))
}

/// The methods of a sweep, comma-separated.
#[derive(Debug, Clone)]
pub struct MethodsArg(pub Vec<Method>);

pub(super) fn methods_arg(text: &str) -> Result<MethodsArg, String> {
    let mut methods = Vec::new();
    for name in text.split(',') {
        let method: Method = name.trim().parse()?;
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    Ok(MethodsArg(methods))
}

/// `8` (nodes of 8 ranks), or `catalog` (the device's).
pub(super) fn node_size_arg(text: &str) -> Result<NodeLayout, String> {
    if text.trim().eq_ignore_ascii_case("catalog") {
        return Ok(NodeLayout::CatalogNode);
    }
    match text.trim().parse::<u32>() {
        Ok(g) if g >= 1 => Ok(NodeLayout::NodesOf(g)),
        _ => Err(format!(
            "expected a positive number of ranks or `catalog`, got `{text}`"
        )),
    }
}
