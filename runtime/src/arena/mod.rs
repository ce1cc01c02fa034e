//! The static arena: every buffer of a plan gets a byte offset in one allocation before the first
//! step, from its lifetime on the cyclic slot timeline, so the peak is known before the run and
//! the steady state never allocates.
//!
//! A buffer is contiguous but need not be alive all at once: it is a run of consecutive parts,
//! each alive in its own slots (an op whose blocks launch in several slots holds each launch's
//! blocks from that launch on, as the simulator counts them). Packing places buffers one by one in
//! some order, each at an aligned offset at which none of its parts overlaps a placed part alive
//! in a common slot (the lowest, or the start of the tightest free gap). The peak of live bytes
//! over slots is a lower bound on any packing; `size_bytes` is compared with it (and with the
//! simulator's peak) in the run report.

mod parity;
mod skyline;

pub use parity::{Packed, Tenure, pack_by_parity};

use skyline::skyline_order;

/// Consecutive bytes of a buffer alive in the same slots (indices into the cyclic timeline).
#[derive(Debug, Clone)]
pub struct Part {
    pub bytes: u64,
    pub alive: Vec<bool>,
}

/// A buffer to place: its parts, in address order (all with the same number of slots).
#[derive(Debug, Clone)]
pub struct Request {
    pub name: String,
    pub parts: Vec<Part>,
}

impl Request {
    /// A buffer alive as a whole in the slots `alive`.
    pub fn whole(name: String, bytes: u64, alive: Vec<bool>) -> Self {
        Request {
            name,
            parts: vec![Part { bytes, alive }],
        }
    }

    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Whether any part is alive in slot `s`.
    pub fn alive_in(&self, s: usize) -> bool {
        self.parts.iter().any(|p| p.alive[s])
    }

    /// Each part as (start, end, alive), byte offsets from the buffer's start; the last part
    /// ends at the aligned size (the padding is held with it).
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64, &[bool])> {
        let last = self.parts.len().saturating_sub(1);
        let mut start = 0;
        self.parts.iter().enumerate().map(move |(k, p)| {
            let end = if k == last {
                aligned(start + p.bytes)
            } else {
                start + p.bytes
            };
            let extent = (start, end, p.alive.as_slice());
            start = end;
            extent
        })
    }
}

/// Where each request went.
#[derive(Debug, Clone)]
pub struct Arena {
    pub offsets: Vec<u64>,
    pub size_bytes: u64,
    /// max over slots of the bytes alive in the slot.
    pub live_peak_bytes: u64,
}

/// A request's sort key for one packing order (the largest first).
type SortKey<'a> = dyn Fn(usize) -> (u64, u64, u64) + 'a;

/// Reorderings the local search tries after the fixed orders, at most; fewer for large plans, so
/// that the search compares at most [`SEARCH_WORK`] pairs of parts' lifetimes in all.
const SEARCH_MOVES: usize = 400;
const SEARCH_WORK: usize = 200_000_000;

/// Alignment of every buffer (a cache line).
pub const ALIGN: u64 = 64;

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN) * ALIGN
}

fn together(a: &[bool], b: &[bool]) -> bool {
    a.iter().zip(b).any(|(x, y)| *x && *y)
}

