//! The training loop. Each step: upload the batch, forward on a fresh tape, fused
//! cross-entropy, backward (saved activations freed as it goes), clip, schedule,
//! optimizer step, zero_grad, the allocator's step end; then one JSON line with the
//! loss, time and the allocator's counters by category.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::checkpoint::{self, CheckpointData, CheckpointError, HostTensor};
use super::config::{Config, Precision};
use crate::kernels::TensorOps;
use crate::autograd::{Params, Tape, ops};
use crate::data::fashion_mnist::{self, FashionMnist};
use crate::data::text::{self, CharCorpus};
use crate::data::tokens::TokenFile;
use crate::data::{BatchOrder, DataError, Dataset, HostBatch, Loader, batches_per_epoch};
use crate::device::Gpu;
use crate::kernels::optim::{AdamW, Sgd};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::memory::{AllocError, AllocatorOptions, Category, MemoryCap, MemoryStats};
use crate::nn::{Gpt, GptConfig, Init, Mlp};
use crate::optim::{Optimizer, Rule, clip_grad_norm, lr_at};
use crate::scaler::GradScaler;
use crate::tensor::Tensor;

/// Rows of logits per fused cross-entropy launch (and per chunk of the fused head:
/// GPT-2's 50257-wide vocabulary makes a 2048-row chunk 412 MB in f32).
const CE_ROW_CHUNK: usize = 2048;
/// Examples per evaluation batch.
const EVAL_BATCH: usize = 1000;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    /// Data.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Kernels, device or memory.
    #[error(transparent)]
    Kernel(#[from] Error),
    /// Checkpoints.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The log file.
    #[error("writing the log {path}: {source}")]
    Log {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// fp16-mixed asked for on an adapter without f16 shaders.
    #[error(
        "memory.precision = \"fp16-mixed\" needs SHADER_F16, which the adapter '{0}' lacks; use memory.precision = \"fp32\", or set memory.fp32_fallback = true to train in fp32 on such adapters"
    )]
    NoF16(String),
    /// Out of memory even at a micro-batch of one.
    #[error("out of memory at a micro-batch of 1 example: {0}\nlower the model size or raise memory.cap / memory.budget")]
    OutOfMemory(String),
    /// The loss stopped being a number.
    #[error("the loss became {0} at step {1}; lower train.lr or enable train.grad_clip")]
    NonFinite(f32, u64),
}

/// Memory figures of one step's log line.
#[derive(Clone, Debug, Serialize)]
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
}

impl MemLog {
    fn of(s: &MemoryStats) -> MemLog {
        MemLog {
            allocated: s.allocated.current,
            reserved: s.reserved.current,
            peak: s.allocated.peak,
            peak_reserved: s.reserved.peak,
            cap: s.cap,
            by_category: Category::ALL
                .iter()
                .map(|c| (c.name().to_string(), s.category(*c).allocated.current))
                .collect(),
            at_peak: Category::ALL.iter().map(|c| (c.name().to_string(), s.at_peak[c.index()])).collect(),
            fragmentation: s.fragmentation(),
            num_ooms: s.num_ooms,
            num_alloc_retries: s.num_alloc_retries,
        }
    }
}

/// Evaluation results.
#[derive(Clone, Debug, Serialize)]
pub struct EvalLog {
    /// Mean loss over the evaluation split.
    pub loss: f64,
    /// Fraction classified correctly (classifiers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
}

/// The model being trained.
pub enum Model {
    /// A classifier of feature vectors.
    Mlp(Mlp),
    /// A language model of token windows.
    Gpt(Gpt),
}

/// One line of the JSONL log.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepLog {
    /// Steps done (1 after the first).
    pub step: u64,
    /// Epoch of the batch.
    pub epoch: u64,
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
    /// Memory after the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<MemLog>,
    /// The loss scale the step used (fp16-mixed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Whether the step was skipped for an inf or NaN gradient (fp16-mixed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<bool>,
    /// The micro-batch the step ran with, when it accumulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<usize>,
    /// Something that happened during the step (an out-of-memory retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Evaluation, on eval lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalLog>,
}

