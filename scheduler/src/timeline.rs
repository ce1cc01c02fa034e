//! The iteration timeline of DESIGN §2–3: slots F_1 … F_L, B_L … B_1, E (cyclic), sharding
//! levels, communication ops and the cyclic launch window of every op.
//!
//! Slot indices: F_i ↦ i−1, B_i ↦ 2L−i, E ↦ 2L; S = 2L+1. Units are 1-based in names (F3) and
//! 0-based in code (`unit` = i−1).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A unit's sharding level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Replicated; gradients AllReduced (DDP).
    None,
    /// Sharded at rest, gathered once per iteration (ZeRO-2).
    Sdp,
    /// Gathered before forward and again before backward (ZeRO-3).
    Fsdp,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::None, Level::Sdp, Level::Fsdp];

    /// The ops a unit at this level runs, in canonical order.
    pub fn ops(self) -> &'static [Op] {
        match self {
            Level::None => &[Op::AllReduce],
            Level::Sdp => &[Op::ReduceScatter, Op::Gather],
            Level::Fsdp => &[Op::ReduceScatter, Op::GatherForward, Op::GatherBackward],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Sdp => "sdp",
            Level::Fsdp => "fsdp",
        }
    }
}

/// A communication op of a unit (DESIGN §3 table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// AR_i (`none`): gradient AllReduce.
    AllReduce,
    /// RS_i (`sdp`, `fsdp`): gradient ReduceScatter.
    ReduceScatter,
    /// AG_i (`sdp`): gather kept until the end of B_i.
    Gather,
    /// AGF_i (`fsdp`): forward gather, freed after F_i.
    GatherForward,
    /// AGB_i (`fsdp`): backward gather, freed after B_i.
    GatherBackward,
    /// RA_i (`sdp`, `fsdp` over a shard group smaller than the world, DESIGN §3.11): the reduced
    /// shard's AllReduce across the replica group, after the unit's ReduceScatter.
    ReplicaAllReduce,
}

/// A collective of the communication stream, as NCCL, MPI and nccl-tests name them; each `Op`
/// launches one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl Collective {
    pub const ALL: [Collective; 3] = [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
    ];

    /// The name NCCL's API and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllGather => "AllGather",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::AllReduce => "AllReduce",
        }
    }

    /// The nccl-tests program's name without `_perf`.
    pub fn test_name(self) -> &'static str {
        match self {
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllReduce => "all_reduce",
        }
    }
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::AllReduce,
        Op::ReduceScatter,
        Op::Gather,
        Op::GatherForward,
        Op::GatherBackward,
        Op::ReplicaAllReduce,
    ];

    /// The short name used in plan files and messages.
    pub fn key(self) -> &'static str {
        match self {
            Op::AllReduce => "ar",
            Op::ReduceScatter => "rs",
            Op::Gather => "ag",
            Op::GatherForward => "agf",
            Op::GatherBackward => "agb",
            Op::ReplicaAllReduce => "ra",
        }
    }

    /// Reductions carry gradients (g bytes per parameter); gathers carry parameters (p).
    pub fn is_reduction(self) -> bool {
        matches!(
            self,
            Op::AllReduce | Op::ReduceScatter | Op::ReplicaAllReduce
        )
    }

    /// Gathers whose window is (B_i, F_i) and that must follow every RS_i block.
    pub fn is_forward_gather(self) -> bool {
        matches!(self, Op::Gather | Op::GatherForward)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key().to_uppercase())
    }
}

/// A slot of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// F_i, unit i 1-based.
    F(usize),
    /// B_i, unit i 1-based.
    B(usize),
    /// E, the iteration boundary.
    E,
    /// I, the boundary between two micro-batches of a step (DESIGN §3.10): no compute.
    I,
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slot::F(i) => write!(f, "F{i}"),
            Slot::B(i) => write!(f, "B{i}"),
            Slot::E => f.write_str("E"),
            Slot::I => f.write_str("I"),
        }
    }
}

impl Serialize for Slot {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Slot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Written as in messages and traces: `AR`, `RS`, `AG`, `AGF`, `AGB`, `RA`.
impl Serialize for Op {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::str::FromStr for Slot {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || format!("a slot written F<i>, B<i>, E or I (i >= 1), got `{s}`");
        match s {
            "E" => return Ok(Slot::E),
            "I" => return Ok(Slot::I),
            _ => {}
        }
        let (kind, number) = s.split_at_checked(1).ok_or_else(expected)?;
        let i: usize = number.parse().map_err(|_| expected())?;
        if i == 0 {
            return Err(expected());
        }
        match kind {
            "F" => Ok(Slot::F(i)),
            "B" => Ok(Slot::B(i)),
            _ => Err(expected()),
        }
    }
}

/// The slots of a model with `units` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    pub units: usize,
}

/// Which of the two cyclic windows an op uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// (B_i, F_i): after the unit's backward, wrapping through E, until its forward.
    AfterBackward,
    /// (F_i, B_i): between the unit's forward and its backward.
    BetweenPasses,
}

impl Op {
    pub fn window_kind(self) -> WindowKind {
        match self {
            Op::GatherBackward => WindowKind::BetweenPasses,
            _ => WindowKind::AfterBackward,
        }
    }
}

/// An open cyclic interval of slots: positions 0 … len−1 map to slot indices first, first+1, …
/// (mod S).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub first: usize,
    pub len: usize,
    pub slots: usize,
}

