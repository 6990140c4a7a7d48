//! One line of the JSONL training log (`wgtrain train --log`): a step line with the
//! loss, time and the allocator's counters by category (and, on profiled steps, the
//! step's kernel table), or an evaluation line.
//!
//! May call: serde. Called by: the trainer (writes), the dashboard (reads).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Memory figures of one step's log line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemLog {
    /// Bytes in live blocks now.
    pub allocated: u64,
    /// Bytes in pages now.
    pub reserved: u64,
    /// Peak allocated bytes during the step.
    pub peak: u64,
    /// Peak reserved bytes during the step.
    pub peak_reserved: u64,
    /// The cap on reserved bytes, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    /// Allocated bytes by category now.
    pub by_category: BTreeMap<String, u64>,
    /// Allocated bytes by category at the step's peak (they add up to `peak`).
    pub at_peak: BTreeMap<String, u64>,
    /// Inactive split bytes over reserved bytes.
    pub fragmentation: f64,
    /// Out-of-memory failures so far.
    pub num_ooms: u64,
    /// Cache flushes to retry an allocation so far.
    pub num_alloc_retries: u64,
    /// A multi-device run: each device's own figures, in rank order (the line's other
    /// fields are the first device's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<MemLog>,
    /// Bytes held in host memory by category (offloaded state), when any is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host: BTreeMap<String, u64>,
    /// A run over MPI: the rank whose device this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// A run over MPI: the machine the rank runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The device's memory budget for this process after the step, where the backend
    /// tells it (as `torch.cuda.mem_get_info`'s total less what others hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_budget: Option<u64>,
    /// This process's usage of the device's memory after the step, where told (more
    /// than `reserved`: the driver's own allocations count too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_usage: Option<u64>,
}

/// One kernel's row of a step's profile, as torch.profiler's `key_averages()` gives it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KernelRow {
    /// Family and variant, e.g. `matmul f16,f16->f32 tm8 gelu vec4`.
    pub name: String,
    /// Launches.
    pub calls: usize,
    /// GPU time attributed to it, microseconds.
    pub total_us: f64,
    /// Per launch.
    pub mean_us: f64,
    /// Share of the GPU time, percent (the rows add up to 100).
    pub pct: f64,
    /// Achieved GFLOP/s, where the kernel states its FLOPs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// Achieved GB/s over the bound blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// GPU time by phase of the step (forward, backward, optimizer, ...), microseconds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_phase: BTreeMap<String, f64>,
}

/// Evaluation results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalLog {
    /// Mean loss over the evaluation split.
    pub loss: f64,
    /// Fraction classified correctly (classifiers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// The most bytes allocated during the evaluation (its batches, no tape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
    /// Bytes reserved after it (the pages its batches needed stay cached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
}

/// One line of the JSONL log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepLog {
    /// Steps done (1 after the first).
    pub step: u64,
    /// Epoch of the batch.
    pub epoch: u64,
    /// When the line was written: seconds since the Unix epoch (a wall-time axis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    /// Training loss of the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Learning rate used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Wall time of the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<f64>,
    /// Examples per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_per_s: Option<f64>,
    /// Tokens per second (token models).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Model FLOPs per second of the step, TFLOP/s (6N + 12·L·T·C per token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_tflops: Option<f64>,
    /// Model TFLOP/s over the adapter's peak, where the peak is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Memory after the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<MemLog>,
    /// GPU busy time of the step, milliseconds: every step while `train.log_gpu_busy`
    /// (the union of its compute passes), or a profiled step's launches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_ms: Option<f64>,
    /// The step's kernels by GPU time, largest first (profiled steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<Vec<KernelRow>>,
    /// The loss scale the step used (fp16-mixed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Whether the step was skipped for an inf or NaN gradient (fp16-mixed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<bool>,
    /// The micro-batch the step ran with, when it accumulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<usize>,
    /// The global gradient norm before clipping (where `train.grad_clip` computes it),
    /// over every device's gradients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// ||update|| / ||weight|| of each layer's parameters in the step
    /// (`train.log_update_ratio`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_ratio: Option<BTreeMap<String, f64>>,
    /// This process's resident host memory after the step, bytes (where the system
    /// says: Linux).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_rss: Option<u64>,
    /// Something that happened during the step (an out-of-memory retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Evaluation, on eval lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalLog>,
}

impl StepLog {
    /// Whether this is a training step's line (it carries memory), not an evaluation's.
    pub fn is_step(&self) -> bool {
        self.mem.is_some()
    }
}

impl MemLog {
    /// Bytes by category at the step's peak (`at_peak`), or now for logs without it.
    pub fn peak_by_category(&self) -> &BTreeMap<String, u64> {
        if self.at_peak.is_empty() {
            &self.by_category
        } else {
            &self.at_peak
        }
    }
}
