//! The plan before running: the memory estimate (`wgtrain estimate`) and the fit to a
//! budget (`memory.fit`, `memory.checkpoint = "auto"`).
//!
//! The estimate is a dry run of two training steps through the trainer's own code path
//! on a bookkeeping-only allocator (see `memory::allocator`'s dry mode): every tensor
//! the real step would allocate is allocated, split, cached and freed in the same
//! order, with the same page policy, but no device memory is touched and no kernel is
//! recorded. Two steps, because the optimizer's state appears in the first step only
//! after backward has freed the activations; from the second step on it lives through
//! the whole step. The model states are also given by the formulas (ZeRO paper,
//! section 3.1: parameters, gradients and optimizer states of Psi elements) as a check.
//! Evaluation is not part of the estimate (it runs without gradients, under the peak).
//!
//! May call: `device`, `error`, `memory`, `runtime`, `train::{build, config, error,
//! step, trainer}`; never `train::run`. Called by: `train::open`, the CLI, tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::autograd::Params;
use crate::device::Gpu;
use crate::error::Error;
use crate::memory::{AllocatorOptions, Category, MemoryCap, format_bytes};
use crate::nn::{Builder, Init};
use crate::runtime::Runtime;
use crate::train::build::{Loaded, load_data_for_estimate, resolve_precision};
use crate::train::config::{Checkpointing, Choice, Config, ConfigError, Offload, OptimizerKind, Precision};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;
use wgtrain_record::{PeakView, StepMemory, WhatIf};

/// Model states from the formulas, in bytes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelStates {
    /// Parameter elements.
    pub elements: u64,
    /// 4 bytes per f32 master weight.
    pub parameters: u64,
    /// 4 bytes per f32 gradient.
    pub gradients: u64,
    /// AdamW: two f32 moments (8 bytes); SGD: one momentum buffer (4 bytes).
    pub optimizer_state: u64,
}

/// What one step will need.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    /// "fp32" or "fp16-mixed".
    pub precision: String,
    /// Examples per optimizer step.
    pub batch_size: usize,
    /// Examples per forward/backward.
    pub micro_batch_size: usize,
    /// GPT blocks: one in every N is recomputed in backward (0: none).
    pub checkpoint_every: usize,
    /// Peak bytes in live blocks during a step (torch.cuda.max_memory_allocated).
    pub peak_bytes: u64,
    /// Peak bytes in pages (torch.cuda.max_memory_reserved): what the device must hold.
    pub peak_reserved_bytes: u64,
    /// What the peak is made of: bytes per category at the moment of the peak.
    pub by_category: BTreeMap<String, u64>,
    /// Each category's own peak (they need not coincide).
    pub category_peaks: BTreeMap<String, u64>,
    /// The formulas' model states (per device: ZeRO's shards on a multi-device run).
    pub model_states: ModelStates,
    /// A multi-device run: each device's peak allocated bytes, in rank order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_peaks: Vec<u64>,
    /// A multi-device run with offload: host memory by category (every device's
    /// offloaded state together), as its step lines' `mem.host` will say.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub host_bytes: BTreeMap<String, u64>,
    /// What is alive at the peak, largest first: the dashboard's peak view of the
    /// step with the highest peak (rank 0's on a multi-device run).
    pub at_peak: PeakView,
    /// The activation category's own peak per example of a forward pass on device 0:
    /// what forward saves for backward per image or sequence.
    pub activation_per_example: u64,
    /// The memory of the adapter it was made for, where the backend says (a device's
    /// whole memory, not what other programs leave free).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_bytes: Option<u64>,
    /// Whether the peak reserved bytes fit that memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fits_device: Option<bool>,
}

