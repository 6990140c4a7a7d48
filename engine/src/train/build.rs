//! What a run is built from: its data (with the configured limits), the precision rule
//! applied to the adapter, the model, the optimizer's rule and the loss scaler. Each
//! piece is a function of the config; `trainer` puts them together.
//!
//! May call: `data`, `device`, `error`, `kernels`, `nn`, `optim`, `runtime`, `scaler`,
//! `train::{config, error, model}`. Called by: `train::{trainer, open, plan}`.

use std::path::PathBuf;
use std::sync::Arc;

use super::config::{Config, ConfigError, Precision};
use super::error::TrainError;
use super::model::Trainable;
use crate::autograd::Params;
use crate::data::fashion_mnist::{self, FashionMnist};
use crate::data::text::{self, CharCorpus};
use crate::data::tokens::TokenFile;
use crate::data::{DataError, Dataset, HostBatch};
use crate::device::Gpu;
use crate::kernels::optim::{AdamW, Sgd};
use crate::memory::format_bytes;
use crate::nn::{Gpt, GptConfig, Init, Mlp};
use crate::optim::Rule;
use crate::runtime::Runtime;
use crate::scaler::GradScaler;

/// Training and evaluation data, the model's output width, and the text's unigram
/// entropy in nats (language models on text).
#[derive(Clone)]
pub struct Loaded {
    /// The training split.
    pub train: Arc<dyn Dataset>,
    /// The evaluation split.
    pub eval: Arc<dyn Dataset>,
    /// Classes or vocabulary size.
    pub outputs: usize,
    /// Unigram entropy of the training text.
    pub unigram_entropy: Option<f64>,
}

impl Loaded {
    /// The first `batch_size` training examples (the shapes of every step's batch).
    pub fn first_batch(&self, batch_size: usize) -> Result<HostBatch, DataError> {
        let mut b = HostBatch::default();
        for i in 0..batch_size.min(self.train.len()) {
            self.train.push(i, &mut b)?;
            b.examples += 1;
        }
        Ok(b)
    }
}

fn limit(mut d: FashionMnist, n: usize) -> FashionMnist {
    if n > 0 && n < d.labels.len() {
        d.labels.truncate(n);
        d.images.truncate(n * fashion_mnist::PIXELS);
    }
    d
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
    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        self.inner.push(i, batch)
    }
}

fn limited(inner: Arc<dyn Dataset>, n: usize) -> Arc<dyn Dataset> {
    if n == 0 { inner } else { Arc::new(Limited { inner, n }) }
}

/// Loads `config.data` (Fashion-MNIST, character text or token files); a split with
/// no example (a text shorter than one window, a limit of the wrong kind) is an error,
/// not a run of zero steps.
pub fn load_data(config: &Config) -> Result<Loaded, TrainError> {
    let data = load_splits(config)?;
    for (split, set) in [("training", &data.train), ("evaluation", &data.eval)] {
        if set.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "the {split} split of data.kind \"{}\"{} has no example{}; use more data{}",
                config.data.kind,
                config.data.path.as_ref().map(|p| format!(" at {p}")).unwrap_or_default(),
                if config.model.kind == "gpt" {
                    format!(" (a window is model.block_size + 1 = {} tokens)", config.model.block_size + 1)
                } else {
                    String::new()
                },
                if config.model.kind == "gpt" {
                    " or a smaller model.block_size"
                } else {
                    " (or a larger data.train_limit / data.eval_limit, 0 for all)"
                }
            ))
            .into());
        }
    }
    Ok(data)
}

fn load_splits(config: &Config) -> Result<Loaded, TrainError> {
    let m = &config.model;
    let path = config.data.path.clone().map(PathBuf::from);
    Ok(match config.data.kind.as_str() {
        "fashion_mnist" => {
            let dir = path.unwrap_or_else(|| PathBuf::from(fashion_mnist::DEFAULT_PATH));
            let train = limit(FashionMnist::load(&dir, "train")?, config.data.train_limit);
            let eval = limit(FashionMnist::load(&dir, "t10k")?, config.data.eval_limit);
            Loaded {
                train: Arc::new(train),
                eval: Arc::new(eval),
                outputs: fashion_mnist::CLASSES,
                unigram_entropy: None,
            }
        }
        "chars" => {
            let p = path.unwrap_or_else(|| PathBuf::from(text::DEFAULT_PATH));
            let corpus = CharCorpus::load(&p, m.block_size)?;
            let entropy = corpus.unigram_entropy();
            let vocab = corpus.vocab.len();
            let (train, val) = corpus.split(0.1);
            Loaded {
                train: limited(Arc::new(train), config.data.train_limit),
                eval: limited(Arc::new(val), config.data.eval_limit),
                outputs: vocab,
                unigram_entropy: Some(entropy),
            }
        }
        _ => {
            let dir = path.ok_or_else(|| DataError::Missing {
                what: "token files".into(),
                path: "(data.path unset)".into(),
                hint: String::new(),
            })?;
            let width = if config.data.token_dtype == "u32" { 4 } else { 2 };
            let train = TokenFile::open(&dir.join("train.bin"), m.block_size, m.vocab_size, width)?;
            let val = TokenFile::open(&dir.join("val.bin"), m.block_size, m.vocab_size, width)?;
            Loaded {
                train: limited(Arc::new(train), config.data.train_limit),
                eval: limited(Arc::new(val), config.data.eval_limit),
                outputs: m.vocab_size,
                unigram_entropy: None,
            }
        }
    })
}

