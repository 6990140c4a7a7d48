//! Training. The loop and the run's state here, one job per file: `config` (the TOML
//! config, its typed settings and checks), `build` (data, precision, model, optimizer
//! rule, scaler), `model` (the `Trainable` trait every model implements), `trainer`
//! (the state), `step` (one optimizer step and out-of-memory recovery), `eval`, `plan`
//! (the estimate and the fit to a budget: depends on `build` and `step`, never on
//! `run`), `open` (a trainer from a config or a caller's model and data), `run` (the
//! loop), `error`. Three subsystems beside it: `checkpoint` (what a checkpoint holds,
//! its folder's rules, saving and resuming), `parallel` (one step over several devices:
//! data parallel, ZeRO 1-3, offload, gradient buckets), `observe` (the JSONL log, the
//! progress bar, the profiler, and the observer the dashboard records through).
//!
//! May call: everything below it in the engine, and `wgtrain_record` (the log and
//! memory records the dashboard reads). Called by: the CLI, the dashboard, tests.

pub mod build;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod eval;
pub mod generate;
pub mod model;
pub mod observe;
pub mod open;
pub mod parallel;
pub mod phase_estimate;
pub mod plan;
pub mod run;
pub mod step;
pub mod trainer;
pub mod world;

pub use config::Config;
pub use error::TrainError;
pub use model::{BuildModel, Decoder, EvalBatch, Trainable};
pub use observe::Observer;
pub use observe::log::{EvalLog, MemLog, StepLog};
pub use run::{RunOptions, RunSummary};
pub use trainer::Trainer;
