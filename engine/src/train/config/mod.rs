//! The training configuration: a TOML file with [model], [data], [train], [memory],
//! [checkpoint] and [parallel] sections, overridable with `--set section.key=value`.
//! Unknown keys are errors, so a typo never trains silently with a default. `model`
//! holds the model kinds, `choices` the settings that take a name.
//!
//! May call: `nn::gpt` (its size limits), `train::config::{choices, model}`.

use serde::{Deserialize, Serialize};

mod choices;
mod model;

pub use choices::{Backend, Checkpointing, Choice, DataKind, Offload, OptimizerKind, Precision, Schedule, TokenDtype};
pub use model::{BertSpec, CnnSpec, GptSpec, LlamaSpec, MlpSpec, ModelConfig, ResNetSpec};

/// Everything a run needs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The model.
    pub model: ModelConfig,
    /// The data.
    pub data: DataConfig,
    /// Optimisation and schedule.
    pub train: TrainConfig,
    /// Memory policy.
    pub memory: MemoryConfig,
    /// Checkpoints.
    pub checkpoint: CheckpointConfig,
    /// Training over several devices.
    pub parallel: ParallelConfig,
}

/// [data]
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// What the examples are.
    pub kind: DataKind,
    /// Where the files are (defaults to the Debian package's folder).
    pub path: Option<String>,
    /// Examples used from the training split (0 = all); for quick runs and tests.
    pub train_limit: usize,
    /// Examples used from the evaluation split (0 = all).
    pub eval_limit: usize,
    /// Token files' id type.
    pub token_dtype: TokenDtype,
    /// Synthetic images' [channels, height, width].
    pub image: Vec<usize>,
    /// Synthetic images' classes.
    pub classes: usize,
    /// Zero padding around each training image before a random crop of its size (0:
    /// no crop); image data only.
    pub crop_padding: usize,
    /// Mirror each training image left-right with probability 1/2; image data only.
    pub flip: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            kind: DataKind::FashionMnist,
            path: None,
            train_limit: 0,
            eval_limit: 0,
            token_dtype: TokenDtype::U16,
            image: vec![3, 32, 32],
            classes: 10,
            crop_padding: 0,
            flip: false,
        }
    }
}

/// [train]
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training data.
    pub epochs: u64,
    /// Total steps; overrides epochs when set.
    pub steps: Option<u64>,
    /// Examples per step.
    pub batch_size: usize,
    /// Examples per forward/backward; gradients accumulate over batch_size (unset: all).
    pub micro_batch_size: Option<usize>,
    /// Peak learning rate.
    pub lr: f32,
    /// Floor of the cosine schedule.
    pub min_lr: f32,
    /// Linear warmup steps.
    pub warmup_steps: u64,
    /// The learning-rate schedule after warmup.
    pub schedule: Schedule,
    /// The update rule.
    pub optimizer: OptimizerKind,
    /// Weight decay (decoupled for AdamW, L2 for SGD).
    pub weight_decay: f32,
    /// SGD momentum.
    pub momentum: f32,
    /// AdamW betas.
    pub betas: (f32, f32),
    /// Global-norm clipping (0 = off).
    pub grad_clip: f32,
    /// Log each layer's update/weight ratio every step.
    pub log_update_ratio: bool,
    /// Log how long the GPU was busy in each step (GPU timestamps around each
    /// submission's compute pass, read at the step's end).
    pub log_gpu_busy: bool,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Evaluate every N steps (0 = at the end of each epoch).
    pub eval_every: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            steps: None,
            batch_size: 128,
            micro_batch_size: None,
            lr: 1e-3,
            min_lr: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            optimizer: OptimizerKind::Adamw,
            weight_decay: 0.0,
            momentum: 0.9,
            betas: (0.9, 0.999),
            grad_clip: 0.0,
            log_update_ratio: false,
            log_gpu_busy: true,
            seed: 0,
            eval_every: 0,
        }
    }
}