impl Estimate {
    /// A readable table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "estimate: {}, batch {} in micro-batches of {}, checkpointing {}\n",
            self.precision,
            self.batch_size,
            self.micro_batch_size,
            match self.checkpoint_every {
                0 => "none".to_string(),
                1 => "every layer".to_string(),
                k => format!("one block in {k}"),
            }
        );
        out += &format!("  {:<16} {:>12} {:>12}\n", "category", "at peak", "own peak");
        for (name, bytes) in &self.by_category {
            out += &format!(
                "  {:<16} {:>12} {:>12}\n",
                name,
                format_bytes(*bytes),
                format_bytes(self.category_peaks.get(name).copied().unwrap_or(0))
            );
        }
        out += &format!("  {:<16} {:>12}\n", "peak allocated", format_bytes(self.peak_bytes));
        out += &format!("  {:<16} {:>12}\n", "peak reserved", format_bytes(self.peak_reserved_bytes));
        if let Some(mem) = self.device_memory_bytes {
            out += &if self.peak_reserved_bytes <= mem {
                format!(
                    "  fits this adapter's {} ({} to spare)\n",
                    format_bytes(mem),
                    format_bytes(mem - self.peak_reserved_bytes)
                )
            } else {
                format!(
                    "  does NOT fit this adapter's {}: {} over; `wgtrain estimate --memory {}` says which change fits\n",
                    format_bytes(mem),
                    format_bytes(self.peak_reserved_bytes - mem),
                    format_bytes(mem).replace(' ', "")
                )
            };
        }
        out += &format!(
            "  saved activations: {} an example of a forward pass\n",
            format_bytes(self.activation_per_example)
        );
        if !self.device_peaks.is_empty() {
            let peaks: Vec<String> = self.device_peaks.iter().map(|b| format_bytes(*b)).collect();
            out += &format!("  {:<16} {}\n", "peak per device", peaks.join(", "));
        }
        for (name, bytes) in &self.host_bytes {
            out += &format!("  {:<16} {:>12}\n", format!("host {name}"), format_bytes(*bytes));
        }
        let m = &self.model_states;
        out += &format!(
            "  model states by formula: {} parameters -> {} weights + {} gradients + {} optimizer state",
            m.elements,
            format_bytes(m.parameters),
            format_bytes(m.gradients),
            format_bytes(m.optimizer_state)
        );
        let blocks = &self.at_peak.blocks;
        if !blocks.is_empty() {
            out += &format!("\n  largest of the {} blocks alive at the peak:", blocks.len());
            for b in blocks.iter().take(TABLE_BLOCKS) {
                out += &format!(
                    "\n  {:>12}  {:<16} {} ({})",
                    format_bytes(b.size),
                    b.category.name(),
                    b.label,
                    b.phase
                );
            }
        }
        out
    }
}

/// Blocks alive at the peak that the estimate's table lists (the JSON has them all).
const TABLE_BLOCKS: usize = 8;

/// A bookkeeping-only runtime on `gpu` (no cap: the estimate says what is needed).
pub fn dry_runtime(gpu: Arc<Gpu>) -> Result<Arc<Runtime>, Error> {
    Ok(Arc::new(Runtime::new(
        gpu,
        AllocatorOptions {
            debug: Some(false),
            cap: None,
            dry: true,
        },
    )?))
}

