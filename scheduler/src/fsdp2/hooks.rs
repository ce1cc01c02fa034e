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

/// One module boundary: FSDP group `unit`'s pre-hook of `pass` in micro-batch `micro_batch`
/// (0-based), run just before the compute of unit `computes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    pub micro_batch: usize,
    pub pass: Pass,
    /// The unit (FSDP group) whose pre-hook this is.
    pub unit: usize,
    /// The unit whose compute starts after the pre-hook: `unit` itself, but for a tied lender's
    /// pre-backward its borrower's (FSDP2 runs it on the gradient of the borrower's output).
    pub computes: usize,
    /// Whether the unit's own pre-hook issued its all-gather (nothing had prefetched it).
    pub own_gather: bool,
    /// The all-gathers issued at this pre-hook, in issue order (own first).
    pub issued: Vec<usize>,
    /// Whether the unit's parameters were made whole at this pre-hook (its copy-out: a gathered
    /// unit's waited all-gather, a replicated unit's local copy).
    pub copied_out: bool,
    /// Units whose unsharded parameters exist when this compute starts (in flight or done).
    pub unsharded: Vec<usize>,
    /// Backward only: whether the unit's post-backward reduces its gradients.
    pub reduces: bool,
    /// Units whose unsharded parameters are freed after this pre-hook and before the next
    /// boundary's (post-forward and post-backward reshards), in order.
    pub resharded: Vec<usize>,
    /// Units whose gradients are reduced after this pre-hook and before the next boundary's, in
    /// order.
    pub reduced: Vec<usize>,
}

/// The hooks' walk over a step of K micro-batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    pub boundaries: Vec<Boundary>,
}

impl Walk {
    /// The boundary of `unit`'s pre-hook of `pass` in micro-batch `m`.
    pub fn at(&self, m: usize, pass: Pass, unit: usize) -> Option<&Boundary> {
        self.boundaries
            .iter()
            .find(|b| b.micro_batch == m && b.pass == pass && b.unit == unit)
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

/// Unit `u` followed by the units that lend it their parameters (`borrowers[i] == Some(u)`),
/// theirs after them: one FSDP2 group holds a lender with its borrower's module, so the group's
/// forward ends where the borrower's does, and its pre-backward runs first on the gradient of the
/// borrower's output.
fn with_lenders(u: usize, borrowers: &[Option<usize>]) -> Vec<usize> {
    let mut group = vec![u];
    for i in (0..borrowers.len()).filter(|&i| borrowers[i] == Some(u)) {
        group.extend(with_lenders(i, borrowers));
    }
    group
}

/// The state of every group as the hooks run, and the boundaries they have passed.
struct Hooks<'a> {
    units: &'a [UnitSettings],
    unsharded: Vec<bool>,
    pending: Vec<bool>,
    boundaries: Vec<Boundary>,
}

impl Hooks<'_> {
    fn gathered(&self, u: usize) -> bool {
        self.units[u].sharding != Sharding::Replicated
    }

    /// Unit `j`'s pre-hook before `computes`' compute: its own unshard and wait, then `list`.
    fn pre_hook(&mut self, m: usize, pass: Pass, j: usize, computes: usize, list: &[usize]) {
        let mut issued = Vec::new();
        let own_gather = !self.unsharded[j] && self.gathered(j);
        let copied_out = self.pending[j] || !self.unsharded[j];
        if own_gather {
            issued.push(j);
        }
        self.unsharded[j] = true;
        self.pending[j] = false;
        for &t in list {
            if self.gathered(t) && !self.unsharded[t] {
                self.unsharded[t] = true;
                self.pending[t] = true;
                issued.push(t);
            }
        }
        self.boundaries.push(Boundary {
            micro_batch: m,
            pass,
            unit: j,
            computes,
            own_gather,
            issued,
            copied_out,
            unsharded: (0..self.units.len())
                .filter(|&v| self.unsharded[v])
                .collect(),
            reduces: false,
            resharded: Vec::new(),
            reduced: Vec::new(),
        });
    }

    /// Frees unit `u`'s unsharded parameters unless `keep`, noted at the latest boundary.
    fn reshard(&mut self, u: usize, keep: bool) {
        if self.unsharded[u] && !keep {
            self.unsharded[u] = false;
            if let Some(b) = self.boundaries.last_mut() {
                b.resharded.push(u);
            }
        }
    }

