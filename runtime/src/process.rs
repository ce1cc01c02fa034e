//! What the operating system says of this process: its peak resident memory (the arena, the
//! program, the libraries and every allocation besides), reported beside the arena; and the
//! host memory this rank may take ([`host_memory_share`]), checked before a run allocates.

use crate::{Error, Result};
use shardplan_scheduler::size::format_bytes;

/// Overrides `MemAvailable` (bytes), for tests of a host without the memory.
pub const HOST_MEMORY_VAR: &str = "SHARDPLAN_HOST_MEMORY_AVAILABLE";

/// The launcher's variables for the number of ranks on this host.
const LOCAL_RANKS_VARS: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];

/// The host memory available now (`MemAvailable`, or [`HOST_MEMORY_VAR`]) and the ranks on this
/// host that share it (the launcher's count, else 1); None where the system does not say.
pub fn host_memory_share() -> Option<(u64, u64)> {
    let available = match std::env::var(HOST_MEMORY_VAR) {
        Ok(bytes) => bytes.trim().parse().ok()?,
        Err(_) => parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?,
    };
    let ranks = LOCAL_RANKS_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    Some((available, ranks))
}

/// Refuses an allocation of `bytes` (`what` says of what) that this rank's share of the host's
/// available memory cannot hold, naming both figures and what would fit.
pub fn check_host_memory(bytes: u64, what: &str) -> Result<()> {
    let Some((available, ranks)) = host_memory_share() else {
        return Ok(());
    };
    let source = if std::env::var(HOST_MEMORY_VAR).is_ok() {
        HOST_MEMORY_VAR
    } else {
        "MemAvailable"
    };
    match shortfall(bytes, available, ranks, source) {
        Some(why) => Err(Error::NotEnoughMemory(format!("{what} {why}"))),
        None => Ok(()),
    }
}

/// Why `bytes` a rank do not fit `available` bytes (as `source` says) shared by `ranks` ranks,
/// and what would fit; None when they fit.
fn shortfall(bytes: u64, available: u64, ranks: u64, source: &str) -> Option<String> {
    let share = available / ranks;
    if bytes <= share {
        return None;
    }
    let fits = available / bytes.max(1);
    Some(format!(
        "needs {} on each rank, but this host has {} available ({source}) for its {ranks} rank{}: {} each; {}",
        format_bytes(bytes as f64),
        format_bytes(available as f64),
        if ranks == 1 { "" } else { "s" },
        format_bytes(share as f64),
        if fits >= 1 {
            format!("start at most {fits} rank(s) per host, or make the batch smaller")
        } else {
            "make the batch smaller (or the model), or use a host with more memory".into()
        }
    ))
}

/// The `MemAvailable:` line of a meminfo file, in bytes.
fn parse_meminfo(meminfo: &str) -> Option<u64> {
    kilobytes_field(meminfo, "MemAvailable:")
}

/// The peak resident set of this process in bytes (`VmHWM` of `/proc/self/status`); None where
/// the system does not report it.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// The `VmHWM:` line of a status file, in bytes.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    kilobytes_field(status, "VmHWM:")
}

/// The value of the line starting with `key` in a `/proc` file whose values are `N kB`, in bytes.
fn kilobytes_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut fields = line[key.len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next()? {
        "kB" => value.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share that holds the buffers passes; one that does not names both figures and how
    /// many ranks the host holds, or that none fits.
    #[test]
    fn a_share_too_small_says_what_would_fit() {
        assert_eq!(shortfall(100, 400, 4, "MemAvailable"), None);
        let two = shortfall(100, 300, 4, "MemAvailable").unwrap();
        assert!(two.contains("100 B on each rank"), "{two}");
        assert!(
            two.contains("300 B available (MemAvailable) for its 4 ranks: 75 B each"),
            "{two}"
        );
        assert!(two.contains("start at most 3 rank(s) per host"), "{two}");
        let none = shortfall(100, 50, 1, "MemAvailable").unwrap();
        assert!(none.contains("make the batch smaller"), "{none}");
    }

    #[test]
    fn reads_the_available_memory_in_bytes() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn reads_the_high_water_mark_in_bytes() {
        let status = "Name:\tshardplan\nVmPeak:\t  900 kB\nVmHWM:\t   12345 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(12345 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS:\t 100 kB\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\t 100 MB\n"), None);
    }

    #[test]
    fn this_process_has_a_peak_at_least_as_large_as_a_buffer_it_touched() {
        let buffer = vec![1u8; 64 << 20];
        let peak = peak_resident_bytes().expect("Linux reports VmHWM");
        assert!(peak >= buffer.len() as u64, "peak {peak}");
        assert_eq!(buffer.iter().map(|&b| u64::from(b)).sum::<u64>(), 64 << 20);
    }
}