impl Window {
    /// Slot index at window position `pos`.
    pub fn slot_at(&self, pos: usize) -> usize {
        debug_assert!(pos < self.len);
        (self.first + pos) % self.slots
    }

    /// Window position of slot index `slot`, if the slot is inside the window.
    pub fn position(&self, slot: usize) -> Option<usize> {
        let pos = (slot + self.slots - self.first) % self.slots;
        (pos < self.len).then_some(pos)
    }
}

impl Timeline {
    pub fn new(units: usize) -> Self {
        Timeline { units }
    }

    /// S = 2L + 1.
    pub fn slot_count(&self) -> usize {
        2 * self.units + 1
    }

    /// Index of F_{unit+1}.
    pub fn forward(&self, unit: usize) -> usize {
        unit
    }

    /// Index of B_{unit+1}.
    pub fn backward(&self, unit: usize) -> usize {
        2 * self.units - 1 - unit
    }

    /// Index of E.
    pub fn end(&self) -> usize {
        2 * self.units
    }

    /// The slot at an index.
    pub fn slot(&self, index: usize) -> Slot {
        let l = self.units;
        if index < l {
            Slot::F(index + 1)
        } else if index < 2 * l {
            Slot::B(2 * l - index)
        } else {
            Slot::E
        }
    }

    /// Index of a slot, or an error if it names a unit beyond L.
    pub fn index(&self, slot: Slot) -> Result<usize, String> {
        match slot {
            Slot::E => Ok(self.end()),
            Slot::I => Err(
                "slot I is the boundary between micro-batches: only the inner boundary's launches \
                 (`<op>_inner`) use it"
                    .into(),
            ),
            Slot::F(i) | Slot::B(i) if i > self.units => Err(format!(
                "slot {slot} names unit {i}, but there are {} units",
                self.units
            )),
            Slot::F(i) => Ok(self.forward(i - 1)),
            Slot::B(i) => Ok(self.backward(i - 1)),
        }
    }

    /// The slot at an index of an inner boundary's window (DESIGN §3.10): I where the step's
    /// window has E.
    pub fn inner_slot(&self, index: usize) -> Slot {
        match self.slot(index) {
            Slot::E => Slot::I,
            slot => slot,
        }
    }

    /// Index of a slot of an inner boundary's window: I is at E's index, and E is not one.
    pub fn inner_index(&self, slot: Slot) -> Result<usize, String> {
        match slot {
            Slot::I => Ok(self.end()),
            Slot::E => Err(
                "slot E ends the step: the inner boundary's launches use I, the boundary between \
                 micro-batches"
                    .into(),
            ),
            slot => self.index(slot),
        }
    }

    /// The unit (0-based) whose compute runs in a slot, None for E.
    pub fn compute_unit(&self, index: usize) -> Option<usize> {
        match self.slot(index) {
            Slot::F(i) | Slot::B(i) => Some(i - 1),
            Slot::E | Slot::I => None,
        }
    }

    /// The window of `op` for unit `unit` (0-based), endpoints excluded.
    pub fn window(&self, unit: usize, kind: WindowKind) -> Window {
        let slots = self.slot_count();
        match kind {
            // B_i+1 … E … F_i−1: 2i−1 slots (i 1-based).
            WindowKind::AfterBackward => Window {
                first: self.backward(unit) + 1,
                len: 2 * unit + 1,
                slots,
            },
            // F_i+1 … B_i+1: 2(L−i) slots.
            WindowKind::BetweenPasses => Window {
                first: self.forward(unit) + 1,
                len: 2 * (self.units - 1 - unit),
                slots,
            },
        }
    }

    /// Whether slot `index` lies in F_i … B_i (inclusive, not cyclic): unit i's activations are
    /// alive.
    pub fn activations_alive(&self, unit: usize, index: usize) -> bool {
        (self.forward(unit)..=self.backward(unit)).contains(&index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_indices_round_trip() {
        let t = Timeline::new(3);
        let names: Vec<String> = (0..t.slot_count()).map(|s| t.slot(s).to_string()).collect();
        assert_eq!(names, ["F1", "F2", "F3", "B3", "B2", "B1", "E"]);
        for s in 0..t.slot_count() {
            assert_eq!(t.index(t.slot(s)).unwrap(), s);
            assert_eq!(t.slot(s).to_string().parse::<Slot>().unwrap(), t.slot(s));
        }
        assert!(t.index(Slot::F(4)).is_err());
        assert!("F0".parse::<Slot>().is_err());
        assert!("X1".parse::<Slot>().is_err());
        assert!("".parse::<Slot>().is_err());
    }

    #[test]
    fn windows_match_the_design_table() {
        let t = Timeline::new(3);
        let names = |w: Window| {
            (0..w.len)
                .map(|p| t.slot(w.slot_at(p)).to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(t.window(0, WindowKind::AfterBackward)), ["E"]);
        assert_eq!(
            names(t.window(2, WindowKind::AfterBackward)),
            ["B2", "B1", "E", "F1", "F2"]
        );
        assert_eq!(
            names(t.window(0, WindowKind::BetweenPasses)),
            ["F2", "F3", "B3", "B2"]
        );
        assert!(names(t.window(2, WindowKind::BetweenPasses)).is_empty());
        let w = t.window(1, WindowKind::AfterBackward);
        assert_eq!(w.position(t.end()), Some(1));
        assert_eq!(w.position(t.forward(1)), None);
    }
}