/// Packs `requests` (all with the same number of slots): first-fit and best-fit in each of a few
/// orders, keeping the smallest arena; where that is above the live peak, a search for a skyline
/// packing at the live peak; then a local search over the order until the arena is the live peak
/// or its moves are spent.
pub fn pack(requests: &[Request]) -> Arena {
    let slots = requests
        .iter()
        .find_map(|r| r.parts.first())
        .map_or(0, |p| p.alive.len());
    let live = |s: usize| -> u64 {
        requests
            .iter()
            .flat_map(Request::extents)
            .filter(|(_, _, alive)| alive[s])
            .map(|(start, end, _)| end - start)
            .sum()
    };
    let live_by_slot: Vec<u64> = (0..slots).map(live).collect();
    let live_peak_bytes = live_by_slot.iter().copied().max().unwrap_or(0);
    let peak_slots: Vec<usize> = (0..slots)
        .filter(|&s| live_by_slot[s] == live_peak_bytes)
        .collect();
    let size = |k: usize| aligned(requests[k].bytes());
    let slots_alive = |k: usize| (0..slots).filter(|&s| requests[k].alive_in(s)).count() as u64;
    let at_peak = |k: usize| peak_slots.iter().any(|&s| requests[k].alive_in(s));
    // The timeline cut where the fewest bytes live; a buffer's start is its first slot after it.
    let cut = (0..slots).min_by_key(|&s| live_by_slot[s]).unwrap_or(0);
    let start = |k: usize| {
        (0..slots)
            .position(|p| requests[k].alive_in((cut + p) % slots))
            .unwrap_or(slots) as u64
    };
    // Sort keys, the largest first.
    let orders: [Box<SortKey>; 5] = [
        Box::new(|k| (size(k), 0, 0)),
        Box::new(|k| (slots_alive(k), size(k), 0)),
        Box::new(|k| (size(k) * slots_alive(k), 0, 0)),
        Box::new(|k| (u64::from(at_peak(k)), size(k), 0)),
        Box::new(|k| (u64::MAX - start(k), slots_alive(k), size(k))),
    ];
    let (mut order, mut fit, (mut offsets, mut size_bytes)) = orders
        .iter()
        .flat_map(|key| {
            let mut order: Vec<usize> = (0..requests.len()).collect();
            order.sort_by_cached_key(|&k| (std::cmp::Reverse(key(k)), k));
            [Fit::First, Fit::Best].map(|fit| {
                let packed = place(requests, &order, fit);
                (order.clone(), fit, packed)
            })
        })
        .min_by_key(|(_, _, (_, size))| *size)
        .unwrap_or((Vec::new(), Fit::First, Default::default()));
    // A skyline packing near the live peak, where the greedy orders missed it (`skyline`).
    // Targets from the live peak up to a quarter and half of the way to the greedy arena; the
    // first one the search meets is kept.
    if size_bytes > live_peak_bytes {
        let excess = size_bytes - live_peak_bytes;
        if let Some((skyline, (o, size))) = [0, 1, 2].into_iter().find_map(|quarters| {
            skyline_order(requests, slots, live_peak_bytes + excess * quarters / 4).map(|order| {
                let packed = place(requests, &order, Fit::First);
                (order, packed)
            })
        }) && size < size_bytes
        {
            (order, fit, offsets, size_bytes) = (skyline, Fit::First, o, size);
        }
    }
    // Local search: move one request earlier in the order; keep moves that do not grow the
    // arena. A fixed-seed generator keeps the layout reproducible.
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let parts: usize = requests.iter().map(|r| r.parts.len()).sum();
    let moves = SEARCH_MOVES.min(SEARCH_WORK / (parts * parts * slots).max(1));
    for _ in 0..moves {
        if size_bytes == live_peak_bytes || order.len() < 2 {
            break;
        }
        let from = 1 + next(order.len() as u64 - 1) as usize;
        let to = next(from as u64) as usize;
        let mut candidate = order.clone();
        let k = candidate.remove(from);
        candidate.insert(to, k);
        let (o, size) = place(requests, &candidate, fit);
        if size <= size_bytes {
            (order, offsets, size_bytes) = (candidate, o, size);
        }
    }
    Arena {
        offsets,
        size_bytes,
        live_peak_bytes,
    }
}

/// A fixed-seed generator of integers below its argument (xorshift64), so that layouts are
/// reproducible.
fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |bound| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    }
}

/// Where a request goes among the offsets that fit it.
#[derive(Debug, Clone, Copy)]
enum Fit {
    /// The lowest.
    First,
    /// The start of the smallest free gap (the top only when no gap below fits).
    Best,
}

