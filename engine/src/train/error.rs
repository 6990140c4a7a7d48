//! Why a run stopped with an error: the engine's [`Error`] (ops, files, device, memory)
//! and what only training has (configuration, data, checkpoints, the log, the loss).
//!
//! May call: `error`, `data`, `train::config`. Called by: the train layer. The
//! checkpoint format's error lives here so that `train::checkpoint` depends on this file,
//! not the other way.

use crate::data::DataError;
use crate::error::Error;
use crate::train::config::ConfigError;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Data.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Ops, files, the device or memory.
    #[error(transparent)]
    Engine(#[from] Error),
    /// Checkpoints.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The log file.
    #[error("writing the log {path}: {source}")]
    Log {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// fp16-mixed asked for on an adapter without f16 shaders.
    #[error(
        "memory.precision = \"fp16-mixed\" needs SHADER_F16, which the adapter '{0}' lacks; use memory.precision = \"fp32\", or set memory.fp32_fallback = true to train in fp32 on such adapters"
    )]
    NoF16(String),
    /// Out of memory even at a micro-batch of one.
    #[error("out of memory at a micro-batch of 1 example: {0}\nlower the model size or raise memory.cap / memory.budget")]
    OutOfMemory(String),
    /// The loss stopped being a number.
    #[error("the loss became {0} at step {1}; lower train.lr or enable train.grad_clip")]
    NonFinite(f32, u64),
}

impl TrainError {
    /// Whether this is the allocator running out of memory (what a retry can mend).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, TrainError::Engine(e) if e.is_out_of_memory())
    }
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read or written.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not match its manifest, or is not what it should be.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint folder cannot be used (a file, unwritable, held by another run,
    /// or holding another run's checkpoints).
    #[error("checkpoint.dir {path} cannot be used: {reason}")]
    Unusable {
        /// The folder.
        path: String,
        /// Why.
        reason: String,
    },
    /// Another process of a save over MPI failed (its own error is on its stderr).
    #[error("checkpoint save failed on rank {rank}: {reason}")]
    Rank {
        /// The rank that failed.
        rank: usize,
        /// Its error.
        reason: String,
    },
    /// The checkpoint does not fit this model.
    #[error("checkpoint {path} does not fit this run: {reason}")]
    Mismatch {
        /// The file.
        path: String,
        /// What differs.
        reason: String,
    },
}
