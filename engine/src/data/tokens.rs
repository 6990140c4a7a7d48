//! nanoGPT-style token files: a flat array of little-endian u16 token ids
//! (train.bin, val.bin), read through memmap, cut into windows of T + 1 tokens.
//!
//! May call: `data::loader`.

use std::path::Path;

use super::loader::{DataError, Dataset, HostBatch};

/// A memory-mapped token file.
pub struct TokenFile {
    map: memmap2::Mmap,
    /// Window length T.
    pub block: usize,
}

impl TokenFile {
    /// Maps `path` and checks that every id is below `vocab`.
    pub fn open(path: &Path, block: usize, vocab: usize) -> Result<TokenFile, DataError> {
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DataError::Missing {
                what: "token file".into(),
                path: path.display().to_string(),
                hint: " (nanoGPT's prepare.py writes train.bin and val.bin; set data.path to their folder)".into(),
            },
            _ => DataError::Io {
                path: path.display().to_string(),
                source: e,
            },
        })?;
        // SAFETY: the file is only read; a concurrent truncation would be a user error
        // that at worst ends the process, as with any mapped input.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| DataError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        let corrupt = |reason: String| DataError::Corrupt {
            path: path.display().to_string(),
            reason,
        };
        if map.len() % 2 != 0 {
            return Err(corrupt(format!("{} bytes is not a whole number of u16 tokens", map.len())));
        }
        if map.len() / 2 < block + 1 {
            return Err(corrupt(format!(
                "{} tokens is shorter than one window of {}",
                map.len() / 2,
                block + 1
            )));
        }
        if let Some((i, t)) = map
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .enumerate()
            .find(|&(_, t)| t as usize >= vocab)
        {
            return Err(corrupt(format!("token {t} at position {i} is not below model.vocab_size {vocab}")));
        }
        Ok(TokenFile { map, block })
    }

    fn token(&self, i: usize) -> i32 {
        u16::from_le_bytes([self.map[2 * i], self.map[2 * i + 1]]) as i32
    }
}

impl Dataset for TokenFile {
    fn len(&self) -> usize {
        (self.map.len() / 2 - 1) / self.block
    }

    fn push(&self, i: usize, batch: &mut HostBatch) {
        let start = i * self.block;
        batch.tokens.extend((start..start + self.block).map(|j| self.token(j)));
        batch.targets.extend((start + 1..start + self.block + 1).map(|j| self.token(j)));
    }
}
