//! `wgtrain train [CONFIG.toml] [--set section.key=value]... [--log FILE.jsonl]
//! [--adapter N] [--resume DIR]`: trains as the config says; Ctrl-C saves and exits.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use super::CliResult;
use wgtrain_engine::train::{Config, RunOptions, Trainer};

/// Arguments of `wgtrain train`.
#[derive(Args)]
pub struct TrainArgs {
    /// The TOML config (defaults apply without one).
    config: Option<PathBuf>,
    /// Override a key: --set train.lr=3e-4 (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Append one JSON line per step (and per evaluation) to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
    /// Continue from a checkpoint folder (or a folder whose `latest` names one).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Trains.
pub fn run(args: TrainArgs) -> CliResult {
    let config = Config::load(args.config.as_deref(), &args.set)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\nsecond Ctrl-C: exiting without a checkpoint");
            std::process::exit(130);
        }
        eprintln!("\nCtrl-C: finishing this step, saving a checkpoint, then exiting (Ctrl-C again to quit now)");
    })?;
    let mut trainer = Trainer::new(config, args.adapter.as_deref())?;
    for note in &trainer.notes {
        eprintln!("{note}");
    }
    eprintln!(
        "training on {} ({}): {} parameters, {} steps",
        trainer.rt.gpu.report.name,
        trainer.rt.gpu.report.backend,
        trainer.params.numel(),
        trainer.total_steps()
    );
    let options = RunOptions {
        adapter: args.adapter,
        log: args.log,
        resume: args.resume,
        progress: !args.quiet,
        stop: Some(stop),
    };
    let summary = trainer.run(&options)?;
    if let Some(e) = &summary.last_eval {
        let acc = e.accuracy.map(|a| format!(", accuracy {:.2}%", 100.0 * a)).unwrap_or_default();
        let entropy = trainer
            .unigram_entropy
            .map(|h| format!(" (unigram entropy of the text: {h:.4})"))
            .unwrap_or_default();
        println!("eval loss {:.4}{acc}{entropy}", e.loss);
    }
    println!(
        "{} steps in {:.1} s{}{}",
        summary.steps,
        summary.seconds,
        if summary.interrupted { " (interrupted)" } else { "" },
        summary
            .checkpoint
            .as_ref()
            .map(|p| format!("; checkpoint {}", p.display()))
            .unwrap_or_default()
    );
    println!("{}", trainer.rt.alloc.summary());
    Ok(())
}
