//! The training step's profile (`wgtrain profile`), as torch.profiler's
//! `key_averages()` gives it: warm-up steps, then steps with every launch timed on the
//! GPU (`runtime::profile`). Per kernel (family and variant): calls, total and mean
//! time, share of the GPU time, achieved GFLOP/s and GB/s; per step: wall time, GPU busy
//! time (the union of the launches' intervals), host overhead, launches, tokens (or
//! samples) per second, model TFLOP/s and MFU the way nanoGPT and PaLM count them
//! (6N + 12·L·T·C FLOPs per token, N without the position embedding). Launches that
//! overlap on the GPU are attributed exclusively in launch order, so the kernels' times
//! add up to the GPU time.
//!
//! May call: `optim`, `runtime`, `train::{error, step,
//! trainer}`. Called by: the CLI.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::optim::lr_at;
use crate::runtime::{LaunchRecord, StepTrace};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;

/// Known peaks, dense TFLOP/s: (name part, fp32 without tensor cores, f16 tensor cores).
pub const KNOWN_PEAKS: [(&str, f64, f64); 2] = [("H100", 67.0, 989.5), ("H200", 67.0, 989.5)];

pub use wgtrain_record::KernelRow;

/// One profiled step.
#[derive(Clone, Debug, Serialize)]
pub struct StepProfile {
    /// Wall time of the step, milliseconds.
    pub wall_ms: f64,
    /// GPU busy time (union of the launches), milliseconds.
    pub gpu_ms: f64,
    /// Wall minus GPU busy, milliseconds.
    pub host_ms: f64,
    /// Launches recorded.
    pub launches: usize,
}

/// The profile of a run's steps.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// Profiled steps.
    pub steps: usize,
    /// Median wall time per step, milliseconds.
    pub step_ms: f64,
    /// Median GPU busy time per step, milliseconds.
    pub gpu_ms: f64,
    /// Launches per step: the median of the profiled steps' (held column sums are
    /// recorded early when an allocation would raise the step's peak, which depends on
    /// where the allocator's blocks lie, so a step may group them into a launch more or
    /// fewer).
    pub launches_per_step: usize,
    /// Tokens per second (token models), at the median step.
    pub tokens_per_s: Option<f64>,
    /// Examples per second, at the median step.
    pub samples_per_s: f64,
    /// Model FLOPs per second, TFLOP/s, at the median step.
    pub model_tflops: f64,
    /// Model TFLOP/s over the adapter's peak, where the peak is known.
    pub mfu: Option<f64>,
    /// The peak used for MFU, TFLOP/s.
    pub peak_tflops: Option<f64>,
    /// Kernels by total time, largest first.
    pub kernels: Vec<KernelRow>,
    /// The same time by the module (layer) whose tensor each launch wrote and the op
    /// there, largest first.
    pub modules: Vec<ModuleRow>,
    /// Each profiled step.
    pub per_step: Vec<StepProfile>,
    /// Every profiled step's launches and host phases (for the trace).
    #[serde(skip)]
    pub traces: Vec<ProfiledStep>,
}

/// One profiled step as recorded: when it started on the host, its wall time, its
/// launches and host phases.
#[derive(Clone, Debug)]
pub struct ProfiledStep {
    /// When the step started (its batch's loading included).
    pub start: Instant,
    /// Its wall time, milliseconds.
    pub wall_ms: f64,
    /// Its launches and host spans.
    pub trace: StepTrace,
}

/// GPU time of one op of one module (layer) over the profiled steps: the launches that
/// wrote that module's tensors (its output, or in backward its gradients) in one phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModuleRow {
    /// `module: op phase`, e.g. `transformer.h.0.mlp.c_fc: matmul backward`.
    pub name: String,
    /// Launches.
    pub calls: usize,
    /// GPU time, microseconds.
    pub total_us: f64,
    /// Share of the GPU time, percent.
    pub pct: f64,
    /// The kernel variants that ran (the kernel table's names).
    pub kernels: Vec<String>,
}

/// The module a launch's tensor belongs to: its label without the suffix a
/// parameter, a gradient or a temporary adds (`.weight`, `.dx`, `.weight.grad`,
/// `.dy.f16`, `.dqkv`, ...).
pub fn module_of(label: &str) -> &str {
    const SUFFIXES: [&str; 13] = [
        ".weight.grad",
        ".bias.grad",
        ".grad",
        ".weight",
        ".bias",
        ".exp_avg_sq",
        ".exp_avg",
        ".dqkv",
        ".dx",
        ".dy.f16",
        ".dy",
        ".da",
        ".db",
    ];
    let mut m = label;
    while let Some(s) = SUFFIXES.iter().find(|s| m.ends_with(*s)) {
        m = &m[..m.len() - s.len()];
    }
    m
}

