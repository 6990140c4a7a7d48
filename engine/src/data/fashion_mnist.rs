//! Fashion-MNIST from the IDX .gz files of Debian's `dataset-fashion-mnist` package
//! (/usr/share/datasets/fashion-mnist): 60,000 training and 10,000 test images of
//! 28 x 28, ten classes. Pixels are scaled to [0, 1] and normalised with the training
//! set's mean and standard deviation.
//!
//! May call: `data::loader`.

use std::io::Read;
use std::path::Path;

use super::loader::{DataError, Dataset, HostBatch};

/// Where Debian installs the files.
pub const DEFAULT_PATH: &str = "/usr/share/datasets/fashion-mnist";
/// Mean of the training pixels in [0, 1].
pub const MEAN: f32 = 0.2860;
/// Standard deviation of the training pixels in [0, 1].
pub const STD: f32 = 0.3530;
/// Pixels per image.
pub const PIXELS: usize = 28 * 28;
/// Classes.
pub const CLASSES: usize = 10;

/// One split.
pub struct FashionMnist {
    /// Normalised pixels, [n, 784].
    pub images: Vec<f32>,
    /// Labels in 0..10.
    pub labels: Vec<i32>,
}

/// The most bytes an IDX file of this loader may hold once decompressed (Fashion-MNIST's
/// training images take 47 MB).
const MAX_IDX: u64 = 1 << 30;

/// Reads the gzip-compressed IDX file `path` with magic `magic` and `dims` dimensions:
/// its shape and its bytes after the header. The decompressed size is bounded by what
/// the header says the file holds, checked before the rest is inflated: a file that
/// inflates to more (a compression bomb) or less is refused.
fn read_idx(path: &Path, magic: u32, dims: usize) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let corrupt = |reason: String| DataError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    let file = DataError::open(
        path,
        MAX_IDX,
        "Fashion-MNIST",
        " (install Debian's package: apt-get install dataset-fashion-mnist, or set data.path)",
    )?;
    let mut gz = flate2::read::GzDecoder::new(file);
    let unreadable = |e: std::io::Error| corrupt(format!("not a readable gzip file ({e})"));
    let mut head = vec![0u8; 4 + 4 * dims];
    let mut got = 0;
    while got < head.len() {
        match gz.read(&mut head[got..]).map_err(unreadable)? {
            0 => return Err(corrupt(format!("{got} bytes is too short for an IDX header"))),
            n => got += n,
        }
    }
    let m = u32::from_be_bytes(head[0..4].try_into().expect("4 bytes"));
    if m != magic {
        return Err(corrupt(format!("IDX magic {m:#010x}, expected {magic:#010x}")));
    }
    let shape: Vec<usize> = (0..dims)
        .map(|d| u32::from_be_bytes(head[4 + 4 * d..8 + 4 * d].try_into().expect("4 bytes")) as usize)
        .collect();
    let body = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= MAX_IDX)
        .ok_or_else(|| corrupt(format!("header says {shape:?}: more than {MAX_IDX} bytes")))?;
    let mut out = Vec::with_capacity(body as usize);
    (&mut gz).take(body + 1).read_to_end(&mut out).map_err(unreadable)?;
    if out.len() as u64 != body {
        return Err(corrupt(format!(
            "header says {shape:?} ({} bytes) but the file holds {}",
            head.len() as u64 + body,
            if out.len() as u64 > body {
                "more".to_string()
            } else {
                (head.len() + out.len()).to_string()
            }
        )));
    }
    Ok((shape, out))
}

impl FashionMnist {
    /// Loads `train` or `t10k` from `dir`.
    pub fn load(dir: &Path, split: &str) -> Result<FashionMnist, DataError> {
        let images_path = dir.join(format!("{split}-images-idx3-ubyte.gz"));
        let labels_path = dir.join(format!("{split}-labels-idx1-ubyte.gz"));
        let (ishape, images) = read_idx(&images_path, 0x0000_0803, 3)?;
        let (lshape, labels) = read_idx(&labels_path, 0x0000_0801, 1)?;
        if ishape[1] * ishape[2] != PIXELS || ishape[0] != lshape[0] {
            return Err(DataError::Corrupt {
                path: images_path.display().to_string(),
                reason: format!("images {ishape:?} do not match 28x28 or the {} labels", lshape[0]),
            });
        }
        let labels: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        if let Some(bad) = labels.iter().find(|&&l| l as usize >= CLASSES) {
            return Err(DataError::Corrupt {
                path: labels_path.display().to_string(),
                reason: format!("label {bad} is not in 0..10"),
            });
        }
        let images = images.iter().map(|&p| (p as f32 / 255.0 - MEAN) / STD).collect();
        Ok(FashionMnist { images, labels })
    }
}

impl Dataset for FashionMnist {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        batch.features.extend_from_slice(&self.images[i * PIXELS..(i + 1) * PIXELS]);
        batch.targets.push(self.labels[i]);
        Ok(())
    }
}