/// Estimates one step of `config` on the dry runtime `rt` (reused across estimates so
/// that pipelines compile once).
pub fn estimate_on(rt: &Arc<Runtime>, config: &Config, data: &Loaded) -> Result<Estimate, TrainError> {
    if rt.runs_kernels() {
        return Err(Error::invalid("estimate", "needs a dry runtime").into());
    }
    rt.alloc.empty_cache();
    let batch = data.first_batch(config.train.batch_size)?;
    let mut trainer = Trainer::assemble(config.clone(), rt.clone(), data.clone())?;
    // A multi-device run: rank 0's peak (its shards are the largest), beside dry peers.
    if config.parallel.enabled() {
        let peers = (1..config.parallel.world())
            .map(|_| rt.dry_beside().map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        trainer.join(peers)?;
    }
    let mut best: Option<(u64, [u64; Category::ALL.len()])> = None;
    let mut reserved = 0u64;
    let mut own = [0u64; Category::ALL.len()];
    let mut device_peaks = vec![0u64; trainer.world_size()];
    let mut peak_view = PeakView::default();
    for step in 0..2 {
        let rts = trainer.runtimes();
        rts.iter().for_each(|r| r.alloc.reset_peaks());
        drop(rt.alloc.take_events());
        let start_us = rt.alloc.now_us();
        trainer.train_step(&batch, config.train.lr)?;
        let (events, dropped) = rt.alloc.take_events();
        let view = StepMemory::from_events(step, start_us, rt.alloc.now_us(), &events, dropped, rt.alloc.snapshot_pages()).peak();
        if view.peak_bytes > peak_view.peak_bytes {
            peak_view = view;
        }
        for (peak, r) in device_peaks.iter_mut().zip(&rts) {
            *peak = (*peak).max(r.alloc.stats().allocated.peak);
        }
        let s = rt.alloc.stats();
        if best.is_none_or(|(p, _)| s.allocated.peak > p) {
            best = Some((s.allocated.peak, s.at_peak));
        }
        reserved = reserved.max(s.reserved.peak);
        for (i, c) in s.by_category.iter().enumerate() {
            own[i] = own[i].max(c.allocated.peak);
        }
    }
    let (peak, at_peak) = best.expect("two steps ran");
    let elements = trainer.parameter_count() as u64;
    // ZeRO: rank 0's shards (the largest) of the sharded states.
    let shards = trainer.shards();
    let owned = shards.owned(0) as u64;
    let zero = if config.parallel.enabled() { config.parallel.zero } else { 0 };
    let micro = config
        .train
        .micro_batch_size
        .unwrap_or(config.train.batch_size)
        .min(config.train.batch_size);
    // Examples in one forward pass of device 0: its share of the batch, then the
    // micro-batch within it.
    let share = config.train.batch_size.div_ceil(trainer.world_size());
    let forward_examples = config.train.micro_batch_size.map_or(share, |m| m.min(share));
    let estimate = Estimate {
        precision: config.memory.precision.name().into(),
        batch_size: config.train.batch_size,
        micro_batch_size: micro,
        checkpoint_every: config.memory.checkpoint_every(),
        peak_bytes: peak,
        peak_reserved_bytes: reserved,
        by_category: Category::ALL.iter().map(|c| (c.name().to_string(), at_peak[c.index()])).collect(),
        category_peaks: Category::ALL.iter().map(|c| (c.name().to_string(), own[c.index()])).collect(),
        model_states: ModelStates {
            elements,
            parameters: if config.parallel.enabled() && config.parallel.offload == Offload::OptimizerParameters {
                0
            } else {
                4 * if zero >= 3 { owned } else { elements }
            },
            gradients: 4 * if zero >= 2 { owned } else { elements },
            // Offloaded optimizer state lives in host memory, not on the device.
            optimizer_state: if config.parallel.enabled() && config.parallel.offload != Offload::None {
                0
            } else {
                let rule = crate::train::build::optimizer_rule(config);
                rule.state_bytes_all((0..shards.numels.len()).map(|i| {
                    (
                        shards.numels[i],
                        if zero >= 1 { shards.range(i, 0).len() } else { shards.numels[i] },
                    )
                }))
            },
        },
        device_peaks: if trainer.world_size() > 1 { device_peaks } else { Vec::new() },
        host_bytes: host_bytes(config, elements, &shards),
        at_peak: peak_view,
        activation_per_example: own[Category::Activation.index()] / forward_examples.max(1) as u64,
        device_memory_bytes: rt.gpu.report.memory_bytes,
        fits_device: rt.gpu.report.memory_bytes.map(|m| reserved <= m),
    };
    drop(trainer);
    rt.alloc.empty_cache();
    Ok(estimate)
}

/// What a run with offload keeps in host memory, every device's shards together: the
/// optimizer's state (8-bit AdamW's moments a byte an element and an f32 a block) and,
/// offloading parameters, the f32 weights.
fn host_bytes(config: &Config, elements: u64, shards: &crate::parallel::Shards) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let p = &config.parallel;
    if p.enabled() && p.offload != Offload::None {
        let rule = crate::train::build::optimizer_rule(config);
        let state = (0..shards.numels.len())
            .flat_map(|i| (0..shards.world).map(move |r| (i, r)))
            .map(|(i, r)| rule.host_state_bytes_of(shards.numels[i], shards.range(i, r).len()))
            .sum();
        out.insert(Category::OptimizerState.name().to_string(), state);
        if p.offload == Offload::OptimizerParameters {
            out.insert(Category::Parameter.name().to_string(), 4 * elements);
        }
    }
    out
}

