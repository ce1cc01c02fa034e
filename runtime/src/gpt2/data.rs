//! Training data: a text file read as bytes (tokens 0–255 for byte-level models), cut into
//! sequences of `seq` input tokens whose targets are the `seq` tokens that follow (as llm.c and
//! nanoGPT batch). Sequence n starts at token (n mod W)·seq, W = ⌊(len − 1)/seq⌋ windows, so the
//! file is read in order and wraps around. Step k's global batch is sequences k·B … k·B + B − 1;
//! rank r of N takes the r-th share of B/N, so every world size trains on the same batch.

use crate::{Error, Result};
use std::path::Path;

/// Where the tokens come from.
#[derive(Debug, Clone)]
pub enum Tokens {
    /// A file's bytes.
    Text { bytes: Vec<u8>, origin: String },
    /// Deterministic pseudo-random tokens (for timing, when no data is given).
    Synthetic { seed: u64, vocab: usize },
}

impl Tokens {
    /// Reads a text file; it must hold at least one sequence and its targets (`seq + 1` bytes).
    pub fn load(path: &Path, seq: usize, vocab: usize) -> Result<Tokens> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Mismatch(format!("{origin}: cannot read the data file: {e}")))?;
        if bytes.len() < seq + 1 {
            return Err(Error::Mismatch(format!(
                "{origin}: {} bytes, but one sequence of {seq} tokens and its targets need {}",
                bytes.len(),
                seq + 1
            )));
        }
        if vocab < 256 {
            return Err(Error::Mismatch(format!(
                "{origin}: text is tokenized as bytes (vocab 256), but the model's vocab is {vocab}"
            )));
        }
        Ok(Tokens::Text { bytes, origin })
    }

    /// Writes sequence `n`'s inputs and targets (`seq` each, as f32 token ids).
    pub fn sequence(&self, n: usize, seq: usize, inputs: &mut [f32], targets: &mut [f32]) {
        match self {
            Tokens::Text { bytes, .. } => {
                let windows = (bytes.len() - 1) / seq;
                let start = (n % windows) * seq;
                for t in 0..seq {
                    inputs[t] = f32::from(bytes[start + t]);
                    targets[t] = f32::from(bytes[start + t + 1]);
                }
            }
            Tokens::Synthetic { seed, vocab } => {
                let token = |t: usize| {
                    let u = crate::mlp::uniform(*seed, n as u64, t as u64);
                    (((u + 1.0) / 2.0 * *vocab as f32) as usize).min(vocab - 1) as f32
                };
                for t in 0..seq {
                    inputs[t] = token(t);
                    targets[t] = token(t + 1);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// Rank `rank`'s share of step `step`'s global batch of `batch` sequences over `world` ranks.
    pub fn rank_batch(
        &self,
        step: usize,
        batch: usize,
        rank: usize,
        world: usize,
        seq: usize,
        inputs: &mut [f32],
        targets: &mut [f32],
    ) {
        let share = batch / world;
        for j in 0..share {
            let n = step * batch + rank * share + j;
            let (a, b) = (j * seq, (j + 1) * seq);
            self.sequence(n, seq, &mut inputs[a..b], &mut targets[a..b]);
        }
    }
}
