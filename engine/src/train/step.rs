//! One optimizer step: forward and backward over the batch in micro-batches (the
//! accumulated gradients equal the whole batch's), unscale and the inf/NaN check under
//! fp16-mixed, clipping, the update, the scaler's update; without clipping the whole
//! step runs without a read-back until its end (the updates skip on the device); the
//! variant that applies updates inside backward; and the step that survives running out
//! of memory.
//!
//! May call: `autograd`, `data`, `memory`, `optim`, `runtime`, `tensor`, `train::{error,
//! trainer}`. Called by: `train::{run, plan}`.

use crate::autograd::Param;
use crate::data::HostBatch;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::format_bytes;
use crate::optim::{clip_coef, grad_norm, scale_grads};
use crate::runtime::Runtime;
use crate::tensor::Tensor;
use crate::train::error::TrainError;
use crate::train::trainer::{StepKind, Trainer};

/// Splits a batch into consecutive parts of at most `micro` examples.
pub(super) fn split_batch(batch: &HostBatch, micro: usize) -> Vec<std::borrow::Cow<'_, HostBatch>> {
    if micro >= batch.examples {
        // The batch itself, not a copy (a batch of images is hundreds of MB).
        return vec![std::borrow::Cow::Borrowed(batch)];
    }
    let per = |len: usize| len / batch.examples.max(1);
    let (fe, to, ta) = (per(batch.features.len()), per(batch.tokens.len()), per(batch.targets.len()));
    (0..batch.examples)
        .step_by(micro)
        .map(|start| {
            let end = (start + micro).min(batch.examples);
            std::borrow::Cow::Owned(HostBatch {
                features: batch.features[start * fe..end * fe].to_vec(),
                tokens: batch.tokens[start * to..end * to].to_vec(),
                targets: batch.targets[start * ta..end * ta].to_vec(),
                examples: end - start,
                position: batch.position,
            })
        })
        .collect()
}

/// Where a recorded step found the trainer: what a skip returns to.
pub(super) struct StepBookmark {
    opt: crate::optim::OptimizerBookmark,
    scaler: Option<crate::scaler::GradScaler>,
    /// Steps done before it.
    step: u64,
}

/// A step recorded and submitted whose losses and skip flag are on their way back
/// ([`Trainer::record_step`]).
pub(super) struct PendingStep {
    download: crate::device::transfer::Download,
    /// Each micro-batch's weight in the batch's mean loss.
    weights: Vec<f64>,
    before: StepBookmark,
}

/// What one step reports.
pub struct StepOutcome {
    /// The batch's mean loss.
    pub loss: f64,
    /// Whether the update was skipped for an inf or NaN gradient (fp16-mixed).
    pub skipped: bool,
    /// What happened on the way (out-of-memory retries), if anything.
    pub event: Option<String>,
}

impl Trainer {
    /// Forward and backward over `batch`, in micro-batches of `train.micro_batch_size`
    /// examples when set: each micro-batch's mean loss is weighted by its share of the
    /// batch's targets (the backward seed), so the accumulated gradients equal the whole
    /// batch's. Returns the batch's mean loss; gradients are left in `params`.
    pub fn compute_gradients(&mut self, batch: &HostBatch) -> Result<f64, TrainError> {
        let losses = self.forward_backward(batch)?;
        self.rt.phase("readback");
        read_losses(&self.rt, &losses)
    }

    /// Forward and backward over `batch`'s micro-batches, reading nothing back: each
    /// micro-batch's loss stays on the device with its weight in the batch's mean.
    fn forward_backward(&mut self, batch: &HostBatch) -> Result<Vec<(Tensor, f64)>, TrainError> {
        let micro = match self.config.train.micro_batch_size {
            Some(m) if m > 0 && m < batch.examples => m,
            _ => batch.examples,
        };
        let total_targets = batch.targets.len().max(1);
        let mut losses = Vec::new();
        for (k, part) in split_batch(batch, micro).into_iter().enumerate() {
            let rows = part.targets.len();
            let weight = rows as f32 / total_targets as f32;
            let seed = weight * self.scaler.as_ref().map_or(1.0, |s| s.scale);
            let mut tape = self.tape(k).with_grad_prescale(seed);
            self.rt.phase("forward");
            let loss = self.model.loss(&mut tape, &self.rt, &self.params, &part)?;
            self.rt.phase("backward");
            tape.backward_with(&self.rt, &loss, seed, &mut self.params)?;
            losses.push((loss.value, weight as f64));
        }
        Ok(losses)
    }

