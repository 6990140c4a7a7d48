//! One file per subcommand; each turns its arguments into engine calls and prints.
//!
//! May call: its command files. Called by: `main`.

pub mod bench;
pub mod dashboard;
pub mod devices;
pub mod estimate;
pub mod eval;
pub mod generate;
pub mod profile;
pub mod step;
pub mod train;

/// Errors a subcommand reports to the user (printed as "error: ...").
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

pub use wgtrain_engine::files::write_atomically;

/// A run stopped by SIGINT or SIGTERM after saving: the process exits 128 + the signal
/// (130 for SIGINT, 143 for SIGTERM), as shells and schedulers expect.
#[derive(Debug)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
    /// Whether the message was printed already (over MPI, before the ranks part: once
    /// a rank exits non-zero, mpirun ends the others).
    pub said: bool,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.signal {
            signal_hook::consts::SIGTERM => "SIGTERM",
            signal_hook::consts::SIGHUP => "SIGHUP",
            _ => "SIGINT",
        };
        write!(f, "interrupted by {name}")
    }
}

impl std::error::Error for Interrupted {}

/// Writes one line of command output (the `say!` macro, main.rs).
pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|_| out.write_all(b"\n")) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("cannot write to stdout: {e}");
        }
    }
}

/// Watches SIGINT, SIGTERM and SIGHUP (a closed terminal or SSH session) on a thread:
/// the first sets `stop` and records the signal (with `message` printed), a second
/// exits at once with 128 + its number.
pub fn watch_signals(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    received: std::sync::Arc<std::sync::atomic::AtomicI32>,
    message: impl Fn() -> &'static str + Send + 'static,
) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    use std::sync::atomic::Ordering;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let name = match signal {
                SIGTERM => "SIGTERM",
                SIGHUP => "SIGHUP",
                _ => "Ctrl-C",
            };
            if stop.swap(true, Ordering::SeqCst) {
                eprintln!("\nsecond {name}: exiting now");
                std::process::exit(128 + signal);
            }
            received.store(signal, Ordering::SeqCst);
            eprintln!("\n{name}: {}", message());
        }
    });
    Ok(())
}
