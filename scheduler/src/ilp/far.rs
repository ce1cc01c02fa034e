//! The far-band relaxation (DESIGN §4.5, "far bands"): a MIP the size of a window-limited one
//! whose optimum bounds every plan from below, so that branching on levels and recompute — which
//! the full-window LP relaxation cannot do and the full-window MIP does not reach in the time —
//! proves a bound over the full plan space.
//!
//! The positions a window limit leaves out are grouped into bands, runs of positions whose slots
//! are aligned dyadic runs of the timeline, wider away from the consumer. A band column x_β stands for every launch of its op at any of the band's positions:
//! its blocks count in memory and in the RS→AG order as if launched at the band's position nearest
//! to its consumer (a gather holds its buffer from that position on, a reduction frees its
//! gradient from its band's first position), which is never more memory and never a stricter
//! order than any launch it stands for. Their communication time goes to no one slot: per slot,
//! the slack σ^ℓ_s of d_s ≥ Q^ℓ_s + κ_q·c_s on the band's link (and λ_s of d_s ≥ c_s + L_s) may
//! absorb it, over the band's slots, pooled with every band on that link whose slots lie within
//! the same run. Every plan maps
//! into the relaxation at its own time (each launch outside the limit to its band, σ_s and λ_s
//! the slots' real slack beyond the limited launches), so the relaxation's optimum, and HiGHS'
//! dual bound on it, are at most the best plan's time.

use super::constraints::link_position;
use super::variables::{Col, Columns, UnitVars};
use crate::profile::Link;
use good_lp::{Constraint, Expression, constraint};

/// A run of consecutive slots of the cyclic timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Run {
    first: usize,
    len: usize,
}

impl Run {
    /// Whether every slot of `other` is in this run (timeline of `slots`).
    fn contains(self, other: Run, slots: usize) -> bool {
        let offset = (other.first + slots - self.first) % slots;
        self.len >= slots || offset + other.len <= self.len
    }
}

/// The slack columns: per link in use and slot σ^ℓ_s, per slot λ_s, and their running sums over
/// the slots.
pub(super) struct Slack {
    pub comm: Vec<Vec<Col>>,
    pub compute: Vec<Col>,
    comm_sums: Vec<Vec<Col>>,
    compute_sums: Vec<Col>,
}

impl Slack {
    pub fn declare(columns: &mut Columns, slots: usize, links: usize) -> Slack {
        let mut per_slot = || (0..slots).map(|_| columns.continuous()).collect::<Vec<_>>();
        Slack {
            comm: (0..links).map(|_| per_slot()).collect(),
            compute: per_slot(),
            comm_sums: (0..links).map(|_| per_slot()).collect(),
            compute_sums: per_slot(),
        }
    }

    /// Σ_{s ∈ run} of the slack whose running sums are `sums`.
    fn over(sums: &[Col], run: Run) -> Expression {
        let slots = sums.len();
        let last = run.first + run.len - 1;
        if last < slots {
            Expression::from(sums[last].var) - sum_before(sums, run.first)
        } else {
            Expression::from(sums[slots - 1].var) - sum_before(sums, run.first)
                + sums[last - slots].var
        }
    }
}

/// The running sum up to the slot before `s` (0 before the first).
fn sum_before(sums: &[Col], s: usize) -> Expression {
    s.checked_sub(1)
        .map_or_else(Expression::default, |p| sums[p].var.into())
}

/// Running sums of the slack: Σσ^ℓ_s = Σσ^ℓ_{s−1} + σ^ℓ_s and Σλ_s = Σλ_{s−1} + λ_s
/// (Σ_{−1} = 0).
pub(super) fn slack_running_sums(slack: &Slack) -> Vec<Constraint> {
    let mut rows = Vec::new();
    let pairs = slack.comm_sums.iter().zip(&slack.comm);
    for (sums, per_slot) in pairs.chain([(&slack.compute_sums, &slack.compute)]) {
        for (s, (sum, own)) in sums.iter().zip(per_slot).enumerate() {
            rows.push(constraint!(sum.var == sum_before(sums, s) + own.var));
        }
    }
    rows
}

/// The bands' communication, pooled: for the slots S of each band (a run) and each link ℓ,
///
/// ```text
/// Σ_{s∈S} σ^ℓ_s ≥ Σ_{β on ℓ: S_β ⊆ S} t_β·x_β        Σ_{s∈S} λ_s ≥ Σ_{β: S_β ⊆ S} ℓ_β·x_β
/// ```
///
/// with t_β a block's communication time and ℓ_β the compute it costs (κ_c,op·t + κ_u·upd). A
/// shard group's RS band brings its replica AllReduces on the band's slots shifted by one.
pub(super) fn pooled_bands(
    units: &[UnitVars],
    slack: &Slack,
    (slots, links): (usize, &[Link]),
) -> Vec<Constraint> {
    let bands: Vec<(Run, usize, Col, (f64, f64))> = units
        .iter()
        .flat_map(UnitVars::ops)
        .flat_map(|op| {
            op.band_launches().flat_map(move |(positions, x)| {
                op.parts().map(move |(offset, link, time, load)| {
                    let run = Run {
                        first: (op.window.slot_at(positions.start) + offset) % slots,
                        len: positions.len(),
                    };
                    (run, link_position(links, link), x, (time, load))
                })
            })
        })
        .collect();
    let mut runs: Vec<Run> = bands.iter().map(|b| b.0).collect();
    runs.sort_by_key(|r| (r.first, r.len));
    runs.dedup();
    let mut rows = Vec::new();
    for run in runs {
        let mut time = vec![Expression::default(); links.len()];
        let mut load = Expression::default();
        for &(inner, link, x, (t, l)) in &bands {
            if run.contains(inner, slots) {
                time[link].add_mul(t, x.var);
                load.add_mul(l, x.var);
            }
        }
        for (sums, time) in slack.comm_sums.iter().zip(time) {
            rows.push(constraint!(Slack::over(sums, run) >= time));
        }
        rows.push(constraint!(Slack::over(&slack.compute_sums, run) >= load));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_contain_runs_across_the_cycles_end() {
        let slots = 10;
        let wrap = Run { first: 8, len: 4 };
        assert!(wrap.contains(Run { first: 9, len: 2 }, slots));
        assert!(wrap.contains(Run { first: 0, len: 2 }, slots));
        assert!(!wrap.contains(Run { first: 0, len: 3 }, slots));
        assert!(!wrap.contains(Run { first: 7, len: 2 }, slots));
        assert!(Run { first: 3, len: 10 }.contains(Run { first: 1, len: 9 }, slots));
    }
}
