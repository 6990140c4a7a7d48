//! The run recorder: an [`Observer`] that keeps what the dashboard shows (log lines,
//! the latest pages, the allocation timelines of a bounded set of steps) and fans each
//! step out to live clients through a bounded broadcast queue. It never waits on a
//! client: a client that falls behind loses frames, and those are counted.
//!
//! The record is written beside the log (`NAME.memory.json`, whole or not at all) as
//! the run goes (every [`SAVE_EVERY`] at most, off the training thread) and at its end,
//! so `wgtrain dashboard --runs DIR` shows the same views later, also of a run that was
//! killed or is still training. Timelines kept: the first steps, the latest ones, and
//! the step with the largest peak.
//!
//! May call: `wgtrain_engine::{files, train}`, `wgtrain_record`. Called by: `server`, the CLI.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use wgtrain_engine::files::write_atomically;
use wgtrain_engine::train::{Observer, TrainError};
use wgtrain_record::{Frame, RunInfo, RunRecord, StepLog, StepMemory};

/// Timelines kept from the start of a run.
pub const KEEP_FIRST: usize = 3;
/// Timelines kept from the end of a run.
pub const KEEP_LAST: usize = 20;
/// Frames a live client may fall behind before it loses some.
pub const QUEUE: usize = 256;

/// How often the record is saved while the run goes on (at most; on a thread of its own).
pub const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps `memory`'s timeline: the first [`KEEP_FIRST`] steps, the latest [`KEEP_LAST`],
/// and the step with the largest peak so far (`peak_step`), which is never dropped.
fn keep_timeline(record: &mut RunRecord, memory: StepMemory, peak_step: Option<u64>) {
    record.timelines.insert(memory.step, memory);
    let limit = KEEP_FIRST + KEEP_LAST + usize::from(peak_step.is_some());
    while record.timelines.len() > limit {
        let drop = record
            .timelines
            .keys()
            .skip(KEEP_FIRST)
            .find(|&&s| Some(s) != peak_step)
            .copied()
            .expect("more than KEEP_FIRST + 1");
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
    saving: Arc<Saving>,
    /// The first step with the largest `mem.peak` so far, and that peak.
    peak: Mutex<Option<(u64, u64)>>,
}

/// The record's saves: at most one in flight, and never an older state over a newer.
#[derive(Default)]
struct Saving {
    /// Taken while a save writes; holds the version last written.
    written: Mutex<u64>,
    /// The version of the latest state handed to a save.
    version: AtomicU64,
    /// When the last save was started.
    last: Mutex<Option<std::time::Instant>>,
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
            saving: Arc::default(),
            peak: Mutex::new(None),
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
        let version = self.saving.version.fetch_add(1, Ordering::SeqCst) + 1;
        write_record(&self.saving, path, &self.saved_record(), version)
    }

    fn saved_record(&self) -> RunRecord {
        let r = self.lock();
        RunRecord {
            info: r.info.clone(),
            lines: Vec::new(),
            timelines: r.timelines.clone(),
            pages: r.pages.clone(),
            finished: r.finished,
        }
    }

    /// Saves the record on a thread of its own if [`SAVE_EVERY`] has passed since the
    /// last save: a run killed mid-training keeps its timelines, and training does not
    /// wait on the disk. A failure is logged; the final save at the end reports it too.
    fn save_soon(&self) {
        let Some(path) = self.save_to.clone() else { return };
        {
            let mut last = self.saving.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < SAVE_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let record = self.saved_record();
        let version = self.saving.version.fetch_add(1, Ordering::SeqCst) + 1;
        let saving = self.saving.clone();
        let spawned = std::thread::Builder::new().name("wgtrain-record".into()).spawn(move || {
            if let Err(e) = write_record(&saving, &path, &record, version) {
                tracing::warn!("could not save the run record {}: {e}", path.display());
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("could not start saving the run record: {e}");
        }
    }
}

/// Writes `record` (state `version`) to `path` atomically unless a newer state was
/// written already.
fn write_record(saving: &Saving, path: &Path, record: &RunRecord, version: u64) -> std::io::Result<()> {
    let mut written = saving.written.lock().unwrap_or_else(|p| p.into_inner());
    if *written >= version {
        return Ok(());
    }
    let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    write_atomically(path, &text)?;
    *written = version;
    Ok(())
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
                let mut peak = self.peak.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(mem) = &line.mem
                    && peak.is_none_or(|(_, p)| mem.peak > p)
                {
                    *peak = Some((line.step, mem.peak));
                }
                keep_timeline(&mut r, m.clone(), peak.map(|p| p.0));
            }
        }
        if memory.is_some() {
            self.save_soon();
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

/// The largest memory record the server reads (kept timelines of a large model take
/// tens of MB; a larger file is not a record wgtrain wrote).
pub const MAX_RECORD: u64 = 64 << 20;

/// The most bytes one log line may hold (the engine's bound: `train::log::MAX_LINE`).
pub const MAX_LINE: usize = wgtrain_engine::train::observe::log::MAX_LINE;

/// Parsed records by file, with the size and modification time they were read at: an
/// API call re-reads a record only when its file changed. Bounded: the oldest go first.
type Cached = (PathBuf, u64, Option<std::time::SystemTime>, Arc<RunRecord>);
static RECORDS: Mutex<Vec<Cached>> = Mutex::new(Vec::new());
/// Records kept parsed at once, and their files' bytes together.
const CACHE_ENTRIES: usize = 8;
const CACHE_BYTES: u64 = 128 << 20;

/// Whether `path` is a regular file itself (not a symlink to one, a FIFO or a device):
/// the server reads nothing outside the runs folder and nothing that blocks.
pub fn plain_file(path: &Path) -> Result<std::fs::Metadata, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read {}: {e}", file_name(path)))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "{} is a symbolic link; the dashboard reads only files in the runs folder",
            file_name(path)
        ));
    }
    if !meta.is_file() {
        return Err(format!("{} is {}, not a file", file_name(path), wgtrain_engine::files::kind(&meta)));
    }
    Ok(meta)
}

