//! Training data: a text file read as bytes (tokens 0–255 for byte-level models), or a token file
//! as nanoGPT and llm.c write it ([`TokenFile`], memory-mapped), cut into sequences of `seq` input
//! tokens whose targets are the `seq` tokens that follow (as llm.c and nanoGPT batch). Sequence n
//! starts at token (n mod W)·seq, W = ⌊(len − 1)/seq⌋ windows, so the file is read in order and
//! wraps around. Step k's global batch is sequences k·B … k·B + B − 1; rank r of N takes the r-th
//! share of B/N, so every world size trains on the same batch.

use super::token_file::TokenFile;
use crate::{Error, Result};
use std::io::Read;
use std::path::Path;

/// Where the tokens come from.
#[derive(Debug)]
pub enum Tokens {
    /// A file's bytes.
    Text { bytes: Vec<u8>, origin: String },
    /// A file of token ids (llm.c's or nanoGPT's), memory-mapped.
    File(TokenFile),
    /// Deterministic pseudo-random tokens (for timing, when no data is given).
    Synthetic { seed: u64, vocab: usize },
}

impl Tokens {
    /// Reads a data file: a token file ([`TokenFile::is_token_file`]: llm.c's header, or a
    /// `.bin` name) is mapped and its tokens checked against `vocab`; anything else is text, read
    /// as bytes. It must hold at least one sequence and its targets (`seq + 1` tokens).
    pub fn load(path: &Path, seq: usize, vocab: usize) -> Result<Tokens> {
        let origin = path.display().to_string();
        let unreadable = |e: std::io::Error| {
            Error::Mismatch(format!("{origin}: cannot read the data file: {e}"))
        };
        let mut first = Vec::with_capacity(4);
        std::fs::File::open(path)
            .and_then(|f| f.take(4).read_to_end(&mut first))
            .map_err(unreadable)?;
        if TokenFile::is_token_file(path, &first) {
            return TokenFile::open(path, seq, vocab).map(Tokens::File);
        }
        let bytes = std::fs::read(path).map_err(unreadable)?;
        if bytes.len() < seq + 1 {
            return Err(Error::Mismatch(format!(
                "{origin}: {} bytes, but one sequence of {seq} tokens and its targets need {}",
                bytes.len(),
                seq + 1
            )));
        }
        if vocab < 256 {
            return Err(Error::Mismatch(format!(
                "{origin}: text is tokenized as bytes (vocab 256), but the model's vocab is {vocab}; give a token file (.bin, nanoGPT's uint16 or llm.c's)"
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
            Tokens::File(file) => {
                let windows = (file.count() - 1) / seq;
                let start = (n % windows) * seq;
                for t in 0..seq {
                    inputs[t] = file.token(start + t) as f32;
                    targets[t] = file.token(start + t + 1) as f32;
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