/// How to run besides the config.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Adapter selector (see `wgtrain devices`).
    pub adapter: Option<String>,
    /// Where to write the JSONL log.
    pub log: Option<PathBuf>,
    /// Checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
    /// Set to stop after the current step (Ctrl-C); a checkpoint is saved if configured.
    pub stop: Option<Arc<AtomicBool>>,
    /// Told about every step with its memory timeline (the dashboard).
    pub observer: Option<Arc<dyn super::observe::Observer>>,
}

/// What a finished run reports.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// Steps done in total (including those before a resume).
    pub steps: u64,
    /// Loss of each step run in this invocation, in order.
    pub losses: Vec<f64>,
    /// The last evaluation.
    pub last_eval: Option<EvalLog>,
    /// Wall time of this invocation.
    pub seconds: f64,
    /// Whether the run stopped early on request.
    pub interrupted: bool,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
}

/// A training run.
pub struct Trainer {
    /// The configuration.
    pub config: Config,
    /// The device and allocator.
    pub rt: Arc<Runtime>,
    /// Model parameters.
    pub params: Params,
    /// The model.
    pub model: Model,
    opt: Optimizer,
    train: Arc<dyn Dataset>,
    eval: Arc<dyn Dataset>,
    /// Unigram entropy of the training text in nats (language models on text).
    pub unigram_entropy: Option<f64>,
    /// The loss scaler (fp16-mixed only).
    pub scaler: Option<GradScaler>,
    /// What `memory.fit` or the fp32 fallback decided, for the user.
    pub notes: Vec<String>,
    step: u64,
    epoch: u64,
    index: u64,
}

fn limit(mut d: FashionMnist, n: usize) -> FashionMnist {
    if n > 0 && n < d.labels.len() {
        d.labels.truncate(n);
        d.images.truncate(n * fashion_mnist::PIXELS);
    }
    d
}

/// Splits a batch into consecutive parts of at most `micro` examples.
fn split_batch(batch: &HostBatch, micro: usize) -> Vec<HostBatch> {
    if micro >= batch.examples {
        return vec![batch.clone()];
    }
    let per = |len: usize| len / batch.examples.max(1);
    let (fe, to, ta) = (per(batch.features.len()), per(batch.tokens.len()), per(batch.targets.len()));
    (0..batch.examples)
        .step_by(micro)
        .map(|start| {
            let end = (start + micro).min(batch.examples);
            HostBatch {
                features: batch.features[start * fe..end * fe].to_vec(),
                tokens: batch.tokens[start * to..end * to].to_vec(),
                targets: batch.targets[start * ta..end * ta].to_vec(),
                examples: end - start,
                position: batch.position,
            }
        })
        .collect()
}

/// A dataset restricted to its first `n` examples (all when n is 0).
struct Limited {
    inner: Arc<dyn Dataset>,
    n: usize,
}

impl Dataset for Limited {
    fn len(&self) -> usize {
        self.n.min(self.inner.len())
    }
    fn push(&self, i: usize, batch: &mut HostBatch) {
        self.inner.push(i, batch)
    }
}

fn limited(inner: Arc<dyn Dataset>, n: usize) -> Arc<dyn Dataset> {
    if n == 0 { inner } else { Arc::new(Limited { inner, n }) }
}

/// Training and evaluation data, the model's output width, and the text's entropy.
pub(crate) type Loaded = (Arc<dyn Dataset>, Arc<dyn Dataset>, usize, Option<f64>);

pub(crate) fn load_data(config: &Config) -> Result<Loaded, TrainError> {
    let m = &config.model;
    let path = config.data.path.clone().map(PathBuf::from);
    Ok(match config.data.kind.as_str() {
        "fashion_mnist" => {
            let dir = path.unwrap_or_else(|| PathBuf::from(fashion_mnist::DEFAULT_PATH));
            let train = limit(FashionMnist::load(&dir, "train")?, config.data.train_limit);
            let eval = limit(FashionMnist::load(&dir, "t10k")?, config.data.eval_limit);
            (Arc::new(train), Arc::new(eval), fashion_mnist::CLASSES, None)
        }
        "chars" => {
            let p = path.unwrap_or_else(|| PathBuf::from(text::DEFAULT_PATH));
            let corpus = CharCorpus::load(&p, m.block_size)?;
            let entropy = corpus.unigram_entropy();
            let vocab = corpus.vocab.len();
            let (train, val) = corpus.split(0.1);
            (
                limited(Arc::new(train), config.data.train_limit),
                limited(Arc::new(val), config.data.eval_limit),
                vocab,
                Some(entropy),
            )
        }
        _ => {
            let dir = path.ok_or_else(|| DataError::Missing {
                what: "token files".into(),
                path: "(data.path unset)".into(),
                hint: String::new(),
            })?;
            let train = TokenFile::open(&dir.join("train.bin"), m.block_size, m.vocab_size)?;
            let val = TokenFile::open(&dir.join("val.bin"), m.block_size, m.vocab_size)?;
            (
                limited(Arc::new(train), config.data.train_limit),
                limited(Arc::new(val), config.data.eval_limit),
                m.vocab_size,
                None,
            )
        }
    })
}