/// [memory]
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Cap on reserved memory: "3GiB", bytes, or a fraction of the device's memory (a
    /// TOML number is taken as bytes, or as a fraction when at most 1).
    #[serde(deserialize_with = "size_text", default)]
    pub cap: Option<String>,
    /// Guard bytes around every block (slow; for debugging kernels).
    pub debug: bool,
    /// Activation checkpointing of the model's segments (unset: none, and `fit` may
    /// choose).
    pub checkpoint: Option<Checkpointing>,
    /// Apply each parameter's update as soon as its gradient is final, and free the
    /// gradient (no gradient accumulation or clipping then).
    pub optimizer_in_backward: bool,
    /// fp32, or fp16-mixed: f32 master weights, f16 matmul inputs, dynamic loss
    /// scaling (torch.amp.GradScaler's policy).
    pub precision: Precision,
    /// With "fp16-mixed" on an adapter without SHADER_F16: train in fp32 instead of
    /// failing (off by default: the run stops with an error).
    pub fp32_fallback: bool,
    /// The loss scale fp16-mixed starts from (torch.amp.GradScaler's init_scale).
    pub init_scale: Option<f32>,
    /// A bound for `fit`: "3GiB", bytes, or a fraction of the device's memory (a TOML
    /// number as for `cap`).
    #[serde(deserialize_with = "size_text", default)]
    pub budget: Option<String>,
    /// Choose the micro-batch and checkpointing whose estimated peak fits `budget`.
    pub fit: bool,
}

/// A size setting given as text ("3GiB", "0.5") or as a TOML number (1000000, 0.5).
fn size_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Text(String),
        Int(u64),
        Float(f64),
        Other(toml::Value),
    }
    Option::<Size>::deserialize(d)?
        .map(|s| match s {
            Size::Text(t) => Ok(t),
            Size::Int(i) => Ok(i.to_string()),
            Size::Float(f) => Ok(f.to_string()),
            Size::Other(v) => Err(serde::de::Error::custom(format!(
                "memory.cap and memory.budget take a size (\"3GiB\", bytes) or a fraction in (0, 1], not {v}"
            ))),
        })
        .transpose()
}

impl MemoryConfig {
    /// Whether checkpointing is left to the estimate ("auto").
    pub fn checkpoint_auto(&self) -> bool {
        self.checkpoint == Some(Checkpointing::Auto)
    }

    /// Every how many of the model's segments one is recomputed in backward (0: none;
    /// "auto" is resolved by the trainer from the estimate and reads as 0 here).
    pub fn checkpoint_every(&self) -> usize {
        self.checkpoint.map_or(0, Checkpointing::every)
    }
}

/// [checkpoint]
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Folder of checkpoints (none: no checkpoints).
    pub dir: Option<String>,
    /// Save every N steps (0: only at the end and on Ctrl-C).
    pub every: u64,
}

/// [parallel]: one run over several devices, each with its share of every batch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelConfig {
    /// One adapter selector per device, as `--adapter` takes them; a selector may repeat
    /// (several devices on one adapter); an index may be written as a number. Empty: one
    /// device, `--adapter`'s.
    #[serde(deserialize_with = "selectors")]
    pub devices: Vec<String>,
    /// ZeRO stage: 0 plain data parallel, 1 optimizer state sharded, 2 and gradients,
    /// 3 and parameters (gathered per use).
    pub zero: u8,
    /// What lives in host memory instead of on the devices.
    pub offload: Offload,
    /// Gradient bucket size in MiB (reduced as backward makes them final).
    pub bucket_mb: f64,
    /// BatchNorm over every device's batch (PyTorch's SyncBatchNorm) instead of each
    /// device's own share.
    pub sync_batch_norm: bool,
    /// How the ranks talk: "in-process" (the devices above, in this process) or "mpi"
    /// (one rank per process under mpirun or srun; each opens the device its local rank
    /// picks from `devices`, cycling, else `--adapter`'s).
    pub backend: Backend,
    /// Over MPI: the processes in the run (set when the run starts; not a setting).
    #[serde(skip)]
    pub ranks: Option<usize>,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            devices: Vec::new(),
            zero: 0,
            offload: Offload::None,
            bucket_mb: 25.0,
            sync_batch_norm: false,
            backend: Backend::InProcess,
            ranks: None,
        }
    }
}

