//! `wgtrain estimate [CONFIG.toml] [--set section.key=value]... [--json] [--described FILE]`:
//! the peak memory of a training step by category, from a dry run that allocates nothing,
//! on this machine's adapter or on one that a `wgtrain devices --json` file describes.
//!
//! May call: `wgtrain_engine::train`, `commands`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::CliResult;
use wgtrain_engine::device::Gpu;
use wgtrain_engine::device::described::read_description;
use wgtrain_engine::train::Config;
use wgtrain_engine::train::plan::{estimate, estimate_with};

/// Arguments of `wgtrain estimate`.
#[derive(Args)]
pub struct EstimateArgs {
    /// The TOML config (defaults apply without one).
    config: Option<PathBuf>,
    /// Override a key: --set memory.precision=fp16-mixed (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`). With
    /// --described, which of the file's adapters.
    #[arg(long)]
    adapter: Option<String>,
    /// Estimate for an adapter this machine need not have, described by FILE: what
    /// `wgtrain devices --json > FILE` wrote on the machine that has it. Kernels choose
    /// their variants as on that adapter; this machine's adapter only keeps the books.
    #[arg(long, value_name = "FILE")]
    described: Option<PathBuf>,
    /// Print JSON (peak_bytes, peak_reserved_bytes, by_category, ...) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Estimates.
pub fn run(args: EstimateArgs) -> CliResult {
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let (estimate, notes) = match &args.described {
        None => estimate(config, args.adapter.as_deref())?,
        Some(file) => {
            let described = read_description(file, args.adapter.as_deref())?;
            eprintln!("estimating for '{}' as {} describes it", described.name, file.display());
            estimate_with(config, Arc::new(Gpu::stand_in(described, None)?))?
        }
    };
    for n in &notes {
        eprintln!("{n}");
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&estimate)?);
    } else {
        say!("{}", estimate.table());
    }
    Ok(())
}