/// Applies `memory.precision`: fp16-mixed needs SHADER_F16; without it the run fails,
/// or trains in fp32 when `memory.fp32_fallback` asks for that (said in a note).
pub(crate) fn resolve_precision(mut config: Config, gpu: &Gpu) -> Result<(Config, Vec<String>), TrainError> {
    let mut notes = Vec::new();
    if config.memory.precision()? == Precision::Fp16Mixed && !gpu.caps.shader_f16 {
        if !config.memory.fp32_fallback {
            return Err(TrainError::NoF16(gpu.report.name.clone()));
        }
        config.memory.precision = Some("fp32".into());
        notes.push(format!(
            "the adapter '{}' lacks SHADER_F16: training in fp32 (memory.fp32_fallback = true)",
            gpu.report.name
        ));
    }
    Ok((config, notes))
}

impl Trainer {
    /// Loads the data, opens the device and builds the model (after `memory.fit` or
    /// `memory.checkpoint = "auto"` chose the micro-batch and checkpointing).
    pub fn new(config: Config, adapter: Option<&str>) -> Result<Trainer, TrainError> {
        // Data first: a missing dataset should not wait for the GPU.
        let data = load_data(&config)?;
        let gpu = Arc::new(Gpu::open(adapter).map_err(Error::from)?);
        let (config, mut notes) = resolve_precision(config, &gpu)?;
        let (config, fit_notes) = super::estimate::plan(config, &gpu, &data)?;
        notes.extend(fit_notes);
        let limit = config.memory.cap.as_ref().or(config.memory.budget.as_ref());
        let cap = match limit {
            Some(text) => Some(MemoryCap::parse(text).map_err(Error::from)?),
            None => None,
        };
        let rt = Arc::new(Runtime::new(
            gpu,
            AllocatorOptions {
                debug: Some(config.memory.debug),
                cap,
                dry: false,
            },
        )?);
        let mut trainer = Trainer::assemble(config, rt, data)?;
        trainer.notes = notes;
        Ok(trainer)
    }

    /// Builds the model and optimizer for `config` on `rt` over loaded data.
    pub(crate) fn assemble(config: Config, rt: Arc<Runtime>, data: Loaded) -> Result<Trainer, TrainError> {
        let (train, eval, vocab, unigram_entropy) = data;
        let mut params = Params::default();
        let mut init = Init::new(config.train.seed);
        let m = &config.model;
        let model = if m.kind == "gpt" {
            let gc = GptConfig {
                vocab_size: vocab,
                n_positions: m.block_size,
                n_embd: m.n_embd,
                n_layer: m.n_layer,
                n_head: m.n_head,
                layer_norm_epsilon: 1e-5,
                activation_function: "gelu_new".into(),
                resid_pdrop: 0.0,
                embd_pdrop: 0.0,
                attn_pdrop: 0.0,
                extra: Default::default(),
            };
            let mut gpt = Gpt::new(&rt, gc, &mut params, &mut init)?;
            gpt.checkpoint_every = config.memory.checkpoint_every()?;
            Model::Gpt(gpt)
        } else {
            let mut sizes = vec![fashion_mnist::PIXELS];
            sizes.extend(&m.hidden);
            sizes.push(vocab);
            Model::Mlp(Mlp::new(&rt, &mut params, &sizes, &mut init)?)
        };
        let t = &config.train;
        let rule = match t.optimizer.as_str() {
            "sgd" => Rule::Sgd(Sgd {
                lr: t.lr,
                momentum: t.momentum,
                dampening: 0.0,
                weight_decay: t.weight_decay,
                nesterov: false,
            }),
            _ => Rule::AdamW(AdamW {
                lr: t.lr,
                betas: t.betas,
                eps: 1e-8,
                weight_decay: t.weight_decay,
            }),
        };
        let scaler = (config.memory.precision()? == Precision::Fp16Mixed).then(|| GradScaler {
            scale: config.memory.init_scale.unwrap_or(crate::scaler::INIT_SCALE),
            ..GradScaler::default()
        });
        Ok(Trainer {
            config,
            rt,
            params,
            model,
            opt: Optimizer::new(rule),
            train,
            eval,
            unigram_entropy,
            scaler,
            notes: Vec::new(),
            step: 0,
            epoch: 0,
            index: 0,
        })
    }