impl ParallelConfig {
    /// Devices of the run (1 when `devices` is empty).
    pub fn world(&self) -> usize {
        self.ranks.unwrap_or(self.devices.len()).max(1)
    }

    /// Whether the run goes through the multi-device step (any `devices` given, or
    /// ranks over MPI).
    pub fn enabled(&self) -> bool {
        !self.devices.is_empty() || self.backend == Backend::Mpi
    }

    /// This process's device over MPI: entry `local_rank` of `devices` (cycling), or
    /// `adapter` when none is listed.
    pub fn rank_device(&self, local_rank: usize, adapter: Option<&str>) -> Option<String> {
        match self.devices.len() {
            0 => adapter.map(str::to_string),
            n => Some(self.devices[local_rank % n].clone()),
        }
    }

    /// The bucket size in bytes.
    pub fn bucket_bytes(&self) -> usize {
        (self.bucket_mb * 1048576.0) as usize
    }

    fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.devices.len() > MAX_DEVICES {
            return bad(format!(
                "parallel.devices lists {} devices; at most {MAX_DEVICES}",
                self.devices.len()
            ));
        }
        if let Some(d) = self.devices.iter().find(|d| d.trim().is_empty()) {
            return bad(format!("parallel.devices has an empty selector '{d}'"));
        }
        if self.zero > 3 {
            return bad(format!("parallel.zero must be 0, 1, 2 or 3, got {}", self.zero));
        }
        match self.offload {
            Offload::Optimizer if self.zero == 0 && self.enabled() => {
                return bad(
                    "parallel.offload = \"optimizer\" needs parallel.zero >= 1 (each device's host thread updates its shard)".into(),
                );
            }
            Offload::OptimizerParameters if self.zero < 3 && self.enabled() => {
                return bad("parallel.offload = \"optimizer+parameters\" needs parallel.zero = 3 (the parameters sharded)".into());
            }
            _ => {}
        }
        if !(self.bucket_mb.is_finite() && self.bucket_mb > 0.0 && self.bucket_mb <= 65536.0) {
            return bad(format!("parallel.bucket_mb must be in (0, 65536], got {}", self.bucket_mb));
        }
        if !self.enabled() {
            if self.zero > 0 || self.offload != Offload::None {
                return bad("parallel.zero and parallel.offload need parallel.devices (e.g. [\"0\"] for one device)".into());
            }
            return Ok(());
        }
        let n = self.world();
        if self.backend == Backend::Mpi && self.ranks.is_none() {
            // The ranks are known once MPI has started: checked again then.
            return Ok(());
        }
        if !config.train.batch_size.is_multiple_of(n) {
            return bad(format!(
                "train.batch_size {} does not split evenly over the {n} devices of parallel.devices",
                config.train.batch_size
            ));
        }
        if config.memory.optimizer_in_backward {
            return bad("memory.optimizer_in_backward cannot be combined with parallel.devices yet".into());
        }
        Ok(())
    }
}

/// Adapter selectors: strings, or adapter indices written as numbers (`[0, 1]`).
fn selectors<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Selector {
        Name(String),
        Index(u32),
        Other(toml::Value),
    }
    Vec::<Selector>::deserialize(d)?
        .into_iter()
        .map(|s| match s {
            Selector::Name(n) => Ok(n),
            Selector::Index(i) => Ok(i.to_string()),
            Selector::Other(v) => Err(serde::de::Error::custom(format!(
                "parallel.devices takes adapter selectors (an index >= 0, a backend or part of a name), not {v}"
            ))),
        })
        .collect()
}

/// Most devices in one run.
pub const MAX_DEVICES: usize = 64;

/// A configuration error, said in the user's terms.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// TOML or a key is wrong.
    #[error("invalid config: {0}")]
    Invalid(String),
}

