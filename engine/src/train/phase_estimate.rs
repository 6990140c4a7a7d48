//! The memory of evaluating and of generating, estimated as the training step is: the
//! trainer's own code (`Trainer::evaluate`, `Trainer::generate`) on a bookkeeping-only
//! allocator, one device, the weights alone (what `wgtrain eval` and `wgtrain generate`
//! load: no optimizer state, no gradients).
//!
//! May call: `device`, `error`, `memory`, `train::{build, config, error, generate,
//! plan, trainer}`. Called by: the CLI, tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::device::Gpu;
use crate::memory::Category;
use crate::train::build::{load_data_for_estimate, resolve_precision};
use crate::train::config::Config;
use crate::train::error::TrainError;
use crate::train::generate::Sampling;
use crate::train::plan::dry_runtime;
use crate::train::trainer::Trainer;

/// What is estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One pass over the evaluation split, as `wgtrain eval` runs it (in batches of
    /// this many examples; none: the model's own).
    Eval(Option<usize>),
    /// `tokens` new tokens after a prompt of `prompt` tokens, for `batch` sequences, as
    /// `wgtrain generate` draws them (with the model's key/value cache where it has one).
    Generate {
        /// Prompt tokens.
        prompt: usize,
        /// New tokens.
        tokens: usize,
        /// Sequences.
        batch: usize,
    },
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::Eval(None) => write!(f, "evaluation in the run's batches"),
            Phase::Eval(Some(b)) => write!(f, "evaluation in batches of {b}"),
            Phase::Generate { prompt, tokens, batch } => {
                let s = if *batch == 1 { "" } else { "s" };
                write!(f, "generating {tokens} tokens after a {prompt}-token prompt, {batch} sequence{s}")
            }
        }
    }
}

/// The memory a phase will need.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseEstimate {
    /// What was estimated.
    pub phase: Phase,
    /// The most bytes allocated at once.
    pub peak_bytes: u64,
    /// The most bytes reserved.
    pub peak_reserved_bytes: u64,
    /// Bytes of each category at the peak.
    pub by_category: BTreeMap<String, u64>,
}

/// Estimates `phase` of a run of `config` on `gpu` (an opened adapter or a described
/// one's stand-in); the notes say what stood in (token files).
pub fn estimate_phase(config: Config, gpu: Arc<Gpu>, phase: Phase) -> Result<(PhaseEstimate, Vec<String>), TrainError> {
    let (data, stand_in) = load_data_for_estimate(&config)?;
    let (mut config, mut notes) = resolve_precision(config, &gpu)?;
    notes.extend(stand_in);
    // One device evaluates and generates, whatever the run was spread over.
    config.parallel = Default::default();
    let rt = dry_runtime(gpu)?;
    let trainer = Trainer::assemble(config, rt.clone(), data)?;
    rt.alloc.reset_peaks();
    match phase {
        Phase::Eval(None) => drop(trainer.evaluate()?),
        Phase::Eval(Some(batch)) => drop(trainer.evaluate_in_batches(batch)?),
        Phase::Generate { prompt, tokens, batch } => {
            let sampling = Sampling {
                temperature: 0.0,
                top_k: None,
                seed: 0,
                cache: true,
            };
            // Once the cache is full every token runs the same whole-window pass, so
            // the peak is reached within two windows: a longer generation is estimated
            // from them (10^11 tokens' dry run ran past a minute before).
            let window = trainer.model.tokens_per_example().unwrap_or(tokens);
            let tokens = tokens.min(2 * window + 2);
            trainer.generate(&vec![0; prompt.max(1)], tokens, batch, &sampling, |_| Ok(()))?;
        }
    }
    let s = rt.alloc.stats();
    let estimate = PhaseEstimate {
        phase,
        peak_bytes: s.allocated.peak,
        peak_reserved_bytes: s.reserved.peak,
        by_category: Category::ALL.iter().map(|c| (c.name().to_string(), s.at_peak[c.index()])).collect(),
    };
    drop(trainer);
    Ok((estimate, notes))
}

/// The largest evaluation batch (at most `most` examples) whose estimated peak reserved
/// memory fits `limit` bytes, with its estimate; none when one example does not fit.
pub fn largest_eval_batch(config: &Config, gpu: &Arc<Gpu>, most: usize, limit: u64) -> Result<Option<(usize, PhaseEstimate)>, TrainError> {
    let fits = |batch: usize| -> Result<Option<PhaseEstimate>, TrainError> {
        let (e, _) = estimate_phase(config.clone(), gpu.clone(), Phase::Eval(Some(batch)))?;
        Ok((e.peak_reserved_bytes <= limit).then_some(e))
    };
    let Some(mut best) = fits(1)?.map(|e| (1, e)) else {
        return Ok(None);
    };
    // Memory grows with the batch: the largest that fits, by halving the gap.
    let (mut lo, mut hi) = (1usize, most.max(1) + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid)? {
            Some(e) => {
                lo = mid;
                best = (mid, e);
            }
            None => hi = mid,
        }
    }
    Ok(Some(best))
}
