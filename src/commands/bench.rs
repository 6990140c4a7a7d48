//! `wgtrain bench [--quick] [--tune] [--filter NAME] [--adapter N] [--json FILE]
//! [--compare FILE]`: settles the device (full runs: `bench::measure::settle`), runs the
//! benchmarks (each warmed until its time is stable, then the median
//! and spread of its repeats; rows spread over 10% are flagged), prints a table, writes
//! the records as JSON, and with `--compare` the ratio of each row's time against a
//! previous JSON's (ours, or scripts/torch_kernels.py's), flagging rows that differ by
//! more than 10%.
//!
//! May call: `wgtrain_engine` (bench, runtime, device), `commands`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::{CliResult, write_atomically};
use wgtrain_engine::bench::{self, BenchRecord};
use wgtrain_engine::memory::AllocatorOptions;
use wgtrain_engine::runtime::KernelOverrides;
use wgtrain_engine::{Gpu, Runtime};

/// Arguments of `wgtrain bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Small shapes, a short run.
    #[arg(long)]
    quick: bool,
    /// Run only benchmarks whose name contains this (or any of several, comma-separated:
    /// `char.fc.dw,gpt2.fc.dw`).
    #[arg(long)]
    filter: Option<String>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Write the records to this file as JSON ("-" for standard output).
    #[arg(long)]
    json: Option<PathBuf>,
    /// A previous `--json` file (ours or scripts/torch_kernels.py's): print each row's
    /// time against it.
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,
    /// Instead of the benchmarks: every candidate tile of the cooperative-matrix matmul
    /// at 4096^3 and at GPT-2's linear products (needs an adapter with cooperative
    /// matrices).
    #[arg(long)]
    tune: bool,
    /// Instead of the benchmarks: a matmul of this shape, MxKxN (repeat the flag for
    /// more): f16 inputs on the tensor-core path where the adapter has it, else f32.
    #[arg(long, value_name = "MxKxN", value_parser = parse_shape)]
    matmul: Vec<[usize; 3]>,
    /// Calls of each case per timed sample, back to back (as a training step runs its
    /// kernels); the row's time is per call. 1 (the default) times each call from an
    /// idle device, as scripts/torch_kernels.py times PyTorch's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    launches: u32,
    /// K slices for every matmul row (split-K; 1 does not split) instead of the count the
    /// shape picks: the rows show what another split would cost. A split the shape
    /// cannot take fails its row with the reason.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    splits: Option<u32>,
    /// The register-tiled f32 attention's variants, forced for every attention row:
    /// `fwd=`, `q=`, `kv=` tiles (rows owned x rows streamed x own rows a thread, `p` for
    /// prefetch, or `off`; `kv=lane`: one key row a thread), `unroll`, `u1`, `u2`, `u4`
    /// (its loops), or `off` (the lane kernels throughout); e.g. `fwd=64x64x4p,kv=lane`.
    #[arg(long, value_name = "SPEC", value_parser = parse_attention_tiles)]
    attention_tiles: Option<String>,
}

/// A register-tiled attention spec, checked before anything runs.
fn parse_attention_tiles(text: &str) -> Result<String, String> {
    wgtrain_engine::kernels::flash_attention_tiled::check_spec(text).map_err(|e| e.to_string())?;
    Ok(text.to_string())
}

/// `MxKxN` as three positive sizes.
fn parse_shape(text: &str) -> Result<[usize; 3], String> {
    let dims: Vec<usize> = text
        .split(['x', 'X'])
        .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{text:?} is not MxKxN with three positive sizes (e.g. 8192x768x768)"))?;
    <[usize; 3]>::try_from(dims).map_err(|_| format!("{text:?} is not MxKxN: three sizes, not {}", text.split(['x', 'X']).count()))
}

/// Rows of a previous run, read before anything is measured (a bad file fails fast).
fn load_compare(path: &std::path::Path) -> Result<Vec<BenchRecord>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a list of benchmark rows (wgtrain bench --json, scripts/torch_kernels.py): {e}",
            path.display()
        )
    })
}

