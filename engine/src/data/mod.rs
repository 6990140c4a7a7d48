//! Datasets and the batch loader: deterministic shuffling by seed and epoch, and a
//! background thread that prepares the next batches while the GPU works.
//!
//! May call: nothing of the engine (host data only). Called by: the trainer.

pub mod fashion_mnist;
pub mod images;
pub mod loader;
pub mod text;
pub mod tokens;
pub use loader::{BatchOrder, DataError, Dataset, HostBatch, Loader, PAD_TARGET, batches_per_epoch, bucketed, collate, epoch_order};
