//! `wgtrain estimate [CONFIG.toml] [--set section.key=value]... [--json] [--described FILE]
//! [--memory SIZE] [--ranks N] [--eval | --generate N [--prompt-tokens P] [--batch B]]`:
//! the peak memory of a training step (or of an evaluation, or of generating) by category, from a dry run that allocates nothing,
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
use wgtrain_engine::train::plan::{estimate, estimate_with, fit_report};

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
    /// Will it fit in SIZE ("8GiB", "24GB", bytes)? Estimates for a device of that much
    /// memory (this adapter, or --described's, with bindings of up to 2 GiB as discrete
    /// GPUs have), says whether the peak fits and by how much, and which single change of
    /// the memory settings fits when it does not.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// With parallel.backend = "mpi": the ranks the run will have, each its own device
    /// (default: the launcher's count when run under mpirun or srun, else 1). Estimates
    /// rank 0's device, whose shards are the largest.
    #[arg(long, value_name = "N")]
    ranks: Option<usize>,
    /// Estimate an evaluation pass (`wgtrain eval`: the weights alone and the
    /// evaluation's batches) instead of a training step.
    #[arg(long, conflicts_with = "generate")]
    eval: bool,
    /// With --eval: examples per evaluation batch (default: the model's own). With
    /// --memory too: the most to consider.
    #[arg(long, value_name = "N", requires = "eval")]
    eval_batch: Option<usize>,
    /// Estimate generating N tokens (`wgtrain generate`: the weights, the key/value
    /// cache, one position at a time) instead of a training step.
    #[arg(long, value_name = "N", conflicts_with = "memory")]
    generate: Option<usize>,
    /// With --generate: the prompt's tokens.
    #[arg(long, value_name = "P", default_value_t = 1, requires = "generate")]
    prompt_tokens: usize,
    /// With --generate: sequences drawn together.
    #[arg(long, value_name = "B", default_value_t = 1, requires = "generate")]
    batch: usize,
}

/// The ranks a run over MPI will have: `--ranks`, else the launcher's environment
/// (Open MPI's, MPICH's or Slurm's), else none.
fn mpi_ranks(config: &mut Config, asked: Option<usize>) -> CliResult {
    use wgtrain_engine::train::config::Backend;
    if config.parallel.backend != Backend::Mpi {
        if asked.is_some() {
            return Err("--ranks is for parallel.backend = \"mpi\"; in one process, parallel.devices lists the devices".into());
        }
        return Ok(());
    }
    let from_env = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok());
    let n = match asked.or(from_env) {
        Some(0) => return Err("--ranks must be at least 1".into()),
        Some(n) => n,
        None => {
            eprintln!("parallel.backend = \"mpi\": estimating one rank; --ranks N gives the run's count");
            1
        }
    };
    config.parallel.ranks = Some(n);
    config.validate()?;
    if n > 1 {
        eprintln!("estimating rank 0 of {n} MPI ranks, each its own device");
    }
    Ok(())
}