/// `wgtrain estimate`: loads the data, opens the adapter, applies the precision rule and
/// any fit, and estimates the resulting run. Returns the notes of the plan too.
pub fn estimate(config: Config, adapter: Option<&str>) -> Result<(Estimate, Vec<String>), TrainError> {
    let gpu = Arc::new(Gpu::open(adapter).map_err(Error::from)?);
    estimate_with(config, gpu)
}

/// [`estimate`] on `gpu`: an opened adapter, or a stand-in for a described one
/// (`device::described`).
pub fn estimate_with(config: Config, gpu: Arc<Gpu>) -> Result<(Estimate, Vec<String>), TrainError> {
    let (data, stand_in) = load_data_for_estimate(&config)?;
    let (config, mut notes) = resolve_precision(config, &gpu)?;
    notes.extend(stand_in);
    let (config, fit_notes) = plan(config, &gpu, &data)?;
    notes.extend(fit_notes);
    let rt = dry_runtime(gpu)?;
    Ok((estimate_on(&rt, &config, &data)?, notes))
}

/// Whether a run of `config` fits `limit` bytes on `gpu` (a stand-in with that memory):
/// its estimate, the plan's notes, and every single change of its memory settings with
/// its estimated peak and whether that fits (the what-if table).
pub fn fit_report(config: Config, gpu: Arc<Gpu>, limit: u64) -> Result<(Estimate, Vec<String>, Vec<WhatIf>), TrainError> {
    let (data, stand_in) = load_data_for_estimate(&config)?;
    let (config, mut notes) = resolve_precision(config, &gpu)?;
    notes.extend(stand_in);
    let (config, fit_notes) = plan(config, &gpu, &data)?;
    notes.extend(fit_notes);
    let rt = dry_runtime(gpu)?;
    let estimate = estimate_on(&rt, &config, &data)?;
    let options = what_if(&config, &rt, &data, Some(limit))?;
    Ok((estimate, notes, options))
}

/// The bound a plan must fit: `memory.budget`, else `memory.cap`, else 90% of the
/// device's memory (for `checkpoint = "auto"` alone).
fn bound(config: &Config, gpu: &Gpu) -> Result<Option<(u64, String)>, TrainError> {
    let resolve = |text: &str, what: &str| -> Result<(u64, String), TrainError> {
        let cap = MemoryCap::parse(text).map_err(Error::from)?;
        Ok((cap.resolve(gpu.usable_memory()).map_err(Error::from)?, format!("{what} {text}")))
    };
    if let Some(b) = &config.memory.budget {
        return Ok(Some(resolve(b, "memory.budget")?));
    }
    if let Some(c) = &config.memory.cap {
        return Ok(Some(resolve(c, "memory.cap")?));
    }
    Ok(gpu
        .usable_memory()
        .map(|m| (m / 10 * 9, "90% of the device's memory for this process".to_string())))
}

