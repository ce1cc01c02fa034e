//! What the operating system says of this process: its peak resident memory (the arena, the
//! program, the libraries and every allocation besides), reported beside the arena.

/// The peak resident set of this process in bytes (`VmHWM` of `/proc/self/status`); None where
/// the system does not report it.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// The `VmHWM:` line of a status file, in bytes.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut fields = line["VmHWM:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next()? {
        "kB" => value.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
