//! What a running trainer tells its observers: the run's facts at the start, each
//! step's log line (with the step's allocation timeline and pages, for observers that
//! want memory), each evaluation, and the end. The JSONL log writer (`log`), the
//! progress bar (`progress`) and the dashboard's recorder are observers. Observers run
//! on the training thread between steps and must return quickly; an error from one
//! (the log's disk is full) stops the run.
//!
//! May call: `wgtrain_record`, `train::error`. Called by: `train::run`, the dashboard.

pub mod log;
pub mod profile;
pub mod progress;

use wgtrain_record::{RunInfo, StepLog, StepMemory};

use crate::train::error::TrainError;

/// Receives a run's progress (see the module).
pub trait Observer: Send + Sync {
    /// The run starts.
    fn start(&self, _info: &RunInfo) -> Result<(), TrainError> {
        Ok(())
    }
    /// Whether [`Observer::step`] wants the step's memory timeline (building it costs
    /// a walk over the step's allocator events).
    fn wants_memory(&self) -> bool {
        false
    }
    /// A step finished: its log line, and its memory when some observer wants it.
    fn step(&self, line: &StepLog, memory: Option<&StepMemory>) -> Result<(), TrainError>;
    /// An evaluation finished (its log line).
    fn eval(&self, _line: &StepLog) -> Result<(), TrainError> {
        Ok(())
    }
    /// The run ended (normally, interrupted or with an error).
    fn finish(&self) {}
}
