//! What the trainer needs of a model: the mean loss of a batch on a tape, one
//! evaluation batch, and what it reports for planning and display (FLOPs, tokens,
//! checkpointable segments, a resume signature). Models stay unaware of the trainer:
//! the MLP and the GPT implement [`Trainable`] here, a user's model implements it in
//! their crate, and [`BuildModel`] is how the trainer makes one on each device.
//!
//! May call: `autograd`, `data`, `error`, `kernels`, `memory`, `nn`, `runtime`,
//! `tensor`. Called by: the train layer.

use crate::autograd::{Params, Tape, Var, ops};
use crate::data::HostBatch;
use crate::data::fashion_mnist;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::nn::bert::BertInputs;
use crate::nn::{Bert, Builder, Cnn, Gpt, Llama, Mlp, ResNet};
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

/// A language model's decoding with a key/value cache: each call appends one token a
/// sequence and returns the next-token logits [B, V].
pub trait Decoder {
    /// The logits after token `ids` [B] (i32) at the next position.
    fn next(&mut self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error>;
    /// Positions decoded so far.
    fn len(&self) -> usize;
    /// Whether none was.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions it can hold.
    fn capacity(&self) -> usize;
}

/// The GPT's decoder: the model and its cache.
/// A model's decoding over its key/value cache: the GPT's or the Llama's.
struct CachedDecoder<'a, M> {
    model: &'a M,
    cache: crate::nn::kv_cache::KvCache,
    decode: fn(&M, &mut Tape, &Runtime, &Params, &mut crate::nn::kv_cache::KvCache, &Tensor) -> Result<Var, Error>,
}

impl<M> Decoder for CachedDecoder<'_, M> {
    fn next(&mut self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        (self.decode)(self.model, tape, rt, params, &mut self.cache, ids)
    }
    fn len(&self) -> usize {
        self.cache.len()
    }
    fn capacity(&self) -> usize {
        self.cache.capacity()
    }
}

/// A model the trainer can train: the engine's (built from `[model]`) and a user's alike.
/// Only `loss` is required; the rest report what the trainer shows and plans with, and
/// their defaults suit a model that declares nothing.
pub trait Trainable: Send + Sync {
    /// The mean loss of `batch` on `tape`; backward from it fills `params`' gradients.
    /// The tape's [`Mode`](crate::autograd::Mode) says training or evaluation, the
    /// pass's seed (dropout) and how often to recompute a segment (checkpointing).
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, batch: &HostBatch) -> Result<Var, Error>;
    /// The loss (and, for classifiers, the correct count) of one evaluation batch
    /// (default: the loss alone).
    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, batch: &HostBatch) -> Result<EvalBatch, Error> {
        let loss = self.loss(tape, rt, params, batch)?;
        Ok(EvalBatch {
            loss: loss.value.to_f32_vec(rt)?[0] as f64,
            rows: batch.valid_targets(),
            correct: None,
        })
    }
    /// Examples per evaluation batch, given the training micro-batch (default: the same).
    fn eval_batch(&self, micro_batch: usize) -> usize {
        micro_batch
    }
    /// Whether it classifies (evaluation then reports accuracy).
    fn is_classifier(&self) -> bool {
        false
    }
    /// Model FLOPs of one example, forward and backward, for MFU (default: 6 per
    /// parameter, a dense model without attention).
    fn flops_per_example(&self, parameters: usize) -> f64 {
        6.0 * parameters as f64
    }
    /// Tokens per example (sequence models), for tokens/s; a language model's context.
    fn tokens_per_example(&self) -> Option<usize> {
        None
    }
    /// A token-at-a-time decoder with a key/value cache for `batch` sequences, where the
    /// model has one (default: none; generation then runs the whole window each token).
    fn decoder(&self, _rt: &Runtime, _batch: usize) -> Result<Option<Box<dyn Decoder + '_>>, Error> {
        Ok(None)
    }
    /// A language model's next-token logits [B, V] after token ids [B, T] (i32), for
    /// `wgtrain generate`; the default says the model does not generate text.
    fn next_token_logits(&self, _tape: &mut Tape, _rt: &Runtime, _params: &Params, _ids: &Tensor) -> Result<Var, Error> {
        Err(Error::invalid(
            "generate",
            "this model does not generate text (the GPT and the Llama do)",
        ))
    }
    /// How many segments activation checkpointing can recompute (a transformer's
    /// blocks); 0 when the model offers none (`memory.checkpoint` is then refused).
    fn checkpoint_segments(&self) -> usize {
        0
    }
    /// What must match for a checkpoint to resume into this model beyond its parameter
    /// names and shapes (head counts, say); empty when those say everything.
    fn signature(&self) -> String {
        String::new()
    }
}

