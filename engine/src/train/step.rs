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

    /// A step with no host read-back until its end: under fp16-mixed the gradients are
    /// checked on the device (the update unscales them itself), in f32 the losses; the
    /// optimizer's updates skip there when the check found an inf or NaN, and only then
    /// are the losses and the flag read (one wait per step, so the host records the
    /// next launches while the device runs). The same arithmetic as the step that reads
    /// the flag first; in f32 a non-finite loss ends the run with the weights and the
    /// optimizer's state as the step found them.
    fn train_step_on_device(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        let losses = self.forward_backward(batch)?;
        self.rt.phase("optimizer");
        let (found, inv_scale) = match &self.scaler {
            Some(scaler) => (scaler.check_on_device(&self.rt, &self.params)?, 1.0 / scaler.scale),
            None => {
                let values: Vec<&Tensor> = losses.iter().map(|(l, _)| l).collect();
                (crate::scaler::found_non_finite(&self.rt, &values)?, 1.0)
            }
        };
        self.opt.step_scaled(&self.rt, &self.params, lr, Some(&found), inv_scale)?;
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
        ranges.push((found.block(), 4 * found.offset() as u64, 4));
        let bytes = self.rt.download(&ranges)?.finish().map_err(Error::from)?;
        let word = |i: usize| <[u8; 4]>::try_from(&bytes[4 * i..4 * i + 4]).expect("four bytes a value");
        let loss = losses
            .iter()
            .enumerate()
            .map(|(i, (_, weight))| f32::from_le_bytes(word(i)) as f64 * weight)
            .sum::<f64>();
        let skipped = u32::from_le_bytes(word(losses.len())) != 0;
        if skipped {
            self.opt.undo_skipped_step();
        }
        match &mut self.scaler {
            Some(scaler) => scaler.update(skipped),
            None if skipped => return Err(TrainError::NonFinite(loss as f32, self.step + 1)),
            None => {}
        }
        Ok((loss, skipped))
    }

    /// One step that survives running out of memory: on an out-of-memory error the
    /// cache is emptied and the step retried; if it fails again the micro-batch is
    /// halved (the effective batch stays, through accumulation) until it fits.
    pub fn resilient_step(&mut self, batch: &HostBatch, lr: f32) -> Result<StepOutcome, TrainError> {
        let mut events: Vec<String> = Vec::new();
        let mut retried = false;
        loop {
            match self.train_step(batch, lr) {
                Ok((loss, skipped)) => {
                    return Ok(StepOutcome {
                        loss,
                        skipped,
                        event: (!events.is_empty()).then(|| events.join("; ")),
                    });
                }
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
