//! Skyline search: a depth-first search for a packing within a target size, used when the
//! greedy orders leave the arena above the live peak.
//!
//! A skyline packing places each buffer on top of everything placed in its slots: the skyline
//! h(s) is the top of the placed bytes alive in slot s, and a buffer goes at the lowest offset
//! at which each of its parts starts at or above h over the part's slots. The search covers the
//! lowest slot of the skyline that still has unplaced bytes with one of the buffers alive there
//! (those that sit flush on it first, then the longest-lived and largest), and backtracks when some
//! slot's skyline plus its unplaced bytes exceeds the target — at the live peak the slot at the
//! peak must be tiled without a hole. Skyline packings are not every packing, so a search that
//! fails proves nothing; a search that succeeds has met the live peak, the lower bound.

use super::Request;

/// Search nodes × requests × slots at most (about 0.1 s; the search is deterministic).
const WORK: usize = 100_000_000;

/// A request's parts as (offset in the buffer, end, slots alive).
struct Shape {
    parts: Vec<(u64, u64, Vec<usize>)>,
    /// Bytes alive in each slot.
    bytes_in: Vec<u64>,
    /// Slots with any part alive.
    span: u64,
}

struct Search<'a> {
    shapes: &'a [Shape],
    target: u64,
    nodes_left: usize,
    skyline: Vec<u64>,
    unplaced: Vec<u64>,
    left: Vec<bool>,
    order: Vec<usize>,
}

impl Search<'_> {
    /// The lowest offset at which request `k` lies on or above the skyline.
    fn offset(&self, k: usize) -> u64 {
        self.shapes[k]
            .parts
            .iter()
            .flat_map(|(start, _, slots)| {
                slots
                    .iter()
                    .map(move |&s| self.skyline[s].saturating_sub(*start))
            })
            .max()
            .unwrap_or(0)
    }

    fn descend(&mut self) -> bool {
        if self.nodes_left == 0 {
            return false;
        }
        self.nodes_left -= 1;
        let slots = self.skyline.len();
        let Some(low) = (0..slots)
            .filter(|&s| self.unplaced[s] > 0)
            .min_by_key(|&s| (self.skyline[s], std::cmp::Reverse(self.unplaced[s]), s))
        else {
            return true;
        };
        let mut candidates: Vec<(bool, u64, std::cmp::Reverse<u64>, usize)> =
            (0..self.shapes.len())
                .filter(|&k| self.left[k] && self.shapes[k].bytes_in[low] > 0)
                .map(|k| {
                    let offset = self.offset(k);
                    let weight = self.shapes[k].bytes_in[low] * self.shapes[k].span;
                    (
                        offset != self.skyline[low],
                        offset,
                        std::cmp::Reverse(weight),
                        k,
                    )
                })
                .collect();
        candidates.sort_unstable();
        for (_, offset, _, k) in candidates {
            let saved = self.skyline.clone();
            let shape = &self.shapes[k];
            for (_, end, alive) in &shape.parts {
                for &s in alive {
                    self.skyline[s] = self.skyline[s].max(offset + end);
                }
            }
            let mut within = true;
            for s in 0..slots {
                self.unplaced[s] -= shape.bytes_in[s];
                within &= self.skyline[s] + self.unplaced[s] <= self.target;
            }
            self.left[k] = false;
            self.order.push(k);
            if within && self.descend() {
                return true;
            }
            self.order.pop();
            self.left[k] = true;
            for s in 0..slots {
                self.unplaced[s] += shape.bytes_in[s];
            }
            self.skyline = saved;
            if self.nodes_left == 0 {
                return false;
            }
        }
        false
    }
}

/// An order in which placing `requests` at their lowest fitting offsets (first fit) packs them
/// within `target` bytes, if the search finds a skyline packing within it: first fit in the
/// order of a packing's offsets never places a request above its offset there.
pub(super) fn skyline_order(requests: &[Request], slots: usize, target: u64) -> Option<Vec<usize>> {
    let shapes: Vec<Shape> = requests
        .iter()
        .map(|r| {
            let parts: Vec<(u64, u64, Vec<usize>)> = r
                .extents()
                .map(|(start, end, alive)| (start, end, (0..slots).filter(|&s| alive[s]).collect()))
                .collect();
            let mut bytes_in = vec![0; slots];
            for (start, end, alive) in &parts {
                for &s in alive {
                    bytes_in[s] += end - start;
                }
            }
            let span = bytes_in.iter().filter(|&&b| b > 0).count() as u64;
            Shape {
                parts,
                bytes_in,
                span,
            }
        })
        .collect();
    let unplaced = (0..slots)
        .map(|s| shapes.iter().map(|p| p.bytes_in[s]).sum())
        .collect();
    let mut search = Search {
        shapes: &shapes,
        target,
        nodes_left: WORK / (requests.len() * slots).max(1),
        skyline: vec![0; slots],
        unplaced,
        left: vec![true; requests.len()],
        order: Vec::with_capacity(requests.len()),
    };
    if !search.descend() {
        return None;
    }
    let mut order = search.order;
    // Requests alive in no slot take no room; first fit puts them anywhere.
    order.extend((0..requests.len()).filter(|&k| search.left[k]));
    Some(order)
}
