//! `wgtrain profile CONFIG [--set ...] [--steps N] [--warmup K] [--adapter A] [--json FILE]
//! [--trace FILE] [--peak-tflops X]`: runs K warm-up steps and N profiled steps of the
//! real trainer and prints the kernel table and the per-step figures; `--json` writes
//! them, `--trace` a Chrome trace for ui.perfetto.dev.
//!
//! May call: `wgtrain_engine::train`, `commands`.

use std::path::PathBuf;

use clap::Args;

use super::{CliResult, write_atomically};
use wgtrain_engine::train::{Config, Trainer};

/// A peak in TFLOP/s: a positive finite number.
fn positive_tflops(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("'{text}' is not a positive number of TFLOP/s")),
    }
}

/// Arguments of `wgtrain profile`.
#[derive(Args)]
pub struct ProfileArgs {
    /// The TOML config (defaults apply without one).
    config: Option<PathBuf>,
    /// Override a key: --set train.batch_size=8 (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Profiled steps.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Warm-up steps before them (pipelines compiled, clocks up).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Write the profile as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a Chrome trace (Perfetto) here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// The adapter's peak TFLOP/s for MFU (known adapters have a default).
    #[arg(long, value_parser = positive_tflops)]
    peak_tflops: Option<f64>,
}

fn write(path: &std::path::Path, value: &impl serde::Serialize) -> CliResult {
    let text = serde_json::to_string_pretty(value)?;
    write_atomically(path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Profiles.
pub fn run(args: ProfileArgs) -> CliResult {
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let mut trainer = Trainer::new(config, args.adapter.as_deref())?;
    eprintln!(
        "profiling on {} ({}): {} warm-up and {} profiled steps",
        trainer.rt.gpu.report.name, trainer.rt.gpu.report.backend, args.warmup, args.steps
    );
    let profile = trainer.profile(args.warmup, args.steps, args.peak_tflops)?;
    say!("{}", profile.table());
    if let Some(path) = &args.json {
        write(path, &profile)?;
    }
    if let Some(path) = &args.trace {
        write(path, &profile.trace())?;
    }
    Ok(())
}
