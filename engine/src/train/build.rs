//! What a run is built from: its data (with the configured limits), the precision rule
//! applied to the adapter, the model, the optimizer's rule and the loss scaler. Each
//! piece is a function of the config; `trainer` puts them together.
//!
//! May call: `data`, `device`, `error`, `kernels`, `nn`, `optim`, `runtime`, `scaler`,
//! `train::{config, error, model}`. Called by: `train::{trainer, open, plan}`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::autograd::Params;
use crate::data::fashion_mnist::{self, FashionMnist};
use crate::data::images::{Augment, Augmented, SyntheticImages};
use crate::data::text::{self, CharCorpus};
use crate::data::tokens::{TokenFile, ZeroTokens};
use crate::data::{DataError, Dataset, HostBatch};
use crate::device::Gpu;
use crate::error::Error;
use crate::kernels::optim::{AdamW, Sgd};
use crate::memory::format_bytes;
use crate::nn::{Builder, Init};
use crate::optim::Rule;
use crate::runtime::Runtime;
use crate::scaler::GradScaler;
use crate::train::config::{Choice, Config, ConfigError, DataKind, OptimizerKind, Precision};
use crate::train::error::TrainError;
use crate::train::model::{BuildModel, Trainable};

/// What a run is made of: training and evaluation data, the model's output width, the
/// text's unigram entropy in nats (language models on text), and how to build the model.
#[derive(Clone)]
pub struct Loaded {
    /// How the model is built (from `[model]`, or a user's).
    pub model: Arc<BuildModel>,
    /// Whether `model` is `[model]`'s and the data `[data]`'s (not a user's).
    pub from_config: bool,
    /// The training split.
    pub train: Arc<dyn Dataset>,
    /// The evaluation split.
    pub eval: Arc<dyn Dataset>,
    /// Classes or vocabulary size.
    pub outputs: usize,
    /// Unigram entropy of the training text.
    pub unigram_entropy: Option<f64>,
    /// Image data's [channels, height, width].
    pub image: Option<[usize; 3]>,
}

