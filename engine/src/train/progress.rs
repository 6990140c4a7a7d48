//! The terminal progress bar as an observer: position, loss, throughput and memory per
//! step, and a printed line for each evaluation and each out-of-memory event.
//!
//! May call: `memory`, `wgtrain_protocol`, `train::{error, observe}`.

use wgtrain_protocol::{StepLog, StepMemory};

use super::error::TrainError;
use super::observe::Observer;
use crate::memory::format_bytes;

/// indicatif's bar, told about every step.
pub struct ProgressBar {
    bar: indicatif::ProgressBar,
}

impl ProgressBar {
    /// A bar of `total` steps at `done`.
    pub fn new(total: u64, done: u64) -> ProgressBar {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
                .expect("a valid template"),
        );
        bar.set_position(done);
        ProgressBar { bar }
    }
}

impl Observer for ProgressBar {
    fn step(&self, line: &StepLog, _memory: Option<&StepMemory>) -> Result<(), TrainError> {
        if let Some(e) = &line.event {
            self.bar.println(format!("step {}: {e}", line.step));
        }
        self.bar.set_position(line.step);
        if let (Some(loss), Some(rate), Some(mem)) = (line.loss, line.samples_per_s, &line.mem) {
            let rate = match line.tokens_per_s {
                Some(t) => format!("{t:.0} tokens/s"),
                None => format!("{rate:.0} samples/s"),
            };
            self.bar.set_message(format!(
                "loss {loss:.4} | {rate} | {} allocated, {} reserved",
                format_bytes(mem.allocated),
                format_bytes(mem.reserved)
            ));
        }
        Ok(())
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        if let Some(e) = &line.eval {
            let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
            self.bar.println(format!("step {}: eval loss {:.4}{acc}", line.step, e.loss));
        }
        Ok(())
    }

    fn finish(&self) {
        self.bar.finish();
    }
}
