//! The executor's communication kinds and the tables it keeps per unit and kind (events, blocks
//! per step, the micro-batches each kind's instances serve), looked up by (unit, kind).

use shardplan_scheduler::timeline::Op;
use std::ops::{Index, IndexMut};

/// The communication kinds of the executor (RS serves both sharded levels; FG is AG or AGF; RA
/// is a shard group's replica AllReduce, DESIGN §3.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    AllReduce,
    ReduceScatter,
    ForwardGather,
    BackwardGather,
    ReplicaAllReduce,
}

impl Kind {
    /// The number of kinds (events are kept per unit and kind).
    const COUNT: usize = 5;

    const ALL: [Kind; Kind::COUNT] = [
        Kind::AllReduce,
        Kind::ReduceScatter,
        Kind::ForwardGather,
        Kind::BackwardGather,
        Kind::ReplicaAllReduce,
    ];

    pub(super) fn of(op: Op) -> Kind {
        match op {
            Op::AllReduce => Kind::AllReduce,
            Op::ReduceScatter => Kind::ReduceScatter,
            Op::Gather | Op::GatherForward => Kind::ForwardGather,
            Op::GatherBackward => Kind::BackwardGather,
            Op::ReplicaAllReduce => Kind::ReplicaAllReduce,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    pub(super) fn name(self) -> &'static str {
        ["AR", "RS", "AG", "AGB", "RA"][self.index()]
    }

    /// What it is, in words: the collective and, for a gather, which.
    pub(super) fn described(self) -> &'static str {
        [
            "AllReduce",
            "ReduceScatter",
            "forward AllGather",
            "backward AllGather",
            "replica AllReduce",
        ][self.index()]
    }
}

/// One value per unit and communication kind, indexed by `(unit, kind)`.
#[derive(Debug, Clone)]
pub(super) struct PerUnitKind<T>(Vec<T>);

impl<T> PerUnitKind<T> {
    /// `make(unit, kind)` for every kind of each of `units` units.
    pub(super) fn new(units: usize, mut make: impl FnMut(usize, Kind) -> T) -> Self {
        let keys = (0..units).flat_map(|unit| Kind::ALL.map(|kind| (unit, kind)));
        PerUnitKind(keys.map(|(unit, kind)| make(unit, kind)).collect())
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.0.iter_mut()
    }
}

impl<T> Index<(usize, Kind)> for PerUnitKind<T> {
    type Output = T;

    fn index(&self, (unit, kind): (usize, Kind)) -> &T {
        &self.0[unit * Kind::COUNT + kind.index()]
    }
}

impl<T> IndexMut<(usize, Kind)> for PerUnitKind<T> {
    fn index_mut(&mut self, (unit, kind): (usize, Kind)) -> &mut T {
        &mut self.0[unit * Kind::COUNT + kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_and_kind_has_its_own_value() {
        let mut table = PerUnitKind::new(3, |unit, kind| (unit, kind));
        for unit in 0..3 {
            for kind in Kind::ALL {
                assert_eq!(table[(unit, kind)], (unit, kind));
            }
        }
        table[(2, Kind::ReplicaAllReduce)].0 = 7;
        assert_eq!(table.iter().filter(|v| v.0 == 7).count(), 1);
        assert_eq!(table.iter().count(), 3 * Kind::COUNT);
    }
}
