//! `wgtrain estimate [CONFIG.toml] [--set section.key=value]... [--json]`: the peak
//! memory of a training step by category, from a dry run that allocates nothing.
//!
//! May call: `wgtrain_engine::train`, `commands`.

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use wgtrain_engine::train::Config;
use wgtrain_engine::train::plan::estimate;

/// Arguments of `wgtrain estimate`.
#[derive(Args)]
pub struct EstimateArgs {
    /// The TOML config (defaults apply without one).
    config: Option<PathBuf>,
    /// Override a key: --set memory.precision=fp16-mixed (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Print JSON (peak_bytes, peak_reserved_bytes, by_category, ...) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Estimates.
pub fn run(args: EstimateArgs) -> CliResult {
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let (estimate, notes) = estimate(config, args.adapter.as_deref())?;
    for n in &notes {
        eprintln!("{n}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&estimate)?);
    } else {
        println!("{}", estimate.table());
    }
    Ok(())
}
