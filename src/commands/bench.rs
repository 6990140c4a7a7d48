//! `wgtrain bench [--quick] [--filter NAME] [--adapter N] [--json FILE]`: runs the
//! benchmarks, prints a table, and writes the records as JSON.
//!
//! May call: `wgtrain_engine` (bench, runtime, device), `commands`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::{CliResult, write_atomically};
use wgtrain_engine::bench::{self, BenchRecord};
use wgtrain_engine::memory::AllocatorOptions;
use wgtrain_engine::{Gpu, Runtime};

/// Arguments of `wgtrain bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Small shapes, a short run.
    #[arg(long)]
    quick: bool,
    /// Run only benchmarks whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Write the records to this file as JSON ("-" for standard output).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs the benchmarks.
pub fn run(args: BenchArgs) -> CliResult {
    let gpu = Arc::new(Gpu::open(args.adapter.as_deref())?);
    eprintln!(
        "adapter: {} ({}); timing: {}",
        gpu.report.name,
        gpu.report.backend,
        if gpu.caps.timestamps { "GPU timestamps" } else { "wall clock" }
    );
    let wanted = |name: &str| args.filter.as_deref().is_none_or(|f| name.contains(f));
    let mut records: Vec<BenchRecord> = Vec::new();
    {
        let rt = Runtime::new(
            gpu.clone(),
            AllocatorOptions {
                debug: Some(false),
                cap: None,
                ..Default::default()
            },
        )?;
        records.extend(bench::kernels::run_all(&rt, args.quick, &wanted)?);
        if wanted("launch_overhead") {
            records.extend(bench::launch::run_all(&rt)?);
        }
    }
    if wanted("alloc") {
        records.extend(bench::alloc::run_all(&gpu, args.quick)?.into_iter().filter(|r| wanted(&r.kernel)));
    }
    print_table(&records);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&records)?;
        if path.as_os_str() == "-" {
            println!("{text}");
        } else {
            write_atomically(path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    if records.iter().any(|r| !r.ok) {
        return Err("some benchmarks did not check out (ok = false)".into());
    }
    Ok(())
}

fn opt(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

fn print_table(records: &[BenchRecord]) {
    println!(
        "{:<22} {:<6} {:<26} {:>12} {:>10} {:>10} {:>10} {:>4}",
        "kernel", "dtype", "shape", "median_us", "GFLOP/s", "GB/s", "max_err", "ok"
    );
    for r in records {
        let shape = format!("{:?}", r.shape);
        println!(
            "{:<22} {:<6} {:<26} {:>12.3} {:>10} {:>10} {:>10} {:>4}",
            r.kernel,
            r.dtype,
            shape,
            r.median_us,
            opt(r.gflops),
            opt(r.gbps),
            r.max_abs_err.map_or("-".into(), |e| format!("{e:.1e}")),
            if r.ok { "yes" } else { "NO" }
        );
        if !r.extra.is_null() {
            println!("    {}", r.extra);
        }
    }
}