/// Applies `memory.precision`: fp16-mixed needs SHADER_F16; without it the run fails,
/// or trains in fp32 when `memory.fp32_fallback` asks for that (said in a note).
pub fn resolve_precision(mut config: Config, gpu: &Gpu) -> Result<(Config, Vec<String>), TrainError> {
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

fn gpt_config(config: &Config, outputs: usize) -> GptConfig {
    let m = &config.model;
    GptConfig {
        vocab_size: outputs,
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
    }
}

fn mlp_sizes(config: &Config, outputs: usize) -> Vec<usize> {
    let mut sizes = vec![fashion_mnist::PIXELS];
    sizes.extend(&config.model.hidden);
    sizes.push(outputs);
    sizes
}

/// Checks the model's size against the adapter before anything is allocated: every
/// parameter tensor must fit one binding, and the model states (weights, gradients,
/// optimizer state, f16 copies under fp16-mixed) the device's memory where it is known.
pub fn check_sizes(config: &Config, outputs: usize, gpu: &Gpu) -> Result<(), TrainError> {
    let shapes: Vec<(String, Vec<usize>)> = if config.model.kind == "gpt" {
        let gc = gpt_config(config, outputs);
        gc.validate()?;
        crate::nn::gpt::parameter_shapes(&gc)
    } else {
        let sizes = mlp_sizes(config, outputs);
        sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| (format!("layers.{i}.weight"), vec![w[1], w[0]]))
            .collect()
    };
    let elements = |shape: &[usize]| shape.iter().fold(1u128, |a, &d| a * d as u128);
    let max_binding = gpu.caps.limits.max_storage_buffer_binding_size as u128;
    if let Some((name, shape)) = shapes.iter().find(|(_, s)| elements(s) * 4 > max_binding) {
        return Err(ConfigError::Invalid(format!(
            "the parameter {name} {shape:?} ({}) is larger than one buffer binding on '{}' ({}); make the model smaller",
            format_bytes((elements(shape) * 4).min(u64::MAX as u128) as u64),
            gpu.report.name,
            format_bytes(max_binding as u64)
        ))
        .into());
    }
    let total: u128 = shapes.iter().map(|(_, s)| elements(s)).sum();
    let per = 4
        + 4
        + if config.train.optimizer == "sgd" { 4 } else { 8 }
        + if config.memory.precision()? == Precision::Fp16Mixed { 2 } else { 0 };
    let states = total * per;
    if let Some(memory) = gpu.caps.memory_bytes
        && states > memory as u128
    {
        return Err(ConfigError::Invalid(format!(
            "the model has {total} parameters: {} of weights, gradients and optimizer state, more than the {} of '{}'; make the model smaller",
            format_bytes(states.min(u64::MAX as u128) as u64),
            format_bytes(memory),
            gpu.report.name
        ))
        .into());
    }
    Ok(())
}

/// The model `config.model` describes with `outputs` classes or tokens, its parameters
/// registered in `params` and initialised from `train.seed`.
pub fn build_model(config: &Config, rt: &Runtime, outputs: usize, params: &mut Params) -> Result<Box<dyn Trainable>, TrainError> {
    check_sizes(config, outputs, &rt.gpu)?;
    let mut init = Init::new(config.train.seed);
    Ok(if config.model.kind == "gpt" {
        let mut gpt = Gpt::new(rt, gpt_config(config, outputs), params, &mut init)?;
        gpt.checkpoint_every = config.memory.checkpoint_every()?;
        Box::new(gpt)
    } else {
        Box::new(Mlp::new(rt, params, &mlp_sizes(config, outputs), &mut init)?)
    })
}

/// The optimizer's update rule (`train.optimizer`).
pub fn optimizer_rule(config: &Config) -> Rule {
    let t = &config.train;
    match t.optimizer.as_str() {
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
    }
}

/// The loss scaler under fp16-mixed (`memory.init_scale`), none under fp32.
pub fn loss_scaler(config: &Config) -> Result<Option<GradScaler>, TrainError> {
    Ok((config.memory.precision()? == Precision::Fp16Mixed).then(|| GradScaler {
        scale: config.memory.init_scale.unwrap_or(crate::scaler::INIT_SCALE),
        ..GradScaler::default()
    }))
}