/// The module table of `steps`' launches (see [`ModuleRow`]), largest first.
pub fn module_rows<'a>(steps: impl IntoIterator<Item = &'a [LaunchRecord]>) -> Vec<ModuleRow> {
    let mut rows: BTreeMap<String, ModuleRow> = BTreeMap::new();
    let mut gpu_total = 0.0;
    for records in steps {
        let (times, busy) = exclusive_times(records);
        gpu_total += busy;
        for (r, ns) in records.iter().zip(times) {
            let module = r.label.as_deref().map_or("(unnamed)", module_of);
            let phase = if r.phase.is_empty() { "other" } else { r.phase };
            let name = format!("{module}: {} {phase}", r.key.family);
            let row = rows.entry(name).or_default();
            row.calls += 1;
            row.total_us += ns * 1e-3;
            if !row.kernels.iter().any(|k| **k == *r.name) {
                row.kernels.push(r.name.to_string());
            }
        }
    }
    let mut out: Vec<ModuleRow> = rows
        .into_iter()
        .map(|(name, row)| ModuleRow {
            name,
            pct: if gpu_total > 0.0 {
                100.0 * row.total_us * 1e3 / gpu_total
            } else {
                0.0
            },
            ..row
        })
        .collect();
    out.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// The row name of a launch: its family and variant, readable.
pub fn kernel_name(r: &LaunchRecord) -> String {
    r.name.to_string()
}

/// Each launch's exclusive GPU time in launch order (overlaps go to the earlier one),
/// and their union.
pub fn exclusive_times(launches: &[LaunchRecord]) -> (Vec<f64>, f64) {
    let mut order: Vec<usize> = (0..launches.len()).collect();
    order.sort_by(|&a, &b| launches[a].start_ns.total_cmp(&launches[b].start_ns));
    let mut times = vec![0.0; launches.len()];
    let mut cursor = f64::MIN;
    let mut busy = 0.0;
    for i in order {
        let (s, e) = (launches[i].start_ns.max(cursor), launches[i].end_ns);
        if e > s {
            times[i] = e - s;
            busy += e - s;
        }
        cursor = cursor.max(e);
    }
    (times, busy)
}

/// The kernel table of `steps`' launches, largest total first, and their GPU busy time
/// in nanoseconds (the rows' times add up to it).
pub fn kernel_rows<'a>(steps: impl IntoIterator<Item = &'a [LaunchRecord]>) -> (Vec<KernelRow>, f64) {
    let mut rows: BTreeMap<String, (KernelRow, f64, f64)> = BTreeMap::new();
    let mut gpu_total = 0.0;
    for records in steps {
        let (times, busy) = exclusive_times(records);
        gpu_total += busy;
        for (r, ns) in records.iter().zip(times) {
            let (row, flops, bytes) = rows.entry(kernel_name(r)).or_default();
            row.calls += 1;
            row.total_us += ns * 1e-3;
            *row.by_phase
                .entry(if r.phase.is_empty() { "other" } else { r.phase }.to_string())
                .or_default() += ns * 1e-3;
            *flops += r.work.flops;
            *bytes += r.work.bytes;
        }
    }
    let mut kernels: Vec<KernelRow> = rows
        .into_iter()
        .map(|(name, (row, flops, bytes))| {
            let ns = row.total_us * 1e3;
            KernelRow {
                name,
                mean_us: row.total_us / row.calls.max(1) as f64,
                pct: if gpu_total > 0.0 { 100.0 * ns / gpu_total } else { 0.0 },
                gflops: (flops > 0.0 && ns > 0.0).then(|| flops / ns),
                gbps: (bytes > 0.0 && ns > 0.0).then(|| bytes / ns),
                ..row
            }
        })
        .collect();
    kernels.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    (kernels, gpu_total)
}

impl Trainer {
    /// Model FLOPs of one example (forward and backward), as the model counts them.
    pub fn model_flops_per_example(&self) -> f64 {
        self.model.flops_per_example(self.parameter_count())
    }

