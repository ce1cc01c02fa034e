//! A rank's kept state outside the steps: initialised from the workload's parameters before the
//! first step, and the trained parameters gathered from the shards after the last.

use crate::Result;
use crate::backend::{Backend, Group, Region};
use crate::layout::{Layout, UnitLayout};
use crate::workload::Workload;

/// Initialises every rank's persistent state: full parameters for replicated units, this rank's
/// part of every block for sharded ones, in the fp32 master too where there is one (bf16
/// parameters hold them rounded); gradients and Adam state start at zero.
pub fn initialise<B: Backend>(backend: &B, workload: &dyn Workload, layout: &Layout) -> Result<()> {
    for (i, u) in layout.units.iter().enumerate() {
        let mut full = workload.initial_params(i)?;
        full.resize(u.blocks * u.block_elements, 0.0);
        for (j, (start, len)) in u.shard_of(backend.rank()).enumerate() {
            for kept in [Some(u.params), u.master].into_iter().flatten() {
                backend.upload(kept.part(j, u.blocks), &full[start..start + len])?;
            }
        }
    }
    Ok(())
}

/// The trained parameters of every unit (Ψ entries), gathered from the shards (collective: every
/// rank must call it): the fp32 master where there is one.
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
            if let Some(master) = u.master {
                let mut out = final_master(backend, u, master)?;
                out.truncate(workload.params(i));
                return Ok(out);
            }
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

/// A unit's full fp32 master: the first shard group's ranks place their shards in a vector of
/// zeros, which a host AllReduce over the world sums (each element from exactly one rank, so
/// the sum is that rank's value, exactly).
fn final_master<B: Backend>(backend: &B, u: &UnitLayout, master: Region) -> Result<Vec<f32>> {
    let rank = backend.rank();
    let mut full = vec![0.0; u.blocks * u.block_elements];
    if rank < u.shard_ranks {
        for (j, (start, len)) in u.shard_of(rank).enumerate() {
            backend.download(master.part(j, u.blocks), &mut full[start..start + len])?;
        }
    }
    backend.all_reduce_host(&mut full)?;
    Ok(full)
}
