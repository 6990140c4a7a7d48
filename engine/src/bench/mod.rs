//! `wgtrain bench`: benchmarks that print JSON. Each record names what it measured;
//! kernel records carry throughput and error against the CPU reference, allocator
//! records carry their own figures under `extra`.

pub mod alloc;
pub mod kernels;
pub mod launch;

use serde::{Deserialize, Serialize};

/// One measured row.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Whether the result checked out.
    pub ok: bool,
    /// Figures particular to the record.
    #[serde(skip_serializing_if = "serde_json::Value::is_null", default)]
    pub extra: serde_json::Value,
}

/// The median of `samples` (sorted in place); 0 for none.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let mid = samples.len() / 2;
    if samples.len() % 2 == 1 {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2.0
    }
}
