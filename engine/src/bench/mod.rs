//! `wgtrain bench`: benchmarks that print JSON. Each record names what it measured;
//! kernel records carry throughput and error against the CPU reference, allocator
//! records carry their own figures under `extra`.
//!
//! May call: nothing of the engine.

pub mod alloc;
pub mod gpt2;
pub mod kernels;
pub mod launch;
pub mod measure;
pub mod record;
pub mod resnet;
pub mod tune;

pub use record::{BenchRecord, median};