    /// The adapter's peak TFLOP/s in the run's precision, when it is a known one.
    pub fn known_peak_tflops(&self) -> Option<f64> {
        let half = self.half();
        KNOWN_PEAKS
            .iter()
            .find(|(n, _, _)| self.rt.gpu.report.name.contains(n))
            .map(|&(_, fp32, f16)| if half { f16 } else { fp32 })
    }

    /// Tokens per example (token models).
    pub fn tokens_per_example(&self) -> Option<usize> {
        self.model.tokens_per_example()
    }

    /// Runs `warmup` steps, then `steps` steps with every launch timed (see the module).
    /// Training state advances as in a run; nothing is logged or checkpointed.
    pub fn profile(&mut self, warmup: usize, steps: usize, peak_tflops: Option<f64>) -> Result<Profile, TrainError> {
        let t = self.config.train.clone();
        let mut loader = self.batches();
        let total = self.total_steps().max((warmup + steps) as u64);
        let mut per_step = Vec::new();
        let mut traces = Vec::new();
        let mut rates = Vec::new();
        for i in 0..warmup + steps {
            let profiled = i >= warmup;
            self.rt.sync()?;
            if profiled {
                self.rt.start_profiling()?;
            }
            let start = Instant::now();
            self.rt.phase("data wait");
            let Some(batch) = loader.next_batch() else { break };
            let batch = batch?;
            let lr = lr_at(
                self.step,
                t.lr,
                t.warmup_steps,
                total,
                t.min_lr,
                t.schedule == crate::train::config::Schedule::Cosine,
            );
            self.resilient_step(&batch, lr)?;
            self.rt.sync()?;
            self.rt.phase("");
            let wall = start.elapsed().as_secs_f64();
            self.step += 1;
            self.rt.alloc.end_step().map_err(crate::error::Error::from)?;
            if !profiled {
                continue;
            }
            let trace = self.rt.collect_profile()?;
            self.rt.stop_profiling();
            let (_, busy_ns) = exclusive_times(&trace.launches);
            per_step.push(StepProfile {
                wall_ms: wall * 1e3,
                gpu_ms: busy_ns * 1e-6,
                host_ms: (wall * 1e3 - busy_ns * 1e-6).max(0.0),
                launches: trace.launches.len(),
            });
            rates.push(batch.examples as f64 / wall);
            traces.push(ProfiledStep {
                start,
                wall_ms: wall * 1e3,
                trace,
            });
        }
        let profiled = per_step.len();
        let (kernels, _) = kernel_rows(traces.iter().map(|s| s.trace.launches.as_slice()));
        let modules = module_rows(traces.iter().map(|s| s.trace.launches.as_slice()));
        let step_ms = median(per_step.iter().map(|s| s.wall_ms).collect());
        let samples_per_s = median(rates);
        let model_tflops = self.model_flops_per_example() * samples_per_s / 1e12;
        let peak = peak_tflops.or_else(|| self.known_peak_tflops());
        Ok(Profile {
            steps: profiled,
            step_ms,
            gpu_ms: median(per_step.iter().map(|s| s.gpu_ms).collect()),
            launches_per_step: {
                let mut counts: Vec<usize> = per_step.iter().map(|s| s.launches).collect();
                counts.sort_unstable();
                counts.get(counts.len() / 2).copied().unwrap_or(0)
            },
            tokens_per_s: self.tokens_per_example().map(|t| t as f64 * samples_per_s),
            samples_per_s,
            model_tflops,
            mfu: peak.map(|p| model_tflops / p),
            peak_tflops: peak,
            kernels,
            modules,
            per_step,
            traces,
        })
    }
}

