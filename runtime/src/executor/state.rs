//! A rank's kept state outside the steps: initialised from the workload's parameters before the
//! first step, and the trained parameters gathered from the shards after the last.

use crate::Result;
use crate::backend::{Backend, Group};
use crate::layout::Layout;
use crate::workload::Workload;

/// Initialises every rank's persistent state: full parameters for replicated units, this rank's
/// part of every block for sharded ones (gradients and Adam state start at zero).
pub fn initialise<B: Backend>(backend: &B, workload: &dyn Workload, layout: &Layout) -> Result<()> {
    for (i, u) in layout.units.iter().enumerate() {
        let mut full = workload.initial_params(i)?;
        full.resize(u.blocks * u.block_elements, 0.0);
        for (j, (start, len)) in u.shard_of(backend.rank()).enumerate() {
            backend.upload(u.params.part(j, u.blocks), &full[start..start + len])?;
        }
    }
    Ok(())
}

/// The trained parameters of every unit (Ψ entries), gathered from the shards (collective: every
/// rank must call it).
pub fn final_params<B: Backend>(
    backend: &B,
    workload: &dyn Workload,
    layout: &Layout,
) -> Result<Vec<Vec<f32>>> {
    layout
        .units
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let full = match u.gathered_forward {
                None => u.params,
                Some(gathered) => {
                    // Among the unit's shard group: every replica holds the same state.
                    let group = Group::Consecutive(u.shard_ranks);
                    for j in 0..u.blocks {
                        let (shard, full) =
                            (u.params.part(j, u.blocks), gathered.part(j, u.blocks));
                        backend.all_gather(group, shard, full)?;
                    }
                    gathered
                }
            };
            let mut out = vec![0.0; full.len];
            backend.download(full, &mut out)?;
            out.truncate(workload.params(i));
            Ok(out)
        })
        .collect()
}