/// Runs the benchmarks.
pub fn run(args: BenchArgs) -> CliResult {
    let previous = args.compare.as_deref().map(load_compare).transpose()?;
    let gpu = Arc::new(Gpu::open(args.adapter.as_deref())?);
    eprintln!(
        "adapter: {} ({}); timing: {}",
        gpu.report.name,
        gpu.report.backend,
        if gpu.caps.timestamps { "GPU timestamps" } else { "wall clock" }
    );
    let wanted = |name: &str| args.filter.as_deref().is_none_or(|f| f.split(',').any(|part| name.contains(part)));
    let mut records: Vec<BenchRecord> = Vec::new();
    {
        let mut rt = Runtime::new(
            gpu.clone(),
            AllocatorOptions {
                debug: Some(false),
                cap: None,
                ..Default::default()
            },
        )?;
        rt.set_overrides(KernelOverrides {
            attention_tiles: args.attention_tiles.clone().unwrap_or_default(),
        });
        if !args.quick {
            let s = bench::measure::settle(&rt)?;
            eprintln!(
                "device settled after {:.1} s of load ({}): 8 matmuls of 2048^3 took {:.0} us at first, {:.0} us at the end",
                s.seconds,
                if s.plateau {
                    "its speed plateaued"
                } else {
                    "no plateau within the limit"
                },
                s.first_us,
                s.last_us
            );
        }
        bench::measure::set_launches(args.launches as usize);
        bench::measure::set_quick(args.quick);
        // Each row as it is measured, so a long run is never silent.
        bench::measure::on_row(|r| {
            eprintln!(
                "  {} {} {:.1} us{}",
                r.kernel,
                r.dtype,
                r.median_us,
                if r.ok { "" } else { " (does not check out)" }
            )
        });
        bench::measure::set_splits(args.splits.map(|n| n as usize));
        if !args.matmul.is_empty() {
            for &shape in &args.matmul {
                records.extend(bench::measure::unless_unsplittable(bench::kernels::matmul_shape(&rt, shape))?);
            }
        } else if args.tune {
            records.extend(bench::tune::run_all(&rt, &wanted)?);
        } else {
            records.extend(bench::kernels::run_all(&rt, args.quick, &wanted)?);
            records.extend(bench::gpt2::run_all(&rt, args.quick, &wanted)?);
            records.extend(bench::resnet::run_all(&rt, args.quick, &wanted)?);
            if wanted("launch_overhead") {
                records.extend(bench::launch::run_all(&rt)?);
            }
        }
    }
    if wanted("alloc") && !args.tune && args.matmul.is_empty() {
        records.extend(bench::alloc::run_all(&gpu, args.quick)?.into_iter().filter(|r| wanted(&r.kernel)));
    }
    print_table(&records);
    if let (Some(previous), Some(path)) = (&previous, &args.compare) {
        print_comparison(&records, previous, path);
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&records)?;
        if path.as_os_str() == "-" {
            say!("{text}");
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
    say!(
        "{:<26} {:<6} {:<22} {:>12} {:>7} {:>10} {:>10} {:>10} {:>4}",
        "kernel",
        "dtype",
        "shape",
        "median_us",
        "spread",
        "GFLOP/s",
        "GB/s",
        "max_err",
        "ok"
    );
    for r in records {
        let shape = format!("{:?}", r.shape);
        say!(
            "{:<26} {:<6} {:<22} {:>12.3} {:>7} {:>10} {:>10} {:>10} {:>4}",
            r.kernel,
            r.dtype,
            shape,
            r.median_us,
            r.spread.map_or("-".into(), |s| format!("{:.1}%", 100.0 * s)),
            opt(r.gflops),
            opt(r.gbps),
            r.max_abs_err.map_or("-".into(), |e| format!("{e:.1e}")),
            if r.ok { "yes" } else { "NO" }
        );
        if let Some(flag) = &r.flag {
            say!("    FLAGGED: {flag}");
        }
        if !r.extra.is_null() {
            say!("    {}", r.extra);
        }
    }
}

/// Each row against the previous file's row of the same kernel, dtype and shape:
/// their time over ours (above 1: we are faster now), flagged past 10% either way.
fn print_comparison(records: &[BenchRecord], previous: &[BenchRecord], path: &std::path::Path) {
    say!("\ncompared with {} (their time / ours; above 1 = faster now):", path.display());
    say!(
        "{:<26} {:<6} {:<22} {:>12} {:>12} {:>8}",
        "kernel",
        "dtype",
        "shape",
        "ours_us",
        "theirs_us",
        "ratio"
    );
    let (mut matched, mut differ) = (0, 0);
    for r in records {
        let Some(p) = previous.iter().find(|p| {
            p.kernel == r.kernel && p.dtype == r.dtype && p.shape == r.shape && p.extra.get("launches") == r.extra.get("launches")
        }) else {
            continue;
        };
        matched += 1;
        let ratio = p.median_us / r.median_us.max(1e-12);
        let far = (ratio - 1.0).abs() > 0.10;
        differ += usize::from(far);
        say!(
            "{:<26} {:<6} {:<22} {:>12.3} {:>12.3} {:>8.3}{}",
            r.kernel,
            r.dtype,
            format!("{:?}", r.shape),
            r.median_us,
            p.median_us,
            ratio,
            if far { "  differs by more than 10%" } else { "" }
        );
    }
    say!("{matched} rows matched, {differ} differ by more than 10%");
}