impl Profile {
    /// The kernel table and the per-step figures, as `key_averages().table()` prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<44} {:>7} {:>12} {:>10} {:>7} {:>10} {:>9}\n",
            "kernel", "calls", "total ms", "mean us", "% GPU", "GFLOP/s", "GB/s"
        );
        for k in &self.kernels {
            out += &format!(
                "{:<44} {:>7} {:>12.3} {:>10.1} {:>7.2} {:>10} {:>9}\n",
                k.name,
                k.calls,
                k.total_us / 1e3,
                k.mean_us,
                k.pct,
                k.gflops.map_or("-".into(), |v| format!("{v:.1}")),
                k.gbps.map_or("-".into(), |v| format!("{v:.1}"))
            );
        }
        // By module: the layers' names, as the checkpoint names their weights.
        out += &format!(
            "\n{:<58} {:>7} {:>12} {:>7}  kernels\n",
            "module: op phase (largest 25)", "calls", "total ms", "% GPU"
        );
        for m in self.modules.iter().take(25) {
            out += &format!(
                "{:<58} {:>7} {:>12.3} {:>7.2}  {}\n",
                m.name,
                m.calls,
                m.total_us / 1e3,
                m.pct,
                m.kernels.join("; ")
            );
        }
        out.push('\n');
        for (i, s) in self.per_step.iter().enumerate() {
            out += &format!(
                "step {}: wall {:.2} ms, GPU busy {:.2} ms, host {:.2} ms, {} launches\n",
                i + 1,
                s.wall_ms,
                s.gpu_ms,
                s.host_ms,
                s.launches
            );
        }
        out += &format!(
            "median step {:.2} ms (GPU {:.2} ms), {:.0} samples/s{}, model {:.3} TFLOP/s{}",
            self.step_ms,
            self.gpu_ms,
            self.samples_per_s,
            self.tokens_per_s.map(|t| format!(", {t:.0} tokens/s")).unwrap_or_default(),
            self.model_tflops,
            match (self.mfu, self.peak_tflops) {
                (Some(m), Some(p)) => format!(", MFU {:.2}% of {p} TFLOP/s", 100.0 * m),
                _ => ", MFU unknown (no known peak for this adapter: --peak-tflops)".into(),
            }
        );
        out
    }

    /// A Chrome trace (opens in ui.perfetto.dev and chrome://tracing): a host track of
    /// steps, a host track of phases (data wait, forward, backward, readback,
    /// optimizer), and a GPU track with a complete event per launch. GPU times are
    /// placed so that the first launch starts with the host phase that recorded it.
    pub fn trace(&self) -> serde_json::Value {
        let mut events = Vec::new();
        let Some(origin) = self.traces.first().map(|s| s.start) else {
            return serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" });
        };
        let us = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e6;
        for (step, s) in self.traces.iter().enumerate() {
            let records = &s.trace.launches;
            events.push(serde_json::json!({
                "name": format!("step {}", step + 1), "ph": "X", "ts": us(s.start), "dur": s.wall_ms * 1e3,
                "pid": 1, "tid": 1, "args": {"launches": records.len()}
            }));
            for span in &s.trace.spans {
                events.push(serde_json::json!({
                    "name": span.name, "ph": "X", "ts": us(span.start),
                    "dur": span.end.saturating_duration_since(span.start).as_secs_f64() * 1e6,
                    "pid": 1, "tid": 2, "args": {"step": step + 1}
                }));
            }
            let Some(first) = records.iter().min_by(|a, b| a.start_ns.total_cmp(&b.start_ns)) else {
                continue;
            };
            let anchor = s
                .trace
                .spans
                .iter()
                .find(|p| p.name == first.phase)
                .map_or(us(s.start), |p| us(p.start));
            for r in records {
                events.push(serde_json::json!({
                    "name": kernel_name(r), "ph": "X",
                    "ts": anchor + (r.start_ns - first.start_ns) * 1e-3,
                    "dur": (r.end_ns - r.start_ns) * 1e-3,
                    "pid": 1, "tid": 3,
                    "args": {"label": r.label.as_deref(), "phase": r.phase, "groups": r.groups, "flops": r.work.flops, "bytes": r.work.bytes}
                }));
            }
        }
        for (tid, name) in [(1, "host: steps"), (2, "host: phases"), (3, "GPU: kernels")] {
            events.push(serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}));
        }
        events.push(serde_json::json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "wgtrain"}}));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }
}

#[cfg(test)]
mod module_tests {
    use super::module_of;

    #[test]
    fn a_launchs_module_is_its_label_without_a_parameters_or_gradients_suffix() {
        assert_eq!(module_of("transformer.h.0.mlp.c_fc.weight.grad"), "transformer.h.0.mlp.c_fc");
        assert_eq!(module_of("transformer.h.0.ln_1.weight"), "transformer.h.0.ln_1");
        assert_eq!(module_of("transformer.h.1.attn.dqkv"), "transformer.h.1.attn");
        assert_eq!(module_of("layers.0.weight.exp_avg_sq"), "layers.0");
        assert_eq!(module_of("transformer.h.0.mlp.act.dx"), "transformer.h.0.mlp.act");
        assert_eq!(module_of("lm_head"), "lm_head");
    }
}
