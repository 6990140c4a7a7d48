//! What the trainer needs of a model: the mean loss of a batch on a tape, and one
//! evaluation batch. Models stay unaware of the trainer: the MLP and the GPT implement
//! [`Trainable`] here, and a new model is a new impl, not an edit of the trainer.
//!
//! May call: `autograd`, `data`, `error`, `kernels`, `memory`, `nn`, `runtime`,
//! `tensor`. Called by: the train layer.

use crate::autograd::{Params, Tape, Var, ops};
use crate::data::HostBatch;
use crate::data::fashion_mnist;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::nn::{Gpt, Mlp};
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// Rows of logits per fused cross-entropy launch (and per chunk of the fused head:
/// GPT-2's 50257-wide vocabulary makes a 2048-row chunk 412 MB in f32).
pub const CE_ROW_CHUNK: usize = 2048;
/// Examples per evaluation batch of a classifier.
pub const EVAL_BATCH: usize = 1000;

/// One evaluation batch's result.
pub struct EvalBatch {
    /// The batch's mean loss.
    pub loss: f64,
    /// Targets the loss is over.
    pub rows: usize,
    /// How many were classified right (classifiers only).
    pub correct: Option<usize>,
}

/// A model the trainer can train.
pub trait Trainable: Send + Sync {
    /// The mean loss of `batch` on `tape`; backward from it fills `params`' gradients.
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, batch: &HostBatch) -> Result<Var, Error>;
    /// The loss (and, for classifiers, the correct count) of one evaluation batch.
    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, batch: &HostBatch) -> Result<EvalBatch, Error>;
    /// Examples per evaluation batch, given the training micro-batch.
    fn eval_batch(&self, micro_batch: usize) -> usize;
    /// Whether it classifies (evaluation then reports accuracy).
    fn is_classifier(&self) -> bool;
}

fn targets(rt: &Runtime, b: &HostBatch) -> Result<Tensor, Error> {
    Tensor::from_i32(rt, &b.targets, &[b.targets.len()], Category::Input, "batch.targets")
}

impl Mlp {
    fn logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let x = Tensor::from_f32(
            rt,
            &b.features,
            &[b.examples, fashion_mnist::PIXELS],
            Category::Input,
            "batch.images",
        )?;
        self.forward(tape, rt, params, x)
    }
}

impl Trainable for Mlp {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let y = targets(rt, b)?;
        let logits = self.logits(tape, rt, params, b)?;
        ops::cross_entropy_mean(tape, rt, &logits, &y, b.targets.len(), CE_ROW_CHUNK, "loss")
    }

    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<EvalBatch, Error> {
        let rows = b.targets.len();
        let y = targets(rt, b)?;
        let logits = self.logits(tape, rt, params, b)?;
        let loss = ops::cross_entropy_mean(tape, rt, &logits, &y, rows, CE_ROW_CHUNK, "eval.loss")?;
        let loss = loss.value.to_f32_vec(rt)?[0] as f64;
        let classes = logits.value.shape()[1];
        let values = logits.value.to_f32_vec(rt)?;
        let mut correct = 0;
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
        Ok(EvalBatch {
            loss,
            rows,
            correct: Some(correct),
        })
    }

    fn eval_batch(&self, _micro_batch: usize) -> usize {
        EVAL_BATCH
    }

    fn is_classifier(&self) -> bool {
        true
    }
}

impl Trainable for Gpt {
    /// Through the fused head + cross-entropy: the GPT never holds the whole logits.
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let rows = b.targets.len();
        let y = targets(rt, b)?;
        let t = b.tokens.len() / b.examples.max(1);
        let ids = Tensor::from_i32(rt, &b.tokens, &[b.examples, t], Category::Input, "batch.tokens")?;
        self.forward_loss(tape, rt, params, &ids, (&y, rows), CE_ROW_CHUNK)
    }

    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<EvalBatch, Error> {
        let loss = self.loss(tape, rt, params, b)?;
        Ok(EvalBatch {
            loss: loss.value.to_f32_vec(rt)?[0] as f64,
            rows: b.targets.len(),
            correct: None,
        })
    }

    fn eval_batch(&self, micro_batch: usize) -> usize {
        micro_batch
    }

    fn is_classifier(&self) -> bool {
        false
    }
}
