//! Host data: the dataset trait, a batch, the deterministic batch order (seeded
//! shuffles by epoch), and the loader thread that prepares the next batches while the
//! GPU works.
//!
//! May call: `files` (host data only). Called by: the datasets, the
//! trainer.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Why a dataset could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file is missing.
    #[error("{what} not found at {path}{hint}")]
    Missing {
        /// What was looked for.
        what: String,
        /// Where.
        path: String,
        /// How to get it.
        hint: String,
    },
    /// A file is not what it should be.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// Reading failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl DataError {
    /// Opens the data file `path` (`what`, with `hint` on how to get it when missing):
    /// a regular file of at most `max` bytes, never a FIFO (whose open would block) or
    /// a device (read forever).
    pub fn open(path: &std::path::Path, max: u64, what: &str, hint: &str) -> Result<std::fs::File, DataError> {
        crate::files::regular_size(path, max)
            .and_then(|_| std::fs::File::open(path))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => DataError::Missing {
                    what: what.into(),
                    path: path.display().to_string(),
                    hint: hint.into(),
                },
                _ => DataError::Io {
                    path: path.display().to_string(),
                    source: e,
                },
            })
    }
}

/// A host-side dataset of fixed-size examples.
pub trait Dataset: Send + Sync + 'static {
    /// Number of examples.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends example `i`'s inputs and targets to a batch (an error when the data
    /// became unreadable since it was opened).
    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError>;
}

/// One batch on the host: f32 features or i32 tokens, and i32 targets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostBatch {
    /// Float features (flattened), if the dataset has them.
    pub features: Vec<f32>,
    /// Token inputs (flattened), if the dataset has them.
    pub tokens: Vec<i32>,
    /// Targets (class or next token), flattened.
    pub targets: Vec<i32>,
    /// Examples in the batch.
    pub examples: usize,
    /// Epoch and index of the batch within it.
    pub position: (u64, u64),
}

/// The example order of `epoch` for `seed`: a permutation, the same on every run.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
    }
    order
}

/// Batches per epoch (the last partial batch is dropped when `drop_last`).
pub fn batches_per_epoch(n: usize, batch: usize, drop_last: bool) -> u64 {
    if drop_last {
        (n / batch.max(1)) as u64
    } else {
        n.div_ceil(batch.max(1)) as u64
    }
}

/// How examples are grouped into batches.
#[derive(Clone, Copy, Debug)]
pub struct BatchOrder {
    /// Examples per batch.
    pub batch: usize,
    /// Seed of the shuffles.
    pub seed: u64,
    /// Shuffle each epoch.
    pub shuffle: bool,
    /// Drop the last partial batch.
    pub drop_last: bool,
}

/// Batches from a background thread, starting at a position (for resume).
pub struct Loader {
    rx: Receiver<Result<HostBatch, DataError>>,
    handle: Option<JoinHandle<()>>,
}

impl Loader {
    /// Streams batches from (`epoch`, `index`) on, `prefetch` ahead.
    pub fn start(data: std::sync::Arc<dyn Dataset>, order: BatchOrder, (epoch, index): (u64, u64), prefetch: usize) -> Loader {
        let BatchOrder {
            batch,
            seed,
            shuffle,
            drop_last,
        } = order;
        type Batch = Result<HostBatch, DataError>;
        let (tx, rx): (SyncSender<Batch>, Receiver<Batch>) = sync_channel(prefetch.max(1));
        let handle = std::thread::spawn(move || {
            let n = data.len();
            let per_epoch = batches_per_epoch(n, batch, drop_last);
            let (mut epoch, mut index) = (epoch, index);
            loop {
                let order = epoch_order(n, seed, epoch, shuffle);
                while index < per_epoch {
                    let start = index as usize * batch;
                    let end = (start + batch).min(n);
                    let mut b = HostBatch {
                        position: (epoch, index),
                        ..Default::default()
                    };
                    for &i in &order[start..end] {
                        if let Err(e) = data.push(i, &mut b) {
                            let _ = tx.send(Err(e));
                            return;
                        }
                        if b.examples == 0 {
                            // Room for the rest at the first example's size: a batch of
                            // images grows by no copies.
                            let left = end - start - 1;
                            b.features.reserve(left * b.features.len());
                            b.tokens.reserve(left * b.tokens.len());
                            b.targets.reserve(left * b.targets.len());
                        }
                        b.examples += 1;
                    }
                    if tx.send(Ok(b)).is_err() {
                        return; // the trainer stopped
                    }
                    index += 1;
                }
                epoch += 1;
                index = 0;
                if per_epoch == 0 {
                    return;
                }
            }
        });
        Loader { rx, handle: Some(handle) }
    }

    /// The next batch (None if the dataset is empty; an error if the data became
    /// unreadable).
    pub fn next_batch(&mut self) -> Option<Result<HostBatch, DataError>> {
        self.rx.recv().ok()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the channel ends the thread at its next send.
        let (_, dead) = sync_channel(1);
        drop(std::mem::replace(&mut self.rx, dead));
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
