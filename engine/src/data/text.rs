//! Character-level text: any file or folder of text files (default: Debian's
//! `fortunes` package under /usr/share/games/fortunes), a vocabulary of the characters
//! seen, and windows of T + 1 characters (inputs and next-character targets), or each
//! line an example of its own length (`data.kind = "lines"`).
//!
//! May call: `data::loader`, `files`.

use std::path::Path;

use super::loader::{DataError, Dataset, HostBatch};

/// Where Debian's fortunes package puts its text.
pub const DEFAULT_PATH: &str = "/usr/share/games/fortunes";

/// A character corpus split into a vocabulary and ids.
pub struct CharCorpus {
    /// The characters, sorted; id = index.
    pub vocab: Vec<char>,
    /// The text as ids.
    pub ids: Vec<i32>,
    /// Window length T.
    pub block: usize,
    /// Stride between window starts (T for non-overlapping windows).
    pub stride: usize,
}

/// The most bytes of text a corpus may hold (held in memory whole, as characters).
const MAX_TEXT: u64 = 1 << 30;

fn read_texts(path: &Path) -> Result<String, DataError> {
    let missing = || DataError::Missing {
        what: "text corpus".into(),
        path: path.display().to_string(),
        hint: " (install Debian's package: apt-get install fortunes, or set data.path to a text file)".into(),
    };
    let meta = std::fs::metadata(path).map_err(|_| missing())?;
    let mut files = Vec::new();
    if meta.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| DataError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            // fortunes ships each text beside its index (.dat) and a UTF-8 copy (.u8).
            if p.is_file() && p.extension().is_none() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut text = String::new();
    let mut left = MAX_TEXT;
    for f in &files {
        let bytes = crate::files::read_bounded(f, left).map_err(|e| DataError::Io {
            path: f.display().to_string(),
            source: e,
        })?;
        left -= bytes.len() as u64;
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    if text.is_empty() {
        return Err(DataError::Corrupt {
            path: path.display().to_string(),
            reason: "no text found".into(),
        });
    }
    Ok(text)
}

impl CharCorpus {
    /// Reads `path` and cuts windows of `block` + 1 characters every `block` characters.
    pub fn load(path: &Path, block: usize) -> Result<CharCorpus, DataError> {
        let text = read_texts(path)?;
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<i32> = text
            .chars()
            .map(|c| vocab.binary_search(&c).expect("every char is in the vocab") as i32)
            .collect();
        if ids.len() < block + 2 {
            return Err(DataError::Corrupt {
                path: path.display().to_string(),
                reason: format!("{} characters is shorter than one window of {}", ids.len(), block + 1),
            });
        }
        Ok(CharCorpus {
            vocab,
            ids,
            block,
            stride: block,
        })
    }

    /// Entropy of the unigram character distribution in nats (a model that ignores
    /// context cannot do better than this loss).
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = vec![0usize; self.vocab.len()];
        for &i in &self.ids {
            counts[i as usize] += 1;
        }
        let n = self.ids.len() as f64;
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum()
    }

    /// Splits off the last `fraction` of the windows as a validation corpus.
    pub fn split(self, fraction: f64) -> (CharCorpus, CharCorpus) {
        let cut = ((self.ids.len() as f64) * (1.0 - fraction)) as usize;
        let val = CharCorpus {
            vocab: self.vocab.clone(),
            ids: self.ids[cut.saturating_sub(self.block)..].to_vec(),
            block: self.block,
            stride: self.stride,
        };
        let train = CharCorpus {
            vocab: self.vocab,
            ids: self.ids[..cut].to_vec(),
            block: self.block,
            stride: self.stride,
        };
        (train, val)
    }
}

impl Dataset for CharCorpus {
    fn len(&self) -> usize {
        (self.ids.len().saturating_sub(self.block + 1)) / self.stride.max(1) + usize::from(self.ids.len() > self.block)
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        let start = i * self.stride;
        batch.tokens.extend_from_slice(&self.ids[start..start + self.block]);
        batch.targets.extend_from_slice(&self.ids[start + 1..start + self.block + 1]);
        Ok(())
    }
}

/// A corpus's lines as examples of their own lengths (`data.kind = "lines"`): each line
/// with its newline, at most T + 1 characters (a longer line's rest is left out), as
/// inputs and next-character targets. Lines of a lone newline are left out. The loader
/// pads a batch to its longest and groups similar lengths.
pub struct CharLines {
    ids: Vec<i32>,
    /// Each example's start in `ids` and its characters (inputs + 1).
    spans: Vec<(usize, usize)>,
}

impl CharCorpus {
    /// The corpus's lines, at most `block` + 1 characters each.
    pub fn lines(&self) -> CharLines {
        let newline = self.vocab.binary_search(&'\n').ok().map(|i| i as i32);
        let mut spans = Vec::new();
        let mut start = 0;
        for (k, &id) in self.ids.iter().enumerate() {
            if Some(id) == newline || k + 1 == self.ids.len() {
                let len = (k + 1 - start).min(self.block + 1);
                if len >= 2 {
                    spans.push((start, len));
                }
                start = k + 1;
            }
        }
        CharLines {
            ids: self.ids.clone(),
            spans,
        }
    }
}

impl CharLines {
    /// The longest example's tokens (inputs).
    pub fn longest(&self) -> usize {
        self.spans.iter().map(|&(_, l)| l - 1).max().unwrap_or(0)
    }
}

impl Dataset for CharLines {
    fn len(&self) -> usize {
        self.spans.len()
    }

    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        let (start, len) = self.spans[i];
        batch.tokens.extend_from_slice(&self.ids[start..start + len - 1]);
        batch.targets.extend_from_slice(&self.ids[start + 1..start + len]);
        Ok(())
    }

    fn length(&self, i: usize) -> Option<usize> {
        Some(self.spans[i].1 - 1)
    }
}