    /// One training step on `batch`; returns the loss and, under fp16-mixed, whether
    /// the step was skipped for a non-finite gradient. Gradients are unscaled before
    /// clipping, and the scale is updated after the step (torch.amp.GradScaler's order).
    pub fn train_step(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        match self.step_kind {
            StepKind::Parallel => return self.parallel_step(batch, lr),
            StepKind::InBackward => return Ok((self.train_step_in_backward(batch, lr)?, false)),
            StepKind::OnDevice => return self.train_step_on_device(batch, lr),
            StepKind::Plain => {}
        }
        let loss = self.compute_gradients(batch)?;
        self.rt.phase("optimizer");
        self.grad_norm = None;
        let mut skipped = false;
        if let Some(scaler) = &self.scaler {
            skipped = scaler.unscale(&self.rt, &self.params)?;
        } else if !loss.is_finite() {
            return Err(TrainError::NonFinite(loss as f32, self.step + 1));
        }
        if !skipped {
            // Clipping's factor goes into the update, which multiplies each gradient by
            // it as it reads it (the same f32 products as scaling the gradients first);
            // the update-ratio step scales them first.
            let mut factor = 1.0;
            if self.config.train.grad_clip > 0.0 {
                let norm = grad_norm(&self.rt, &self.params)?;
                self.grad_norm = Some(norm as f64);
                let coef = clip_coef(norm, self.config.train.grad_clip);
                if coef < 1.0 {
                    factor = coef;
                }
            }
            if self.config.train.log_update_ratio {
                scale_grads(&self.rt, &self.params, factor)?;
                let sums = self.opt.step_measured(&self.rt, &self.params, lr)?;
                self.update_ratio = Some(update_ratios(&self.params, &sums));
            } else {
                self.opt.step_scaled(&self.rt, &self.params, lr, None, factor)?;
            }
        }
        if let Some(scaler) = &mut self.scaler {
            scaler.update(skipped);
        }
        self.params.zero_grad();
        Ok((loss, skipped))
    }

    /// A step with no host read-back until its end: [`Trainer::record_step`], then
    /// [`Trainer::finish_step`].
    fn train_step_on_device(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        let pending = self.record_step(batch, lr)?;
        self.finish_step(pending)
    }

    /// Records a whole step and starts reading its losses and skip flag back, waiting
    /// for nothing: under fp16-mixed the gradients are checked on the device (the update
    /// unscales them itself), in f32 the losses; the optimizer's updates skip there when
    /// a check found an inf or NaN. The flag is the optimizer's (`Optimizer::skip_flag`) and
    /// only a check sets it, so a step recorded before an earlier one's flag is read
    /// skips too when that one did: the loop records step N+1 while step N runs and
    /// reads N after (`train::run`). The scaler moves on as if the step were clean;
    /// [`Trainer::finish_step`] corrects it (and the optimizer's bookkeeping) when not.
    /// The same arithmetic as the step that reads the flag first.
    pub(super) fn record_step(&mut self, batch: &HostBatch, lr: f32) -> Result<PendingStep, TrainError> {
        let before = StepBookmark {
            opt: self.opt.bookmark(),
            scaler: self.scaler.clone(),
            step: self.step,
        };
        let losses = self.forward_backward(batch)?;
        self.rt.phase("optimizer");
        let flag = self.opt.skip_flag(&self.rt)?;
        let inv_scale = match &self.scaler {
            Some(scaler) => {
                scaler.check_into(&self.rt, &self.params, &flag)?;
                1.0 / scaler.scale
            }
            None => {
                let values: Vec<&Tensor> = losses.iter().map(|(l, _)| l).collect();
                crate::scaler::flag_if_non_finite(&self.rt, &values, &flag)?;
                1.0
            }
        };
        self.opt.step_scaled(&self.rt, &self.params, lr, Some(&flag), inv_scale)?;
        self.params.zero_grad();
        self.rt.phase("readback");
        // The losses and the flag in one read-back: one wait for the device.
        let mut ranges: Vec<(&crate::memory::Block, u64, u64)> = Vec::with_capacity(losses.len() + 1);
        for (l, _) in &losses {
            if l.dtype() != crate::tensor::DType::F32 || l.numel() != 1 {
                return Err(Error::shape("loss", "one f32 value", format!("{:?} {}", l.shape(), l.dtype())).into());
            }
            ranges.push((l.block(), 4 * l.offset() as u64, 4));
        }
        ranges.push((flag.block(), 4 * flag.offset() as u64, 4));
        let download = self.rt.download(&ranges)?;
        if let Some(scaler) = &mut self.scaler {
            scaler.update(false);
        }
        Ok(PendingStep {
            download,
            weights: losses.iter().map(|(_, w)| *w).collect(),
            before,
        })
    }