    /// Steps in the whole run.
    pub fn total_steps(&self) -> u64 {
        let per_epoch = batches_per_epoch(self.train.len(), self.config.train.batch_size, false);
        self.config.train.steps.unwrap_or(per_epoch * self.config.train.epochs)
    }

    /// Logits [N, classes] and targets [N] of a batch, on a tape.
    fn forward(&self, tape: &mut Tape, b: &HostBatch) -> Result<(crate::autograd::Var, Tensor), Error> {
        let y = Tensor::from_i32(&self.rt, &b.targets, &[b.targets.len()], Category::Input, "batch.targets")?;
        let logits = match &self.model {
            Model::Mlp(mlp) => {
                let x = Tensor::from_f32(
                    &self.rt,
                    &b.features,
                    &[b.examples, fashion_mnist::PIXELS],
                    Category::Input,
                    "batch.images",
                )?;
                mlp.forward(tape, &self.rt, &self.params, x)?
            }
            Model::Gpt(gpt) => {
                let t = b.tokens.len() / b.examples.max(1);
                let ids = Tensor::from_i32(&self.rt, &b.tokens, &[b.examples, t], Category::Input, "batch.tokens")?;
                gpt.forward(tape, &self.rt, &self.params, &ids)?
            }
        };
        Ok((logits, y))
    }

    /// The mean loss of a batch on a tape. A GPT goes through the fused head +
    /// cross-entropy (never the whole logits); the MLP through logits and the fused loss.
    fn loss(&self, tape: &mut Tape, b: &HostBatch) -> Result<crate::autograd::Var, Error> {
        let rows = b.targets.len();
        if let Model::Gpt(gpt) = &self.model {
            let y = Tensor::from_i32(&self.rt, &b.targets, &[rows], Category::Input, "batch.targets")?;
            let t = b.tokens.len() / b.examples.max(1);
            let ids = Tensor::from_i32(&self.rt, &b.tokens, &[b.examples, t], Category::Input, "batch.tokens")?;
            return gpt.forward_loss(tape, &self.rt, &self.params, &ids, (&y, rows), CE_ROW_CHUNK);
        }
        let (logits, y) = self.forward(tape, b)?;
        ops::cross_entropy_mean(tape, &self.rt, &logits, &y, rows, CE_ROW_CHUNK, "loss")
    }

    /// Forward and backward over `batch`, in micro-batches of `train.micro_batch_size`
    /// examples when set: each micro-batch's mean loss is weighted by its share of the
    /// batch's targets (the backward seed), so the accumulated gradients equal the whole
    /// batch's. Returns the batch's mean loss; gradients are left in `params`.
    pub fn compute_gradients(&mut self, batch: &HostBatch) -> Result<f64, TrainError> {
        let micro = match self.config.train.micro_batch_size {
            Some(m) if m > 0 && m < batch.examples => m,
            _ => batch.examples,
        };
        let total_targets = batch.targets.len().max(1);
        let mut loss_sum = 0.0f64;
        for part in split_batch(batch, micro) {
            let rows = part.targets.len();
            let weight = rows as f32 / total_targets as f32;
            let seed = weight * self.scaler.as_ref().map_or(1.0, |s| s.scale);
            let mut tape = self.tape().with_grad_prescale(seed);
            let loss = self.loss(&mut tape, &part)?;
            tape.backward_with(&self.rt, &loss, seed, &mut self.params)?;
            loss_sum += loss.value.to_f32_vec(&self.rt)?[0] as f64 * weight as f64;
        }
        Ok(loss_sum)
    }

    /// A tape in the run's precision.
    fn tape(&self) -> Tape {
        Tape::new().with_half_matmuls(self.scaler.is_some())
    }