/// Checkpointing choices from least to most: none, then one block in 4, in 2, every one.
fn checkpoint_choices(n_layer: usize) -> Vec<usize> {
    let mut v = vec![0];
    for k in [4, 2] {
        if n_layer >= k {
            v.push(k);
        }
    }
    v.push(1);
    v
}

/// How many segments the model offers to checkpointing (it is built once on the dry
/// runtime `rt` to say).
fn segments_of(rt: &Runtime, config: &Config, data: &Loaded) -> Result<usize, TrainError> {
    let mut params = Params::default();
    let model = (data.model)(&mut Builder::new(rt, &mut params, &mut Init::new(config.train.seed)))?;
    Ok(model.checkpoint_segments())
}

fn checkpoint_name(k: usize) -> String {
    Checkpointing::every_k(k).to_string()
}

/// ZeRO stage and offload pairs from least to most memory saved per device, in the
/// order a fit tries them: every stage without offload, then the optimizer offloaded
/// (stages 1-3), then the parameters too (stage 3).
const STAGES: [(u8, Offload); 8] = [
    (0, Offload::None),
    (1, Offload::None),
    (2, Offload::None),
    (3, Offload::None),
    (1, Offload::Optimizer),
    (2, Offload::Optimizer),
    (3, Offload::Optimizer),
    (3, Offload::OptimizerParameters),
];

/// The stage and offload pairs a fit of `config` may choose: with several devices, those
/// that keep at least the configured stage and offload (`STAGES`' order); else only the
/// configured one.
fn stage_choices(config: &Config) -> Vec<(u8, Offload)> {
    let p = &config.parallel;
    if !(p.enabled() && config.memory.fit) {
        return vec![(p.zero, p.offload)];
    }
    STAGES
        .iter()
        .filter(|(z, o)| *z >= p.zero && o.level() >= p.offload.level())
        .copied()
        .collect()
}

/// Resolves `memory.fit` and `memory.checkpoint = "auto"`: tries micro-batches from the
/// largest down (halving; the batch is kept through accumulation) and, for each, the
/// least checkpointing first, and keeps the first whose estimated peak reserved memory
/// fits the bound. With several devices a fit also chooses the ZeRO stage and offload
/// (`stage_choices`): for each micro-batch, each offload level in turn, and within it
/// the least checkpointing with each stage before more checkpointing; the bound is each
/// device's and the first device's estimate is the largest (its shards are). Without fit
/// the micro-batch (and stage) are kept; with an explicit checkpoint setting,
/// checkpointing is kept. Returns the config to run and what was chosen.
pub fn plan(mut config: Config, gpu: &Arc<Gpu>, data: &Loaded) -> Result<(Config, Vec<String>), TrainError> {
    let auto = config.memory.checkpoint_auto();
    let fit = config.memory.fit;
    if !fit && !auto {
        return Ok((config, Vec::new()));
    }
    let Some((limit, what)) = bound(&config, gpu)? else {
        return Err(ConfigError::Invalid(
            "memory.checkpoint = \"auto\" needs memory.budget or memory.cap: this adapter does not report its memory size".into(),
        )
        .into());
    };
    let batch = config.train.batch_size;
    let per_device = batch / config.parallel.world().max(1);
    let micro_now = config.train.micro_batch_size.unwrap_or(per_device).min(per_device);
    let micros: Vec<usize> = if fit {
        std::iter::successors(Some(per_device), |&m| (m > 1).then_some(m / 2)).collect()
    } else {
        vec![micro_now]
    };
    let rt = dry_runtime(gpu.clone())?;
    let segments = segments_of(&rt, &config, data)?;
    if auto && segments == 0 {
        return Err(ConfigError::Invalid(
            "memory.checkpoint = \"auto\": this model offers no segments to recompute (a transformer's blocks); leave it unset".into(),
        )
        .into());
    }
    let ckpts: Vec<usize> = if segments > 0 && (auto || config.memory.checkpoint.is_none()) {
        checkpoint_choices(segments)
    } else {
        vec![config.memory.checkpoint_every()]
    };
    let stages = stage_choices(&config);
    let several = config.parallel.enabled();
    let mut tried = Vec::new();
    for &micro in &micros {
        for level in 0..3 {
            for &k in &ckpts {
                for (zero, offload) in stages.iter().filter(|(_, o)| o.level() == level) {
                    let mut candidate = config.clone();
                    candidate.train.micro_batch_size = (micro < per_device).then_some(micro);
                    if segments > 0 {
                        candidate.memory.checkpoint = Some(Checkpointing::every_k(k));
                    }
                    candidate.parallel.zero = *zero;
                    candidate.parallel.offload = *offload;
                    let stage = if several {
                        format!(", zero {zero}, offload {}", offload.name())
                    } else {
                        String::new()
                    };
                    let e = estimate_on(&rt, &candidate, data)?;
                    tried.push(format!(
                        "micro-batch {micro}, checkpoint {}{stage}: {}",
                        checkpoint_name(k),
                        format_bytes(e.peak_reserved_bytes)
                    ));
                    if e.peak_reserved_bytes <= limit {
                        let note = format!(
                            "fit to {what}: micro-batch {micro} of {}{}, checkpoint {}{stage}; estimated peak {} allocated, {} reserved{}",
                            if several {
                                format!("{per_device} per device")
                            } else {
                                format!("batch {batch}")
                            },
                            if micro < per_device {
                                format!(" ({} accumulation steps)", per_device.div_ceil(micro))
                            } else {
                                String::new()
                            },
                            checkpoint_name(k),
                            format_bytes(e.peak_bytes),
                            format_bytes(e.peak_reserved_bytes),
                            if several { " on each device" } else { "" }
                        );
                        config = candidate;
                        return Ok((config, vec![note]));
                    }
                }
            }
        }
    }
    Err(ConfigError::Invalid(format!("nothing fits {what} ({}): {}", format_bytes(limit), tried.join("; "))).into())
}

