//! Evaluation: the loss (and accuracy, for classifiers) over the evaluation split,
//! without gradients, in batches the model chooses; running out of memory halves the
//! batch until it fits.
//!
//! May call: `autograd`, `data`, `protocol` (the log's types), `train::{error, trainer}`.
//! Called by: `train::run`, tests.

use wgtrain_record::EvalLog;

use crate::autograd::{Mode, Tape};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;

impl Trainer {
    /// Loss (and accuracy, for classifiers) over the evaluation split, without gradients.
    /// Out of memory halves the evaluation batch (after emptying the cache) until it fits.
    pub fn evaluate(&self) -> Result<EvalLog, TrainError> {
        let micro = self.config.train.micro_batch_size.unwrap_or(self.config.train.batch_size);
        self.evaluate_in_batches(self.model.eval_batch(micro))
    }

    /// [`Trainer::evaluate`] in batches of `batch` examples (halved on running out of
    /// memory).
    pub fn evaluate_in_batches(&self, batch: usize) -> Result<EvalLog, TrainError> {
        let mut batch = batch.max(1);
        loop {
            match self.evaluate_in(batch) {
                Err(e) if e.is_out_of_memory() && batch > 1 => {
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
        // ZeRO stage 3: the weights whole on the first device for the evaluation.
        let whole = self.whole_params()?;
        let params = whole.as_ref().unwrap_or(&self.params);
        for start in (0..n).step_by(batch.max(1)) {
            let indices: Vec<usize> = (start..(start + batch).min(n)).collect();
            let b = crate::data::collate(&*self.eval, &indices, (0, 0))?;
            let mut tape = Tape::no_grad()
                .with_half_matmuls(self.half())
                .with_mode(Mode::eval())
                .with_half_weights(self.halves.clone());
            let result = self.model.evaluate(&mut tape, &self.rt, params, &b)?;
            loss_sum += result.loss * result.rows as f64;
            count += result.rows;
            correct += result.correct.unwrap_or(0);
        }
        Ok(EvalLog {
            loss: loss_sum / count.max(1) as f64,
            accuracy: self.model.is_classifier().then(|| correct as f64 / count.max(1) as f64),
            ..Default::default()
        })
    }
}
