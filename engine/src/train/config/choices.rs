//! The settings that take one of a few names, as enums: how each is written, and the
//! names a message lists when a config gives another.
//!
//! May call: nothing of the engine.

use serde::{Deserialize, Serialize};

/// A setting that takes one of a few names: the names it takes, for messages.
pub trait Choice: Serialize + Sized + 'static {
    /// Every value.
    const ALL: &'static [Self];
    /// How it is written in a config.
    fn name(&self) -> String {
        match toml::Value::try_from(self) {
            Ok(toml::Value::String(s)) => s,
            other => format!("{other:?}"),
        }
    }
    /// "a", "b" or "c".
    fn choices() -> String {
        let names: Vec<String> = Self::ALL.iter().map(|c| format!("\"{}\"", c.name())).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

/// Display as written in a config, for each named setting.
macro_rules! display_as_written {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.name())
            }
        }
    )*};
}

display_as_written!(DataKind, TokenDtype, OptimizerKind, Schedule, Offload, Precision);

/// `data.kind`: what the examples are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// Fashion-MNIST's IDX files (images and labels).
    #[default]
    FashionMnist,
    /// Character-level text: the vocabulary is the text's characters.
    Chars,
    /// The text's lines, each an example of its own length (characters): batches are
    /// padded to their longest and group similar lengths.
    Lines,
    /// nanoGPT's token files: a folder with train.bin and val.bin.
    Tokens,
    /// Images made from the seed (`data.image`, `data.classes`): for benchmarks.
    SyntheticImages,
}

impl Choice for DataKind {
    const ALL: &'static [Self] = &[
        DataKind::FashionMnist,
        DataKind::Chars,
        DataKind::Lines,
        DataKind::Tokens,
        DataKind::SyntheticImages,
    ];
}

/// `data.token_dtype`: the id type of token files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// nanoGPT's, vocabularies up to 65,536.
    #[default]
    U16,
    /// Larger vocabularies (Llama 3's 128,256).
    U32,
}

impl Choice for TokenDtype {
    const ALL: &'static [Self] = &[TokenDtype::U16, TokenDtype::U32];
}

impl TokenDtype {
    /// Bytes per id.
    pub fn bytes(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }
}

/// `train.optimizer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// AdamW (decoupled weight decay).
    #[default]
    Adamw,
    /// SGD with momentum (L2 weight decay).
    Sgd,
    /// AdamW with both moments in 8 bits, blockwise (bitsandbytes' 8-bit Adam).
    Adamw8bit,
}

impl Choice for OptimizerKind {
    const ALL: &'static [Self] = &[OptimizerKind::Adamw, OptimizerKind::Sgd, OptimizerKind::Adamw8bit];
}

/// `train.schedule`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The peak rate after warmup.
    #[default]
    Constant,
    /// Cosine decay to `min_lr` after warmup.
    Cosine,
}

impl Choice for Schedule {
    const ALL: &'static [Self] = &[Schedule::Cosine, Schedule::Constant];
}

/// `parallel.backend`: how the ranks of a run talk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    /// Every device in this process (`parallel.devices`), exchanging through host memory.
    #[default]
    #[serde(rename = "in-process")]
    InProcess,
    /// One rank per process under mpirun or srun, over MPI.
    #[serde(rename = "mpi")]
    Mpi,
}

impl Choice for Backend {
    const ALL: &'static [Self] = &[Backend::InProcess, Backend::Mpi];
}

/// `parallel.offload`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Offload {
    /// Everything on the devices.
    #[default]
    #[serde(rename = "none")]
    None,
    /// Optimizer state and the update in host memory (ZeRO-Offload; zero >= 1).
    #[serde(rename = "optimizer")]
    Optimizer,
    /// The weights' shards too (zero = 3).
    #[serde(rename = "optimizer+parameters")]
    OptimizerParameters,
}

impl Choice for Offload {
    const ALL: &'static [Self] = &[Offload::None, Offload::Optimizer, Offload::OptimizerParameters];
}

impl Offload {
    /// How much lives on the host: 0 none, 1 optimizer, 2 and parameters.
    pub fn level(self) -> u8 {
        self as u8
    }
}

/// `memory.checkpoint`: which of the model's segments are recomputed in backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Checkpointing {
    /// Keep every activation.
    None,
    /// Recompute every k-th segment ("every-layer" is 1, "every-k:N" is N).
    Every(usize),
    /// Left to the estimate: the least recomputation that fits the budget.
    Auto,
}

impl Checkpointing {
    /// Every how many segments one is recomputed (0: none; "auto" reads as 0 until the
    /// trainer resolves it).
    pub fn every(self) -> usize {
        match self {
            Checkpointing::Every(k) => k,
            _ => 0,
        }
    }

    /// The policy of recomputing every `k`-th segment (0: none).
    pub fn every_k(k: usize) -> Checkpointing {
        if k == 0 { Checkpointing::None } else { Checkpointing::Every(k) }
    }
}

impl TryFrom<String> for Checkpointing {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Ok(match text.trim() {
            "none" => Checkpointing::None,
            "every-layer" => Checkpointing::Every(1),
            "auto" => Checkpointing::Auto,
            other => match other.strip_prefix("every-k:").map(|n| n.parse::<usize>()) {
                Some(Ok(n)) if n > 0 => Checkpointing::Every(n),
                _ => {
                    return Err(format!(
                        "memory.checkpoint must be \"none\", \"every-layer\", \"every-k:N\" (N >= 1) or \"auto\", got \"{other}\""
                    ));
                }
            },
        })
    }
}

impl From<Checkpointing> for String {
    fn from(c: Checkpointing) -> String {
        match c {
            Checkpointing::None => "none".into(),
            Checkpointing::Every(1) => "every-layer".into(),
            Checkpointing::Every(k) => format!("every-k:{k}"),
            Checkpointing::Auto => "auto".into(),
        }
    }
}

impl std::fmt::Display for Checkpointing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from(*self))
    }
}

/// Numeric precision of training (`memory.precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// Everything f32.
    #[default]
    #[serde(rename = "fp32")]
    Fp32,
    /// f32 master weights and loss scaling; matmuls on f16 inputs.
    #[serde(rename = "fp16-mixed")]
    Fp16Mixed,
}

impl Choice for Precision {
    const ALL: &'static [Self] = &[Precision::Fp32, Precision::Fp16Mixed];
}

impl Precision {
    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16Mixed => "fp16-mixed",
        }
    }
}
