//! What a running trainer tells its observers: the run's facts at the start, each
//! step's log line (with the step's allocation timeline and pages, for observers that
//! want memory), each evaluation, and the end. The JSONL log writer (`log`), the
//! progress bar (`progress`), TensorBoard's event files (`tensorboard`) and the
//! dashboard's recorder are observers; [`Observers`] tells several as one. Observers run
//! on the training thread between steps and must return quickly; an error from one
//! (the log's disk is full) stops the run.
//!
//! May call: `wgtrain_record`, `train::error`. Called by: `train::run`, the dashboard.

pub mod log;
pub mod profile;
pub mod progress;
pub mod tensorboard;

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

/// Several observers as one, told in order (the first error stops the rest).
pub struct Observers(pub Vec<std::sync::Arc<dyn Observer>>);

impl Observer for Observers {
    fn start(&self, info: &RunInfo) -> Result<(), TrainError> {
        self.0.iter().try_for_each(|o| o.start(info))
    }

    fn wants_memory(&self) -> bool {
        self.0.iter().any(|o| o.wants_memory())
    }

    fn step(&self, line: &StepLog, memory: Option<&StepMemory>) -> Result<(), TrainError> {
        self.0.iter().try_for_each(|o| o.step(line, memory))
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        self.0.iter().try_for_each(|o| o.eval(line))
    }

    fn finish(&self) {
        self.0.iter().for_each(|o| o.finish());
    }
}