/// Places `requests` in `order`, each at an aligned offset where none of its parts overlaps a
/// placed part alive in a common slot, chosen by `fit`; the offsets and the arena's size.
fn place(requests: &[Request], order: &[usize], fit: Fit) -> (Vec<u64>, u64) {
    let mut offsets = vec![0u64; requests.len()];
    // Placed parts as absolute (start, end, alive).
    let mut placed: Vec<(u64, u64, &[bool])> = Vec::new();
    for &k in order {
        let r = &requests[k];
        // Offsets o at which part (a, b) of r would overlap a placed part (s, e) alive with it:
        // s − b < o < e − a, kept as the half-open [s − b + 1, e − a).
        let mut forbidden: Vec<(u64, u64)> = r
            .extents()
            .flat_map(|(a, b, alive)| {
                placed
                    .iter()
                    .filter(move |(_, _, other)| together(alive, other))
                    .filter(move |(_, e, _)| *e > a)
                    .map(move |(s, e, _)| ((s + 1).saturating_sub(b), e - a))
            })
            .collect();
        forbidden.sort_unstable();
        // Free gaps [start, end) of aligned offsets; the last one is open.
        let mut gaps = Vec::new();
        let mut start = 0;
        for (low, high) in forbidden {
            if start < low {
                gaps.push((start, low));
            }
            start = start.max(aligned(high));
        }
        let top = start;
        offsets[k] = match fit {
            Fit::First => gaps.first().map_or(top, |g| g.0),
            Fit::Best => gaps
                .iter()
                .min_by_key(|(start, end)| (end - start, *start))
                .map_or(top, |g| g.0),
        };
        let offset = offsets[k];
        placed.extend(
            r.extents()
                .map(|(a, b, alive)| (offset + a, offset + b, alive)),
        );
    }
    let size = requests
        .iter()
        .zip(&offsets)
        .map(|(r, o)| o + aligned(r.bytes()))
        .max()
        .unwrap_or(0);
    (offsets, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(slots: &[usize], count: usize) -> Vec<bool> {
        (0..count).map(|s| slots.contains(&s)).collect()
    }

    fn req(bytes: u64, slots: &[usize], count: usize) -> Request {
        Request::whole(format!("{bytes}"), bytes, alive(slots, count))
    }

    /// Every pair of parts alive in a common slot lies at disjoint addresses.
    fn assert_disjoint(rs: &[Request], a: &Arena) {
        let parts: Vec<(u64, u64, &[bool], usize)> = rs
            .iter()
            .zip(&a.offsets)
            .enumerate()
            .flat_map(|(k, (r, o))| r.extents().map(move |(s, e, l)| (o + s, o + e, l, k)))
            .collect();
        for (i, p) in parts.iter().enumerate() {
            for q in &parts[..i] {
                let apart = p.1 <= q.0 || q.1 <= p.0;
                assert!(
                    !together(p.2, q.2) || apart,
                    "parts of requests {} and {} are alive together and overlap",
                    p.3,
                    q.3
                );
            }
        }
        assert!(a.size_bytes >= a.live_peak_bytes);
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
        assert_disjoint(&rs, &a);
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

    /// A gather launched over two slots: its second half is not alive in slot 0, so a buffer of
    /// slot 0 may sit there; the arena is the live peak, where whole lifetimes would need more.
    #[test]
    fn a_buffer_alive_in_parts_lends_its_later_parts() {
        let staircase = Request {
            name: "gathered".into(),
            parts: vec![
                Part {
                    bytes: 256,
                    alive: alive(&[0, 1, 2], 3),
                },
                Part {
                    bytes: 256,
                    alive: alive(&[1, 2], 3),
                },
            ],
        };
        let rs = [staircase, req(192, &[0], 3), req(64, &[0, 1, 2], 3)];
        let a = pack(&rs);
        assert_disjoint(&rs, &a);
        assert_eq!(a.live_peak_bytes, 576);
        assert_eq!(a.size_bytes, 576);
        assert_eq!(a.offsets[1], 256, "slot 0's buffer takes the later half");
        let whole: Vec<Request> = rs
            .iter()
            .map(|r| {
                let slots = (0..3).filter(|&s| r.alive_in(s)).collect::<Vec<_>>();
                req(r.bytes(), &slots, 3)
            })
            .collect();
        assert_eq!(pack(&whole).size_bytes, 768);
    }

    /// The smallest first-fit arena over every order of `rs`: the optimum of static packing
    /// (first fit in the order of an optimal packing's offsets never places above them).
    fn optimum_by_enumeration(rs: &[Request]) -> u64 {
        fn orders(prefix: &mut Vec<usize>, n: usize, out: &mut dyn FnMut(&[usize])) {
            if prefix.len() == n {
                return out(prefix);
            }
            for k in 0..n {
                if !prefix.contains(&k) {
                    prefix.push(k);
                    orders(prefix, n, out);
                    prefix.pop();
                }
            }
        }
        let mut best = u64::MAX;
        orders(&mut Vec::new(), rs.len(), &mut |order| {
            best = best.min(place(rs, order, Fit::First).1);
        });
        best
    }

    /// Small random instances (cyclic lifetimes over 6 slots, 1–3 parts a buffer) against every
    /// order: wherever some packing reaches the live peak, `pack` reaches it (251 of 300), and it
    /// packs above the optimum on fewer than 10 (4, all where the optimum is above the peak).
    #[test]
    fn pack_meets_the_live_peak_wherever_an_enumeration_does() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let (mut reachable, mut above_optimum) = (0, 0);
        for _ in 0..300 {
            let count = 3 + next(4) as usize;
            let rs: Vec<Request> = (0..count)
                .map(|k| {
                    let first = next(6) as usize;
                    let length = 1 + next(5) as usize;
                    let parts = (0..1 + next(3) as usize)
                        .map(|p| Part {
                            bytes: 64 * (1 + next(8)),
                            alive: (0..6)
                                .map(|s| (s + 6 - first) % 6 < length - p.min(length - 1))
                                .collect(),
                        })
                        .collect();
                    Request {
                        name: k.to_string(),
                        parts,
                    }
                })
                .collect();
            let packed = pack(&rs);
            assert_disjoint(&rs, &packed);
            let optimum = optimum_by_enumeration(&rs);
            assert!(packed.size_bytes >= optimum);
            if optimum == packed.live_peak_bytes {
                reachable += 1;
                assert_eq!(packed.size_bytes, optimum, "{rs:?}");
            }
            above_optimum += usize::from(packed.size_bytes > optimum);
        }
        assert!(
            reachable > 100,
            "the instances exercise the live peak ({reachable})"
        );
        assert!(
            above_optimum < 10,
            "{above_optimum} of 300 packed above the optimum"
        );
    }

    /// Random buffers tiling `bytes` over the cyclic arc of `len` slots from `start` (of
    /// `total`): cut into bands of bytes, each band cut into arcs at its own points (arcs wrap
    /// around the step), each arc a buffer or tiled again. Every slot of the arc holds exactly
    /// `bytes`, so a packing at the live peak exists: the tiling itself.
    fn tiling(
        next: &mut impl FnMut(u64) -> u64,
        bytes: u64,
        (start, len): (usize, usize),
        total: usize,
        depth: usize,
        out: &mut Vec<Request>,
    ) {
        if depth == 0 || bytes < 1024 || (depth < 3 && next(3) == 0) {
            let alive = (0..total)
                .map(|s| (s + total - start) % total < len)
                .collect();
            out.push(Request::whole(out.len().to_string(), bytes, alive));
            return;
        }
        let mut left = bytes;
        while left > 0 {
            let band = if left <= bytes / 4 {
                left
            } else {
                64 * (bytes / 256 + next(left / 128)).min(left / 64)
            };
            left -= band;
            let shift = next(len as u64) as usize;
            let mut cuts: Vec<usize> = (0..1 + next(3))
                .map(|_| next(len as u64) as usize)
                .collect();
            cuts.push(0);
            cuts.sort_unstable();
            cuts.dedup();
            for (k, &cut) in cuts.iter().enumerate() {
                let end = cuts.get(k + 1).copied().unwrap_or(len);
                let arc_start = if len == total {
                    (start + cut + shift) % total
                } else {
                    (start + cut) % total
                };
                tiling(next, band, (arc_start, end - cut), total, depth - 1, out);
            }
        }
    }

    /// Tilings (a packing at the live peak exists) with arcs wrapping around the step: the
    /// skyline search meets the live peak on twice as many as the greedy orders and their local
    /// search do alone (on these 40: 15 against 7; the worst packs 6.7% above either way).
    #[test]
    fn tilings_pack_at_their_height() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut met = 0;
        for _ in 0..40 {
            let mut rs = Vec::new();
            tiling(&mut next, 64 * 256, (0, 12), 12, 3, &mut rs);
            let packed = pack(&rs);
            assert_disjoint(&rs, &packed);
            assert_eq!(packed.live_peak_bytes, 64 * 256);
            met += usize::from(packed.size_bytes == packed.live_peak_bytes);
        }
        assert!(met >= 14, "{met} of 40 tilings packed at their height");
    }

    proptest::proptest! {
        /// Random multi-part buffers: parts alive together never overlap, and the arena is never
        /// below the live peak.
        #[test]
        fn parts_alive_together_never_overlap(
            buffers in proptest::collection::vec(
                proptest::collection::vec((1u64..600, proptest::collection::vec(proptest::bool::ANY, 6)), 1..4),
                0..12,
            )
        ) {
            let rs: Vec<Request> = buffers
                .into_iter()
                .enumerate()
                .map(|(k, parts)| Request {
                    name: k.to_string(),
                    parts: parts.into_iter().map(|(bytes, alive)| Part { bytes, alive }).collect(),
                })
                .collect();
            let a = pack(&rs);
            assert_disjoint(&rs, &a);
            proptest::prop_assert!(a.offsets.iter().all(|o| o % ALIGN == 0));
        }
    }
}
