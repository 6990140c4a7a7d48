//! Text from a trained language model (`wgtrain generate`, nanoGPT's sample.py): each
//! new token is drawn from the model's next-token logits over the last context window
//! of the ids so far: greedily at temperature 0, else from the softmax of the logits
//! over the temperature, restricted to the `top_k` likeliest where asked, with a seeded
//! generator (the same seed draws the same text). A model with a key/value cache (the
//! GPT, the Llama) decodes a token at a time over it; others, or a full cache, run the whole
//! window again each token. No tape; the run's precision (or `--precision`'s); the last
//! position's logits read back to the host.
//!
//! May call: `autograd`, `error`, `kernels`, `memory`, `tensor`, `train::{error,
//! trainer}`. Called by: the CLI, tests.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::autograd::{Mode, Tape};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::tensor::Tensor;
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;

/// How each token is drawn.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Divides the logits; 0 takes the likeliest token (greedy).
    pub temperature: f32,
    /// Only the k likeliest tokens may be drawn (0: any, as transformers' `top_k=0`).
    pub top_k: Option<usize>,
    /// Seeds the draws.
    pub seed: u64,
    /// Decode with the model's key/value cache where it has one (else every token runs
    /// the whole window).
    pub cache: bool,
}

impl Trainer {
    /// `tokens` new token ids after `prompt` (ids below the model's vocabulary) for each
    /// of `batch` sequences drawn together; each step's new ids (one a sequence) are
    /// handed to `each` as they come. Returns each sequence's new ids.
    pub fn generate(
        &self,
        prompt: &[i32],
        tokens: usize,
        batch: usize,
        sampling: &Sampling,
        mut each: impl FnMut(&[i32]) -> Result<(), Error>,
    ) -> Result<Vec<Vec<i32>>, TrainError> {
        let window = self
            .model
            .tokens_per_example()
            .ok_or_else(|| Error::invalid("generate", "this model does not generate text (the GPT and the Llama do)"))?;
        if prompt.is_empty() {
            return Err(Error::invalid("generate", "the prompt is empty: give at least one token").into());
        }
        if batch == 0 {
            return Err(Error::invalid("generate", "a batch of no sequences").into());
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t < 0 || t as usize >= self.outputs) {
            return Err(Error::invalid(
                "generate",
                format!("prompt token {bad} is not in the model's vocabulary of {}", self.outputs),
            )
            .into());
        }
        if !(sampling.temperature >= 0.0 && sampling.temperature.is_finite()) {
            return Err(Error::invalid("generate", format!("temperature {} is not a number >= 0", sampling.temperature)).into());
        }
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        let mut seqs: Vec<Vec<i32>> = vec![prompt.to_vec(); batch];
        let tape = || {
            Tape::no_grad()
                .with_half_matmuls(self.half())
                .with_mode(Mode::eval())
                .with_half_weights(self.halves.clone())
        };
        // Under fp16-mixed each product casts its weight, every token: keeping the f16
        // copies instead (commit 13c9077) took 176 MB more on GPT-2 for 223.8 against
        // 208.7 tokens/s at batch 1 and 1,384 against 1,489 at batch 16 (H100).
        let read = |v: crate::autograd::Var| v.value.to_f32_vec(&self.rt);
        let vocab = self.outputs;
        // Each sequence's token from its row of the logits, in order (one generator).
        let mut step = |logits: &[f32], seqs: &mut Vec<Vec<i32>>| -> Result<Vec<i32>, Error> {
            let new: Vec<i32> = logits.chunks(vocab).map(|row| draw(row, sampling, &mut rng)).collect();
            seqs.iter_mut().zip(&new).for_each(|(s, &t)| s.push(t));
            each(&new)?;
            Ok(new)
        };
        let mut made = 0;
        let decoder = if sampling.cache {
            self.model.decoder(&self.rt, batch)?
        } else {
            None
        };
        if let Some(mut dec) = decoder {
            // The prompt's last window into the cache, then a token a call until the
            // cache is full (the whole window each token from there on, below).
            let mut logits = Vec::new();
            for &t in &prompt[prompt.len().saturating_sub(dec.capacity())..] {
                let id = Tensor::from_i32(&self.rt, &vec![t; batch], &[batch], Category::Input, "token")?;
                logits = read(dec.next(&mut tape(), &self.rt, &self.params, &id)?)?;
            }
            while made < tokens {
                let new = step(&logits, &mut seqs)?;
                made += 1;
                if made == tokens || dec.len() == dec.capacity() {
                    break;
                }
                let id = Tensor::from_i32(&self.rt, &new, &[batch], Category::Input, "token")?;
                logits = read(dec.next(&mut tape(), &self.rt, &self.params, &id)?)?;
            }
        }
        while made < tokens {
            let len = seqs[0].len().min(window);
            let context: Vec<i32> = seqs.iter().flat_map(|s| s[s.len() - len..].to_vec()).collect();
            let input = Tensor::from_i32(&self.rt, &context, &[batch, len], Category::Input, "prompt")?;
            let logits = read(self.model.next_token_logits(&mut tape(), &self.rt, &self.params, &input)?)?;
            step(&logits, &mut seqs)?;
            made += 1;
        }
        Ok(seqs.into_iter().map(|mut s| s.split_off(prompt.len())).collect())
    }
}

/// One token from `logits` as `sampling` says.
pub fn draw(logits: &[f32], sampling: &Sampling, rng: &mut impl Rng) -> i32 {
    let likeliest = || {
        // The first of the largest (a NaN never wins).
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] || logits[best].is_nan() {
                best = i;
            }
        }
        best as i32
    };
    if sampling.temperature == 0.0 {
        return likeliest();
    }
    let t = sampling.temperature as f64;
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    // Top-k: the k likeliest, found without sorting the whole vocabulary (a sort of
    // GPT-2's 50,257 logits took about as long as decoding the token).
    if let Some(k) = sampling.top_k.filter(|&k| k > 0 && k < order.len()) {
        order.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        order.truncate(k);
    }
    let Some(top) = order.iter().map(|&i| logits[i]).reduce(f32::max) else {
        return likeliest();
    };
    let top = top as f64 / t;
    let weights: Vec<f64> = order.iter().map(|&i| (logits[i] as f64 / t - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (&i, w) in order.iter().zip(&weights) {
        if u < *w {
            return i as i32;
        }
        u -= w;
    }
    *order.last().expect("not empty") as i32
}
