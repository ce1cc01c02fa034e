//! The columns of the micro-batch MIP (DESIGN §4.8): per unit one indicator per configuration
//! (level, group of ranks, accumulate, keep, replica AllReduce), its recompute column, its launch
//! column sets per op, group and boundary kind with their running sums, and per group the step's
//! RS→FG order indicators; the step unrolled to K' micro-batches ([`Unrolled`]) that places
//! them, and the communicator columns ([`Communicator`]).

use super::linear::Linear;
use crate::cost::Among;
use crate::groups::{secondary_group, shard_groups};
use crate::ilp::variables::Col;
use crate::profile::Profile;
use crate::schedule::ReplicaReduce;
use crate::timeline::{Level, Op, Timeline, Window, WindowKind};

/// A unit's level, the groups of ranks it runs in and its choices across micro-batches (DESIGN
/// §3.10, §3.11.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Config {
    pub level: Level,
    /// The shard group S a sharded level shards over; None: the world.
    pub group: Option<u32>,
    /// H, the secondary group an fsdp unit keeps its shard in (hpz).
    pub secondary: Option<u32>,
    pub accumulate: bool,
    pub keep: bool,
    /// Where a shard-group unit reduces every micro-batch: whether RA follows every RS or the
    /// step's only (`Every` wherever the choice does not exist).
    pub replica_reduce: ReplicaReduce,
}

impl Config {
    /// Every configuration of `profile`'s unit `unit`: none; sdp, fsdp and hpz over the world
    /// and over each offered shard group whose window (B_i, F_i) holds RS, RA and a gather
    /// (3 slots), hpz where a smaller secondary group is offered; the last unit is never fsdp,
    /// an fsdp unit whose parameters another unit reads never keeps them (DESIGN §3.10), and
    /// `replica_reduce = last` exists only over a shard group without accumulating.
    pub fn all(profile: &Profile, unit: usize) -> Vec<Config> {
        let timeline = Timeline::new(profile.unit_count());
        let last = unit + 1 == profile.unit_count();
        let lender = profile.borrower(unit).is_some();
        let after = timeline.window(unit, WindowKind::AfterBackward).len;
        let mut all = Vec::new();
        for accumulate in [false, true] {
            all.push(Config {
                level: Level::None,
                group: None,
                secondary: None,
                accumulate,
                keep: false,
                replica_reduce: ReplicaReduce::Every,
            });
        }
        let shards = shard_groups(profile).into_iter().filter(|_| after >= 3);
        for group in std::iter::once(None).chain(shards.map(Some)) {
            let ranks = group.unwrap_or(profile.world_size);
            let hpz = secondary_group(profile).filter(|&h| h < ranks && ranks.is_multiple_of(h));
            let mut kinds = vec![(Level::Sdp, None)];
            if !last {
                kinds.push((Level::Fsdp, None));
                kinds.extend(hpz.map(|h| (Level::Fsdp, Some(h))));
            }
            for (level, secondary) in kinds {
                for accumulate in [false, true] {
                    for keep in [false, true] {
                        // An fsdp lender never keeps.
                        if keep && lender && level == Level::Fsdp {
                            continue;
                        }
                        let every_or_last: &[ReplicaReduce] = if group.is_some() && !accumulate {
                            &[ReplicaReduce::Every, ReplicaReduce::Last]
                        } else {
                            &[ReplicaReduce::Every]
                        };
                        for &replica_reduce in every_or_last {
                            all.push(Config {
                                level,
                                group,
                                secondary,
                                accumulate,
                                keep,
                                replica_reduce,
                            });
                        }
                    }
                }
            }
        }
        all
    }

    pub fn sharded(self) -> bool {
        self.level != Level::None
    }
}

/// Where an op's blocks go: the step boundary (BG: every micro-batch), or the inner one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Boundary {
    Step,
    Inner,
}

/// The ops of the MIP: AR, RS, FG (the forward gather, AG or AGF by level) and BG (AGB).
pub(super) const OPS: [Op; 4] = [
    Op::AllReduce,
    Op::ReduceScatter,
    Op::Gather,
    Op::GatherBackward,
];

/// Which launch columns: an op at a boundary kind, over a group of ranks (DESIGN §4.8's column
/// sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SetKey {
    pub op: Op,
    pub boundary: Boundary,
    /// The shard group of the configurations it serves; None: the world.
    pub group: Option<u32>,
    /// BG inside this secondary group (hpz).
    pub secondary: Option<u32>,
    /// An inner RS over a shard group: the replica AllReduce choice it serves.
    pub replica_reduce: Option<ReplicaReduce>,
}

impl SetKey {
    /// Whether configuration `c` runs these launches: AR at none, RS and FG at a sharded level
    /// of the group, BG at fsdp of the group with the same secondary group; at the inner
    /// boundary the reductions only where the unit does not accumulate (over a shard group, with
    /// the set's replica AllReduce), the forward gather only where it does not keep.
    pub fn runs(self, c: Config) -> bool {
        let inner = self.boundary == Boundary::Inner;
        let in_group = c.sharded() && c.group == self.group;
        match self.op {
            Op::AllReduce => c.level == Level::None && !(inner && c.accumulate),
            Op::ReduceScatter => {
                in_group
                    && !(inner && c.accumulate)
                    && self.replica_reduce.is_none_or(|r| r == c.replica_reduce)
            }
            Op::GatherBackward => {
                in_group && c.level == Level::Fsdp && c.secondary == self.secondary
            }
            _ => in_group && !(inner && c.keep),
        }
    }
}