    /// One training step on `batch`; returns the loss and, under fp16-mixed, whether
    /// the step was skipped for a non-finite gradient. Gradients are unscaled before
    /// clipping, and the scale is updated after the step (torch.amp.GradScaler's order).
    pub(super) fn train_step(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        if self.config.memory.optimizer_in_backward {
            return Ok((self.train_step_in_backward(batch, lr)?, false));
        }
        let loss = self.compute_gradients(batch)?;
        let mut skipped = false;
        if let Some(scaler) = &self.scaler {
            skipped = scaler.unscale(&self.rt, &self.params)?;
        } else if !loss.is_finite() {
            return Err(TrainError::NonFinite(loss as f32, self.step + 1));
        }
        if !skipped {
            if self.config.train.grad_clip > 0.0 {
                clip_grad_norm(&self.rt, &self.params, self.config.train.grad_clip)?;
            }
            self.opt.step(&self.rt, &self.params, lr)?;
        }
        if let Some(scaler) = &mut self.scaler {
            scaler.update(skipped);
        }
        self.params.zero_grad();
        Ok((loss, skipped))
    }

    /// One step that survives running out of memory: on an out-of-memory error the
    /// cache is emptied and the step retried; if it fails again the micro-batch is
    /// halved (the effective batch stays, through accumulation) until it fits.
    /// Returns the loss, whether it was skipped, and what happened.
    fn resilient_step(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool, Option<String>), TrainError> {
        let mut events: Vec<String> = Vec::new();
        let mut retried = false;
        loop {
            match self.train_step(batch, lr) {
                Ok((loss, skipped)) => return Ok((loss, skipped, (!events.is_empty()).then(|| events.join("; ")))),
                Err(TrainError::Kernel(Error::Alloc(AllocError::OutOfMemory(report)))) => {
                    // No gradient of the failed attempt may leak into the retry.
                    self.params.zero_grad();
                    // Let the device finish what was recorded so the pages really go.
                    let _ = self.rt.sync();
                    let freed = self.rt.alloc.empty_cache();
                    let micro = self.config.train.micro_batch_size.unwrap_or(batch.examples).min(batch.examples);
                    if !retried {
                        retried = true;
                        events.push(format!(
                            "out of memory; emptied the cache ({}) and retried",
                            crate::memory::format_bytes(freed)
                        ));
                        tracing::warn!("step {}: {}", self.step + 1, events.last().expect("just pushed"));
                        continue;
                    }
                    if micro <= 1 || self.config.memory.optimizer_in_backward {
                        return Err(TrainError::OutOfMemory(report.to_string()));
                    }
                    let half = micro / 2;
                    self.config.train.micro_batch_size = Some(half);
                    events.push(format!("out of memory again; micro-batch halved from {micro} to {half}"));
                    tracing::warn!("step {}: {}", self.step + 1, events.last().expect("just pushed"));
                    retried = false;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A step whose updates happen inside backward: each parameter is updated as soon as
    /// its gradient is final, and the gradient is freed at once.
    fn train_step_in_backward(&mut self, batch: &HostBatch, lr: f32) -> Result<f64, TrainError> {
        let mut tape = self.tape();
        let loss = self.loss(&mut tape, batch)?;
        self.opt.begin_step(&self.rt, self.params.list.len())?;
        let opt = &mut self.opt;
        let mut apply = |rt: &Runtime, i: usize, p: &mut crate::autograd::Param| -> Result<(), Error> {
            opt.update_param(rt, i, p, lr)?;
            p.grad = None;
            Ok(())
        };
        tape.backward_with_hook(&self.rt, &loss, 1.0, &mut self.params, &mut apply)?;
        let value = loss.value.to_f32_vec(&self.rt)?[0] as f64;
        if !value.is_finite() {
            return Err(TrainError::NonFinite(value as f32, self.step + 1));
        }
        Ok(value)
    }

    /// Loss (and accuracy, for classifiers) over the evaluation split, without gradients.
    /// Out of memory halves the evaluation batch (after emptying the cache) until it fits.
    pub fn evaluate(&self) -> Result<EvalLog, TrainError> {
        let mut batch = match self.model {
            Model::Mlp(_) => EVAL_BATCH,
            Model::Gpt(_) => self.config.train.micro_batch_size.unwrap_or(self.config.train.batch_size),
        };
        loop {
            match self.evaluate_in(batch) {
                Err(TrainError::Kernel(Error::Alloc(AllocError::OutOfMemory(_)))) if batch > 1 => {
                    let _ = self.rt.sync();
                    self.rt.alloc.empty_cache();
                    batch /= 2;
                    tracing::warn!("evaluation ran out of memory; evaluation batch halved to {batch}");
                }
                other => return other,
            }
        }
    }

    fn evaluate_in(&self, batch: usize) -> Result<EvalLog, TrainError> {
        let n = self.eval.len();
        let (mut loss_sum, mut count, mut correct) = (0.0f64, 0usize, 0usize);
        for start in (0..n).step_by(batch) {
            let mut b = HostBatch::default();
            for i in start..(start + batch).min(n) {
                self.eval.push(i, &mut b);
                b.examples += 1;
            }
            let mut tape = Tape::no_grad().with_half_matmuls(self.scaler.is_some());
            let rows = b.targets.len();
            if let Model::Gpt(_) = self.model {
                let loss = self.loss(&mut tape, &b)?;
                loss_sum += loss.value.to_f32_vec(&self.rt)?[0] as f64 * rows as f64;
                count += rows;
                continue;
            }
            let (logits, y) = self.forward(&mut tape, &b)?;
            let loss = ops::cross_entropy_mean(&mut tape, &self.rt, &logits, &y, rows, CE_ROW_CHUNK, "eval.loss")?;
            loss_sum += loss.value.to_f32_vec(&self.rt)?[0] as f64 * rows as f64;
            count += rows;
            {
                let classes = logits.value.shape()[1];
                let values = logits.value.to_f32_vec(&self.rt)?;
                for (r, &t) in b.targets.iter().enumerate() {
                    let row = &values[r * classes..(r + 1) * classes];
                    let best = row
                        .iter()
                        .enumerate()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    correct += usize::from(best as i32 == t);
                }
            }
        }
        let accuracy = matches!(self.model, Model::Mlp(_)).then(|| correct as f64 / count.max(1) as f64);
        Ok(EvalLog {
            loss: loss_sum / count.max(1) as f64,
            accuracy,
        })
    }

    fn checkpoint_data(&self) -> Result<CheckpointData, TrainError> {
        let mut model = Vec::new();
        let mut optimizer = Vec::new();
        for (i, p) in self.params.list.iter().enumerate() {
            model.push(HostTensor {
                name: p.name.clone(),
                shape: p.value.shape().to_vec(),
                data: p.value.to_f32_vec(&self.rt)?,
            });
            if let Some(Some((m, v))) = self.opt.state.get(i) {
                let names = self.opt.state_names(&p.name);
                optimizer.push(HostTensor {
                    name: names[0].clone(),
                    shape: m.shape().to_vec(),
                    data: m.to_f32_vec(&self.rt)?,
                });
                if matches!(self.opt.rule, Rule::AdamW(_)) {
                    optimizer.push(HostTensor {
                        name: names[1].clone(),
                        shape: v.shape().to_vec(),
                        data: v.to_f32_vec(&self.rt)?,
                    });
                }
            }
        }
        let trainer = BTreeMap::from([
            ("epoch".to_string(), self.epoch.to_string()),
            ("batch_index".to_string(), self.index.to_string()),
            ("optimizer_step".to_string(), self.opt.step.to_string()),
            ("seed".to_string(), self.config.train.seed.to_string()),
            ("config".to_string(), toml::to_string(&self.config).unwrap_or_default()),
        ]);
        let mut trainer = trainer;
        if let Some(sc) = &self.scaler {
            trainer.insert("loss_scale".into(), sc.scale.to_string());
            trainer.insert("scaler_growth_tracker".into(), sc.growth_tracker.to_string());
        }
        Ok(CheckpointData { model, optimizer, trainer })
    }

    /// Saves a checkpoint of the current state into `dir`.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, TrainError> {
        let data = self.checkpoint_data()?;
        Ok(checkpoint::save(dir, self.step, &data)?)
    }

    /// Restores parameters, optimizer state and data position from a checkpoint.
    pub fn restore(&mut self, path: &Path) -> Result<u64, TrainError> {
        let (step, data) = checkpoint::load(path)?;
        let mismatch = |reason: String| CheckpointError::Mismatch {
            path: path.display().to_string(),
            reason,
        };
        if data.model.len() != self.params.list.len() {
            return Err(mismatch(format!("{} parameters, the model has {}", data.model.len(), self.params.list.len())).into());
        }
        for t in &data.model {
            let i = self
                .params
                .find(&t.name)
                .ok_or_else(|| mismatch(format!("unknown parameter {}", t.name)))?;
            if self.params.list[i].value.shape() != t.shape.as_slice() {
                return Err(mismatch(format!(
                    "{} is {:?}, the model has {:?}",
                    t.name,
                    t.shape,
                    self.params.list[i].value.shape()
                ))
                .into());
            }
            self.params.list[i].value = Tensor::from_f32(&self.rt, &t.data, &t.shape, Category::Parameter, &t.name)?;
        }
        let get = |k: &str| -> Result<u64, CheckpointError> {
            data.trainer
                .get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| CheckpointError::Corrupt {
                    path: path.display().to_string(),
                    reason: format!("trainer state lacks {k}"),
                })
        };
        self.epoch = get("epoch")?;
        self.index = get("batch_index")?;
        self.opt.step = get("optimizer_step")? as u32;
        if let Some(sc) = &mut self.scaler {
            // A checkpoint from an fp32 run starts the scaler fresh.
            if let (Some(scale), Some(tracker)) = (data.trainer.get("loss_scale"), data.trainer.get("scaler_growth_tracker")) {
                sc.scale = scale
                    .parse()
                    .map_err(|_| mismatch(format!("loss_scale '{scale}' is not a number")))?;
                sc.growth_tracker = tracker
                    .parse()
                    .map_err(|_| mismatch(format!("scaler_growth_tracker '{tracker}' is not a number")))?;
            }
        }
        self.opt.state = (0..self.params.list.len()).map(|_| None).collect();
        let by_name: BTreeMap<&str, &HostTensor> = data.optimizer.iter().map(|t| (t.name.as_str(), t)).collect();
        for (i, p) in self.params.list.iter().enumerate() {
            let names = self.opt.state_names(&p.name);
            if let Some(m) = by_name.get(names[0].as_str()) {
                let m = Tensor::from_f32(&self.rt, &m.data, &m.shape, Category::OptimizerState, &names[0])?;
                let v = match by_name.get(names[1].as_str()) {
                    Some(v) => Tensor::from_f32(&self.rt, &v.data, &v.shape, Category::OptimizerState, &names[1])?,
                    None => m.clone(),
                };
                self.opt.state[i] = Some((m, v));
            }
        }
        self.step = step;
        Ok(step)
    }

    /// Runs to the configured end (or until asked to stop).
    pub fn run(&mut self, options: &RunOptions) -> Result<RunSummary, TrainError> {
        if let Some(path) = &options.resume {
            self.restore(path)?;
        }
        let started = Instant::now();
        let total = self.total_steps();
        let mut log = match &options.log {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| TrainError::Log {
                        path: path.display().to_string(),
                        source: e,
                    })?,
            )),
            None => None,
        };
        let log_path = options.log.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let mut write = |line: &StepLog| -> Result<(), TrainError> {
            if let Some(w) = log.as_mut() {
                let text = serde_json::to_string(line).expect("log lines serialize");
                writeln!(w, "{text}").and_then(|_| w.flush()).map_err(|e| TrainError::Log {
                    path: log_path.clone(),
                    source: e,
                })?;
            }
            Ok(())
        };
        let t = self.config.train.clone();
        let per_epoch = batches_per_epoch(self.train.len(), t.batch_size, false);
        let order = BatchOrder {
            batch: t.batch_size,
            seed: t.seed,
            shuffle: true,
            drop_last: false,
        };
        let mut loader = Loader::start(self.train.clone(), order, (self.epoch, self.index), 2);
        let observer = options.observer.clone();
        if let Some(o) = &observer {
            o.start(super::observe::RunInfo {
                device: serde_json::to_value(&self.rt.gpu.report).unwrap_or_default(),
                config: serde_json::to_value(&self.config).unwrap_or_default(),
                parameters: self.params.numel() as u64,
                total_steps: total,
                notes: self.notes.clone(),
                cap: self.rt.alloc.stats().cap,
            });
            // The first step's timeline starts from an empty trace.
            self.rt.alloc.take_events();
        }
        let bar = options.progress.then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
                    .expect("a valid template"),
            );
            bar.set_position(self.step);
            bar
        });
        let ckpt_dir = self.config.checkpoint.dir.as_ref().map(PathBuf::from);
        let mut summary = RunSummary {
            steps: self.step,
            losses: Vec::new(),
            last_eval: None,
            seconds: 0.0,
            interrupted: false,
            checkpoint: None,
        };
        while self.step < total {
            if options.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                summary.interrupted = true;
                break;
            }
            let Some(batch) = loader.next_batch() else { break };
            let lr = lr_at(self.step, t.lr, t.warmup_steps, total, t.min_lr, t.schedule == "cosine");
            self.rt.alloc.reset_peaks();
            let step_start_us = self.rt.alloc.now_us();
            let step_start = Instant::now();
            let scale = self.scaler.as_ref().map(|s| s.scale as f64);
            let (loss, skipped, event) = self.resilient_step(&batch, lr)?;
            if let (Some(bar), Some(e)) = (&bar, &event) {
                bar.println(format!("step {}: {e}", self.step + 1));
            }
            let guard = self.rt.alloc.end_step();
            let step_s = step_start.elapsed().as_secs_f64();
            guard.map_err(Error::from)?;
            self.step += 1;
            (self.epoch, self.index) = if batch.position.1 + 1 >= per_epoch {
                (batch.position.0 + 1, 0)
            } else {
                (batch.position.0, batch.position.1 + 1)
            };
            summary.losses.push(loss);
            let stats = self.rt.alloc.stats();
            let line = StepLog {
                step: self.step,
                epoch: batch.position.0,
                loss: Some(loss),
                lr: Some(lr as f64),
                step_ms: Some(step_s * 1e3),
                samples_per_s: Some(batch.examples as f64 / step_s),
                mem: Some(MemLog::of(&stats)),
                scale,
                skipped: self.scaler.as_ref().map(|_| skipped),
                micro_batch: self.config.train.micro_batch_size.filter(|&m| m < batch.examples),
                event,
                eval: None,
            };
            write(&line)?;
            if let Some(o) = &observer {
                let end_us = self.rt.alloc.now_us();
                let (events, dropped) = self.rt.alloc.take_events();
                let pages = self.rt.alloc.snapshot_pages();
                o.step(
                    &line,
                    super::observe::StepMemory::from_events(self.step, step_start_us, end_us, &events, dropped, pages),
                );
            }
            if let Some(bar) = &bar {
                bar.set_position(self.step);
                bar.set_message(format!(
                    "loss {loss:.4} | {:.0} samples/s | {} allocated, {} reserved",
                    batch.examples as f64 / step_s,
                    crate::memory::format_bytes(stats.allocated.current),
                    crate::memory::format_bytes(stats.reserved.current)
                ));
            }
            let epoch_end = self.index == 0;
            let eval_now = if t.eval_every > 0 {
                self.step.is_multiple_of(t.eval_every)
            } else {
                epoch_end
            } || self.step == total;
            if eval_now {
                let e = self.evaluate()?;
                if let Some(bar) = &bar {
                    let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
                    bar.println(format!("step {}: eval loss {:.4}{acc}", self.step, e.loss));
                }
                let line = StepLog {
                    step: self.step,
                    epoch: batch.position.0,
                    eval: Some(e.clone()),
                    ..Default::default()
                };
                write(&line)?;
                if let Some(o) = &observer {
                    o.eval(&line);
                    // Evaluation's allocations are not part of the next step's timeline.
                    self.rt.alloc.take_events();
                }
                summary.last_eval = Some(e);
            }
            if let Some(dir) = &ckpt_dir
                && self.config.checkpoint.every > 0
                && self.step.is_multiple_of(self.config.checkpoint.every)
            {
                summary.checkpoint = Some(self.save(dir)?);
            }
        }
        drop(loader);
        if let Some(dir) = &ckpt_dir
            && summary
                .checkpoint
                .as_ref()
                .is_none_or(|p| !p.ends_with(checkpoint::step_dir_name(self.step)))
        {
            summary.checkpoint = Some(self.save(dir)?);
        }
        if let Some(bar) = bar {
            bar.finish();
        }
        summary.steps = self.step;
        summary.seconds = started.elapsed().as_secs_f64();
        if let Some(o) = &observer {
            o.finish();
        }
        Ok(summary)
    }
}
