//! What a run over several devices shares between them: the collectives (`collective`:
//! the trait each rank calls and its one-process implementation over host memory;
//! `mpi`: across processes, feature `mpi`, with `shm` for the ranks of one host) and
//! the partition of parameters into shards (`shard`).
//!
//! May call: nothing of the engine below the train layer but itself. Called by:
//! `train::parallel`.

pub mod collective;
pub mod comm;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shard;
#[cfg(feature = "mpi")]
mod shm;

pub use collective::{Collective, CollectiveError, HostComm, HostGroup};
pub use comm::Comm;
pub use shard::{Shards, shard_range};