    /// Waits for a recorded step's losses and flag: its mean loss and whether it was
    /// skipped. A skipped step returns the optimizer's bookkeeping and the scaler to
    /// what they were before it, backed off (fp16-mixed; a step recorded after it was
    /// skipped on the device too and must be recorded again, as `train::run` does),
    /// or ends the run (f32: a non-finite loss, the weights and the optimizer's state as
    /// the step found them).
    pub(super) fn finish_step(&mut self, pending: PendingStep) -> Result<(f64, bool), TrainError> {
        let bytes = pending.download.finish().map_err(Error::from)?;
        let word = |i: usize| <[u8; 4]>::try_from(&bytes[4 * i..4 * i + 4]).expect("four bytes a value");
        let loss = pending
            .weights
            .iter()
            .enumerate()
            .map(|(i, weight)| f32::from_le_bytes(word(i)) as f64 * weight)
            .sum::<f64>();
        let skipped = u32::from_le_bytes(word(pending.weights.len())) != 0;
        if !skipped {
            return Ok((loss, false));
        }
        self.opt.restore(pending.before.opt);
        crate::kernels::map::fill(&self.rt, &self.opt.skip_flag(&self.rt)?, 0.0)?;
        match pending.before.scaler {
            Some(mut scaler) => {
                scaler.update(true);
                self.scaler = Some(scaler);
                Ok((loss, true))
            }
            None => Err(TrainError::NonFinite(loss as f32, pending.before.step + 1)),
        }
    }

    /// One step that survives running out of memory: on an out-of-memory error the
    /// cache is emptied and the step retried; if it fails again the micro-batch is
    /// halved (the effective batch stays, through accumulation) until it fits.
    pub fn resilient_step(&mut self, batch: &HostBatch, lr: f32) -> Result<StepOutcome, TrainError> {
        let ((loss, skipped), event) = self.resilient(batch, lr, Trainer::train_step)?;
        Ok(StepOutcome { loss, skipped, event })
    }

    /// `step` on `batch` made resilient to running out of memory as
    /// [`Trainer::resilient_step`] says; returns what it returned and what happened on
    /// the way (the retries), if anything.
    pub(super) fn resilient<T>(
        &mut self,
        batch: &HostBatch,
        lr: f32,
        step: fn(&mut Trainer, &HostBatch, f32) -> Result<T, TrainError>,
    ) -> Result<(T, Option<String>), TrainError> {
        let mut events: Vec<String> = Vec::new();
        let mut retried = false;
        loop {
            match step(self, batch, lr) {
                Ok(done) => return Ok((done, (!events.is_empty()).then(|| events.join("; ")))),
                Err(e) if e.is_out_of_memory() => {
                    // No gradient of the failed attempt may leak into the retry.
                    self.params.zero_grad();
                    // Let the devices finish what was recorded so the pages really go.
                    let mut freed = 0;
                    for rt in self.runtimes() {
                        let _ = rt.sync();
                        freed += rt.alloc.empty_cache();
                    }
                    let micro = self.config.train.micro_batch_size.unwrap_or(batch.examples).min(batch.examples);
                    if !retried {
                        retried = true;
                        events.push(format!("out of memory; emptied the cache ({}) and retried", format_bytes(freed)));
                        tracing::warn!("step {}: {}", self.step + 1, events.last().expect("just pushed"));
                        continue;
                    }
                    if micro <= 1 || self.config.memory.optimizer_in_backward {
                        return Err(TrainError::OutOfMemory(e.to_string()));
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
        let mut tape = self.tape(0);
        self.rt.phase("forward");
        let loss = self.model.loss(&mut tape, &self.rt, &self.params, batch)?;
        self.rt.phase("backward");
        self.opt.begin_step(&self.rt, self.params.list.len())?;
        let opt = &mut self.opt;
        let mut apply = |rt: &Runtime, i: usize, p: &mut Param| -> Result<(), Error> {
            opt.update_param(rt, i, p, lr)?;
            p.grad = None;
            Ok(())
        };
        tape.backward_with_hook(&self.rt, &loss, 1.0, &mut self.params, &mut apply)?;
        self.rt.phase("readback");
        let value = loss.value.to_f32_vec(&self.rt)?[0] as f64;
        if !value.is_finite() {
            return Err(TrainError::NonFinite(value as f32, self.step + 1));
        }
        Ok(value)
    }
}

/// The batch's mean loss from its micro-batches' losses on the device (one wait).
pub(super) fn read_losses(rt: &Runtime, losses: &[(Tensor, f64)]) -> Result<f64, TrainError> {
    let mut sum = 0.0;
    for (loss, weight) in losses {
        sum += loss.to_f32_vec(rt)?[0] as f64 * weight;
    }
    Ok(sum)
}

/// ||update|| / ||weight|| by layer (the module a parameter belongs to: its name without
/// `.weight` or `.bias`), from each parameter's sums of squares.
pub(super) fn update_ratios(params: &crate::autograd::Params, sums: &[Option<(f64, f64)>]) -> std::collections::BTreeMap<String, f64> {
    let mut by: std::collections::BTreeMap<String, (f64, f64)> = std::collections::BTreeMap::new();
    for (p, s) in params.list.iter().zip(sums) {
        if let Some((u, w)) = s {
            let e = by
                .entry(crate::train::observe::profile::module_of(&p.name).to_string())
                .or_default();
            e.0 += u;
            e.1 += w;
        }
    }
    by.into_iter()
        .filter(|(_, (_, w))| *w > 0.0)
        .map(|(k, (u, w))| (k, (u / w).sqrt()))
        .collect()
}
