//! The `wgtrain` command line: parses arguments and hands each subcommand to
//! `commands/`.
//!
//! May call: `commands`. Called by: the shell.

/// `println!` for command output: a closed stdout (`wgtrain devices | head -1`) drops
/// the line quietly instead of panicking, and the command goes on to its end; another
/// write error is reported on stderr.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::commands::write_line(format_args!($($arg)*))
    };
}

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Train models on any GPU wgpu reaches, with GPU memory you can see and control.
#[derive(Parser)]
#[command(name = "wgtrain", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the GPU adapters (native backends; GL with --gl or when none) with features and limits.
    Devices(commands::devices::DevicesArgs),
    /// Run benchmarks and print a table (and JSON with --json).
    Bench(commands::bench::BenchArgs),
    /// Train a model from a TOML config.
    Train(commands::train::TrainArgs),
    /// Serve the dashboard over a folder of runs, finished or still being written.
    Dashboard(commands::dashboard::DashboardArgs),
    /// Predict a training step's peak memory by category without running it.
    Estimate(commands::estimate::EstimateArgs),
    /// Evaluation only, from a checkpoint: the loss (and accuracy) and the evaluation's memory.
    Eval(commands::eval::EvalArgs),
    /// Text from a trained GPT or Llama checkpoint (nanoGPT's sample.py).
    Generate(commands::generate::GenerateArgs),
    /// One forward and backward of a transformers checkpoint: GPT-2, Llama, BERT or ResNet (check against PyTorch).
    Step(commands::step::StepArgs),
    /// Time every kernel of real training steps (torch.profiler's table, a Perfetto trace, MFU).
    Profile(commands::profile::ProfileArgs),
}

/// Without a desktop session (no `XDG_RUNTIME_DIR`, no `WAYLAND_DISPLAY`: a server, a
/// container, CI) Mesa's Vulkan drivers still look for a Wayland display while wgpu
/// enumerates adapters, and libwayland prints `error: XDG_RUNTIME_DIR is invalid or not
/// set in the environment.` for every look, alarming and meaningless: there is no
/// display to find. Naming a display path that cannot exist makes that look fail
/// quietly. A real session (either variable set) is left alone.
fn quiet_missing_display() {
    let unset = |k: &str| std::env::var_os(k).is_none_or(|v| v.is_empty());
    if cfg!(target_os = "linux") && unset("XDG_RUNTIME_DIR") && unset("WAYLAND_DISPLAY") && unset("WAYLAND_SOCKET") {
        // SAFETY: the first thing main does, before any thread exists.
        unsafe { std::env::set_var("WAYLAND_DISPLAY", "/nonexistent/wgtrain-no-display") };
    }
}

fn main() -> ExitCode {
    quiet_missing_display();
    // Warnings read as one plain line ("WARN text"), colored on a terminal only; with
    // WGTRAIN_LOG set (debugging), each line has its time and module too.
    let debugging = std::env::var_os("WGTRAIN_LOG").is_some();
    let colors = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var("TERM").map_or(true, |t| t != "dumb");
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WGTRAIN_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colors)
        .with_target(debugging);
    if debugging {
        log.init();
    } else {
        log.without_time().init();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => commands::devices::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Step(args) => commands::step::run(args),
        Command::Estimate(args) => commands::estimate::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Dashboard(args) => commands::dashboard::run(args),
        Command::Profile(args) => commands::profile::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<commands::Interrupted>() => {
            let i = err.downcast_ref::<commands::Interrupted>();
            if !i.is_some_and(|i| i.said) {
                eprintln!("{err}");
            }
            let signal = i.map_or(2, |i| i.signal);
            ExitCode::from((128 + signal) as u8)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
