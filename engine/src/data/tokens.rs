//! nanoGPT-style token files: a flat array of little-endian token ids, u16 (nanoGPT's)
//! or u32 (vocabularies past 65,536), in train.bin and val.bin, cut into windows of
//! T + 1 tokens. Windows are read with
//! positioned reads, not a memory map: a file truncated or rewritten while training is
//! a clear error naming it (a mapped file would kill the process with SIGBUS), and
//! every id read is checked against the vocabulary again.
//!
//! May call: `data::loader`.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::loader::{DataError, Dataset, HostBatch};

/// An open token file.
pub struct TokenFile {
    file: std::fs::File,
    path: PathBuf,
    /// Tokens in the file when it was opened.
    tokens: usize,
    vocab: usize,
    /// Bytes per id: 2 (u16) or 4 (u32).
    width: usize,
    /// Window length T.
    pub block: usize,
}

/// The ids of little-endian `bytes` of `width` bytes each.
fn ids(bytes: &[u8], width: usize) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(width).map(move |c| match width {
        2 => u32::from(u16::from_le_bytes([c[0], c[1]])),
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    })
}

impl TokenFile {
    /// Opens `path` (ids of `width` bytes: 2 or 4) and checks that every id is below
    /// `vocab`.
    pub fn open(path: &Path, block: usize, vocab: usize, width: usize) -> Result<TokenFile, DataError> {
        let file = DataError::open(
            path,
            u64::MAX,
            "token file",
            " (nanoGPT's prepare.py writes train.bin and val.bin; set data.path to their folder)",
        )?;
        let io = |e| DataError::Io {
            path: path.display().to_string(),
            source: e,
        };
        let corrupt = |reason: String| DataError::Corrupt {
            path: path.display().to_string(),
            reason,
        };
        let bytes = file.metadata().map_err(io)?.len() as usize;
        let kind = if width == 2 { "u16" } else { "u32" };
        if !bytes.is_multiple_of(width) {
            return Err(corrupt(format!(
                "{bytes} bytes is not a whole number of {kind} tokens (data.token_dtype = \"{kind}\")"
            )));
        }
        let tokens = bytes / width;
        if tokens < block + 1 {
            return Err(corrupt(format!("{tokens} tokens is shorter than one window of {}", block + 1)));
        }
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &file);
        let mut chunk = vec![0u8; 1 << 20];
        let mut at = 0usize;
        while at < tokens {
            let n = ((tokens - at) * width).min(chunk.len());
            reader.read_exact(&mut chunk[..n]).map_err(io)?;
            if let Some((i, t)) = ids(&chunk[..n], width).enumerate().find(|&(_, t)| t as usize >= vocab) {
                return Err(corrupt(format!(
                    "token {t} at position {} is not below model.vocab_size {vocab}",
                    at + i
                )));
            }
            at += n / width;
        }
        drop(reader);
        Ok(TokenFile {
            file,
            path: path.to_path_buf(),
            tokens,
            vocab,
            width,
            block,
        })
    }
}

/// Windows of token 0 in the token files' shape: what the memory estimate runs on when
/// the files are not at hand (its peaks depend on the windows' shape, not their ids).
pub struct ZeroTokens {
    /// Windows it has.
    pub windows: usize,
    /// Tokens a window feeds the model (T).
    pub block: usize,
}

impl Dataset for ZeroTokens {
    fn len(&self) -> usize {
        self.windows
    }

    fn push(&self, _: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        batch.tokens.resize(batch.tokens.len() + self.block, 0);
        batch.targets.resize(batch.targets.len() + self.block, 0);
        Ok(())
    }
}

impl Dataset for TokenFile {
    fn len(&self) -> usize {
        (self.tokens - 1) / self.block
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        let start = i * self.block;
        let mut bytes = vec![0u8; self.width * (self.block + 1)];
        self.file
            .read_exact_at(&mut bytes, (self.width * start) as u64)
            .map_err(|e| DataError::Corrupt {
                path: self.path.display().to_string(),
                reason: format!(
                    "reading tokens {start}..{} failed ({e}); the file had {} tokens when training started: was it changed or truncated?",
                    start + self.block + 1,
                    self.tokens
                ),
            })?;
        let ids: Vec<i32> = ids(&bytes, self.width).map(|t| t.min(i32::MAX as u32) as i32).collect();
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(DataError::Corrupt {
                path: self.path.display().to_string(),
                reason: format!(
                    "token {bad} near position {start} is not below model.vocab_size {}: the file changed while training",
                    self.vocab
                ),
            });
        }
        batch.tokens.extend_from_slice(&ids[..self.block]);
        batch.targets.extend_from_slice(&ids[1..]);
        Ok(())
    }
}
