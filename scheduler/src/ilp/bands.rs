//! Where the far-band relaxation's band columns lie (DESIGN §4.5, "far bands"): the positions a
//! window limit leaves out, grouped into runs whose slots are aligned dyadic runs of the timeline,
//! wider away from the consumer. `variables` declares a column per band; `far` prices them.

use crate::timeline::{Op, Window};
use std::ops::Range;

/// The band columns of `op` over the positions of `window` without a column of their own
/// (`exact[k]` false): (the position it counts as, the positions it stands for). A band's
/// positions are consecutive and without a column, its slots an aligned dyadic run of the timeline
/// ([j·2^m, (j+1)·2^m)), so any two bands' slots are nested or disjoint, and it is no wider than
/// its nearest position is far from the consumer: bands widen away from it.
pub(super) fn bands(op: Op, window: Window, exact: &[bool]) -> Vec<(usize, Range<usize>)> {
    let mut bands = Vec::new();
    let free = |k: usize| !exact[k];
    if op.is_reduction() {
        // Positions increase away from the consumer, and so do slots.
        let mut near = 0;
        while near < window.len {
            if !free(near) {
                near += 1;
                continue;
            }
            let slot = window.slot_at(near);
            let mut width = 1;
            while slot.is_multiple_of(2 * width)
                && 2 * width <= near.max(1)
                && near + 2 * width <= window.len
                && slot + 2 * width <= window.slots
                && (near + width..near + 2 * width).all(free)
            {
                width *= 2;
            }
            bands.push((near, near..near + width));
            near += width;
        }
    } else {
        // Positions decrease away from the consumer; a band ends at its nearest position.
        let mut near = window.len;
        while near > 0 {
            if !free(near - 1) {
                near -= 1;
                continue;
            }
            let end = window.slot_at(near - 1) + 1;
            let distance = (window.len - near).max(1);
            let mut width = 1;
            while end.is_multiple_of(2 * width)
                && 2 * width <= distance
                && 2 * width <= near
                && 2 * width <= end
                && (near - 2 * width..near - width).all(free)
            {
                width *= 2;
            }
            bands.push((near - 1, near - width..near));
            near -= width;
        }
    }
    bands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(op: Op, window: Window, limited: Range<usize>) -> Vec<(usize, Range<usize>)> {
        let exact: Vec<bool> = (0..window.len).map(|k| limited.contains(&k)).collect();
        bands(op, window, &exact)
    }

    #[test]
    fn bands_are_dyadic_runs_that_widen_away_from_the_limit_and_cover_what_it_leaves_out() {
        let window = Window {
            first: 3,
            len: 20,
            slots: 24,
        };
        // Reductions at positions 0..3 (slots 3..6); the rest in slots [6,8), [8,12), [12,16),
        // [16,20), [20,22), [22,23): aligned, at most as wide as they are far.
        assert_eq!(
            all(Op::ReduceScatter, window, 0..3),
            [
                (3, 3..5),
                (5, 5..9),
                (9, 9..13),
                (13, 13..17),
                (17, 17..19),
                (19, 19..20)
            ]
        );
        // Gathers at positions 17..20 (slots 20..23); the rest in slots [18,20), [16,18),
        // [12,16), [8,12), [4,8), [3,4).
        assert_eq!(
            all(Op::GatherForward, window, 17..20),
            [
                (16, 15..17),
                (14, 13..15),
                (12, 9..13),
                (8, 5..9),
                (4, 1..5),
                (0, 0..1)
            ]
        );
        assert!(all(Op::GatherForward, window, 0..20).is_empty());
        let wrapping = Window {
            first: 20,
            len: 8,
            slots: 24,
        };
        // Slots 20..24 then 0..4: no run crosses the cycle's end.
        assert_eq!(
            all(Op::AllReduce, wrapping, 0..1),
            [(1, 1..2), (2, 2..4), (4, 4..8)]
        );
    }
}
