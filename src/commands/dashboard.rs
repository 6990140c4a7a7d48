//! `wgtrain dashboard --runs DIR [--addr ADDR] [--token T] [--bench FILE]`: serves the
//! dashboard over finished runs (each `NAME.jsonl` log with its `NAME.memory.json`).
//!
//! May call: `wgtrain_web`, `wgtrain_engine::bench`, `commands`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::CliResult;
use wgtrain_web::{Dashboard, Options};

/// Arguments of `wgtrain dashboard`.
#[derive(Args)]
pub struct DashboardArgs {
    /// Folder of runs (JSONL logs written by `wgtrain train --log`).
    #[arg(long)]
    runs: PathBuf,
    /// Where to listen (a non-loopback address gets a token, printed once).
    #[arg(long, default_value = "127.0.0.1:8787")]
    addr: std::net::SocketAddr,
    /// The token (generated for non-loopback addresses when not given).
    #[arg(long)]
    token: Option<String>,
    /// Kernel timings for the dashboard's table (a `wgtrain bench --json` file).
    #[arg(long, value_name = "FILE")]
    bench: Option<PathBuf>,
}

/// Reads a `wgtrain bench --json` file (a JSON array of kernel records).
pub fn read_bench(path: &Path) -> Result<Vec<wgtrain_engine::bench::BenchRecord>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    if !v.is_array() {
        return Err(format!("{} is not a `wgtrain bench --json` file (a JSON array)", path.display()).into());
    }
    serde_json::from_value(v).map_err(|e| format!("{} is not a `wgtrain bench --json` file: {e}", path.display()).into())
}

/// Serves until Ctrl-C.
pub fn run(args: DashboardArgs) -> CliResult {
    if !args.runs.is_dir() {
        return Err(format!("--runs {} is not a folder", args.runs.display()).into());
    }
    let bench = args.bench.as_deref().map(read_bench).transpose()?;
    let d = Dashboard::start(Options {
        addr: args.addr,
        token: args.token,
        runs_dir: Some(args.runs),
        bench,
        ..Default::default()
    })?;
    say!("dashboard: {} (Ctrl-C to stop)", d.url());
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let _ = signals.forever().next();
    Ok(())
}
