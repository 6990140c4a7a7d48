//! The data that crosses from the trainer to the dashboard, defined once: the JSONL
//! step log (`log`), the memory record of a step and the allocator's pages (`memory`),
//! the run views the server answers with and the live frames (`run`), memory
//! categories (`category`) and byte formatting (`bytes`).
//!
//! May call: serde only. Called by: the engine (writes), the server and the app (read).

pub mod bytes;
pub mod category;
pub mod csv;
pub mod device;
pub mod log;
pub mod memory;
pub mod run;

pub use bytes::{format_bytes, parse_bytes, short_bytes};
pub use category::{Category, PoolKind};
pub use csv::{CSV_COLUMNS, curves_csv};
pub use device::{AdapterReport, CoopMatrixConfig, LimitsReport};
pub use log::{EvalLog, KernelRow, MemLog, StepLog};
pub use memory::{AllocId, Band, BlockView, Event, EventKind, PageId, PageView, PeakBlock, PeakView, PhaseSpan, StepMemory};
pub use run::{BenchRecord, Frame, Health, HparamsRow, RunEntry, RunInfo, RunRecord, RunView, WhatIf, WhatIfView, flat_config};
