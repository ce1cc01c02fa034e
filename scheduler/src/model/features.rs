//! The features by which the dense decoder families differ in parameters, FLOPs or memory
//! (DESIGN §7.1): which projections carry biases, q/k norms, extra norms per block, a head size
//! of its own, sliding-window layers and logit soft-capping. Each defaults to the GPT/Llama
//! block, so a zoo file that leaves them out means what it always meant.

use serde::{Deserialize, Serialize};

/// Which linear layers of a block carry biases. Written as `bias = true` (every one) or
/// `false` (none) in a zoo file, or as a table `{ qkv = true, output = false, mlp = false }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "BiasesFile", into = "BiasesFile")]
pub struct Biases {
    /// The query, key and value projections (Qwen2 alone has these).
    pub qkv: bool,
    /// The attention's output projection.
    pub output: bool,
    /// The MLP's projections.
    pub mlp: bool,
}

impl Biases {
    pub const NONE: Biases = Biases {
        qkv: false,
        output: false,
        mlp: false,
    };
    pub const ALL: Biases = Biases {
        qkv: true,
        output: true,
        mlp: true,
    };

    /// Bias parameters of one block with query width `q`, key/value width `kv`, hidden `h`, and
    /// `up` outputs of the MLP's up projections (`ffn`, or 2·ffn for a gated MLP's two).
    pub fn params(self, q: u64, kv: u64, h: u64, up: u64) -> u64 {
        let qkv = if self.qkv { q + 2 * kv } else { 0 };
        let output = if self.output { h } else { 0 };
        let mlp = if self.mlp { up + h } else { 0 };
        qkv + output + mlp
    }
}

/// A zoo file's `bias`: a flag for every linear layer, or which ones.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum BiasesFile {
    Every(bool),
    Some {
        #[serde(default)]
        qkv: bool,
        #[serde(default)]
        output: bool,
        #[serde(default)]
        mlp: bool,
    },
}

impl From<BiasesFile> for Biases {
    fn from(file: BiasesFile) -> Self {
        match file {
            BiasesFile::Every(true) => Biases::ALL,
            BiasesFile::Every(false) => Biases::NONE,
            BiasesFile::Some { qkv, output, mlp } => Biases { qkv, output, mlp },
        }
    }
}

impl From<Biases> for BiasesFile {
    fn from(b: Biases) -> Self {
        match b {
            Biases::ALL => BiasesFile::Every(true),
            Biases::NONE => BiasesFile::Every(false),
            Biases { qkv, output, mlp } => BiasesFile::Some { qkv, output, mlp },
        }
    }
}

/// Norms on the queries and keys after their projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// One norm of head_dim shared by every head (Qwen3, Gemma-3): 2·head_dim scales.
    PerHead,
    /// A norm over the whole projection (OLMo-2): (heads + kv_heads)·head_dim scales.
    PerProjection,
}

/// Sliding-window attention: the blocks whose queries see only the last `tokens` keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindow {
    /// Keys a query attends to (itself included).
    pub tokens: u64,
    /// The windowed blocks, numbered 1..L as the units are.
    pub layers: Vec<u64>,
}

impl SlidingWindow {
    /// Whether block `layer` (1..L) attends through the window.
    pub fn covers(&self, layer: u64) -> bool {
        self.layers.binary_search(&layer).is_ok()
    }
}

pub(crate) fn two_norms() -> u64 {
    2
}

pub(crate) fn is_two_norms(n: &u64) -> bool {
    *n == 2
}