/// Estimates.
pub fn run(args: EstimateArgs) -> CliResult {
    let mut config = Config::load(args.config.as_deref(), &args.set)?;
    mpi_ranks(&mut config, args.ranks)?;
    if args.eval && args.memory.is_some() {
        return largest_eval(&args, config);
    }
    if let Some(size) = &args.memory {
        return will_it_fit(&args, config, size);
    }
    if args.eval || args.generate.is_some() {
        return phase(&args, config);
    }
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

/// The adapter an evaluation or generation estimate is for.
fn phase_gpu(args: &EstimateArgs) -> Result<Arc<Gpu>, Box<dyn std::error::Error>> {
    Ok(match &args.described {
        None => Arc::new(Gpu::open(args.adapter.as_deref())?),
        Some(file) => Arc::new(Gpu::stand_in(read_description(file, args.adapter.as_deref())?, None)?),
    })
}

/// `estimate --eval --memory SIZE`: the largest evaluation batch whose peak reserved
/// memory fits SIZE (fit-to-budget for evaluation).
fn largest_eval(args: &EstimateArgs, config: Config) -> CliResult {
    use wgtrain_engine::memory::format_bytes;
    use wgtrain_engine::train::phase_estimate::largest_eval_batch;
    let size = args.memory.as_deref().expect("checked by the caller");
    let limit = wgtrain_engine::memory::MemoryCap::parse(size)?
        .resolve(None)
        .map_err(|_| format!("--memory {size}: give a size (\"8GiB\", \"24GB\", bytes), not a fraction of a device"))?;
    let most = args.eval_batch.unwrap_or(4096);
    let found = largest_eval_batch(&config, &phase_gpu(args)?, most, limit)?;
    if args.json {
        let v = serde_json::json!({
            "memory_bytes": limit,
            "largest_eval_batch": found.as_ref().map(|(b, _)| *b),
            "estimate": found.as_ref().map(|(_, e)| e),
        });
        say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match found {
        Some((batch, e)) => say!(
            "evaluation in batches of {batch} fits {} (peak {}, reserved {}); considered up to {most}",
            format_bytes(limit),
            format_bytes(e.peak_bytes),
            format_bytes(e.peak_reserved_bytes)
        ),
        None => say!("even one example an evaluation batch does not fit {}", format_bytes(limit)),
    }
    Ok(())
}

/// `estimate --eval` or `--generate N`: the peak of evaluating or generating.
fn phase(args: &EstimateArgs, config: Config) -> CliResult {
    use wgtrain_engine::memory::format_bytes;
    use wgtrain_engine::train::phase_estimate::{Phase, estimate_phase};
    let phase = match args.generate {
        Some(tokens) => Phase::Generate {
            prompt: args.prompt_tokens,
            tokens,
            batch: args.batch,
        },
        None => Phase::Eval(args.eval_batch),
    };
    let gpu = phase_gpu(args)?;
    let (e, notes) = estimate_phase(config, gpu, phase)?;
    notes.iter().for_each(|n| eprintln!("{n}"));
    if args.json {
        say!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(());
    }
    say!("estimate: {}", e.phase);
    for (c, b) in &e.by_category {
        say!("  {c:<18} {:>12}", format_bytes(*b));
    }
    say!("  peak allocated     {:>12}", format_bytes(e.peak_bytes));
    say!("  peak reserved      {:>12}", format_bytes(e.peak_reserved_bytes));
    Ok(())
}

/// The largest binding a device of `memory` bytes is assumed to allow (a discrete GPU's
/// Vulkan limit, 2 GiB less 4 bytes, or the memory itself when smaller).
const ASSUMED_BINDING: u64 = 2_147_483_644;

/// `estimate --memory SIZE`: fits or not, by how much, and what single change fits.
fn will_it_fit(args: &EstimateArgs, config: Config, size: &str) -> CliResult {
    let limit = wgtrain_engine::memory::MemoryCap::parse(size)?
        .resolve(None)
        .map_err(|_| format!("--memory {size}: give a size (\"8GiB\", \"24GB\", bytes), not a fraction of a device"))?;
    let mut report = match &args.described {
        Some(file) => read_description(file, args.adapter.as_deref())?,
        None => {
            let mut r = Gpu::open(args.adapter.as_deref())?.report.clone();
            let binding = ASSUMED_BINDING.min(limit);
            r.limits.max_storage_buffer_binding_size = r.limits.max_storage_buffer_binding_size.max(binding);
            r.limits.max_buffer_size = r.limits.max_buffer_size.max(binding);
            r
        }
    };
    report.memory_bytes = Some(limit);
    let name = report.name.clone();
    let gpu = Arc::new(Gpu::stand_in(report, None)?);
    let (estimate, notes, options) = fit_report(config, gpu, limit)?;
    notes.iter().for_each(|n| eprintln!("{n}"));
    let need = estimate.peak_reserved_bytes;
    let fits = need <= limit;
    // The change that fits with the most memory used: the least the run gives up.
    let change = options
        .iter()
        .filter(|o| !o.change.is_empty() && o.fits == Some(true))
        .max_by_key(|o| o.peak_reserved_bytes);
    if args.json {
        let out = serde_json::json!({
            "memory_bytes": limit,
            "fits": fits,
            "estimate": estimate,
            "change_that_fits": change,
            "what_if": options,
        });
        say!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    say!("{}", estimate.table());
    let f = wgtrain_engine::memory::format_bytes;
    if fits {
        say!(
            "fits in {} on '{name}': the peak needs {} reserved ({} allocated), {} to spare",
            f(limit),
            f(need),
            f(estimate.peak_bytes),
            f(limit - need)
        );
        return Ok(());
    }
    say!(
        "does not fit in {} on '{name}': the peak needs {} reserved, {} more",
        f(limit),
        f(need),
        f(need - limit)
    );
    match change {
        Some(c) => say!(
            "the smallest single change that fits: {} (peak {} reserved); or set memory.fit = true with memory.budget = \"{size}\" to choose the micro-batch and checkpointing",
            c.change,
            f(c.peak_reserved_bytes)
        ),
        None => say!(
            "no single change of precision, checkpointing, micro-batch or optimizer-in-backward fits; try memory.fit = true with memory.budget = \"{size}\", or a smaller model"
        ),
    }
    Ok(())
}