/// The record beside a finished run's log (without the lines, which the server streams
/// from the log); a log without one gets an empty, finished record. Parsed once per
/// version of the file (size and modification time). Errors name the file by its name
/// in the runs folder, never by a server path.
pub fn load_record(log: &Path) -> Result<Arc<RunRecord>, String> {
    let path = record_path(log);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(Arc::new(RunRecord {
            finished: true,
            ..Default::default()
        }));
    }
    let meta = plain_file(&path)?;
    if meta.len() > MAX_RECORD {
        return Err(format!(
            "{} holds {} bytes, more than a memory record may ({MAX_RECORD})",
            file_name(&path),
            meta.len()
        ));
    }
    let version = (meta.len(), meta.modified().ok());
    let cache = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, _, record)) = cache.iter().find(|(p, len, time, _)| *p == path && (*len, *time) == version) {
        return Ok(record.clone());
    }
    drop(cache);
    let bytes = wgtrain_engine::files::read_bounded(&path, MAX_RECORD).map_err(|e| format!("cannot read {}: {e}", file_name(&path)))?;
    let record = Arc::new(serde_json::from_slice::<RunRecord>(&bytes).map_err(|e| format!("{}: {e}", file_name(&path)))?);
    drop(bytes);
    let mut cache = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|(p, _, _, _)| *p != path);
    cache.push((path, version.0, version.1, record.clone()));
    while cache.len() > CACHE_ENTRIES || cache.iter().map(|c| c.1).sum::<u64>() > CACHE_BYTES {
        cache.remove(0);
    }
    Ok(record)
}

/// Calls `line` with every complete line of a log, checking each is a wgtrain log line
/// (a step's or an evaluation's); a partial last line (a run killed mid-write) is
/// skipped. Reads line by line, each at most [`MAX_LINE`] bytes: a large log costs one
/// line of memory. Errors name the line, and the file by its name.
pub fn read_log(log: &Path, mut line: impl FnMut(&str) -> Result<(), String>) -> Result<(), String> {
    use std::io::{BufRead, Read};
    let name = file_name(log);
    plain_file(log)?;
    let file = std::fs::File::open(log).map_err(|e| format!("cannot read {name}: {e}"))?;
    let mut reader = std::io::BufReader::new(file);
    let mut raw = Vec::new();
    let mut number = 0;
    loop {
        raw.clear();
        let n = Read::by_ref(&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut raw)
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        if n > MAX_LINE {
            return Err(format!("{name} line {number} is longer than {MAX_LINE} bytes: not a wgtrain log"));
        }
        if !raw.ends_with(b"\n") {
            tracing::warn!("{name}: last line is incomplete");
            return Ok(());
        }
        let text = std::str::from_utf8(&raw).map_err(|_| format!("{name} line {number} is not UTF-8"))?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        serde_json::from_str::<StepLog>(trimmed).map_err(|e| format!("{name} line {number}: {e}"))?;
        // Every line wgtrain writes has its step and a loss (null when NaN) or an
        // evaluation: any other JSON object is not a wgtrain log's line.
        let keyed = |k: &str| trimmed.contains(&format!("\"{k}\":"));
        if !keyed("step") || !(keyed("loss") || keyed("eval")) {
            return Err(format!(
                "{name} line {number} is neither a step's nor an evaluation's line: not a wgtrain log"
            ));
        }
        line(trimmed)?;
    }
}

/// Logs that [`read_log`] found whole, with the size and modification time they had:
/// a log is checked once per version, not once per request.
static VALIDATED: Mutex<Vec<(PathBuf, u64, Option<std::time::SystemTime>)>> = Mutex::new(Vec::new());
const VALIDATED_ENTRIES: usize = 32;

/// Checks every line of `log` as [`read_log`] does, unless this version of the file
/// (size and modification time) was checked before.
pub fn validate_log(log: &Path) -> Result<(), String> {
    let meta = plain_file(log)?;
    let version = (log.to_path_buf(), meta.len(), meta.modified().ok());
    let known = |v: &Vec<_>| v.contains(&version);
    if known(&VALIDATED.lock().unwrap_or_else(|p| p.into_inner())) {
        return Ok(());
    }
    read_log(log, |_| Ok(()))?;
    let mut validated = VALIDATED.lock().unwrap_or_else(|p| p.into_inner());
    validated.retain(|v| v.0 != version.0);
    validated.push(version);
    if validated.len() > VALIDATED_ENTRIES {
        validated.remove(0);
    }
    Ok(())
}

/// Loads a finished run: the log's lines and, if present, the record beside it.
pub fn load_run(log: &Path) -> Result<RunRecord, String> {
    let mut record = (*load_record(log)?).clone();
    let mut lines = Vec::new();
    read_log(log, |l| {
        lines.push(serde_json::from_str::<StepLog>(l).map_err(|e| e.to_string())?);
        Ok(())
    })?;
    record.lines = lines;
    Ok(record)
}
