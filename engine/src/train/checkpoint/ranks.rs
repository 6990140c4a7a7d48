//! A checkpoint saved by the processes of a run over MPI whose optimizer state is
//! sharded (ZeRO 1-3, or offloaded): each rank writes its own shard of the state,
//! `optimizer-RANK-of-N.safetensors` (each tensor the rank's part of the parameter's,
//! flat), and rank 0 writes the model, the trainer state and, once every rank has
//! written and synced its file, the manifest with every file's hash. No process holds
//! the whole optimizer state. A load (`checkpoint::load`) joins the shards in rank
//! order (they are contiguous ranges in rank order), so any number of ranks, or one
//! process, resumes it.
//!
//! Every rank makes the same calls in the same order whatever fails on the way: each
//! phase ends with an exchange of every rank's outcome, so all ranks return the same
//! success or the first failing rank's error, and rank 0 removes the temporary folder.
//!
//! May call: `train::checkpoint`. Called by: `train::state`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{CheckpointData, CheckpointError, HostTensor, finish, fresh_tmp, shard_file, step_dir_name, to_safetensors, write_file};

/// The processes of a save over MPI.
pub trait SaveRanks {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Processes in the run.
    fn size(&self) -> usize;
    /// Every rank's `mine`, in rank order, once every rank has passed its own.
    fn gather(&self, mine: &str) -> Result<Vec<String>, String>;
}

/// Every rank's outcome of a phase: the values, or the first failing rank's error
/// (this rank's own as it is).
fn agree(ranks: &dyn SaveRanks, mine: Result<String, CheckpointError>) -> Result<Vec<String>, CheckpointError> {
    let text = match &mine {
        Ok(v) => format!("ok {v}"),
        Err(e) => format!("error {e}"),
    };
    let all = ranks.gather(&text).map_err(|reason| CheckpointError::Rank {
        rank: ranks.rank(),
        reason: format!("the ranks could not exchange: {reason}"),
    })?;
    let mine = mine?;
    let mut out = Vec::with_capacity(all.len());
    for (rank, t) in all.into_iter().enumerate() {
        match t.split_once(' ') {
            Some(("ok", v)) => out.push(v.to_string()),
            Some((_, reason)) if rank != ranks.rank() => {
                return Err(CheckpointError::Rank {
                    rank,
                    reason: reason.into(),
                });
            }
            _ => out.push(mine.clone()),
        }
    }
    Ok(out)
}

/// Saves `data` (model and trainer state; its optimizer list is not used) with this
/// rank's optimizer `shard`, every rank of `ranks` calling it for the same `step`.
pub fn save_ranks(
    root: &Path,
    step: u64,
    data: &CheckpointData,
    shard: &[HostTensor],
    ranks: &dyn SaveRanks,
) -> Result<PathBuf, CheckpointError> {
    let (rank, n) = (ranks.rank(), ranks.size());
    let mut tmp: Option<PathBuf> = None;
    let result = (|| {
        // Rank 0 makes the folder every rank writes into.
        let made = if rank == 0 {
            fresh_tmp(root, step).map(|t| {
                let name = t.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                tmp = Some(t);
                name
            })
        } else {
            Ok(String::new())
        };
        let names = agree(ranks, made)?;
        let dir = root.join(&names[0]);
        let file = shard_file(rank, n);
        let written = write_file(&dir, &file, to_safetensors(shard, None), step);
        let hashes = agree(ranks, written)?;
        let done = if rank == 0 {
            let mut trainer_meta = data.trainer.clone();
            trainer_meta.insert("step".into(), step.to_string());
            let mut files: BTreeMap<String, String> = hashes.into_iter().enumerate().map(|(r, h)| (shard_file(r, n), h)).collect();
            (|| {
                for (name, bytes) in [
                    ("model.safetensors", to_safetensors(&data.model, None)),
                    ("trainer.safetensors", to_safetensors(&[], Some(trainer_meta))),
                ] {
                    files.insert(name.into(), write_file(&dir, name, bytes, step)?);
                }
                finish(root, step, &dir, files)
            })()
            .map(|_| String::new())
        } else {
            Ok(String::new())
        };
        agree(ranks, done)?;
        Ok(root.join(step_dir_name(step)))
    })();
    if result.is_err()
        && let Some(t) = tmp.filter(|t| t.exists())
    {
        let _ = std::fs::remove_dir_all(t);
    }
    result
}
