//! Two layouts by step parity, where one offset per buffer cannot reach the live peak.
//!
//! Buffers whose lifetimes wrap around the step's end can be alive together pairwise without all
//! of them being alive in one slot; contiguous buffers alive together pairwise must be stacked, so
//! no static packing reaches the live peak then (DESIGN §6.5). A buffer that holds one step's
//! contents need not sit at the same offset in every step: the contents born in an even iteration
//! can live at one offset and those born in an odd one at another. Packing two iterations (2S
//! slots) with each such buffer twice, once per parity, gives the packer that freedom; buffers
//! that keep state from step to step (parameters, gradients, optimizer moments) keep one offset.
//! The live bytes of every slot are the same as on one iteration, so the live peak is unchanged.

use super::{Arena, Part, Request, pack};

/// How a buffer's contents live across steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenure {
    /// State kept from step to step: one offset, alive in every slot.
    Kept,
    /// One step's contents, written first in slot `birth` and alive in the buffer's slots from
    /// there on, cyclically, until `birth` comes round again.
    Step { birth: usize },
}

/// A packing of a plan's buffers.
#[derive(Debug, Clone)]
pub struct Packed {
    /// Offsets of `requests`.
    pub arena: Arena,
    /// What was packed: the buffers over one iteration's slots, or, where that packed above the
    /// live peak and two parities pack lower, over two iterations' slots, each buffer with a
    /// `Step` tenure twice.
    pub requests: Vec<Request>,
    /// Per buffer given, its index in `requests` for contents born in an even and in an odd
    /// iteration (the same index twice when one offset serves both).
    pub copies: Vec<[usize; 2]>,
}

impl Packed {
    /// 2 where contents born in odd iterations sit elsewhere than those born in even ones, else 1.
    pub fn parities(&self) -> usize {
        if self.copies.iter().any(|[even, odd]| even != odd) {
            2
        } else {
            1
        }
    }
}

/// Packs `requests` (with their `tenures`, in the same order) with one offset each; where that
/// is above the live peak, also per parity over two iterations, and keeps the smaller arena (one
/// offset each when equal).
pub fn pack_by_parity(requests: Vec<Request>, tenures: &[Tenure]) -> Packed {
    debug_assert_eq!(requests.len(), tenures.len());
    let single = Packed {
        arena: pack(&requests),
        copies: (0..requests.len()).map(|k| [k, k]).collect(),
        requests,
    };
    let reachable = single.arena.size_bytes == single.arena.live_peak_bytes;
    if reachable || tenures.iter().all(|t| *t == Tenure::Kept) {
        return single;
    }
    let (unrolled, copies) = unroll(&single.requests, tenures);
    let arena = pack(&unrolled);
    if arena.size_bytes < single.arena.size_bytes {
        Packed {
            arena,
            requests: unrolled,
            copies,
        }
    } else {
        single
    }
}

/// Two iterations of `requests`' lifetimes (2S slots): a `Kept` buffer once, alive throughout; a
/// `Step` buffer once per parity p, its slot s of one iteration at p·S + birth + ((s − birth) mod
/// S) (mod 2S), so the contents born in iteration p run into the next one where they wrap.
fn unroll(requests: &[Request], tenures: &[Tenure]) -> (Vec<Request>, Vec<[usize; 2]>) {
    let mut unrolled = Vec::with_capacity(2 * requests.len());
    let copies = requests
        .iter()
        .zip(tenures)
        .map(|(request, tenure)| {
            let mut add = |name: String, alive: &dyn Fn(&[bool]) -> Vec<bool>| {
                unrolled.push(Request {
                    name,
                    parts: request
                        .parts
                        .iter()
                        .map(|p| Part {
                            bytes: p.bytes,
                            alive: alive(&p.alive),
                        })
                        .collect(),
                });
                unrolled.len() - 1
            };
            match *tenure {
                Tenure::Kept => {
                    let k = add(request.name.clone(), &|alive| alive.repeat(2));
                    [k, k]
                }
                Tenure::Step { birth } => [0, 1].map(|parity| {
                    let name = format!("{} ({} iterations)", request.name, ["even", "odd"][parity]);
                    add(name, &|alive| born_in(alive, birth, parity))
                }),
            }
        })
        .collect();
    (unrolled, copies)
}

