//! TensorBoard event files of a run (`wgtrain train --tensorboard DIR`): each step's and
//! each evaluation's numbers from its log line as TensorBoard scalars (`train/loss`,
//! `eval/accuracy`, `memory/peak_mib`, ...), at the line's step and wall time. A file
//! is a sequence of TFRecords (length, its masked CRC-32C, an `Event` protobuf, its
//! masked CRC-32C) opened by a `brain.Event:2` version record, and each record is
//! flushed as it is written, so TensorBoard pointed at DIR follows the run live. A
//! resumed run writes a new file beside the old ones; TensorBoard reads them together.
//!
//! May call: `wgtrain_record`, `train::error`, `train::observe` (and prost, crc32c).
//! Called by: the CLI.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use wgtrain_record::StepLog;

use super::Observer;
use crate::train::error::TrainError;

/// tensorflow/core/util/event.proto's `Event`, the fields written here.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// tensorflow/core/framework/summary.proto's `Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `Summary.Value`: a tag and its scalar.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, tag = "2")]
    simple_value: f32,
}

/// TFRecord's checksum: CRC-32C, rotated and offset.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord holding `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The scalars of a log line, by TensorBoard tag.
pub fn scalars(line: &StepLog) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    let mut put = |tag: &str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.push((tag.to_string(), v));
        }
    };
    if let Some(e) = &line.eval {
        put("eval/loss", Some(e.loss));
        put("eval/accuracy", e.accuracy);
        put("eval/peak_mib", e.peak.map(|b| b as f64 / 1048576.0));
        put("eval/reserved_mib", e.reserved.map(|b| b as f64 / 1048576.0));
        return out;
    }
    put("train/loss", line.loss);
    put("train/lr", line.lr);
    put("train/loss_scale", line.scale);
    put("train/grad_norm", line.grad_norm);
    for (layer, r) in line.update_ratio.iter().flatten() {
        put(&format!("update_ratio/{layer}"), Some(*r));
    }
    put("system/host_rss_mib", line.host_rss.map(|b| b as f64 / 1048576.0));
    put("speed/step_ms", line.step_ms);
    put("speed/samples_per_s", line.samples_per_s);
    put("speed/tokens_per_s", line.tokens_per_s);
    put("speed/model_tflops", line.model_tflops);
    put("speed/mfu", line.mfu);
    put("speed/gpu_ms", line.gpu_ms);
    put("system/gpu_busy_pct", line.gpu_ms.zip(line.step_ms).map(|(g, s)| 100.0 * g / s));
    if let Some(m) = &line.mem {
        let mib = |b: u64| Some(b as f64 / 1048576.0);
        put("memory/allocated_mib", mib(m.allocated));
        put("memory/peak_mib", mib(m.peak));
        put("memory/reserved_mib", mib(m.reserved));
        put("memory/peak_reserved_mib", mib(m.peak_reserved));
        put("memory/fragmentation", Some(m.fragmentation));
        for (cat, bytes) in m.peak_by_category() {
            put(&format!("memory_at_peak/{cat}_mib"), mib(*bytes));
        }
        for (i, d) in m.devices.iter().enumerate() {
            let who = d.rank.map_or_else(|| format!("device{i}"), |r| format!("rank{r}"));
            put(&format!("memory_devices/{who}_peak_mib"), mib(d.peak));
        }
    }
    out
}

/// Writes a run's event file (see the module).
pub struct TensorBoard {
    file: Mutex<std::fs::File>,
    path: PathBuf,
}

impl TensorBoard {
    /// A new event file in `dir` (made if missing), opened by its version record.
    pub fn create(dir: &Path) -> Result<TensorBoard, TrainError> {
        let err = |e: std::io::Error| TrainError::Log {
            path: dir.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "host".into(), |h| h.trim().to_string());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.wgtrain",
            now.as_secs(),
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new().create_new(true).write(true).open(&path).map_err(err)?;
        let tb = TensorBoard {
            file: Mutex::new(file),
            path,
        };
        tb.write(&Event {
            wall_time: now.as_secs_f64(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(tb)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, event: &Event) -> Result<(), TrainError> {
        let bytes = record(&prost::Message::encode_to_vec(event));
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(&bytes).and_then(|_| f.flush()).map_err(|e| TrainError::Log {
            path: self.path.display().to_string(),
            source: e,
        })
    }

    /// Writes `line`'s scalars as one event at its step.
    pub fn line(&self, line: &StepLog) -> Result<(), TrainError> {
        let value: Vec<SummaryValue> = scalars(line)
            .into_iter()
            .map(|(tag, v)| SummaryValue {
                tag,
                simple_value: v as f32,
            })
            .collect();
        if value.is_empty() {
            return Ok(());
        }
        let wall_time = line.time.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64()
        });
        self.write(&Event {
            wall_time,
            step: line.step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }
}

impl Observer for TensorBoard {
    fn step(&self, line: &StepLog, _memory: Option<&wgtrain_record::StepMemory>) -> Result<(), TrainError> {
        self.line(line)
    }

    fn eval(&self, line: &StepLog) -> Result<(), TrainError> {
        self.line(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_frame_their_data_with_crc32c() {
        // CRC-32C's published check value (RFC 3720's polynomial, "123456789"); the
        // framing itself is read back by TensorBoard's own reader in tests/train_cli.rs.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let r = record(b"abc");
        assert_eq!(r.len(), 3 + 16);
        assert_eq!(&r[..8], &3u64.to_le_bytes());
        assert_eq!(&r[12..15], b"abc");
        assert_eq!(&r[8..12], &masked_crc(&r[..8]).to_le_bytes());
    }
}