fn set_key(root: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let (key, value) = assignment
        .split_once('=')
        .ok_or_else(|| ConfigError::Invalid(format!("--set '{assignment}' is not section.key=value")))?;
    let path: Vec<&str> = key.trim().split('.').collect();
    if path.len() != 2 || path.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::Invalid(format!("--set key '{key}' must be section.key")));
    }
    // A TOML literal when it parses as one (numbers, booleans, arrays), else a string.
    let parsed: toml::Value = toml::from_str::<toml::Table>(&format!("v = {}", value.trim()))
        .ok()
        .and_then(|t| t.get("v").cloned())
        .unwrap_or_else(|| toml::Value::String(value.trim().to_string()));
    let section = root
        .entry(path[0].to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| ConfigError::Invalid(format!("'{}' is not a section", path[0])))?;
    section.insert(path[1].to_string(), parsed);
    Ok(())
}

/// The named settings checked before the typed parse, so that a wrong name is said
/// with its key and the names it takes (serde would say neither).
fn check_names(root: &mut toml::Table) -> Result<(), ConfigError> {
    fn one<C: Choice>(root: &toml::Table, section: &str, key: &str) -> Result<(), ConfigError> {
        let Some(v) = root.get(section).and_then(|t| t.get(key)) else {
            return Ok(());
        };
        if C::ALL.iter().any(|c| toml::Value::String(c.name()) == *v) {
            return Ok(());
        }
        let got = match v {
            toml::Value::String(s) => format!("\"{s}\""),
            other => other.to_string(),
        };
        Err(ConfigError::Invalid(format!("{section}.{key} must be {}, got {got}", C::choices())))
    }
    one::<DataKind>(root, "data", "kind")?;
    one::<TokenDtype>(root, "data", "token_dtype")?;
    one::<OptimizerKind>(root, "train", "optimizer")?;
    one::<Schedule>(root, "train", "schedule")?;
    one::<Precision>(root, "memory", "precision")?;
    one::<Offload>(root, "parallel", "offload")?;
    // The model: an MLP unless `kind` says otherwise; a key of another kind is named.
    let Some(model) = root.get_mut("model") else {
        return Ok(());
    };
    let model = model
        .as_table_mut()
        .ok_or_else(|| ConfigError::Invalid("'model' is not a section".into()))?;
    let kinds = ModelConfig::kinds();
    let names: Vec<String> = kinds.iter().map(|k| format!("\"{}\"", k.kind())).collect();
    let kind = match model.get("kind") {
        None => "mlp".to_string(),
        Some(toml::Value::String(k)) => k.clone(),
        Some(other) => {
            return Err(ConfigError::Invalid(format!(
                "model.kind must be one of {}, got {other}",
                names.join(", ")
            )));
        }
    };
    let Some(spec) = kinds.iter().find(|k| k.kind() == kind) else {
        return Err(ConfigError::Invalid(format!(
            "model.kind \"{kind}\" is unknown ({})",
            names.join(", ")
        )));
    };
    model.insert("kind".into(), toml::Value::String(kind.clone()));
    let own = toml::Value::try_from(spec).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let own = own.as_table().cloned().unwrap_or_default();
    if let Some(key) = model.keys().find(|k| !own.contains_key(*k)) {
        let theirs: Vec<&str> = own.keys().filter(|k| *k != "kind").map(String::as_str).collect();
        let elsewhere: Vec<&str> = kinds
            .iter()
            .filter(|k| toml::Value::try_from(k).ok().and_then(|v| v.get(key).cloned()).is_some())
            .map(|k| k.kind())
            .collect();
        return Err(ConfigError::Invalid(format!(
            "model.{key} is not a key of model.kind \"{kind}\" (its keys: {}){}",
            theirs.join(", "),
            if elsewhere.is_empty() {
                String::new()
            } else {
                let kinds: Vec<String> = elsewhere.iter().map(|k| format!("\"{k}\"")).collect();
                format!(
                    "; model.kind {} {} it",
                    kinds.join(" or "),
                    if kinds.len() == 1 { "has" } else { "have" }
                )
            }
        )));
    }
    Ok(())
}

