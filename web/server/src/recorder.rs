//! The run recorder: an [`Observer`] that keeps what the dashboard shows (log lines,
//! the latest pages, the allocation timelines of a bounded set of steps) and fans each
//! step out to live clients through a bounded broadcast queue. It never waits on a
//! client: a client that falls behind loses frames, and those are counted.
//!
//! At the run's end the record is written beside the log (`NAME.memory.json`, whole or
//! not at all) so `wgtrain dashboard --runs DIR` shows the same views later.
//!
//! May call: `wgtrain_engine::{files, train}`, `wgtrain_protocol`. Called by: `server`, the CLI.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use wgtrain_engine::files::write_atomically;
use wgtrain_engine::train::{Observer, TrainError};
use wgtrain_protocol::{Frame, RunInfo, RunRecord, StepLog, StepMemory};

/// Timelines kept from the start of a run.
pub const KEEP_FIRST: usize = 3;
/// Timelines kept from the end of a run.
pub const KEEP_LAST: usize = 20;
/// Frames a live client may fall behind before it loses some.
pub const QUEUE: usize = 256;

fn keep_timeline(record: &mut RunRecord, memory: StepMemory) {
    record.timelines.insert(memory.step, memory);
    while record.timelines.len() > KEEP_FIRST + KEEP_LAST {
        let drop = *record.timelines.keys().nth(KEEP_FIRST).expect("more than KEEP_FIRST");
        record.timelines.remove(&drop);
    }
}

/// Records one run (see the module).
pub struct Recorder {
    name: String,
    record: Mutex<RunRecord>,
    tx: broadcast::Sender<Arc<String>>,
    dropped: AtomicU64,
    save_to: Option<PathBuf>,
}

impl Recorder {
    /// A recorder for the run `name`, saving its record to `save_to` at the end.
    pub fn new(name: &str, save_to: Option<PathBuf>) -> Arc<Recorder> {
        let (tx, _) = broadcast::channel(QUEUE);
        Arc::new(Recorder {
            name: name.to_string(),
            record: Mutex::new(RunRecord::default()),
            tx,
            dropped: AtomicU64::new(0),
            save_to,
        })
    }

    /// The run's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy of the record.
    pub fn record(&self) -> RunRecord {
        self.lock().clone()
    }

    /// Runs `f` on the record under its lock.
    pub fn with<T>(&self, f: impl FnOnce(&RunRecord) -> T) -> T {
        f(&self.lock())
    }

    /// A receiver of live frames (JSON text).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<String>> {
        self.tx.subscribe()
    }

    /// Counts frames a slow client lost.
    pub fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Frames lost by slow clients so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunRecord> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, frame: &Frame) {
        // A full queue evicts its oldest frame, which some client has not read: lost.
        if self.tx.receiver_count() > 0 && self.tx.len() >= QUEUE {
            self.count_dropped(1);
        }
        // No receivers is not an error: nobody is watching.
        let _ = self.tx.send(Arc::new(serde_json::to_string(frame).expect("frames serialize")));
    }

    /// Writes the record (without the lines, which the log has) to `path` atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut record = self.record();
        record.lines.clear();
        let text = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        write_atomically(path, &text)
    }
}

impl Observer for Recorder {
    fn start(&self, info: &RunInfo) -> Result<(), TrainError> {
        self.lock().info = Some(info.clone());
        self.send(&Frame::Info { info: info.clone() });
        Ok(())
    }

    fn wants_memory(&self) -> bool {
        true
    }

    fn step(&self, line: &StepLog, memory: Option<&StepMemory>) -> Result<(), TrainError> {
        let pages = memory.map(|m| m.pages.clone());
        {
            let mut r = self.lock();
            r.lines.push(line.clone());
            if let Some(m) = memory {
                r.pages = m.pages.clone();
                keep_timeline(&mut r, m.clone());
            }
        }
        self.send(&Frame::Line {
            line: line.clone(),
            timeline: memory.is_some(),
            pages,
        });
        Ok(())
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        self.lock().lines.push(line.clone());
        self.send(&Frame::Line {
            line: line.clone(),
            timeline: false,
            pages: None,
        });
        Ok(())
    }

    fn finish(&self) {
        self.lock().finished = true;
        self.send(&Frame::Finished);
        if let Some(path) = &self.save_to
            && let Err(e) = self.save(path)
        {
            tracing::error!("could not save the run record {}: {e}", path.display());
        }
    }
}

/// The record file beside a JSONL log: `runs/x.jsonl` -> `runs/x.memory.json`.
pub fn record_path(log: &Path) -> PathBuf {
    log.with_extension("memory.json")
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "the log".into(), |n| n.to_string_lossy().into_owned())
}

/// The record beside a finished run's log (without the lines, which the server streams
/// from the log); a log without one gets an empty, finished record. Errors name the
/// file by its name in the runs folder, never by a server path.
pub fn load_record(log: &Path) -> Result<RunRecord, String> {
    let path = record_path(log);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<RunRecord>(&bytes).map_err(|e| format!("{}: {e}", file_name(&path))),
        Err(_) => Ok(RunRecord {
            finished: true,
            ..Default::default()
        }),
    }
}

/// Calls `line` with every complete line of a log, checking each is a log line; a
/// partial last line (a run killed mid-write) is skipped. Reads line by line: a large
/// log costs one line of memory. Errors name the line, and the file by its name.
pub fn read_log(log: &Path, mut line: impl FnMut(&str) -> Result<(), String>) -> Result<(), String> {
    use std::io::BufRead;
    let name = file_name(log);
    let file = std::fs::File::open(log).map_err(|e| format!("cannot read {name}: {e}"))?;
    let mut reader = std::io::BufReader::new(file);
    let mut text = String::new();
    let mut number = 0;
    loop {
        text.clear();
        let n = reader.read_line(&mut text).map_err(|e| format!("cannot read {name}: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        if !text.ends_with('\n') {
            tracing::warn!("{name}: last line is incomplete");
            return Ok(());
        }
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        serde_json::from_str::<StepLog>(trimmed).map_err(|e| format!("{name} line {number}: {e}"))?;
        line(trimmed)?;
    }
}

/// Loads a finished run: the log's lines and, if present, the record beside it.
pub fn load_run(log: &Path) -> Result<RunRecord, String> {
    let mut record = load_record(log)?;
    let mut lines = Vec::new();
    read_log(log, |l| {
        lines.push(serde_json::from_str::<StepLog>(l).map_err(|e| e.to_string())?);
        Ok(())
    })?;
    record.lines = lines;
    Ok(record)
}