/// The memory settings of `config` as the what-if view shows them.
fn policy_of(config: &Config, segments: usize) -> Result<BTreeMap<String, serde_json::Value>, TrainError> {
    let micro = device_micro_batch(config);
    let mut p = BTreeMap::new();
    p.insert("precision".into(), config.memory.precision.name().into());
    if segments > 0 {
        p.insert("checkpoint".into(), checkpoint_name(config.memory.checkpoint_every()).into());
    }
    p.insert("micro_batch_size".into(), micro.into());
    p.insert("optimizer_in_backward".into(), config.memory.optimizer_in_backward.into());
    if config.parallel.enabled() {
        p.insert("zero".into(), config.parallel.zero.into());
        p.insert("offload".into(), config.parallel.offload.name().into());
    }
    Ok(p)
}

/// The examples of one forward pass on a device: micro-batches split each device's
/// share of the batch.
fn device_micro_batch(config: &Config) -> usize {
    let share = config.train.batch_size.div_ceil(config.parallel.world().max(1));
    config.train.micro_batch_size.unwrap_or(share).min(share)
}

/// The run's config with one memory setting changed at a time (precision, checkpointing,
/// half the micro-batch, optimizer-in-backward, AdamW's state in 8 bits; on several devices ZeRO-3 and ZeRO-3 with
/// both offloads), and fp16-mixed with every segment checkpointed, each with what
/// changed; the run as configured first. Changes the config rules forbid (e.g. optimizer-in-backward with
/// clipping) or the adapter cannot run (fp16 without SHADER_F16) are left out.
fn what_if_configs(config: &Config, gpu: &Gpu, segments: usize) -> Result<Vec<(String, Config)>, TrainError> {
    let mut out = vec![(String::new(), config.clone())];
    let mut with = |change: String, f: &dyn Fn(&mut Config)| {
        let mut c = config.clone();
        f(&mut c);
        if c.validate().is_ok() {
            out.push((change, c));
        }
    };
    match config.memory.precision {
        Precision::Fp32 if gpu.caps.shader_f16 => with("memory.precision = fp16-mixed".into(), &|c| {
            c.memory.precision = Precision::Fp16Mixed;
            c.memory.optimizer_in_backward = false;
        }),
        Precision::Fp16Mixed => with("memory.precision = fp32".into(), &|c| c.memory.precision = Precision::Fp32),
        _ => {}
    }
    if segments > 0 {
        let now = config.memory.checkpoint_every();
        let mut choices = checkpoint_choices(segments);
        choices.retain(|&k| k != now && (k == 0 || k == 1 || now == 0));
        for k in choices {
            with(format!("memory.checkpoint = {}", checkpoint_name(k)), &|c| {
                c.memory.checkpoint = Some(Checkpointing::every_k(k))
            });
        }
    }
    let micro = device_micro_batch(config);
    if micro >= 2 {
        with(format!("train.micro_batch_size = {}", micro / 2), &|c| {
            c.train.micro_batch_size = Some(micro / 2);
            c.memory.optimizer_in_backward = false;
        });
    }
    let oib = !config.memory.optimizer_in_backward;
    with(format!("memory.optimizer_in_backward = {oib}"), &|c| {
        c.memory.optimizer_in_backward = oib
    });
    if config.train.optimizer == OptimizerKind::Adamw {
        with("train.optimizer = adamw8bit".into(), &|c| {
            c.train.optimizer = OptimizerKind::Adamw8bit
        });
    }
    // Several devices: the sharded stages a fit would reach for last.
    if config.parallel.enabled() && config.parallel.world() > 1 {
        if config.parallel.zero < 3 {
            with("parallel.zero = 3".into(), &|c| c.parallel.zero = 3);
        }
        if config.parallel.offload != Offload::OptimizerParameters {
            with("parallel.zero = 3, parallel.offload = optimizer+parameters".into(), &|c| {
                c.parallel.zero = 3;
                c.parallel.offload = Offload::OptimizerParameters;
            });
        }
    }
    // The two settings that cut activations most, together.
    if config.memory.precision == Precision::Fp32 && gpu.caps.shader_f16 && segments > 0 && config.memory.checkpoint_every() != 1 {
        with("memory.precision = fp16-mixed, memory.checkpoint = every-layer".into(), &|c| {
            c.memory.precision = Precision::Fp16Mixed;
            c.memory.optimizer_in_backward = false;
            c.memory.checkpoint = Some(Checkpointing::every_k(1));
        });
    }
    Ok(out)
}

