//! The JSONL training log: one line per step and per evaluation (the line types are
//! the dashboard protocol's `StepLog`), the allocator's counters turned into a line's
//! `mem`, and the observer that appends lines to the log file.
//!
//! May call: `memory`, `wgtrain_protocol`, `train::{error, observe}`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use wgtrain_protocol::{EvalLog, MemLog, StepLog};

use super::error::TrainError;
use super::observe::Observer;
use crate::memory::{Category, MemoryStats};

/// The memory figures of a log line from the allocator's counters.
pub fn mem_log(s: &MemoryStats) -> MemLog {
    MemLog {
        allocated: s.allocated.current,
        reserved: s.reserved.current,
        peak: s.allocated.peak,
        peak_reserved: s.reserved.peak,
        cap: s.cap,
        by_category: Category::ALL
            .iter()
            .map(|c| (c.name().to_string(), s.category(*c).allocated.current))
            .collect(),
        at_peak: Category::ALL.iter().map(|c| (c.name().to_string(), s.at_peak[c.index()])).collect(),
        fragmentation: s.fragmentation(),
        num_ooms: s.num_ooms,
        num_alloc_retries: s.num_alloc_retries,
    }
}

/// Appends each step's and evaluation's line to a JSONL file, flushed per line.
pub struct LogWriter {
    path: PathBuf,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl LogWriter {
    /// Opens `path` for appending (created if missing).
    pub fn open(path: &Path) -> Result<LogWriter, TrainError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| TrainError::Log {
                path: path.display().to_string(),
                source: e,
            })?;
        Ok(LogWriter {
            path: path.to_path_buf(),
            file: Mutex::new(std::io::BufWriter::new(file)),
        })
    }

    fn write(&self, line: &StepLog) -> Result<(), TrainError> {
        let text = serde_json::to_string(line).expect("log lines serialize");
        let mut w = self.file.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(w, "{text}").and_then(|_| w.flush()).map_err(|e| TrainError::Log {
            path: self.path.display().to_string(),
            source: e,
        })
    }
}

impl Observer for LogWriter {
    fn step(&self, line: &StepLog, _memory: Option<&wgtrain_protocol::StepMemory>) -> Result<(), TrainError> {
        self.write(line)
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        self.write(line)
    }
}
