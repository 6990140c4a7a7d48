//! The log's lines as CSV (the dashboard's "curves.csv" export): one row per line,
//! training steps and evaluations alike, the columns a spreadsheet or pandas plots.
//!
//! May call: `log`. Called by: the dashboard's server.

use crate::log::StepLog;

/// The columns, in order.
pub const CSV_COLUMNS: [&str; 19] = [
    "step",
    "epoch",
    "time",
    "loss",
    "lr",
    "step_ms",
    "samples_per_s",
    "tokens_per_s",
    "model_tflops",
    "mfu",
    "scale",
    "skipped",
    "peak_bytes",
    "reserved_bytes",
    "grad_norm",
    "host_rss_bytes",
    "eval_loss",
    "eval_accuracy",
    "eval_peak_bytes",
];

/// `lines` as CSV with a header row; empty cells where a line has no such value.
pub fn curves_csv(lines: &[StepLog]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    let num = |v: Option<f64>| v.map_or(String::new(), |x| if x.is_finite() { x.to_string() } else { format!("{x}") });
    for l in lines {
        let cells = [
            l.step.to_string(),
            l.epoch.to_string(),
            num(l.time),
            num(l.loss),
            num(l.lr),
            num(l.step_ms),
            num(l.samples_per_s),
            num(l.tokens_per_s),
            num(l.model_tflops),
            num(l.mfu),
            num(l.scale),
            l.skipped.map_or(String::new(), |s| s.to_string()),
            l.mem.as_ref().map_or(String::new(), |m| m.peak.to_string()),
            l.mem.as_ref().map_or(String::new(), |m| m.peak_reserved.to_string()),
            num(l.grad_norm),
            l.host_rss.map_or(String::new(), |b| b.to_string()),
            num(l.eval.as_ref().map(|e| e.loss)),
            num(l.eval.as_ref().and_then(|e| e.accuracy)),
            l.eval.as_ref().and_then(|e| e.peak).map_or(String::new(), |b| b.to_string()),
        ];
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::EvalLog;

    #[test]
    fn one_row_a_line_with_empty_cells_for_what_a_line_lacks() {
        let lines = vec![
            StepLog {
                step: 1,
                loss: Some(2.5),
                lr: Some(0.001),
                ..Default::default()
            },
            StepLog {
                step: 1,
                eval: Some(EvalLog {
                    loss: 2.25,
                    accuracy: Some(0.5),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        let csv = curves_csv(&lines);
        let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.len() == CSV_COLUMNS.len()));
        assert_eq!(rows[1][..5], ["1", "0", "", "2.5", "0.001"]);
        assert_eq!(rows[2][16..], ["2.25", "0.5", ""]);
    }
}