/// What-if: the estimated peak of `config` (as it runs, after fit) and of each single
/// change of its memory settings, measured against `limit` (the cap, else the device's
/// memory). Each is the exact estimate (a dry run beside `beside`, sharing its kernel
/// cache; dry runs validate kernels without compiling pipelines), so this costs a few
/// dry steps.
pub fn what_if(config: &Config, beside: &Runtime, data: &Loaded, limit: Option<u64>) -> Result<Vec<WhatIf>, TrainError> {
    let rt = Arc::new(beside.dry_beside()?);
    let segments = segments_of(&rt, config, data)?;
    let mut out = Vec::new();
    for (change, candidate) in what_if_configs(config, &beside.gpu, segments)? {
        let e = match estimate_on(&rt, &candidate, data) {
            Ok(e) => e,
            // A change that cannot even be planned (a block past the adapter's binding
            // limit, say) is not an option; the run itself is unaffected.
            Err(e) if !change.is_empty() => {
                tracing::debug!("what-if {change}: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        out.push(WhatIf {
            change,
            policy: policy_of(&candidate, segments)?,
            peak_bytes: e.peak_bytes,
            peak_reserved_bytes: e.peak_reserved_bytes,
            by_category: e.by_category,
            fits: limit.map(|l| e.peak_reserved_bytes <= l),
        });
    }
    Ok(out)
}
