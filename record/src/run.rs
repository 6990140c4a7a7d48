//! A run as the dashboard sees it: the facts sent at its start, the record the
//! recorder keeps (and saves beside the log), the views the server answers with, the
//! live frames of its event stream, and the kernel rows of a `wgtrain bench` file.
//!
//! May call: `device`, `log`, `memory`, serde. Called by: the trainer, the server, the app.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::device::AdapterReport;
use crate::log::StepLog;
use crate::memory::{PageView, StepMemory};

/// Facts about a run, sent once at its start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunInfo {
    /// The adapter's report (name, backend, features, limits).
    pub device: AdapterReport,
    /// The configuration as run (after fit), as the TOML config's tables.
    pub config: serde_json::Value,
    /// Parameter elements.
    pub parameters: u64,
    /// Steps the run will take.
    pub total_steps: u64,
    /// What fit and fallbacks decided.
    pub notes: Vec<String>,
    /// The cap or budget on reserved bytes.
    pub cap: Option<u64>,
    /// The estimated peak of this run's config under other memory policies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whatif: Vec<WhatIf>,
}

/// One policy of `GET /api/runs/NAME/whatif`: the run's config with some memory
/// settings changed, and the exact estimate's peak for it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WhatIf {
    /// What differs from the run (empty for the run as configured), e.g.
    /// "memory.precision = fp16-mixed".
    pub change: String,
    /// The memory settings it runs under: precision, checkpoint, micro_batch_size,
    /// optimizer_in_backward.
    pub policy: BTreeMap<String, serde_json::Value>,
    /// Estimated peak bytes in live blocks.
    pub peak_bytes: u64,
    /// Estimated peak bytes in pages (what the device must hold).
    pub peak_reserved_bytes: u64,
    /// Estimated bytes per category at the peak.
    pub by_category: BTreeMap<String, u64>,
    /// Whether the reserved peak fits the cap (else the device's memory); None when
    /// neither is known.
    pub fits: Option<bool>,
}

/// `GET /api/runs/NAME/whatif`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WhatIfView {
    /// The bound the policies are measured against (cap, else device memory).
    pub limit_bytes: Option<u64>,
    /// The run as configured first, then each change.
    pub options: Vec<WhatIf>,
}

/// What the dashboard knows of one run (the recorder's record; saved beside the log as
/// `NAME.memory.json` without the lines, which the log has).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's facts (absent for a log without a record).
    pub info: Option<RunInfo>,
    /// Step and evaluation lines, as in the JSONL log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<StepLog>,
    /// Allocation timelines of the first and the latest steps.
    pub timelines: BTreeMap<u64, StepMemory>,
    /// Pages at the end of the latest step.
    pub pages: Vec<PageView>,
    /// Whether the run has ended.
    pub finished: bool,
}

/// `GET /api/runs/NAME`: a run with its lines, pages and the steps that have timelines.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunView {
    /// The run's name (its log's file name without `.jsonl`).
    pub name: String,
    /// Whether the run is the one training in this process.
    pub live: bool,
    /// Whether it has ended.
    pub finished: bool,
    /// Its facts.
    pub info: Option<RunInfo>,
    /// Step and evaluation lines.
    pub lines: Vec<StepLog>,
    /// Pages at the end of the latest step.
    pub pages: Vec<PageView>,
    /// Steps whose allocation timeline can be fetched.
    pub timeline_steps: Vec<u64>,
    /// Kernel timings given to the dashboard with `--bench` (null without).
    pub bench: Option<Vec<BenchRecord>>,
}

/// One entry of `GET /api/runs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEntry {
    /// The run's name.
    pub name: String,
    /// Whether it is training in this process.
    pub live: bool,
    /// Steps so far (live runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
}

/// One run of `GET /api/hparams` (the runs table): its config flattened to dotted keys
/// and where it ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HparamsRow {
    /// The run's name.
    pub name: String,
    /// Whether it is training in this process.
    pub live: bool,
    /// Training steps logged.
    pub steps: u64,
    /// The config as run, `section.key` to its value as JSON text.
    pub config: BTreeMap<String, String>,
    /// The last step's training loss.
    pub loss: Option<f64>,
    /// The last evaluation's loss and accuracy.
    pub eval_loss: Option<f64>,
    /// The last evaluation's accuracy (classifiers).
    pub eval_accuracy: Option<f64>,
    /// The largest step peak (allocated bytes).
    pub peak_bytes: Option<u64>,
}

impl HparamsRow {
    /// The row of run `name` from its facts and log lines.
    pub fn of(name: &str, live: bool, info: Option<&RunInfo>, lines: &[StepLog]) -> HparamsRow {
        let steps: Vec<&StepLog> = lines.iter().filter(|l| l.is_step()).collect();
        let last_eval = lines.iter().rev().find_map(|l| l.eval.as_ref());
        HparamsRow {
            name: name.to_string(),
            live,
            steps: steps.len() as u64,
            config: info.map(|i| flat_config(&i.config)).unwrap_or_default(),
            loss: steps.last().and_then(|l| l.loss),
            eval_loss: last_eval.map(|e| e.loss),
            eval_accuracy: last_eval.and_then(|e| e.accuracy),
            peak_bytes: steps.iter().filter_map(|l| l.mem.as_ref().map(|m| m.peak)).max(),
        }
    }
}

/// A config's tables as `section.key` to the value's JSON text.
pub fn flat_config(config: &serde_json::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", config, &mut out);
    out
}

/// `GET /api/health`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// Always true when answered.
    pub ok: bool,
    /// Frames slow clients lost so far.
    pub dropped_frames: u64,
}

/// One live update, as sent over server-sent events.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Frame {
    /// The run started.
    Info {
        /// Its facts.
        info: RunInfo,
    },
    /// A step or evaluation line (with the step's pages for steps).
    Line {
        /// The log line.
        line: StepLog,
        /// Whether a timeline was kept for the step.
        timeline: bool,
        /// The allocator's pages after the step (steps only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pages: Option<Vec<PageView>>,
    },
    /// The run ended.
    Finished,
}

/// One measured row of `wgtrain bench --json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// What was measured ("alloc_free_small", "matmul", ...).
    pub kernel: String,
    /// Element type ("f32", "f16", "bytes").
    pub dtype: String,
    /// The problem's shape.
    pub shape: Vec<u64>,
    /// Median time of one repetition, microseconds.
    pub median_us: f64,
    /// Arithmetic rate, when it applies.
    pub gflops: Option<f64>,
    /// Memory rate (bytes read and written), when it applies.
    pub gbps: Option<f64>,
    /// Largest absolute error against the reference, when it applies.
    pub max_abs_err: Option<f64>,
    /// Largest relative error against the reference, when it applies.
    pub max_rel_err: Option<f64>,
    /// Whether the result checked out (false when a row does not say).
    #[serde(default)]
    pub ok: bool,
    /// Spread of the timed repeats: (90th - 10th percentile) over the median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// Timed repeats behind the median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u32>,
    /// Why the row is not to be trusted as it stands (a spread over 10%, clocks that
    /// never settled), when so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// Figures particular to the record.
    #[serde(skip_serializing_if = "serde_json::Value::is_null", default)]
    pub extra: serde_json::Value,
}
