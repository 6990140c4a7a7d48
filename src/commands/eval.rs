//! `wgtrain eval --checkpoint DIR [--set k=v]... [--json]`: evaluation only, from a
//! checkpoint alone: the run's config and weights from it, the loss (and accuracy) over
//! the evaluation split without a tape, and the evaluation's own peak memory. `--set`
//! changes what an evaluation may (`data.eval_limit`, `data.path`, `memory.precision`,
//! `train.micro_batch_size`: the GPT's evaluation batch), not the model.
//!
//! May call: `wgtrain_engine` (train, memory), `commands`.

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use wgtrain_engine::memory::format_bytes;
use wgtrain_engine::train::Trainer;
use wgtrain_engine::train::checkpoint::{resolve, state::resume_config};

/// Arguments of `wgtrain eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// A run's checkpoint folder (or a folder whose `latest` names one).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Override a key of the checkpoint's config: --set data.eval_limit=1000
    /// (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Examples per evaluation batch (default: what the model evaluates in, its
    /// training micro-batch for a language model).
    #[arg(long, value_name = "N")]
    batch_size: Option<usize>,
    /// Evaluate in this precision (fp32 or fp16-mixed) instead of the run's.
    #[arg(long, value_name = "P")]
    precision: Option<String>,
    /// Print {"loss", "accuracy", "peak", "reserved", "step", "at_peak"} as JSON
    /// (`at_peak`: the peak's bytes by category, as the estimate's `by_category`).
    #[arg(long)]
    json: bool,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
}

/// Evaluates.
pub fn run(args: EvalArgs) -> CliResult {
    let dir = resolve(&args.checkpoint)?;
    let mut sets = args.set.clone();
    sets.extend(args.precision.iter().map(|p| format!("memory.precision=\"{p}\"")));
    let (config, _) = resume_config(&dir, &sets)?;
    let mut trainer = Trainer::new(config, args.adapter.as_deref())?;
    let step = trainer.restore_weights(&dir)?;
    trainer.rt.sync()?;
    trainer.rt.alloc.reset_peaks();
    let mut e = match args.batch_size {
        Some(0) => return Err("--batch-size must be at least 1".into()),
        Some(n) => trainer.evaluate_in_batches(n)?,
        None => trainer.evaluate()?,
    };
    let stats = trainer.rt.alloc.stats();
    e.peak = Some(stats.allocated.peak);
    e.reserved = Some(stats.reserved.current);
    if args.json {
        let mut v = serde_json::to_value(&e)?;
        v["step"] = step.into();
        v["at_peak"] = wgtrain_engine::Category::ALL
            .iter()
            .map(|c| (c.name().to_string(), serde_json::Value::from(stats.at_peak[c.index()])))
            .collect::<serde_json::Map<_, _>>()
            .into();
        say!("{v}");
    } else {
        let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
        say!(
            "step {step}: eval loss {:.4}{acc} (peak {}, reserved {})",
            e.loss,
            format_bytes(stats.allocated.peak),
            format_bytes(stats.reserved.current)
        );
        eprintln!("{}", trainer.rt.alloc.summary());
    }
    Ok(())
}
