//! The static arena: every buffer of a plan gets a byte offset in one allocation before the first
//! step, from its lifetime on the cyclic slot timeline, so the peak is known before the run and
//! the steady state never allocates.
//!
//! Packing is first-fit by decreasing size: a region goes to the lowest offset at which it
//! overlaps no placed region alive in a common slot. The peak of live bytes over slots is a lower
//! bound on any packing; `size_bytes` is compared with it (and with the simulator's peak) in the
//! run report.

/// A buffer to place: its size and the slots (indices into the cyclic timeline) it is alive in.
#[derive(Debug, Clone)]
pub struct Request {
    pub name: String,
    pub bytes: u64,
    pub alive: Vec<bool>,
}

/// Where each request went.
#[derive(Debug, Clone)]
pub struct Arena {
    pub offsets: Vec<u64>,
    pub size_bytes: u64,
    /// max over slots of the bytes alive in the slot.
    pub live_peak_bytes: u64,
}

/// Alignment of every region (a cache line).
pub const ALIGN: u64 = 64;

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Packs `requests` (all with the same number of slots).
pub fn pack(requests: &[Request]) -> Arena {
    let slots = requests.first().map_or(0, |r| r.alive.len());
    let live_peak_bytes = (0..slots)
        .map(|s| {
            requests
                .iter()
                .filter(|r| r.alive[s])
                .map(|r| aligned(r.bytes))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&k| (std::cmp::Reverse(aligned(requests[k].bytes)), k));
    let mut offsets = vec![0u64; requests.len()];
    let mut placed: Vec<usize> = Vec::new();
    for k in order {
        let r = &requests[k];
        let size = aligned(r.bytes);
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&p| {
                requests[p]
                    .alive
                    .iter()
                    .zip(&r.alive)
                    .any(|(a, b)| *a && *b)
            })
            .map(|&p| (offsets[p], offsets[p] + aligned(requests[p].bytes)))
            .collect();
        conflicts.sort_unstable();
        let mut offset = 0;
        for (start, end) in conflicts {
            if offset + size <= start {
                break;
            }
            offset = offset.max(end);
        }
        offsets[k] = offset;
        placed.push(k);
    }
    let size_bytes = requests
        .iter()
        .zip(&offsets)
        .map(|(r, o)| o + aligned(r.bytes))
        .max()
        .unwrap_or(0);
    Arena {
        offsets,
        size_bytes,
        live_peak_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bytes: u64, alive: &[usize], slots: usize) -> Request {
        Request {
            name: format!("{bytes}"),
            bytes,
            alive: (0..slots).map(|s| alive.contains(&s)).collect(),
        }
    }

    #[test]
    fn disjoint_lifetimes_share_space_and_overlapping_ones_do_not() {
        let rs = [
            req(640, &[0, 1], 4),
            req(640, &[2, 3], 4),
            req(128, &[1, 2], 4),
        ];
        let a = pack(&rs);
        assert_eq!(
            a.offsets[0], a.offsets[1],
            "disjoint lifetimes reuse the same bytes"
        );
        assert_eq!(a.size_bytes, 768);
        assert_eq!(a.live_peak_bytes, 768);
        for i in 0..3 {
            for j in 0..i {
                let together = rs[i].alive.iter().zip(&rs[j].alive).any(|(x, y)| *x && *y);
                let disjoint = a.offsets[i] + rs[i].bytes <= a.offsets[j]
                    || a.offsets[j] + rs[j].bytes <= a.offsets[i];
                assert!(
                    !together || disjoint,
                    "{i} and {j} are alive together and overlap"
                );
            }
        }
    }

    #[test]
    fn wrapped_lifetimes_are_respected() {
        // A region alive in the last and first slot (wrapping E → F1) cannot share with either.
        let rs = [
            req(64, &[0, 3], 4),
            req(64, &[0], 4),
            req(64, &[3], 4),
            req(64, &[1, 2], 4),
        ];
        let a = pack(&rs);
        assert_ne!(a.offsets[0], a.offsets[1]);
        assert_ne!(a.offsets[0], a.offsets[2]);
        assert_eq!(a.size_bytes, 128);
    }
}
