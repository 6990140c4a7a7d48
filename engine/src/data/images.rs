//! Image datasets beyond Fashion-MNIST's files: synthetic images of any shape (for
//! benchmarks and memory tables: the pixels cost nothing to make and the steps are
//! the real model's), and the host-side augmentation basics (random crop with padding,
//! horizontal flip), drawn from the seed, the epoch and the example so that a run
//! (and a resumed one) sees the same images.
//!
//! May call: `data::loader`.

use std::sync::Arc;

use super::loader::{DataError, Dataset, HostBatch};

/// SplitMix64: one well-mixed u64 from another.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Distinct images a synthetic set cycles through (example i shows image i mod this).
pub const SYNTHETIC_POOL: usize = 64;

/// `n` examples of `image` = [channels, height, width] (NCHW values, roughly standard
/// normal) with labels in 0..classes, from a pool of [`SYNTHETIC_POOL`] images made
/// from `seed`.
pub struct SyntheticImages {
    n: usize,
    image: [usize; 3],
    pool: Vec<f32>,
    labels: Vec<i32>,
}

impl SyntheticImages {
    /// The set (its pool is made here: at most 64 images).
    pub fn new(n: usize, image: [usize; 3], classes: usize, seed: u64) -> SyntheticImages {
        let per = image.iter().product::<usize>();
        let count = SYNTHETIC_POOL.min(n.max(1));
        let mut state = mix(seed ^ 0x5eed_1a9e);
        let pool = (0..count * per)
            .map(|_| {
                // The sum of four uniforms, centred and scaled to unit variance.
                let s: f32 = (0..4)
                    .map(|_| {
                        state = mix(state);
                        (state >> 40) as f32 / (1u64 << 24) as f32
                    })
                    .sum();
                (s - 2.0) * 3f32.sqrt()
            })
            .collect();
        let labels = (0..count)
            .map(|i| (mix(seed.wrapping_add(i as u64)) % classes.max(1) as u64) as i32)
            .collect();
        SyntheticImages { n, image, pool, labels }
    }
}

impl Dataset for SyntheticImages {
    fn len(&self) -> usize {
        self.n
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        let per = self.image.iter().product::<usize>();
        let k = i % self.labels.len();
        batch.features.extend_from_slice(&self.pool[k * per..(k + 1) * per]);
        batch.targets.push(self.labels[k]);
        Ok(())
    }
}

/// What [`Augmented`] does to each training image.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Augment {
    /// Zero padding around the image before a random crop of its own size (0: no crop).
    pub crop_padding: usize,
    /// Mirror left-right with probability 1/2.
    pub flip: bool,
    /// The value of a black pixel (the padding) after the set's normalisation.
    pub fill: f32,
}

/// A dataset of NCHW images augmented per example, per epoch.
pub struct Augmented {
    inner: Arc<dyn Dataset>,
    image: [usize; 3],
    augment: Augment,
    seed: u64,
}

impl Augmented {
    /// `inner`'s images (each `image` = [channels, height, width]) augmented as
    /// `augment` says, drawn from `seed`.
    pub fn new(inner: Arc<dyn Dataset>, image: [usize; 3], augment: Augment, seed: u64) -> Augmented {
        Augmented {
            inner,
            image,
            augment,
            seed,
        }
    }
}

impl Dataset for Augmented {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        let start = batch.features.len();
        self.inner.push(i, batch)?;
        let [c, h, w] = self.image;
        let img = &mut batch.features[start..];
        if img.len() != c * h * w {
            return Err(DataError::Corrupt {
                path: "augmentation".into(),
                reason: format!("an example of {} values is not a {c}x{h}x{w} image", img.len()),
            });
        }
        let r = mix(self.seed ^ mix(batch.position.0 ^ mix(i as u64)));
        let a = self.augment;
        let pad = a.crop_padding as isize;
        let span = 2 * a.crop_padding as u64 + 1;
        let (dy, dx) = if pad > 0 {
            ((r % span) as isize - pad, ((r >> 16) % span) as isize - pad)
        } else {
            (0, 0)
        };
        let flip = a.flip && (r >> 40) & 1 == 1;
        if dy == 0 && dx == 0 && !flip {
            return Ok(());
        }
        let src = img.to_vec();
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let sx = if flip { w - 1 - x } else { x } as isize + dx;
                    let sy = y as isize + dy;
                    let inside = sy >= 0 && sx >= 0 && (sy as usize) < h && (sx as usize) < w;
                    img[(ch * h + y) * w + x] = if inside {
                        src[(ch * h + sy as usize) * w + sx as usize]
                    } else {
                        a.fill
                    };
                }
            }
        }
        Ok(())
    }
}
