//! The groups of ranks a collective runs among (DESIGN §3.11, §6.11): the world, the blocks of
//! consecutive ranks a shard group or a node's secondary group is, and the replica groups across
//! those blocks. Rank r's shard group of S ranks is ⌊r/S⌋·S … ⌊r/S⌋·S + S − 1, and its place in
//! it r mod S, as FSDP2's (N/S, S) device mesh places ranks; its replica group is the N/S ranks
//! r' ≡ r (mod S), ordered by ⌊r'/S⌋.

use shardplan_scheduler::cost::Among;

/// A group of ranks, the same shape on every rank (each rank is in exactly one group of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    World,
    /// The `size` consecutive ranks holding this rank.
    Consecutive(usize),
    /// The ranks at this rank's place in every block of `block` consecutive ranks.
    Across(usize),
}

impl Group {
    /// The group a scheduler collective `among` runs in on `world` ranks: a shard or secondary
    /// group of S ranks is consecutive, a replica group of N/S ranks lies across the blocks of S.
    pub fn of(among: Among, world: usize) -> Group {
        match among {
            Among::World => Group::World,
            Among::Shard(s) | Among::Secondary(s) => Group::Consecutive(s as usize),
            Among::Replica(r) => Group::Across(world / r as usize),
        }
    }

    /// The group as one of `world` ranks sees it: the world when it holds every rank.
    pub fn normalized(self, world: usize) -> Group {
        if self.size(world) == world {
            Group::World
        } else {
            self
        }
    }

    /// Ranks in the group.
    pub fn size(self, world: usize) -> usize {
        match self {
            Group::World => world,
            Group::Consecutive(size) => size,
            Group::Across(block) => world / block,
        }
    }

    /// Which group of this shape `rank` is in (its colour for `MPI_Comm_split`), and its place
    /// in it (its key: the group's ranks in ascending order).
    pub fn place(self, rank: usize) -> (usize, usize) {
        match self {
            Group::World => (0, rank),
            Group::Consecutive(size) => (rank / size, rank % size),
            Group::Across(block) => (rank % block, rank / block),
        }
    }

    /// The global ranks of `rank`'s group, in group order.
    pub fn members(self, rank: usize, world: usize) -> Vec<usize> {
        let (color, _) = self.place(rank);
        (0..world).filter(|&r| self.place(r).0 == color).collect()
    }

    /// Whether `world` ranks split into groups of this shape: a size that divides the world.
    pub fn fits(self, world: usize) -> bool {
        let block = match self {
            Group::World => return true,
            Group::Consecutive(size) => size,
            Group::Across(block) => block,
        };
        block > 0 && world.is_multiple_of(block)
    }

    /// In words, for errors and traces.
    pub fn describe(self, world: usize) -> String {
        match self {
            Group::World => format!("the world of {world} ranks"),
            Group::Consecutive(size) => format!("groups of {size} consecutive ranks"),
            Group::Across(block) => format!(
                "replica groups of {} ranks across blocks of {block}",
                world / block
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Group;
    use shardplan_scheduler::cost::Among;

    /// 8 ranks as 2 nodes of 4, HSDP over the node: rank 6's shard group is 4..8 (place 2), its
    /// replica group {2, 6} (place 1); FSDP2's (2, 4) mesh puts rank 6 at (1, 2).
    #[test]
    fn groups_place_ranks_as_a_two_dimensional_mesh() {
        let shard = Group::of(Among::Shard(4), 8);
        let replica = Group::of(Among::Replica(2), 8);
        assert_eq!(shard.members(6, 8), vec![4, 5, 6, 7]);
        assert_eq!(shard.place(6), (1, 2));
        assert_eq!(replica.members(6, 8), vec![2, 6]);
        assert_eq!(replica.place(6), (2, 1));
        assert_eq!(replica.size(8), 2);
        assert_eq!(
            Group::of(Among::World, 8).members(3, 8),
            (0..8).collect::<Vec<_>>()
        );
        // Every rank is in exactly one group of a shape, at a distinct place.
        for group in [shard, replica] {
            let mut seen = vec![0; 8];
            for r in 0..8 {
                for m in group.members(r, 8) {
                    seen[m] += usize::from(m == r);
                }
            }
            assert_eq!(seen, vec![1; 8]);
        }
    }

    #[test]
    fn a_group_of_the_whole_world_is_the_world() {
        assert_eq!(Group::Consecutive(4).normalized(4), Group::World);
        assert_eq!(Group::Across(1).normalized(4), Group::World);
        assert_eq!(Group::Consecutive(2).normalized(4), Group::Consecutive(2));
        assert!(!Group::Consecutive(3).fits(4));
        assert!(Group::Across(2).fits(4));
    }
}
