//! What the executor trains, as sizes: a [`Workload`] says how many units a model has, their
//! parameters and the buffers each unit's compute needs (so the layout and the profile count the
//! same bytes); [`crate::train::Train`] runs its compute on a backend.
//!
//! Buffer roles, and when each is alive (DESIGN §3; slot names of the timeline):
//!
//! Sizes are 4-byte words: a buffer holds parts of fp32 or bf16 elements ([`carve_parts`]), so
//! under the bf16 policy its bf16 activations take half the words (DESIGN §6.9).
//!
//! | buffer | holds | alive | profile field |
//! |---|---|---|---|
//! | `saved` | kept through recompute (the unit's output, data it was given) | F_i … B_i | `checkpoint_activation_bytes` = 4·saved |
//! | `internals` | what the forward saves for the backward besides `saved` | F_i … B_i without recompute | `activation_bytes` = 4·(saved + internals) |
//! | `recomputed` | the recomputation's copy of `saved` + `internals` | B_i with recompute | (the model's act_i at B_i) |
//! | `forward_workspace` | transient forward buffers | F_i | `forward_workspace_bytes` |
//! | `backward_workspace` | transient backward buffers | B_i | `backward_workspace_bytes`, with both gradients below |
//! | `input_gradient` | dL/d(input) handed to unit i−1 | B_i and B_{i−1} | counted in ws_b of units i and i−1 |

use crate::Result;
use crate::backend::{FloatFormat, Region, words};
use shardplan_scheduler::precision::Precision;

/// 4-byte words of one unit's activation and workspace buffers on one rank (an fp32 element
/// each, two bf16 ones: a workload lays its parts out with [`carve_parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitBuffers {
    pub saved: usize,
    pub internals: usize,
    pub forward_workspace: usize,
    pub backward_workspace: usize,
    pub input_gradient: usize,
}

/// A model the runtime can train, as sizes.
pub trait Workload: Sync {
    fn name(&self) -> &str;
    fn unit_count(&self) -> usize;
    /// The profile's unit name.
    fn unit_name(&self, unit: usize) -> String;
    /// Ψ_i: the unit's flat parameter count.
    fn params(&self, unit: usize) -> usize;
    /// The unit's buffers on a rank.
    fn buffers(&self, unit: usize) -> UnitBuffers;
    /// The unit's initial flat parameters (Ψ_i entries, the same on every rank).
    fn initial_params(&self, unit: usize) -> Result<Vec<f32>>;
    /// The earlier unit whose full parameters this unit's compute also reads and whose gradient
    /// it writes first (a tied output projection), if any.
    fn borrows_params_of(&self, _unit: usize) -> Option<usize> {
        None
    }
    /// K, the micro-batches of one optimizer step (DESIGN §3.10).
    fn micro_batches(&self) -> usize {
        1
    }
    /// The precision policy it trains under (DESIGN §6.9), which fixes its profile's bytes per
    /// parameter.
    fn precision(&self) -> Precision {
        Precision::FP32
    }
    /// The profile's `reads_params_of` of the unit: the name of the unit it borrows from.
    fn reads_params_of(&self, unit: usize) -> Option<String> {
        self.borrows_params_of(unit)
            .map(|lender| self.unit_name(lender))
    }
}

/// Whether a forward is the step's own or the recomputation before a checkpointed backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Recompute,
}

/// Consecutive sub-regions of `region` with the given lengths (what a unit's buffer holds, in
/// order); the lengths must fit.
pub fn carve<const K: usize>(region: Region, lens: [usize; K]) -> [Region; K] {
    let mut start = 0;
    let parts = lens.map(|len| {
        let r = region.sub(start, len);
        start += len;
        r
    });
    assert!(
        start <= region.len,
        "carving {start} elements out of a {}-element region",
        region.len
    );
    parts
}

/// One part of a unit's buffer: its elements and their format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub len: usize,
    pub format: FloatFormat,
}

impl Part {
    pub fn fp32(len: usize) -> Part {
        Part {
            len,
            format: FloatFormat::Fp32,
        }
    }

    /// The 4-byte words it takes.
    pub fn words(self) -> usize {
        words(self.format, self.len)
    }
}

/// The words a buffer of `parts` takes, each part starting on a word.
pub fn words_of(parts: &[Part]) -> usize {
    parts.iter().map(|p| p.words()).sum()
}

/// Consecutive parts of `region` (a buffer counted in words, fp32), each starting on a word and
/// holding its own format; they must fit.
pub fn carve_parts<const K: usize>(region: Region, parts: [Part; K]) -> [Region; K] {
    assert_eq!(
        region.format,
        FloatFormat::Fp32,
        "buffers of parts are counted in words"
    );
    let mut at = 0;
    let regions = parts.map(|part| {
        let r = Region {
            offset: region.offset + at,
            len: part.len,
            format: part.format,
        };
        at += part.words();
        r
    });
    assert!(
        at <= region.len,
        "carving {at} words out of a {}-word region",
        region.len
    );
    regions
}