impl Loaded {
    /// The first `batch_size` training examples (the shapes of every step's batch).
    /// Where examples differ in length (`data.kind = "lines"`), the longest ones: the
    /// step that needs the most memory.
    pub fn first_batch(&self, batch_size: usize) -> Result<HostBatch, DataError> {
        let n = batch_size.min(self.train.len());
        let mut indices: Vec<usize> = (0..self.train.len()).collect();
        if self.train.length(0).is_some() {
            indices.sort_by_key(|&i| std::cmp::Reverse(self.train.length(i).unwrap_or(0)));
        }
        crate::data::collate(&*self.train, &indices[..n], (0, 0))
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

    fn length(&self, i: usize) -> Option<usize> {
        self.inner.length(i)
    }
}

fn limited(inner: Arc<dyn Dataset>, n: usize) -> Arc<dyn Dataset> {
    if n == 0 { inner } else { Arc::new(Limited { inner, n }) }
}

/// `train` with `data.crop_padding` and `data.flip` applied (itself without them);
/// `fill` is a black pixel's value after the set's normalisation.
fn augmented(config: &Config, train: Arc<dyn Dataset>, image: [usize; 3], fill: f32) -> Arc<dyn Dataset> {
    let d = &config.data;
    if d.crop_padding == 0 && !d.flip {
        return train;
    }
    let augment = Augment {
        crop_padding: d.crop_padding,
        flip: d.flip,
        fill,
    };
    Arc::new(Augmented::new(train, image, augment, config.train.seed))
}

/// Loads `config.data` (Fashion-MNIST, character text or token files); a split with
/// no example (a text shorter than one window, a limit of the wrong kind) is an error,
/// not a run of zero steps.
pub fn load_data(config: &Config) -> Result<Loaded, TrainError> {
    let mut data = load_splits(config)?;
    data.model = config.model.builder(data.outputs, data.image)?;
    data.from_config = true;
    for (split, set) in [("training", &data.train), ("evaluation", &data.eval)] {
        if set.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "the {split} split of data.kind \"{}\"{} has no example{}; use more data{}",
                config.data.kind.name(),
                config.data.path.as_ref().map(|p| format!(" at {p}")).unwrap_or_default(),
                match config.model.context() {
                    Some(t) => format!(" (a window is model.block_size + 1 = {} tokens)", t + 1),
                    None => String::new(),
                },
                if config.model.context().is_some() {
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

/// [`load_data`] for the memory estimate: where `data.kind = "tokens"` and the token
/// files are missing, windows of token 0 in their shape stand in (the estimate depends
/// on shapes only), with a note saying so.
pub fn load_data_for_estimate(config: &Config) -> Result<(Loaded, Option<String>), TrainError> {
    match load_data(config) {
        Err(TrainError::Data(DataError::Missing { path, .. })) if config.data.kind == DataKind::Tokens => {
            let block = config.model.context().unwrap_or(1);
            let windows = |limit: usize| if limit == 0 { config.train.batch_size.max(1) * 2 } else { limit };
            let outputs = config.model.vocab_size().unwrap_or(0);
            if outputs == 0 {
                return Err(ConfigError::Invalid("data.kind \"tokens\" needs model.vocab_size".into()).into());
            }
            let data = Loaded {
                model: config.model.builder(outputs, None)?,
                from_config: true,
                train: Arc::new(ZeroTokens {
                    windows: windows(config.data.train_limit),
                    block,
                }),
                eval: Arc::new(ZeroTokens {
                    windows: windows(config.data.eval_limit),
                    block,
                }),
                outputs,
                unigram_entropy: None,
                image: None,
            };
            Ok((
                data,
                Some(format!(
                    "no token files at {path}: estimated on windows of {block} tokens, which is all the estimate needs"
                )),
            ))
        }
        other => Ok((other?, None)),
    }
}

/// A builder that builds nothing: `load_data` replaces it with the config's model.
fn no_model() -> Arc<BuildModel> {
    Arc::new(|_: &mut Builder| Err(Error::invalid("model", "no model was given")))
}

fn load_splits(config: &Config) -> Result<Loaded, TrainError> {
    let m = &config.model;
    let path = config.data.path.clone().map(PathBuf::from);
    let model = no_model();
    let context = m.context().unwrap_or(0);
    Ok(match config.data.kind {
        DataKind::FashionMnist => {
            let dir = path.unwrap_or_else(|| PathBuf::from(fashion_mnist::DEFAULT_PATH));
            let train = limit(FashionMnist::load(&dir, "train")?, config.data.train_limit);
            let eval = limit(FashionMnist::load(&dir, "t10k")?, config.data.eval_limit);
            let image = [1, 28, 28];
            Loaded {
                model,
                from_config: true,
                train: augmented(config, Arc::new(train), image, -fashion_mnist::MEAN / fashion_mnist::STD),
                eval: Arc::new(eval),
                outputs: fashion_mnist::CLASSES,
                unigram_entropy: None,
                image: Some(image),
            }
        }
        DataKind::SyntheticImages => {
            let d = &config.data;
            let image = [d.image[0], d.image[1], d.image[2]];
            let n = |limit: usize, default: usize| if limit == 0 { default } else { limit };
            let seed = config.train.seed;
            let train = Arc::new(SyntheticImages::new(n(d.train_limit, 1024), image, d.classes, seed));
            let eval = Arc::new(SyntheticImages::new(n(d.eval_limit, 256), image, d.classes, seed ^ 1));
            Loaded {
                model,
                from_config: true,
                train: augmented(config, train, image, 0.0),
                eval,
                outputs: d.classes,
                unigram_entropy: None,
                image: Some(image),
            }
        }
        DataKind::Chars | DataKind::Lines => {
            let p = path.unwrap_or_else(|| PathBuf::from(text::DEFAULT_PATH));
            let corpus = CharCorpus::load(&p, context)?;
            let entropy = corpus.unigram_entropy();
            let vocab = corpus.vocab.len();
            let (train, val) = corpus.split(0.1);
            // Windows of the text, or its lines as examples of their own lengths.
            let (train, val): (Arc<dyn Dataset>, Arc<dyn Dataset>) = if config.data.kind == DataKind::Lines {
                (Arc::new(train.lines()), Arc::new(val.lines()))
            } else {
                (Arc::new(train), Arc::new(val))
            };
            Loaded {
                model: model.clone(),
                from_config: true,
                train: limited(train, config.data.train_limit),
                eval: limited(val, config.data.eval_limit),
                outputs: vocab,
                unigram_entropy: Some(entropy),
                image: None,
            }
        }
        DataKind::Tokens => {
            let dir = path.ok_or_else(|| DataError::Missing {
                what: "token files".into(),
                path: "(data.path unset)".into(),
                hint: String::new(),
            })?;
            let width = config.data.token_dtype.bytes();
            let vocab = m.vocab_size().unwrap_or(0);
            let train = TokenFile::open(&dir.join("train.bin"), context, vocab, width)?;
            let val = TokenFile::open(&dir.join("val.bin"), context, vocab, width)?;
            Loaded {
                model: model.clone(),
                from_config: true,
                train: limited(Arc::new(train), config.data.train_limit),
                eval: limited(Arc::new(val), config.data.eval_limit),
                outputs: vocab,
                unigram_entropy: None,
                image: None,
            }
        }
    })
}

/// Applies `memory.precision`: fp16-mixed needs SHADER_F16; without it the run fails,
/// or trains in fp32 when `memory.fp32_fallback` asks for that (said in a note).
pub fn resolve_precision(mut config: Config, gpu: &Gpu) -> Result<(Config, Vec<String>), TrainError> {
    let mut notes = Vec::new();
    if config.memory.precision == Precision::Fp16Mixed && !gpu.caps.shader_f16 {
        if !config.memory.fp32_fallback {
            return Err(TrainError::NoF16(gpu.report.name.clone()));
        }
        config.memory.precision = Precision::Fp32;
        notes.push(format!(
            "the adapter '{}' lacks SHADER_F16: training in fp32 (memory.fp32_fallback = true)",
            gpu.report.name
        ));
    }
    Ok((config, notes))
}

/// Checks the model's size against the adapter: every parameter tensor must fit one
/// binding (the builder refuses one that does not), and the model states (weights,
/// gradients, optimizer state, f16 copies under fp16-mixed) the device's memory where
/// it is known.
fn check_sizes(config: &Config, params: &Params, gpu: &Gpu) -> Result<(), TrainError> {
    let total: u128 = params.list.iter().map(|p| p.value.numel() as u128).sum();
    let per = 4 + 4 + if config.memory.precision == Precision::Fp16Mixed { 2 } else { 0 };
    let rule = optimizer_rule(config);
    let optimizer: u128 = params.list.iter().map(|p| rule.state_bytes(p.value.numel()) as u128).sum();
    let states = total * per + optimizer;
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

/// The model `build` makes on `rt`, its parameters registered in `params` and
/// initialised from `train.seed`. On a device, the model is built on a dry runtime
/// first, so that one too large for the device is refused before anything is allocated.
pub fn build_model(config: &Config, rt: &Runtime, build: &BuildModel, params: &mut Params) -> Result<Box<dyn Trainable>, TrainError> {
    if rt.runs_kernels() {
        let dry = rt.dry_beside()?;
        let mut shapes = Params::default();
        build(&mut Builder::new(&dry, &mut shapes, &mut Init::new(config.train.seed)))?;
        check_sizes(config, &shapes, &rt.gpu)?;
    }
    let model = build(&mut Builder::new(rt, params, &mut Init::new(config.train.seed)))?;
    if !rt.runs_kernels() {
        check_sizes(config, params, &rt.gpu)?;
    }
    let every = config.memory.checkpoint_every();
    if every > 0 && model.checkpoint_segments() == 0 {
        return Err(ConfigError::Invalid(format!(
            "memory.checkpoint = {every}: this model offers no segments to recompute (a transformer's blocks); leave it unset"
        ))
        .into());
    }
    Ok(model)
}

/// The optimizer's update rule (`train.optimizer`).
pub fn optimizer_rule(config: &Config) -> Rule {
    let t = &config.train;
    match t.optimizer {
        OptimizerKind::Sgd => Rule::Sgd(Sgd {
            lr: t.lr,
            momentum: t.momentum,
            dampening: 0.0,
            weight_decay: t.weight_decay,
            nesterov: false,
        }),
        OptimizerKind::Adamw | OptimizerKind::Adamw8bit => {
            let h = AdamW {
                lr: t.lr,
                betas: t.betas,
                eps: 1e-8,
                weight_decay: t.weight_decay,
            };
            if t.optimizer == OptimizerKind::Adamw8bit {
                Rule::AdamW8bit(h)
            } else {
                Rule::AdamW(h)
            }
        }
    }
}

/// The loss scaler under fp16-mixed (`memory.init_scale`), none under fp32.
pub fn loss_scaler(config: &Config) -> Result<Option<GradScaler>, TrainError> {
    Ok((config.memory.precision == Precision::Fp16Mixed).then(|| GradScaler {
        scale: config.memory.init_scale.unwrap_or(crate::scaler::INIT_SCALE),
        ..GradScaler::default()
    }))
}