/// The slots of two iterations in which contents born at `birth` of an iteration of `parity`
/// are alive, given the slots of one iteration they are alive in.
fn born_in(alive: &[bool], birth: usize, parity: usize) -> Vec<bool> {
    let slots = alive.len();
    let mut twice = vec![false; 2 * slots];
    for s in (0..slots).filter(|&s| alive[s]) {
        let since_birth = (s + slots - birth % slots) % slots;
        twice[(parity * slots + birth + since_birth) % (2 * slots)] = true;
    }
    twice
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(slots: &[usize], count: usize) -> Vec<bool> {
        (0..count).map(|s| slots.contains(&s)).collect()
    }

    fn step(bytes: u64, slots: &[usize], count: usize) -> (Request, Tenure) {
        let birth = (0..count)
            .find(|&s| slots.contains(&s) && !slots.contains(&((s + count - 1) % count)))
            .unwrap_or(0);
        let request = Request::whole(format!("{bytes}@{slots:?}"), bytes, alive(slots, count));
        (request, Tenure::Step { birth })
    }

    /// Every two parts alive in a common slot of `packed.requests` lie at disjoint addresses.
    fn assert_disjoint(packed: &Packed) {
        let parts: Vec<(u64, u64, &[bool])> = packed
            .requests
            .iter()
            .zip(&packed.arena.offsets)
            .flat_map(|(r, o)| r.extents().map(move |(s, e, l)| (o + s, o + e, l)))
            .collect();
        for (i, p) in parts.iter().enumerate() {
            for q in &parts[..i] {
                let together = p.2.iter().zip(q.2).any(|(x, y)| *x && *y);
                assert!(
                    !together || p.1 <= q.0 || q.1 <= p.0,
                    "{p:?} and {q:?} overlap"
                );
            }
        }
    }

    /// Three 1 KiB buffers over 3 slots, each alive in two consecutive ones (one across the
    /// step's end): every two are alive together, no slot holds all three. One offset each needs
    /// 3 KiB stacked; per parity the six copies tile two iterations two deep, at the live peak,
    /// 2 KiB, and the unrolled packing is checked part by part.
    #[test]
    fn buffers_alive_together_pairwise_across_the_end_pack_at_the_live_peak_by_parity() {
        let (requests, tenures): (Vec<_>, Vec<_>) =
            (0..3).map(|k| step(1024, &[k, (k + 1) % 3], 3)).unzip();
        assert_eq!(pack(&requests).size_bytes, 3072);
        let packed = pack_by_parity(requests, &tenures);
        assert_eq!(packed.parities(), 2);
        assert_eq!(packed.arena.live_peak_bytes, 2048);
        assert_eq!(packed.arena.size_bytes, 2048);
        assert_eq!(packed.requests.len(), 6);
        assert!(packed.requests.iter().all(|r| r.parts[0].alive.len() == 6));
        assert_disjoint(&packed);
    }

    /// A kept buffer appears once, alive throughout, and keeps one offset.
    #[test]
    fn kept_state_keeps_one_offset() {
        let (mut requests, mut tenures): (Vec<_>, Vec<_>) =
            (0..3).map(|k| step(1024, &[k, (k + 1) % 3], 3)).unzip();
        requests.push(Request::whole("state".into(), 640, vec![true; 3]));
        tenures.push(Tenure::Kept);
        let packed = pack_by_parity(requests, &tenures);
        let [even, odd] = packed.copies[3];
        assert_eq!(even, odd);
        assert_eq!(packed.requests[even].parts[0].alive, vec![true; 6]);
        assert_eq!(packed.arena.size_bytes, 2048 + 640);
        assert_disjoint(&packed);
    }

    /// Where one offset each reaches the live peak, nothing is unrolled.
    #[test]
    fn one_layout_where_it_reaches_the_live_peak() {
        let (requests, tenures): (Vec<_>, Vec<_>) = [
            step(640, &[0, 1], 4),
            step(640, &[2, 3], 4),
            step(128, &[3, 0], 4),
        ]
        .into_iter()
        .unzip();
        let packed = pack_by_parity(requests, &tenures);
        assert_eq!(packed.parities(), 1);
        assert_eq!(packed.requests.len(), 3);
        assert_eq!(packed.arena.size_bytes, packed.arena.live_peak_bytes);
    }

    /// Contents born at slot 3 of 4 and alive in slots 3, 0: the odd copy runs from slot 7 into
    /// slot 0, the even one from slot 3 into slot 4.
    #[test]
    fn contents_wrapping_the_end_run_into_the_next_iteration() {
        let alive = alive(&[0, 3], 4);
        assert_eq!(born_in(&alive, 3, 0), super::tests::alive(&[3, 4], 8));
        assert_eq!(born_in(&alive, 3, 1), super::tests::alive(&[7, 0], 8));
    }

    proptest::proptest! {
        /// Random buffers (cyclic runs over 5 slots, some kept): the unrolled packing keeps every
        /// two parts alive together apart, each slot's live bytes are one iteration's, and the
        /// arena is never above one offset each.
        #[test]
        fn parity_packing_is_sound_and_never_larger(
            buffers in proptest::collection::vec((1u64..20, 0usize..5, 1usize..5, proptest::bool::weighted(0.15)), 1..9)
        ) {
            let (requests, tenures): (Vec<_>, Vec<_>) = buffers
                .iter()
                .map(|&(kib, first, len, kept)| {
                    if kept {
                        (Request::whole("kept".into(), 64 * kib, vec![true; 5]), Tenure::Kept)
                    } else {
                        let slots: Vec<usize> = (0..len).map(|d| (first + d) % 5).collect();
                        let (r, _) = step(64 * kib, &slots, 5);
                        (r, Tenure::Step { birth: first })
                    }
                })
                .unzip();
            let single = pack(&requests);
            let packed = pack_by_parity(requests, &tenures);
            assert_disjoint(&packed);
            proptest::prop_assert_eq!(packed.arena.live_peak_bytes, single.live_peak_bytes);
            proptest::prop_assert!(packed.arena.size_bytes <= single.size_bytes);
            proptest::prop_assert!(packed.arena.size_bytes >= packed.arena.live_peak_bytes);
        }
    }
}
