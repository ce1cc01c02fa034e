//! What the operating system says of this process: its peak resident memory (the arena, the
//! program, the libraries and every allocation besides), reported beside the arena; and the
//! host memory this rank may take ([`host_memory_share`]), checked before a run allocates.

use crate::{Error, Result};
use shardplan_scheduler::size::format_bytes;

/// Overrides `MemAvailable` (bytes), for tests of a host without the memory.
pub const HOST_MEMORY_VAR: &str = "SHARDPLAN_HOST_MEMORY_AVAILABLE";

/// Keeps the pages this process frees for its next allocations (DESIGN §6.6). glibc by default
/// returns a freed heap top to the system past 128 KiB and maps larger allocations afresh, moving
/// its thresholds as the program runs; the host kernels' temporaries (the bf16 policy's widened
/// copies, the matrix products' packing buffers) then cost page faults in some plans' steps and not
/// in others' (gpt2-tiny under bf16 at N = 2: about 2,000 minor faults a step under ddp, none under
/// fsdp2, on the compute thread), so a unit's time depended on the plan around it. Fixed thresholds
/// and no trimming make every step after the first reuse the same pages, in the profile as in a run.
/// Elsewhere than glibc it does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// The size above which glibc maps an allocation on its own: the largest `mallopt`
        /// accepts (half of a thread arena's 64 MiB heap).
        const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
        // SAFETY: mallopt only sets the allocator's tunables; it touches no memory of the
        // caller's and may be called from any thread at any time (glibc takes its own lock).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

/// The launcher's variables for the number of ranks on this host.
const LOCAL_RANKS_VARS: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];

/// The ranks on this host: the launcher's count, else 1.
fn ranks_on_this_host() -> u64 {
    LOCAL_RANKS_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse::<u64>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The host memory available now (`MemAvailable`, or [`HOST_MEMORY_VAR`]) and the ranks on this
/// host that share it (the launcher's count, else 1); None where the system does not say.
pub fn host_memory_share() -> Option<(u64, u64)> {
    let available = match std::env::var(HOST_MEMORY_VAR) {
        Ok(bytes) => bytes.trim().parse().ok()?,
        Err(_) => parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?,
    };
    Some((available, ranks_on_this_host()))
}

/// The CPUs of a kernel CPU list ("0-3,8,10-11": 7), None where it does not parse.
fn count_cpus(list: &str) -> Option<u64> {
    list.trim().split(',').try_fold(0, |count, range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
        Some(count + last.checked_sub(first)? + 1)
    })
}

/// More ranks on this host than it has cores: where the host computes (the CPU backend) their
/// compute time-slices, which the model does not predict (it gives each rank a core, as each
/// GPU rank has its device; docs/runtime-results.md measures 4 ranks on 2 cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversubscribed {
    pub ranks: u64,
    pub cores: u64,
}

impl Oversubscribed {
    /// This host's, where its ranks outnumber its online cores (the host's, not this process's
    /// affinity: mpirun binds each of fewer ranks than cores to a core of its own).
    pub fn here() -> Option<Oversubscribed> {
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
        Oversubscribed::of(ranks_on_this_host(), count_cpus(&online)?)
    }

    fn of(ranks: u64, cores: u64) -> Option<Oversubscribed> {
        (ranks > cores).then_some(Oversubscribed { ranks, cores })
    }

    /// In words, for reports and a profile's source.
    pub fn described(self) -> String {
        format!(
            "{} ranks share {} cores: their compute time-slices, which the prediction (a core per \
             rank) does not model",
            self.ranks, self.cores
        )
    }
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

/// The calling thread's CPU time in µs (`CLOCK_THREAD_CPUTIME_ID`: the time the thread ran, user
/// and system, not the time it waited for a core while the operating system ran other threads or
/// slept). None where the clock cannot be read.
pub fn thread_cpu_us() -> Option<f64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is, and reads nothing else.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (read == 0).then(|| now.tv_sec as f64 * 1e6 + now.tv_nsec as f64 / 1e3)
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

    /// A thread's CPU clock advances with its work and not while it sleeps: time the operating
    /// system gives others is not the thread's.
    #[test]
    fn the_thread_clock_counts_work_and_not_sleep() {
        let start = thread_cpu_us().expect("Linux has a thread CPU clock");
        let mut spun = start;
        while spun - start < 2_000.0 {
            spun = thread_cpu_us().unwrap();
        }
        let wall = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = wall.elapsed().as_secs_f64() * 1e6;
        let after = thread_cpu_us().unwrap();
        assert!(slept >= 50_000.0, "slept {slept} µs");
        assert!(
            after - spun < 25_000.0,
            "{} µs counted over a 50 ms sleep",
            after - spun
        );
        assert!(after >= spun);
    }

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus("x"), None);
    }

    #[test]
    fn only_more_ranks_than_cores_is_oversubscribed() {
        assert_eq!(Oversubscribed::of(2, 2), None);
        assert_eq!(
            Oversubscribed::of(4, 2),
            Some(Oversubscribed { ranks: 4, cores: 2 })
        );
    }

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