impl Config {
    /// Parses TOML text, then applies `--set` overrides.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Config, ConfigError> {
        let mut root: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        for o in overrides {
            set_key(&mut root, o)?;
        }
        check_names(&mut root)?;
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(root)).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid(type_message(&key, &e.into_inner().to_string()))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a file (or the defaults when `path` is None) and applies overrides.
    pub fn load(path: Option<&std::path::Path>, overrides: &[String]) -> Result<Config, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|e| ConfigError::Read {
                path: p.display().to_string(),
                source: e,
            })?,
            None => String::new(),
        };
        Config::parse(&text, overrides)
    }

    /// Checks every setting and how they combine (done on load; again after a change
    /// made in code, such as the MPI ranks being known).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.check_ranges()?;
        if !(self.train.lr.is_finite() && self.train.lr > 0.0) {
            return bad(format!("train.lr must be a positive number, got {}", self.train.lr));
        }
        if !self.model.trains_on().contains(&self.data.kind) {
            return bad(format!(
                "model.kind \"{}\" cannot train on data.kind \"{}\"",
                self.model.kind(),
                self.data.kind.name()
            ));
        }
        if self.memory.optimizer_in_backward {
            if self.train.micro_batch_size.is_some_and(|m| m < self.train.batch_size) {
                return bad("memory.optimizer_in_backward cannot be combined with gradient accumulation (train.micro_batch_size): gradients are freed as soon as they are applied".into());
            }
            if self.train.grad_clip > 0.0 {
                return bad(
                    "memory.optimizer_in_backward cannot be combined with train.grad_clip: clipping needs every gradient before any update"
                        .into(),
                );
            }
        }
        if self.train.log_update_ratio && self.memory.optimizer_in_backward {
            return bad(
                "train.log_update_ratio measures the optimizer's step after backward, not memory.optimizer_in_backward's updates inside it"
                    .into(),
            );
        }
        if self.memory.precision == Precision::Fp16Mixed && self.memory.optimizer_in_backward {
            return bad("memory.optimizer_in_backward cannot be combined with memory.precision = \"fp16-mixed\": a step with an inf or NaN gradient must be skipped before any update".into());
        }
        if let Some(s) = self.memory.init_scale
            && !(s.is_finite() && s > 0.0)
        {
            return bad(format!("memory.init_scale must be a positive number, got {s}"));
        }
        if self.memory.fit && self.memory.budget.is_none() {
            return bad("memory.fit = true needs memory.budget (like \"3GiB\")".into());
        }
        if self.data.kind == DataKind::Tokens && self.model.vocab_size() == Some(0) {
            return bad("data.kind \"tokens\" needs model.vocab_size".into());
        }
        if self.checkpoint.dir.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return bad("checkpoint.dir is empty: give a folder, or leave it unset for no checkpoints".into());
        }
        if self.data.path.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return bad("data.path is empty: give a file or folder, or leave it unset for the default".into());
        }
        let images = matches!(self.data.kind, DataKind::FashionMnist | DataKind::SyntheticImages);
        if !images && (self.data.crop_padding > 0 || self.data.flip) {
            return bad(format!(
                "data.crop_padding and data.flip apply to images, not data.kind \"{}\"",
                self.data.kind.name()
            ));
        }
        if self.data.kind == DataKind::SyntheticImages {
            if self.data.image.len() != 3 || self.data.image.iter().any(|&d| d == 0 || d > 4096) || self.data.image[0] > 64 {
                return bad(format!(
                    "data.image must be [channels, height, width] (channels 1 to 64, sides 1 to 4096), got {:?}",
                    self.data.image
                ));
            }
            if self.data.classes == 0 || self.data.classes > 1 << 20 {
                return bad(format!("data.classes must be in 1..={}, got {}", 1 << 20, self.data.classes));
            }
        }
        if self.data.crop_padding > 64 {
            return bad(format!("data.crop_padding must be in 0..=64, got {}", self.data.crop_padding));
        }
        if self.train.epochs == 0 && self.train.steps.is_none() {
            return bad("train.epochs is 0 and train.steps is unset: nothing to do".into());
        }
        self.parallel.validate(self)
    }

    /// Every numeric setting against its documented range (README, "Settings"), before
    /// anything is built: a value out of range is named with the range it must lie in.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        let real = |key: &str, v: f32, lo: f32, hi_open: Option<f32>, range: &str| {
            let ok = v.is_finite() && v >= lo && hi_open.is_none_or(|h| v < h);
            if ok { Ok(()) } else { out(key, range, v.to_string()) }
        };
        int("train.batch_size", t.batch_size as u64, 1, MAX_BATCH)?;
        if let Some(mb) = t.micro_batch_size {
            int("train.micro_batch_size", mb as u64, 1, t.batch_size as u64)?;
        }
        if t.steps.is_none() {
            int("train.epochs", t.epochs, 1, MAX_EPOCHS)?;
        }
        if let Some(steps) = t.steps {
            int("train.steps", steps, 1, MAX_STEPS)?;
        }
        int("train.warmup_steps", t.warmup_steps, 0, MAX_STEPS)?;
        real("train.lr", t.lr, f32::MIN_POSITIVE, None, "a positive number")?;
        real("train.min_lr", t.min_lr, 0.0, None, "a number >= 0")?;
        if t.min_lr > t.lr {
            return out("train.min_lr", &format!("at most train.lr ({})", t.lr), t.min_lr.to_string());
        }
        real("train.weight_decay", t.weight_decay, 0.0, None, "a number >= 0")?;
        real("train.momentum", t.momentum, 0.0, Some(1.0), "in [0, 1)")?;
        real("train.betas[0]", t.betas.0, 0.0, Some(1.0), "in [0, 1)")?;
        real("train.betas[1]", t.betas.1, 0.0, Some(1.0), "in [0, 1)")?;
        real("train.grad_clip", t.grad_clip, 0.0, None, "a number >= 0 (0 turns clipping off)")?;
        self.model
            .check_ranges(self.data.token_dtype == TokenDtype::U32, self.data.kind == DataKind::Tokens)
    }
}