/// How a model is made: registers its parameters through the builder (named by path,
/// initialised from the run's seed) and returns the model. The trainer calls it for
/// each device of a run and for the memory estimate's dry runs, so it must build the
/// same model every time.
pub type BuildModel = dyn Fn(&mut Builder) -> Result<Box<dyn Trainable>, Error> + Send + Sync;

impl EvalBatch {
    /// A classifier's evaluation: the loss, and how many rows of `logits` [N, classes]
    /// have their largest value at the target's class.
    pub fn classified(rt: &Runtime, loss: &Var, logits: &Var, targets: &[i32]) -> Result<EvalBatch, Error> {
        let classes = *logits.value.shape().last().unwrap_or(&1);
        let values = logits.value.to_f32_vec(rt)?;
        let mut correct = 0;
        for (r, &t) in targets.iter().enumerate() {
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
            loss: loss.value.to_f32_vec(rt)?[0] as f64,
            rows: targets.len(),
            correct: Some(correct),
        })
    }
}

/// `ids` (a batch's tokens, or tokens made from them) as [examples, T].
fn token_ids(rt: &Runtime, b: &HostBatch, ids: &[i32], label: &str) -> Result<Tensor, Error> {
    let t = ids.len() / b.examples.max(1);
    Tensor::from_i32(rt, ids, &[b.examples, t], Category::Input, label)
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

/// A classifier's mean cross-entropy over the batch's targets.
fn class_loss(tape: &mut Tape, rt: &Runtime, logits: &Var, b: &HostBatch, label: &str) -> Result<Var, Error> {
    let y = targets(rt, b)?;
    ops::cross_entropy_mean(tape, rt, logits, &y, b.targets.len(), CE_ROW_CHUNK, label)
}

/// A classifier's evaluation batch: its loss and how many it got right.
fn class_eval(tape: &mut Tape, rt: &Runtime, logits: &Var, b: &HostBatch) -> Result<EvalBatch, Error> {
    let loss = class_loss(tape, rt, logits, b, "eval.loss")?;
    EvalBatch::classified(rt, &loss, logits, &b.targets)
}

impl Trainable for Mlp {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let logits = self.logits(tape, rt, params, b)?;
        class_loss(tape, rt, &logits, b, "loss")
    }

    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<EvalBatch, Error> {
        let logits = self.logits(tape, rt, params, b)?;
        class_eval(tape, rt, &logits, b)
    }

    fn eval_batch(&self, _micro_batch: usize) -> usize {
        EVAL_BATCH
    }

    fn is_classifier(&self) -> bool {
        true
    }
}

/// A conv net on image batches (NCHW pixels per example): the CNN, or a ResNet with
/// its image shape.
pub enum ImageModel {
    /// The small CNN.
    Cnn(Cnn),
    /// A ResNet and the [channels, height, width] of its images.
    ResNet(ResNet, [usize; 3]),
}

impl ImageModel {
    fn logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        match self {
            ImageModel::Cnn(m) => m.forward(tape, rt, params, &b.features, b.examples),
            ImageModel::ResNet(m, [c, h, w]) => m.forward(tape, rt, params, &b.features, [b.examples, *c, *h, *w]),
        }
    }
}

