//! FSDP2's hooks in the order they run over one step (DESIGN §3.12), each rule from torch's
//! `distributed/fsdp/_fully_shard/`:
//!
//! - pre-forward (`FSDPState._pre_forward` → `FSDPParamGroup.pre_forward`): the module's own
//!   `unshard` (a no-op when prefetched or still unsharded) and `wait_for_unshard`, then
//!   `_prefetch_unshard` of each module in its forward list;
//! - post-forward (`FSDPParamGroup.post_forward` → `reshard`): freed unless
//!   `reshard_after_forward` is false (an int keeps a 1/H shard); a replicated module (the
//!   (N, 1) mesh, `reshard_after_forward` left at its default) frees its unsharded copy too;
//! - pre-backward (`FSDPState._pre_backward`): own `unshard` and wait, then the explicit backward
//!   list, or, when it is empty (`default_prefetch = len(self._states_to_backward_prefetch) == 0`),
//!   `FSDPParamGroup._backward_prefetch`: the module before it in post-forward order;
//! - post-backward (`FSDPParamGroup.post_backward`): resharded when `reshard_after_backward`,
//!   gradients reduced when `reduce_grads` (`set_requires_gradient_sync`).
//!
//! A replicated module's `unshard` is a local copy made at its own wait (`world_size == 1`), so
//! a prefetch of it does nothing and it issues no collective.

use super::{Reshard, Sharding, UnitSettings};
use serde::Serialize;

/// The pass a module boundary starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Pass {
    Forward,
    Backward,
}

/// One module boundary: `unit`'s compute of `pass` in micro-batch `micro_batch` (0-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    pub micro_batch: usize,
    pub pass: Pass,
    pub unit: usize,
    /// Whether the unit's own pre-hook issued its all-gather (nothing had prefetched it).
    pub own_gather: bool,
    /// The all-gathers issued at this pre-hook, in issue order (own first).
    pub issued: Vec<usize>,
    /// Whether the unit's parameters were made whole at this pre-hook (its copy-out: a gathered
    /// unit's waited all-gather, a replicated unit's local copy).
    pub copied_out: bool,
    /// Units whose unsharded parameters exist when this compute starts (in flight or done).
    pub unsharded: Vec<usize>,
    /// Backward only: whether the post-backward reduces the unit's gradients.
    pub reduces: bool,
}

/// The hooks' walk over a step of K micro-batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    pub boundaries: Vec<Boundary>,
}

impl Walk {
    /// The boundary of `unit`'s `pass` in micro-batch `m`.
    pub fn at(&self, m: usize, pass: Pass, unit: usize) -> &Boundary {
        let l = self.boundaries.len() / self.micro_batches() / 2;
        let k = match pass {
            Pass::Forward => unit,
            Pass::Backward => 2 * l - 1 - unit,
        };
        &self.boundaries[m * 2 * l + k]
    }

    fn micro_batches(&self) -> usize {
        self.boundaries.last().map_or(1, |b| b.micro_batch + 1)
    }

    /// The boundary of micro-batch `m` whose pre-hook issued `unit`'s all-gather for `pass`
    /// (the forward gather for the forward, the backward's for the backward), if any.
    pub fn issuer(&self, m: usize, pass: Pass, unit: usize) -> Option<&Boundary> {
        self.boundaries
            .iter()
            .filter(|b| b.micro_batch == m && b.pass == pass)
            .find(|b| b.issued.contains(&unit))
    }
}

/// Runs FSDP2's hooks over `micro_batches` micro-batches of `units`' settings.
pub fn walk(units: &[UnitSettings], micro_batches: usize) -> Walk {
    let l = units.len();
    let gathered = |u: usize| units[u].sharding != Sharding::Replicated;
    let mut unsharded = vec![false; l];
    let mut pending = vec![false; l];
    let mut boundaries = Vec::with_capacity(2 * l * micro_batches);
    for m in 0..micro_batches {
        let last = m + 1 == micro_batches;
        for pass in [Pass::Forward, Pass::Backward] {
            let order: Vec<usize> = match pass {
                Pass::Forward => (0..l).collect(),
                Pass::Backward => (0..l).rev().collect(),
            };
            for j in order {
                let mut issued = Vec::new();
                let own_gather = !unsharded[j] && gathered(j);
                let copied_out = pending[j] || !unsharded[j];
                if own_gather {
                    issued.push(j);
                }
                unsharded[j] = true;
                pending[j] = false;
                let list = match pass {
                    Pass::Forward => units[j].forward_prefetch.clone(),
                    Pass::Backward if units[j].backward_prefetch.is_empty() => {
                        j.checked_sub(1).into_iter().collect()
                    }
                    Pass::Backward => units[j].backward_prefetch.clone(),
                };
                for t in list {
                    if gathered(t) && !unsharded[t] {
                        unsharded[t] = true;
                        pending[t] = true;
                        issued.push(t);
                    }
                }
                let reduces = pass == Pass::Backward && (last || units[j].requires_gradient_sync);
                boundaries.push(Boundary {
                    micro_batch: m,
                    pass,
                    unit: j,
                    own_gather,
                    issued,
                    copied_out,
                    unsharded: (0..l).filter(|&v| unsharded[v]).collect(),
                    reduces,
                });
                unsharded[j] = match (pass, units[j].sharding) {
                    (Pass::Forward, Sharding::Replicated) => false,
                    (
                        Pass::Forward,
                        Sharding::Sharded {
                            reshard_after_forward,
                            ..
                        },
                    ) => reshard_after_forward == Reshard::Keep,
                    (Pass::Backward, _) => !(last || units[j].reshard_after_backward),
                };
            }
        }
    }
    Walk { boundaries }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fsdp() -> UnitSettings {
        UnitSettings::new(Sharding::Sharded {
            shard_group: None,
            reshard_after_forward: Reshard::Free,
        })
    }

    #[test]
    fn an_explicit_backward_list_switches_off_the_default_prefetch() {
        let mut units = vec![fsdp(), fsdp(), fsdp(), fsdp()];
        let w = walk(&units, 1);
        // Default: unit 3's pre-backward prefetches unit 2, unit 2's unit 1, unit 1's unit 0.
        assert_eq!(w.at(0, Pass::Backward, 3).issued, [3, 2]);
        assert_eq!(w.at(0, Pass::Backward, 2).issued, [1]);
        units[3].backward_prefetch = vec![1];
        let w = walk(&units, 1);
        assert_eq!(w.at(0, Pass::Backward, 3).issued, [3, 1]);
        let b2 = w.at(0, Pass::Backward, 2);
        assert!(b2.own_gather, "unit 2 is gathered at its own pre-backward");
        assert_eq!(b2.issued, [2]);
    }
}