    /// Unit `u`'s post-forward: freed unless sharded with `reshard_after_forward` false.
    fn post_forward(&mut self, u: usize) {
        let keep = match self.units[u].sharding {
            Sharding::Replicated => false,
            Sharding::Sharded {
                reshard_after_forward,
                ..
            } => reshard_after_forward == Reshard::Keep,
        };
        self.reshard(u, keep);
    }

    /// Unit `u`'s post-backward in a micro-batch that is the step's `last` or not.
    fn post_backward(&mut self, u: usize, last: bool) {
        self.reshard(u, !(last || self.units[u].reshard_after_backward));
        let reduces = last || self.units[u].requires_gradient_sync;
        if let Some(b) = self.boundaries.last_mut().filter(|_| reduces) {
            b.reduced.push(u);
        }
    }
}

/// Runs FSDP2's hooks over `micro_batches` micro-batches of `units`' settings; `borrowers[i]` is
/// the unit that reads unit i's parameters (a tied head, DESIGN §3.9): one FSDP2 group holds
/// both modules, so the lender stays unsharded until the borrower's forward ends, its
/// pre-backward runs just before the borrower's, and its post-forward follows the borrower's.
pub fn walk(units: &[UnitSettings], micro_batches: usize, borrowers: &[Option<usize>]) -> Walk {
    let l = units.len();
    // FSDP2's post-forward order (`comm_ctx.post_forward_order`), each lender after its borrower.
    let groups: Vec<Vec<usize>> = (0..l)
        .filter(|&u| borrowers[u].is_none())
        .map(|u| with_lenders(u, borrowers))
        .collect();
    let order: Vec<usize> = groups.concat();
    // `_backward_prefetch`: the unit before it in post-forward order.
    let default_prefetch = |u: usize| -> Vec<usize> {
        let k = order.iter().position(|&v| v == u);
        k.and_then(|k| k.checked_sub(1))
            .map(|k| order[k])
            .into_iter()
            .collect()
    };
    let mut hooks = Hooks {
        units,
        unsharded: vec![false; l],
        pending: vec![false; l],
        boundaries: Vec::with_capacity(2 * l * micro_batches),
    };
    for m in 0..micro_batches {
        let last = m + 1 == micro_batches;
        for (j, unit) in units.iter().enumerate() {
            hooks.pre_hook(m, Pass::Forward, j, j, &unit.forward_prefetch);
            if let Some(group) = groups.iter().find(|g| g[0] == j) {
                for &u in group {
                    hooks.post_forward(u);
                }
            }
        }
        for j in (0..l).rev() {
            if let Some(group) = groups.iter().find(|g| g[0] == j) {
                for &u in group.iter().rev() {
                    let list = match &units[u].backward_prefetch {
                        explicit if !explicit.is_empty() => explicit.clone(),
                        _ => default_prefetch(u),
                    };
                    hooks.pre_hook(m, Pass::Backward, u, j, &list);
                    if let Some(b) = hooks.boundaries.last_mut() {
                        b.reduces = last || units[u].requires_gradient_sync;
                    }
                }
            }
            // A lender's post-backward follows its own compute (its first module's, or the
            // step's final callback), with the boundary before it.
            hooks.post_backward(j, last);
        }
    }
    Walk {
        boundaries: hooks.boundaries,
    }
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
        let w = walk(&units, 1, &[None; 4]);
        let at = |w: &Walk, unit| w.at(0, Pass::Backward, unit).unwrap().clone();
        // Default: unit 3's pre-backward prefetches unit 2, unit 2's unit 1, unit 1's unit 0.
        assert_eq!(at(&w, 3).issued, [3, 2]);
        assert_eq!(at(&w, 2).issued, [1]);
        units[3].backward_prefetch = vec![1];
        let w = walk(&units, 1, &[None; 4]);
        assert_eq!(at(&w, 3).issued, [3, 1]);
        let b2 = at(&w, 2);
        assert!(b2.own_gather, "unit 2 is gathered at its own pre-backward");
        assert_eq!(b2.issued, [2]);
    }
}
