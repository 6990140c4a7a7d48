//! One benchmark row (the dashboard protocol's `BenchRecord`) and the median the
//! benchmarks report.
//!
//! May call: `wgtrain_record`. Called by: the benchmarks, the CLI.

pub use wgtrain_record::BenchRecord;

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
