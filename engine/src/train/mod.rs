//! Training, one job per file: `config` (the TOML config and its checks), `build` (data,
//! precision, model, optimizer rule, scaler), `model` (the `Trainable` trait the MLP and
//! the GPT implement), `trainer` (the state), `step` (one optimizer step and
//! out-of-memory recovery), `eval`, `state`, `checkpoint` and `checkpoint_dir` (what a
//! checkpoint holds, its files, and the folder's rules), `plan` (the estimate and the fit to a budget: depends on `build` and
//! `step`, never on `run`), `open` (a trainer from a config, on a runtime of its own or
//! one handed in), `parallel` (one step over several devices: data parallel, ZeRO 1-3) and `reducer` (its gradient buckets), `world` (the devices beyond the first), `zero3` (parameters sharded between steps), `shard_state` (its state whole for checkpoints), `run` (the loop), `profile` (the step's kernels timed, `wgtrain profile`), `observe` (its observers: `log` the JSONL writer,
//! `progress` the bar, and the dashboard's recorder), and `error`.
//!
//! May call: everything below it in the engine, and `wgtrain_record` (the log and
//! memory records the dashboard reads). Called by: the CLI, the dashboard, tests.

pub mod build;
pub mod checkpoint;
pub mod checkpoint_dir;
pub mod config;
pub mod error;
pub mod eval;
pub mod log;
pub mod model;
pub mod observe;
pub mod open;
pub mod parallel;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod reducer;
pub mod run;
pub mod shard_state;
pub mod state;
pub mod step;
pub mod trainer;
pub mod world;
pub mod zero3;

pub use config::Config;
pub use error::TrainError;
pub use log::{EvalLog, MemLog, StepLog};
pub use model::{BuildModel, EvalBatch, Trainable};
pub use observe::Observer;
pub use run::{RunOptions, RunSummary};
pub use trainer::Trainer;
