//! One file per subcommand; each turns its arguments into engine calls and prints.
//!
//! May call: its command files. Called by: `main`.

pub mod bench;
pub mod dashboard;
pub mod devices;
pub mod estimate;
pub mod step;
pub mod train;

/// Errors a subcommand reports to the user (printed as "error: ...").
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

pub use wgtrain_engine::files::write_atomically;
