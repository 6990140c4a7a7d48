//! The trainer's state: configuration, runtime, parameters, model, optimizer, data,
//! scaler and position. What it does lives beside it, one file per job: `step` (one
//! optimizer step, out-of-memory recovery), `eval`, `state` (checkpoints), `run` (the
//! loop), `open` (making one from a config), `plan` (estimate and fit).
//!
//! May call: `autograd`, `data`, `optim`, `runtime`, `scaler`, `train::{build, config,
//! error, model}`. Called by: the rest of the train layer.

use std::sync::Arc;

use crate::autograd::{Mode, Params, Tape};
use crate::data::{BatchOrder, Dataset, Loader, batches_per_epoch};
use crate::optim::Optimizer;
use crate::runtime::Runtime;
use crate::scaler::GradScaler;
use crate::train::build::{Loaded, build_model, loss_scaler, optimizer_rule};
use crate::train::config::{Config, Precision};
use crate::train::error::TrainError;
use crate::train::model::{BuildModel, Trainable};

/// A training run.
pub struct Trainer {
    /// The configuration.
    pub config: Config,
    /// The device and allocator.
    pub rt: Arc<Runtime>,
    /// Model parameters.
    pub params: Params,
    /// The model.
    pub model: Box<dyn Trainable>,
    /// How the model is built (on each device of the run, and in estimates).
    pub(super) build: Arc<BuildModel>,
    /// Whether the model and data are the config's (`[model]`, `[data]`), not a user's.
    pub(super) model_from_config: bool,
    pub(super) opt: Optimizer,
    pub(super) train: Arc<dyn Dataset>,
    pub(super) eval: Arc<dyn Dataset>,
    /// Classes or vocabulary size (the data's outputs).
    pub(super) outputs: usize,
    /// Unigram entropy of the training text in nats (language models on text).
    pub unigram_entropy: Option<f64>,
    /// The loss scaler (fp16-mixed only).
    pub scaler: Option<GradScaler>,
    /// What `memory.fit` or the fp32 fallback decided, for the user.
    pub notes: Vec<String>,
    pub(super) step: u64,
    pub(super) epoch: u64,
    pub(super) index: u64,
    /// The log this run writes, known by its first step line (step, time, loss); `None`
    /// inside for a run without a log. Saved with a checkpoint: a resume appends only
    /// to the log whose first line this is. Outer `None`: not known (a checkpoint
    /// written before logs were named).
    pub(super) log_first: Option<Option<LogLine>>,
    /// False while a step runs: an error then may leave the weights half updated.
    pub(super) consistent: bool,
    /// The last step's global gradient norm before clipping, where clipping computed
    /// it (for the log).
    pub(super) grad_norm: Option<f64>,
    /// The last step's update/weight ratio by layer (`train.log_update_ratio`).
    pub(super) update_ratio: Option<std::collections::BTreeMap<String, f64>>,
    /// The other devices of a multi-device run (`train::parallel`).
    pub(super) world: Option<crate::train::world::World>,
    /// How each step runs, chosen when the run opens (and when devices join).
    pub(super) step_kind: StepKind,
    /// fp16-mixed on one device: the weights' f16 copies the optimizer keeps and the
    /// tapes read (`autograd::half`); none over several devices.
    pub(super) halves: Option<Arc<crate::autograd::HalfWeights>>,
}

/// How a step runs: chosen once from the run's settings, not per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Over several devices (`train::parallel`).
    Parallel,
    /// Each update applied inside backward (`memory.optimizer_in_backward`).
    InBackward,
    /// Without clipping or update ratios: the check (fp16-mixed: the gradients, with the
    /// unscale fused into the update; f32: the losses), the skip and the update on the
    /// device, no read-back before the update.
    OnDevice,
    /// Gradients, then (clipping, the scaler's check) the update.
    Plain,
}

impl StepKind {
    /// The kind a single-device run of `config` takes.
    pub fn of(config: &Config) -> StepKind {
        if config.memory.optimizer_in_backward {
            StepKind::InBackward
        } else if config.train.grad_clip <= 0.0 && !config.train.log_update_ratio {
            StepKind::OnDevice
        } else {
            StepKind::Plain
        }
    }
}

/// A step line of a log, as its identity: step, time, loss.
pub(super) type LogLine = (u64, f64, f64);

impl Trainer {
    /// Builds the model and optimizer for `config` on `rt` over loaded data, as the
    /// config says (no precision rule, no planning: see `Trainer::new`).
    pub fn assemble(config: Config, rt: Arc<Runtime>, data: Loaded) -> Result<Trainer, TrainError> {
        let mut params = Params::default();
        let model = build_model(&config, &rt, data.model.as_ref(), &mut params)?;
        let mut opt = Optimizer::new(optimizer_rule(&config));
        let scaler = loss_scaler(&config)?;
        let step_kind = StepKind::of(&config);
        let halves = (config.memory.precision == Precision::Fp16Mixed).then(Arc::default);
        opt.halves = halves.clone();
        Ok(Trainer {
            config,
            rt,
            params,
            model,
            build: data.model,
            model_from_config: data.from_config,
            opt,
            train: data.train,
            eval: data.eval,
            outputs: data.outputs,
            unigram_entropy: data.unigram_entropy,
            scaler,
            notes: Vec::new(),
            step: 0,
            epoch: 0,
            index: 0,
            log_first: Some(None),
            consistent: true,
            grad_norm: None,
            update_ratio: None,
            world: None,
            step_kind,
            halves,
        })
    }

    /// Steps in the whole run.
    pub fn total_steps(&self) -> u64 {
        let per_epoch = batches_per_epoch(self.train.len(), self.config.train.batch_size, false);
        self.config
            .train
            .steps
            .unwrap_or(per_epoch.saturating_mul(self.config.train.epochs))
    }

    /// Steps done so far (including those before a resume).
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// The training batches from the current position on (seeded shuffles by epoch,
    /// prepared ahead on a thread).
    pub(super) fn batches(&self) -> Loader {
        let order = BatchOrder {
            batch: self.config.train.batch_size,
            seed: self.config.train.seed,
            shuffle: true,
            drop_last: false,
        };
        Loader::start(self.train.clone(), order, (self.epoch, self.index), 2)
    }

    /// Whether matmuls run on f16 inputs: the run's precision, as the config resolved it.
    pub(super) fn half(&self) -> bool {
        self.config.memory.precision == Precision::Fp16Mixed
    }

    /// A training tape in the run's precision and mode for micro-batch `micro` of the
    /// next step (see [`Trainer::mode`]).
    pub(super) fn tape(&self, micro: usize) -> Tape {
        Tape::new()
            .with_half_matmuls(self.half())
            .with_mode(self.mode(micro, 0))
            .with_half_weights(self.halves.clone())
    }

    /// The training mode of micro-batch `micro` on device `rank` in the next step: its
    /// seed (dropout's masks) follows from `train.seed`, the step, the micro-batch and
    /// the device, so a resumed run draws what the uninterrupted one drew.
    pub(super) fn mode(&self, micro: usize, rank: usize) -> Mode {
        self.step_mode().fork(&[micro as u64, rank as u64])
    }

    /// The next step's training mode, before its micro-batch and device are mixed in.
    pub(super) fn step_mode(&self) -> Mode {
        Mode {
            training: true,
            seed: self.config.train.seed,
            checkpoint_every: self.config.memory.checkpoint_every(),
        }
        .fork(&[self.step + 1])
    }
}