/// One column set: its launch columns over the positions of its window the limits allow.
pub(super) struct Launches {
    pub key: SetKey,
    /// The ranks its collective runs among.
    pub among: Among,
    /// The replica group whose AllReduce follows each block one position later (an RS over a
    /// shard group, where RA runs at that boundary).
    pub follower: Option<Among>,
    /// Its window; one position short of the op's where a follower must fit after the block.
    pub window: Window,
    /// The window positions that have columns, increasing.
    pub positions: Vec<usize>,
    /// Per position: whether the restricted model launches there (else its column is fixed at
    /// 0: a left-out position the pricing reads, `super::pricing`).
    pub restricted: Vec<bool>,
    /// x_p: blocks launched at each allowed position.
    pub x: Vec<Col>,
    /// C_p = Σ_{p' ≤ p} x_p' at each allowed position.
    pub running: Vec<Col>,
}

impl Launches {
    /// C at window position `pos`: the running sum at the last allowed position ≤ pos.
    pub fn running_at(&self, pos: usize) -> Option<Col> {
        let k = self.positions.partition_point(|&p| p <= pos);
        (k > 0).then(|| self.running[k - 1])
    }

    /// The column launching at window position `pos`, if it is allowed.
    pub fn x_at(&self, pos: usize) -> Option<Col> {
        self.positions.binary_search(&pos).ok().map(|k| self.x[k])
    }
}

/// The step's RS→FG order of one group: Z_p = [boundary ≤ p] over the window after B_i, the
/// forward gather at least `gap` positions after the last RS block (0 over the world, 2 over a
/// shard group: RS, RA, then the gather).
pub(super) struct Order {
    pub group: Option<u32>,
    pub gap: usize,
    pub z: Vec<Col>,
}

/// One unit's columns.
pub(super) struct UnitCols {
    pub configs: Vec<(Config, Col)>,
    /// The blocks one launch column counts (`Target::blocks_per_launch`): 1, or nb_i where the
    /// target launches the unit whole (FSDP2).
    pub blocks_per_launch: u32,
    /// r_i, absent where recomputation is not allowed.
    pub recompute: Option<Col>,
    pub launches: Vec<Launches>,
    pub orders: Vec<Order>,
}

impl UnitCols {
    /// Σ y_c over the configurations `which` admits.
    pub fn y(&self, which: impl Fn(Config) -> bool) -> Linear {
        let mut sum = Linear::default();
        for &(c, col) in &self.configs {
            if which(c) {
                sum.add(col, 1.0);
            }
        }
        sum
    }

    /// The column set of `key`, where the unit has it.
    pub fn set(&self, key: SetKey) -> Option<&Launches> {
        self.launches.iter().find(|l| l.key == key)
    }

    /// The column set of `op` at `boundary` that configuration `c` runs.
    pub fn set_of(&self, c: Config, op: Op, boundary: Boundary) -> Option<&Launches> {
        self.launches
            .iter()
            .find(|l| l.key.op == op && l.key.boundary == boundary && l.key.runs(c))
    }

    pub fn recompute(&self) -> Linear {
        let mut r = Linear::default();
        if let Some(col) = self.recompute {
            r.add(col, 1.0);
        }
        r
    }
}

/// The step unrolled to K' = min(K, 3) micro-batches of 2L + 1 slots.
#[derive(Clone, Copy)]
pub(super) struct Unrolled {
    pub timeline: Timeline,
    /// K'.
    pub micro_batches: usize,
}

impl Unrolled {
    pub fn slots(self) -> usize {
        self.micro_batches * self.timeline.slot_count()
    }

    /// The slot of flat index `flat` in micro-batch `m`.
    pub fn at(self, m: usize, flat: usize) -> usize {
        m * self.timeline.slot_count() + flat
    }

    /// The micro-batches (source, target) each instance of a boundary kind joins: the step's
    /// last and first, or each consecutive pair; BG's runs inside each micro-batch.
    pub fn instances(self, op: Op, boundary: Boundary) -> Vec<(usize, usize)> {
        let k = self.micro_batches;
        match (op, boundary) {
            (Op::GatherBackward, _) => (0..k).map(|m| (m, m)).collect(),
            (_, Boundary::Step) => vec![(k - 1, 0)],
            (_, Boundary::Inner) => (0..k - 1).map(|m| (m, m + 1)).collect(),
        }
    }

    /// The slot of window position `pos` of an instance joining `source` to `target`.
    pub fn position(
        self,
        window: Window,
        kind: WindowKind,
        (source, target): (usize, usize),
        pos: usize,
    ) -> usize {
        let flat = window.slot_at(pos);
        match kind {
            WindowKind::AfterBackward if flat >= window.first => self.at(source, flat),
            _ => self.at(target, flat),
        }
    }
}

/// A communicator column u ≥ y of every configuration that uses it (DESIGN §3.11): a shard
/// group's (its shard and replica groups: 2 communicators) or the secondary group's (1).
pub(super) struct Communicator {
    pub column: Col,
    pub shard: Option<u32>,
    pub secondary: Option<u32>,
    pub count: f64,
}

impl Communicator {
    /// Whether configuration `c` uses it.
    pub fn used_by(&self, c: Config) -> bool {
        (self.shard.is_some() && c.group == self.shard)
            || (self.secondary.is_some() && c.secondary == self.secondary)
    }
}
