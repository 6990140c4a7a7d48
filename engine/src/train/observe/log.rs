//! The JSONL training log: one line per step and per evaluation (the line types are
//! the dashboard protocol's `StepLog`), the allocator's counters turned into a line's
//! `mem`, and the observer that appends lines to the log file.
//!
//! May call: `memory`, `wgtrain_record`, `train::{error, observe}`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use wgtrain_record::{EvalLog, MemLog, StepLog};

use crate::memory::{Category, MemoryStats};
use crate::train::error::TrainError;
use crate::train::observe::Observer;

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
        devices: Vec::new(),
        host: Default::default(),
        rank: None,
        node: None,
        device_budget: None,
        device_usage: None,
    }
}

/// A log line's `mem` for a run over `devices` (rank order): the first device's figures,
/// and each device's in `devices` when there is more than one.
pub fn mem_log_devices(devices: &[MemoryStats]) -> MemLog {
    let mut mem = mem_log(&devices[0]);
    if devices.len() > 1 {
        mem.devices = devices.iter().map(mem_log).collect();
    }
    mem
}

/// Appends each step's and evaluation's line to a JSONL file, written whole per line:
/// a write that fails (a full disk) is undone, so the file never ends in half a line.
pub struct LogWriter {
    path: PathBuf,
    file: Mutex<(std::fs::File, u64)>,
}

impl LogWriter {
    /// Opens `path` for appending (created, with its folders, if missing).
    pub fn open(path: &Path) -> Result<LogWriter, TrainError> {
        let err = |e| TrainError::Log {
            path: path.display().to_string(),
            source: e,
        };
        // Folders the log's path names that do not exist yet are made, as TensorBoard's
        // writer makes its log dir.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        Ok(LogWriter {
            path: path.to_path_buf(),
            file: Mutex::new((file, len)),
        })
    }

    fn write(&self, line: &StepLog) -> Result<(), TrainError> {
        let mut text = serde_json::to_string(line).expect("log lines serialize");
        text.push('\n');
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let (file, len) = &mut *guard;
        match file.write_all(text.as_bytes()).and_then(|_| file.flush()) {
            Ok(()) => {
                *len += text.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Undo what part of the line got out, so appending later stays valid.
                let _ = file.set_len(*len);
                Err(TrainError::Log {
                    path: self.path.display().to_string(),
                    source: e,
                })
            }
        }
    }
}

/// The most bytes one log line may hold: a step's line with its kernel table is a few
/// KiB; a longer line is not a wgtrain log's.
pub const MAX_LINE: usize = 1 << 20;

/// Reads the log at `path` line by line (a line at most [`MAX_LINE`] bytes): the count
/// of lines, and its first step line's step, time and loss, if any.
pub fn scan_log(path: &Path) -> std::io::Result<(usize, Option<(u64, f64, f64)>)> {
    use std::io::{BufRead, Read};
    crate::files::regular_size(path, u64::MAX)?;
    let mut reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let (mut lines, mut found) = (0, None);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = std::io::Read::by_ref(&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if n > MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {} is longer than {MAX_LINE} bytes: not a wgtrain log", lines + 1),
            ));
        }
        lines += 1;
        if found.is_none()
            && let Ok(l) = serde_json::from_slice::<StepLog>(&line)
            && l.eval.is_none()
            && let (Some(loss), Some(time)) = (l.loss, l.time)
        {
            found = Some((l.step, time, loss));
        }
    }
    Ok((lines, found))
}

/// Makes an existing log safe to append to: drops a partial last line (a write cut
/// short by a kill) and, when resuming from `resume_step`, every line of a later step
/// (written after that checkpoint and about to be written again), so no step appears
/// twice. The file is rewritten atomically; returns the number of lines dropped.
pub fn repair_log(path: &Path, resume_step: Option<u64>) -> Result<usize, TrainError> {
    let err = |e| TrainError::Log {
        path: path.display().to_string(),
        source: e,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(err(e)),
    };
    let mut kept = String::with_capacity(text.len());
    let mut dropped = 0;
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let Some(end) = rest.find('\n') else {
            dropped += 1; // a partial last line
            break;
        };
        let line = &rest[..=end];
        rest = &rest[end + 1..];
        let later = resume_step.is_some_and(|s| serde_json::from_str::<StepLog>(line).is_ok_and(|l| l.step > s));
        if later {
            dropped += 1;
        } else {
            kept.push_str(line);
        }
    }
    if dropped > 0 {
        crate::files::write_atomically(path, kept.as_bytes()).map_err(err)?;
    }
    Ok(dropped)
}

impl Observer for LogWriter {
    fn step(&self, line: &StepLog, _memory: Option<&wgtrain_record::StepMemory>) -> Result<(), TrainError> {
        self.write(line)
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        self.write(line)
    }
}
