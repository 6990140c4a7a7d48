//! Progress on the terminal as an observer. On a terminal: a bar that fits its width
//! (80 columns included), fields dropped from the least useful before anything wraps:
//! position, loss, the step's peak memory, throughput (tokens/s for token models),
//! time left, time taken, reserved memory. Not on a terminal (a pipe, a log file): one
//! plain line every N steps, as Lightning logs. Evaluations and out-of-memory events
//! get a line of their own either way, and so does the first step's kernel compilation.
//!
//! May call: `memory`, `wgtrain_record`, `train::{error, observe}`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use wgtrain_record::{StepLog, StepMemory};

use crate::memory::format_bytes;
use crate::train::error::TrainError;
use crate::train::observe::Observer;

/// Where progress goes (stderr).
enum Sink {
    /// A bar redrawn in place.
    Bar(indicatif::ProgressBar),
    /// Plain lines, one per `every` steps.
    Lines { every: u64, started: Instant },
}

/// The run's progress (see the module).
pub struct ProgressBar {
    sink: Sink,
    total: u64,
    /// The bar width the style was made for (the style is rebuilt only when it changes).
    styled: std::sync::atomic::AtomicUsize,
}

/// `d` as h:mm:ss or m:ss.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// The fields of a step, most useful first.
fn fields(line: &StepLog, total: u64, eta: Option<Duration>, elapsed: Duration) -> Vec<String> {
    let mut f = vec![format!("{}/{total}", line.step)];
    if let Some(loss) = line.loss {
        f.push(format!("loss {loss:.4}"));
    }
    if let Some(m) = &line.mem {
        f.push(format!("peak {}", format_bytes(m.peak)));
    }
    match (line.tokens_per_s, line.samples_per_s) {
        (Some(t), _) => f.push(format!("{t:.0} tok/s")),
        (None, Some(s)) => f.push(format!("{s:.0} samples/s")),
        _ => {}
    }
    if let Some(eta) = eta {
        f.push(format!("eta {}", clock(eta)));
    }
    f.push(format!("took {}", clock(elapsed)));
    if let Some(m) = &line.mem {
        f.push(format!("reserved {}", format_bytes(m.reserved)));
    }
    f
}

/// As many of `fields` as fit `width` columns, joined, in order of use.
pub fn fit(fields: &[String], width: usize) -> String {
    let mut out = String::new();
    for f in fields {
        let add = if out.is_empty() { f.chars().count() } else { f.chars().count() + 3 };
        if out.chars().count() + add > width {
            break;
        }
        if !out.is_empty() {
            out += " · ";
        }
        out += f;
    }
    out
}

/// Whether a bar at `position` of `length` steps ended the run (else it was stopped).
fn completed(position: u64, length: Option<u64>) -> bool {
    length.is_none_or(|l| position >= l)
}

/// The bar's width in a terminal of `columns`: none below 70 columns.
fn bar_width(columns: usize) -> usize {
    match columns {
        0..70 => 0,
        70..110 => 10,
        _ => 20,
    }
}

impl ProgressBar {
    /// Progress of `total` steps at `done`: a bar on a terminal, else plain lines.
    pub fn new(total: u64, done: u64) -> ProgressBar {
        let sink = if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_position(done);
            Sink::Bar(bar)
        } else {
            Sink::Lines {
                every: (total / 20).clamp(1, 50),
                started: Instant::now(),
            }
        };
        let bar = ProgressBar {
            sink,
            total,
            styled: std::sync::atomic::AtomicUsize::new(usize::MAX),
        };
        // The first step of a process builds every kernel it runs: say why it is slow.
        if done < total {
            bar.say(format!(
                "step {} also compiles the GPU kernels it runs (seconds on a CPU adapter; drivers keep them for later runs)",
                done + 1
            ));
        }
        bar
    }

    fn say(&self, text: String) {
        match &self.sink {
            Sink::Bar(bar) => bar.println(text),
            Sink::Lines { .. } => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }
}

impl Observer for ProgressBar {
    fn step(&self, line: &StepLog, _memory: Option<&StepMemory>) -> Result<(), TrainError> {
        if let Some(e) = &line.event {
            self.say(format!("step {}: {e}", line.step));
        }
        match &self.sink {
            Sink::Bar(bar) => {
                let columns = console::Term::stderr().size().1 as usize;
                let columns = if columns == 0 { 80 } else { columns };
                let width = bar_width(columns);
                if self.styled.swap(width, std::sync::atomic::Ordering::Relaxed) != width {
                    let style = if width == 0 {
                        "{msg}".to_string()
                    } else {
                        format!("{{bar:{width}.cyan/blue}} {{msg}}")
                    };
                    bar.set_style(indicatif::ProgressStyle::with_template(&style).expect("a valid template"));
                }
                bar.set_position(line.step);
                let eta = (line.step < self.total).then(|| bar.eta());
                let room = columns.saturating_sub(width + usize::from(width > 0) + 1);
                bar.set_message(fit(&fields(line, self.total, eta, bar.elapsed()), room));
            }
            Sink::Lines { every, started } => {
                if line.step.is_multiple_of(*every) || line.step == self.total {
                    let f = fields(line, self.total, None, started.elapsed());
                    let _ = writeln!(std::io::stderr(), "step {}", f.join(" · "));
                }
            }
        }
        Ok(())
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        if let Some(e) = &line.eval {
            let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
            self.say(format!("step {}: eval loss {:.4}{acc}", line.step, e.loss));
        }
        Ok(())
    }

    fn finish(&self) {
        if let Sink::Bar(bar) = &self.sink {
            // An interrupted run's bar stays where it stopped (finish() drew it full).
            if completed(bar.position(), bar.length()) {
                bar.finish();
            } else {
                bar.abandon();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_bar_is_not_drawn_full() {
        assert!(completed(100, Some(100)));
        assert!(!completed(37, Some(100)));
        let bar = indicatif::ProgressBar::hidden();
        bar.set_length(100);
        bar.set_position(37);
        assert!(!completed(bar.position(), bar.length()));
    }

    #[test]
    fn fields_are_dropped_before_the_line_wraps() {
        let line = StepLog {
            step: 1234,
            loss: Some(2.345678),
            samples_per_s: Some(100.0),
            tokens_per_s: Some(123456.0),
            mem: Some(wgtrain_record::MemLog {
                peak: 7 << 30,
                reserved: 8 << 30,
                ..Default::default()
            }),
            ..Default::default()
        };
        let f = fields(&line, 100000, Some(Duration::from_secs(4000)), Duration::from_secs(59));
        for columns in [40usize, 60, 80, 110, 200] {
            let room = columns.saturating_sub(bar_width(columns) + 2);
            let text = fit(&f, room);
            assert!(text.chars().count() + bar_width(columns) + 2 <= columns, "{columns}: {text}");
            assert!(text.starts_with("1234/100000 · loss 2.3457"), "{text}");
        }
        assert!(
            fit(&f, 78).contains("peak 7.00 GiB") && fit(&f, 78).contains("tok/s"),
            "{}",
            fit(&f, 78)
        );
        assert!(fit(&f, 200).contains("reserved 8.00 GiB"));
    }
}
