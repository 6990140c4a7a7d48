//! Host data: the dataset trait, a batch, the deterministic batch order (seeded
//! shuffles by epoch), and the loader thread that prepares the next batches while the
//! GPU works. Examples of their own lengths (text lines) are grouped by length within
//! windows of the shuffled order and padded to their batch's longest.
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
    /// Example `i`'s length in tokens where examples differ in length (a batch of them
    /// is then padded to its longest, and batches group similar lengths); None: every
    /// example has the same shape.
    fn length(&self, _i: usize) -> Option<usize> {
        None
    }
}

/// The target of a padding position: the cross-entropy's ignore index (no loss, no
/// gradient), as PyTorch's -100.
pub const PAD_TARGET: i32 = -100;

/// Windows of the shuffled order, in batches, sorted by length inside (bucketing): a
/// batch's examples are of similar lengths, and the order stays seeded.
const BUCKET_BATCHES: usize = 32;

/// Examples `indices` of `data` as one batch; examples of their own lengths padded to
/// the longest (inputs with token 0, targets with [`PAD_TARGET`]).
pub fn collate(data: &dyn Dataset, indices: &[usize], position: (u64, u64)) -> Result<HostBatch, DataError> {
    let mut b = HostBatch {
        position,
        ..Default::default()
    };
    let mut lengths = Vec::new();
    for (k, &i) in indices.iter().enumerate() {
        let before = b.tokens.len();
        data.push(i, &mut b)?;
        lengths.push(b.tokens.len() - before);
        if k == 0 {
            // Room for the rest at the first example's size: a batch of images grows by
            // no copies.
            let left = indices.len() - 1;
            b.features.reserve(left * b.features.len());
            b.tokens.reserve(left * b.tokens.len());
            b.targets.reserve(left * b.targets.len());
        }
        b.examples += 1;
    }
    let longest = lengths.iter().copied().max().unwrap_or(0);
    if data.length(indices.first().copied().unwrap_or(0)).is_some() && lengths.iter().any(|&l| l != longest) {
        let (mut tokens, mut targets) = (
            Vec::with_capacity(longest * lengths.len()),
            Vec::with_capacity(longest * lengths.len()),
        );
        let mut at = 0;
        for &l in &lengths {
            tokens.extend_from_slice(&b.tokens[at..at + l]);
            targets.extend_from_slice(&b.targets[at..at + l]);
            tokens.resize(tokens.len() + longest - l, 0);
            targets.resize(targets.len() + longest - l, PAD_TARGET);
            at += l;
        }
        (b.tokens, b.targets) = (tokens, targets);
    }
    Ok(b)
}

/// `order` with each window of [`BUCKET_BATCHES`] batches sorted by example length,
/// longest first, where the examples differ in length (else unchanged).
pub fn bucketed(mut order: Vec<usize>, data: &dyn Dataset, batch: usize) -> Vec<usize> {
    if order.first().and_then(|&i| data.length(i)).is_none() {
        return order;
    }
    for window in order.chunks_mut(batch.max(1) * BUCKET_BATCHES) {
        window.sort_by_key(|&i| std::cmp::Reverse(data.length(i).unwrap_or(0)));
    }
    order
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

impl HostBatch {
    /// Targets that count (not padding).
    pub fn valid_targets(&self) -> usize {
        self.targets.iter().filter(|&&t| t != PAD_TARGET).count()
    }
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
                let order = bucketed(epoch_order(n, seed, epoch, shuffle), &*data, batch);
                while index < per_epoch {
                    let start = index as usize * batch;
                    let end = (start + batch).min(n);
                    let b = match collate(&*data, &order[start..end], (epoch, index)) {
                        Ok(b) => b,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Examples i of length 1 + i % 5: tokens i*10+k, targets i*10+k+1.
    struct Varied(usize);

    impl Dataset for Varied {
        fn len(&self) -> usize {
            self.0
        }
        fn push(&self, i: usize, b: &mut HostBatch) -> Result<(), DataError> {
            let n = 1 + i % 5;
            b.tokens.extend((0..n).map(|k| (i * 10 + k) as i32));
            b.targets.extend((0..n).map(|k| (i * 10 + k + 1) as i32));
            Ok(())
        }
        fn length(&self, i: usize) -> Option<usize> {
            Some(1 + i % 5)
        }
    }

    #[test]
    fn a_batch_of_varied_lengths_is_padded_to_its_longest() {
        let b = collate(&Varied(10), &[1, 3], (0, 0)).unwrap();
        assert_eq!(b.examples, 2);
        assert_eq!(b.tokens, [10, 11, 0, 0, 30, 31, 32, 33]);
        assert_eq!(b.targets, [11, 12, PAD_TARGET, PAD_TARGET, 31, 32, 33, 34]);
        assert_eq!(b.valid_targets(), 6);
    }

    #[test]
    fn bucketing_sorts_each_window_by_length_and_keeps_every_example() {
        let data = Varied(300);
        let order = epoch_order(300, 7, 0, true);
        let b = bucketed(order.clone(), &data, 4);
        let mut sorted = b.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..300).collect::<Vec<_>>());
        for (w, o) in b.chunks(4 * BUCKET_BATCHES).zip(order.chunks(4 * BUCKET_BATCHES)) {
            assert!(w.windows(2).all(|p| data.length(p[0]) >= data.length(p[1])));
            let (mut a, mut c) = (w.to_vec(), o.to_vec());
            a.sort_unstable();
            c.sort_unstable();
            assert_eq!(a, c, "a window keeps its own examples");
        }
        // Data of one shape keeps the shuffled order.
        struct Fixed;
        impl Dataset for Fixed {
            fn len(&self) -> usize {
                300
            }
            fn push(&self, _: usize, _: &mut HostBatch) -> Result<(), DataError> {
                Ok(())
            }
        }
        assert_eq!(bucketed(order.clone(), &Fixed, 4), order);
    }
}