impl Trainable for ImageModel {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let logits = self.logits(tape, rt, params, b)?;
        class_loss(tape, rt, &logits, b, "loss")
    }

    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<EvalBatch, Error> {
        let logits = self.logits(tape, rt, params, b)?;
        class_eval(tape, rt, &logits, b)
    }

    /// The CNN evaluates 500 images at a time; a ResNet as many as it trains on.
    fn eval_batch(&self, micro_batch: usize) -> usize {
        match self {
            ImageModel::Cnn(_) => EVAL_BATCH / 2,
            ImageModel::ResNet(..) => micro_batch,
        }
    }

    fn is_classifier(&self) -> bool {
        true
    }

    /// Forward and backward: 3 x 2 x the forward's multiply-adds.
    fn flops_per_example(&self, _parameters: usize) -> f64 {
        6.0 * match self {
            ImageModel::Cnn(m) => m.macs(),
            ImageModel::ResNet(m, [_, h, w]) => m.macs(*h, *w),
        }
    }

    /// A ResNet's blocks.
    fn checkpoint_segments(&self) -> usize {
        match self {
            ImageModel::Cnn(_) => 0,
            ImageModel::ResNet(m, _) => m.blocks(),
        }
    }
}

impl Trainable for Gpt {
    /// Through the fused head + cross-entropy: the GPT never holds the whole logits.
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let (ids, y) = (token_ids(rt, b, &b.tokens, "batch.tokens")?, targets(rt, b)?);
        self.forward_loss(tape, rt, params, &ids, (&y, b.valid_targets()), CE_ROW_CHUNK)
    }

    /// 6N + 12·L·T·C per token (N without the position embedding), T tokens.
    fn flops_per_example(&self, parameters: usize) -> f64 {
        let c = &self.config;
        let (l, t, e) = (c.n_layer as f64, c.n_positions as f64, c.n_embd as f64);
        let non_embedding = parameters as f64 - t * e;
        (6.0 * non_embedding + 12.0 * l * t * e) * t
    }

    fn tokens_per_example(&self) -> Option<usize> {
        Some(self.config.n_positions)
    }

    fn next_token_logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        Gpt::next_token_logits(self, tape, rt, params, ids)
    }

    fn decoder(&self, rt: &Runtime, batch: usize) -> Result<Option<Box<dyn Decoder + '_>>, Error> {
        Ok(Some(Box::new(CachedDecoder {
            model: self,
            cache: self.kv_cache(rt, batch)?,
            decode: Gpt::decode,
        })))
    }

    fn checkpoint_segments(&self) -> usize {
        self.config.n_layer
    }

    fn signature(&self) -> String {
        format!("gpt n_head {}", self.config.n_head)
    }
}

impl Trainable for Llama {
    /// Through the fused head + cross-entropy, as the GPT.
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let (ids, y) = (token_ids(rt, b, &b.tokens, "batch.tokens")?, targets(rt, b)?);
        self.forward_loss(tape, rt, params, &ids, (&y, b.valid_targets()), CE_ROW_CHUNK)
    }

    /// 6N + 12·L·T·(H·D) per token, N without the embedding when the head is its own
    /// (a lookup is no matmul), T tokens.
    fn flops_per_example(&self, parameters: usize) -> f64 {
        let c = &self.config;
        let (l, t) = (c.num_hidden_layers as f64, c.max_position_embeddings as f64);
        let attn = (c.num_attention_heads * c.head_dim()) as f64;
        let lookup = if c.tie_word_embeddings {
            0.0
        } else {
            (c.vocab_size * c.hidden_size) as f64
        };
        (6.0 * (parameters as f64 - lookup) + 12.0 * l * t * attn) * t
    }

    fn tokens_per_example(&self) -> Option<usize> {
        Some(self.config.max_position_embeddings)
    }

    fn next_token_logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        Llama::next_token_logits(self, tape, rt, params, ids)
    }

    fn decoder(&self, rt: &Runtime, batch: usize) -> Result<Option<Box<dyn Decoder + '_>>, Error> {
        Ok(Some(Box::new(CachedDecoder {
            model: self,
            cache: self.kv_cache(rt, batch)?,
            decode: Llama::decode,
        })))
    }

    fn checkpoint_segments(&self) -> usize {
        self.config.num_hidden_layers
    }

    fn signature(&self) -> String {
        format!(
            "llama n_head {} n_kv_head {}",
            self.config.num_attention_heads,
            self.config.kv_heads()
        )
    }
}

