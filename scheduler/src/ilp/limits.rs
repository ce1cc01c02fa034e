//! Window limits (DESIGN §4.5): the subsets of the plan space the ILP searches when asked, and
//! the ones its staged proofs cover.

use crate::schedule::Schedule;
use crate::timeline::{Op, Window};
use serde::{Serialize, Serializer};
use std::fmt;
use std::num::NonZeroUsize;
use std::ops::Range;

/// The window depth at which a staged solve places launches, the far-band search starts and the
/// priced bound prices first (DESIGN §4.5): deep enough for a gather to hide behind a block's
/// forward, shallow enough for the MIP of a large model to finish.
pub(super) const PLACEMENT_DEPTH: NonZeroUsize = NonZeroUsize::new(4).unwrap();

/// Gathers launch only in the last `gather` positions of their window, reductions only in the
/// first `reduce`; `None` is the whole window. A limit is at least one position (the op's
/// consumer-adjacent slot), so every limited space holds a plan whenever the full one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowLimits {
    pub gather: Option<NonZeroUsize>,
    pub reduce: Option<NonZeroUsize>,
}

impl WindowLimits {
    /// No limit: every plan.
    pub const FULL: WindowLimits = WindowLimits {
        gather: None,
        reduce: None,
    };

    /// The same depth for gathers and reductions.
    pub fn depth(depth: NonZeroUsize) -> WindowLimits {
        WindowLimits {
            gather: Some(depth),
            reduce: Some(depth),
        }
    }

    pub fn is_full(self) -> bool {
        self == WindowLimits::FULL
    }

    /// The positions of `window` at which `op` may launch.
    pub fn positions(self, op: Op, window: Window) -> Range<usize> {
        let all = 0..window.len;
        match (op.is_reduction(), self.reduce, self.gather) {
            (true, Some(r), _) => 0..r.get().min(window.len),
            (false, _, Some(d)) => window.len.saturating_sub(d.get())..window.len,
            _ => all,
        }
    }

    /// How many positions the limits allow, summed over both sides (a side without a limit
    /// counts as unbounded): the order in which claims prefer the widest proof.
    pub fn breadth(self) -> usize {
        let side = |d: Option<NonZeroUsize>| d.map_or(usize::MAX, NonZeroUsize::get);
        side(self.gather).saturating_add(side(self.reduce))
    }

    /// Whether every launch of `schedule` lies within these limits.
    pub fn admit(self, schedule: &Schedule) -> bool {
        self.admit_or(schedule, |_, _, _| false)
    }

    /// Whether every launch of `schedule` lies within these limits or at a position `also`
    /// allows (unit, op, window position).
    pub(crate) fn admit_or(
        self,
        schedule: &Schedule,
        mut also: impl FnMut(usize, Op, usize) -> bool,
    ) -> bool {
        let timeline = schedule.timeline();
        // A replica AllReduce follows its RS block (DESIGN §3.11): RS's position is the choice.
        (0..schedule.units().len()).all(|unit| {
            let chosen = schedule
                .ops(unit)
                .filter(|(op, _)| *op != Op::ReplicaAllReduce);
            chosen.into_iter().all(|(op, launches)| {
                let allowed = self.positions(op, timeline.window(unit, op.window_kind()));
                launches
                    .iter()
                    .all(|l| allowed.contains(&l.position) || also(unit, op, l.position))
            })
        })
    }

    /// For tables: `full`, the common depth (`4`), or gather/reduce (`2/full`).
    pub fn short(self) -> String {
        match self.common_depth() {
            Some(d) => depth(d),
            None => format!("{}/{}", depth(self.gather), depth(self.reduce)),
        }
    }

    /// The same depth on both sides, if it is one.
    fn common_depth(self) -> Option<Option<NonZeroUsize>> {
        (self.gather == self.reduce).then_some(self.gather)
    }
}

/// A depth as tables and messages write it: the number, or `full` without a limit.
fn depth(limit: Option<NonZeroUsize>) -> String {
    limit.map_or("full".to_string(), |d| d.to_string())
}

/// `full windows`, `window depth 4`, or `gather depth 2, reduce depth full`.
impl fmt::Display for WindowLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.common_depth() {
            Some(None) => write!(f, "full windows"),
            Some(Some(d)) => write!(f, "window depth {d}"),
            None => write!(
                f,
                "gather depth {}, reduce depth {}",
                depth(self.gather),
                depth(self.reduce)
            ),
        }
    }
}

/// `null` for the full plan space, the depth when gathers and reductions share it, else
/// `{"gather": D or null, "reduce": R or null}`.
impl Serialize for WindowLimits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Split {
            gather: Option<NonZeroUsize>,
            reduce: Option<NonZeroUsize>,
        }
        match self.common_depth() {
            Some(depth) => depth.serialize(s),
            None => Split {
                gather: self.gather,
                reduce: self.reduce,
            }
            .serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Timeline;

    fn limits(gather: usize, reduce: usize) -> WindowLimits {
        WindowLimits {
            gather: NonZeroUsize::new(gather),
            reduce: NonZeroUsize::new(reduce),
        }
    }

    #[test]
    fn gathers_keep_the_last_positions_and_reductions_the_first() {
        let timeline = Timeline::new(4);
        let before = timeline.window(2, Op::GatherForward.window_kind());
        let after = timeline.window(2, Op::ReduceScatter.window_kind());
        let l = limits(2, 3);
        assert_eq!(
            l.positions(Op::GatherForward, before),
            before.len - 2..before.len
        );
        assert_eq!(l.positions(Op::ReduceScatter, after), 0..3.min(after.len));
        assert_eq!(limits(0, 0).positions(Op::Gather, before), 0..before.len);
        assert_eq!(limits(99, 99).positions(Op::Gather, before), 0..before.len);
    }

    #[test]
    fn limits_print_and_serialise_as_one_depth_when_they_agree() {
        let json = |l: WindowLimits| serde_json::to_string(&l).unwrap();
        assert_eq!(json(WindowLimits::FULL), "null");
        assert_eq!(json(limits(4, 4)), "4");
        assert_eq!(json(limits(2, 0)), r#"{"gather":2,"reduce":null}"#);
        assert_eq!(WindowLimits::FULL.to_string(), "full windows");
        assert_eq!(limits(4, 4).to_string(), "window depth 4");
        assert_eq!(
            limits(0, 3).to_string(),
            "gather depth full, reduce depth 3"
        );
        assert_eq!(
            [WindowLimits::FULL, limits(4, 4), limits(2, 0)].map(WindowLimits::short),
            ["full", "4", "2/full"]
        );
    }
}