/// Largest batch (and micro-batch) in examples.
pub const MAX_BATCH: u64 = 1 << 24;
/// Most epochs.
pub const MAX_EPOCHS: u64 = 1_000_000;
/// Most steps (and warmup steps).
pub const MAX_STEPS: u64 = 1 << 40;
/// Most hidden layers of the MLP.
pub const MAX_MLP_LAYERS: usize = 64;
/// Widest hidden layer of the MLP.
pub const MAX_WIDTH: u64 = 1 << 20;
/// Largest vocabulary of token files of u16 ids (u32 ids: the GPT's largest).
pub const MAX_TOKEN_VOCAB: u64 = 1 << 16;

pub(super) fn out(key: &str, range: &str, got: String) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid(format!("{key} must be {range}, got {got}")))
}

pub(super) fn int(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        out(key, &format!("in {lo}..={hi}"), v.to_string())
    } else {
        Ok(())
    }
}

/// A value of the wrong type for `key`, said in a config's words: serde's "invalid type:
/// string \"abc\", expected usize" becomes "train.batch_size takes a whole number (0 or
/// more), not the string \"abc\"".
fn type_message(key: &str, serde: &str) -> String {
    // toml adds "in `key`" on a line of its own; the key leads here instead.
    let serde = serde.lines().next().unwrap_or_default();
    let typed = serde.starts_with("invalid type: ") || serde.starts_with("invalid value: ");
    let Some((got, expected)) = serde.split_once(", expected ").filter(|_| typed) else {
        return if key.is_empty() || key == "." {
            serde.to_string()
        } else {
            format!("{key}: {serde}")
        };
    };
    let got = got
        .trim_start_matches("invalid type: ")
        .trim_start_matches("invalid value: ")
        .replace("integer `", "")
        .replace("floating point `", "")
        .replace('`', "");
    let got = match got.as_str() {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        g if g.starts_with("string ") => format!("the {g}"),
        g => g.to_string(),
    };
    let wants = match expected.trim() {
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number (0 or more)",
        "i64" | "i32" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a sequence" => "a list (like [1, 2])",
        "a string" => "a string in quotes",
        other => other,
    };
    format!("{key} takes {wants}, not {got}")
}
