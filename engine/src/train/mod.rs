//! Training: the configuration, the step loop with its per-step JSONL log, evaluation,
//! and checkpoints. The CLI's `wgtrain train` is a thin wrapper over [`Trainer`].

pub mod checkpoint;
pub mod config;
pub mod estimate;
pub mod hf_step;
pub mod observe;
pub mod trainer;

pub use config::Config;
pub use trainer::{RunOptions, RunSummary, StepLog, TrainError, Trainer};