/// BERT trained as a masked language model on windows of text: in each window a share
/// `probability` of the positions is predicted; of those, 80% are replaced by [MASK]
/// (the last id of the vocabulary), 10% by a random token and 10% left as they are
/// (transformers' DataCollatorForLanguageModeling). The positions are drawn from the
/// pass's seed: new ones every step, the same ones when a step is recomputed or resumed,
/// fixed ones for evaluation.
pub struct MaskedLm {
    /// The model.
    pub bert: Bert,
    probability: f32,
}

impl MaskedLm {
    /// `bert` masked at `probability`.
    pub fn new(bert: Bert, probability: f32) -> MaskedLm {
        MaskedLm { bert, probability }
    }

    /// The masked inputs and the labels (-100 where nothing is predicted) of `tokens`.
    pub fn mask(&self, tokens: &[i32], seed: u64) -> (Vec<i32>, Vec<i32>) {
        use rand::{Rng as _, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mask_id = self.bert.config.vocab_size as i32 - 1;
        let mut inputs = tokens.to_vec();
        let mut labels = vec![crate::kernels::cross_entropy::IGNORE_INDEX; tokens.len()];
        for (i, &t) in tokens.iter().enumerate() {
            if rng.random::<f32>() >= self.probability {
                continue;
            }
            labels[i] = t;
            let r: f32 = rng.random();
            if r < 0.8 {
                inputs[i] = mask_id;
            } else if r < 0.9 {
                inputs[i] = rng.random_range(0..mask_id);
            }
        }
        // A batch with nothing to predict would have a 0/0 loss: predict its first token.
        if !tokens.is_empty() && labels.iter().all(|&l| l == crate::kernels::cross_entropy::IGNORE_INDEX) {
            labels[0] = tokens[0];
            inputs[0] = mask_id;
        }
        (inputs, labels)
    }
}

impl Trainable for MaskedLm {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let mode = tape.mode();
        let seed = if mode.training { mode.seed } else { 0x6d61_736b };
        let (inputs, labels) = self.mask(&b.tokens, seed);
        let ids = token_ids(rt, b, &inputs, "batch.masked")?;
        let n_valid = labels.iter().filter(|&&l| l != crate::kernels::cross_entropy::IGNORE_INDEX).count();
        let y = Tensor::from_i32(rt, &labels, &[labels.len()], Category::Input, "batch.labels")?;
        let inputs = BertInputs {
            ids: &ids,
            token_types: None,
            attention_mask: None,
        };
        self.bert.forward_loss(tape, rt, params, &inputs, (&y, n_valid))
    }

    /// 6N + 12·L·T·C per token (N without the position and type tables), T tokens.
    fn flops_per_example(&self, parameters: usize) -> f64 {
        let c = &self.bert.config;
        let (l, t, e) = (c.num_hidden_layers as f64, c.max_position_embeddings as f64, c.hidden_size as f64);
        let tables = ((c.max_position_embeddings + c.type_vocab_size) * c.hidden_size) as f64;
        (6.0 * (parameters as f64 - tables) + 12.0 * l * t * e) * t
    }

    fn tokens_per_example(&self) -> Option<usize> {
        Some(self.bert.config.max_position_embeddings)
    }

    fn checkpoint_segments(&self) -> usize {
        self.bert.config.num_hidden_layers
    }

    fn signature(&self) -> String {
        format!("bert n_head {} mlm {}", self.bert.config.num_attention_heads, self.probability)
    }
}
