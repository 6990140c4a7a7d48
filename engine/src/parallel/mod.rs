//! What a run over several devices shares between them: the collectives (`collective`:
//! the trait each rank calls and its one-process implementation over host memory) and
//! the partition of parameters into shards (`shard`).
//!
//! May call: nothing of the engine below the train layer but itself. Called by:
//! `train::parallel`.

pub mod collective;
pub mod shard;

pub use collective::{Collective, CollectiveError, HostComm, HostGroup};
pub use shard::{Shards, shard_range};
