//! The checkpoint folder's rules, applied before the first step so a bad folder costs
//! no training:
//!
//! * The folder is created if missing; a path that is a file, or a folder that cannot
//!   be written, is an error now rather than at the first save.
//! * One trainer at a time: the holder keeps an exclusive lock on `.lock`, held by the
//!   kernel (flock), so it goes with the process however it ends, whatever its pid (a
//!   trainer that is pid 1 in its container included); the file holds the holder's pid
//!   for messages. A held lock is an error naming that pid.
//! * What interrupted saves left is mended: an old folder moved aside
//!   (`.step-N.old-PID`) whose step folder is missing is put back; stale temporary
//!   folders and files (`.step-N.tmp-PID`, `.latest.tmp-PID`, asides of steps that are
//!   in place) are removed.
//! * A fresh run (no `--resume`) into a folder that holds checkpoints is refused, so it
//!   never replaces another run's checkpoints silently, unless the caller asks to
//!   overwrite them (`wgtrain train --overwrite`): they are deleted first.
//!
//! May call: `files`, `train::checkpoint`. Called by: `train::run`.

use std::path::{Path, PathBuf};

use crate::train::checkpoint::{CheckpointError, parse_step_dir};

/// The lock file's name inside the checkpoint folder.
pub const LOCK_FILE: &str = ".lock";

/// How the run meets the folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A fresh run: the folder must hold no checkpoints.
    Fresh,
    /// A fresh run that deletes the folder's checkpoints first.
    Overwrite,
    /// A resumed run: the folder's checkpoints are this run's.
    Resume,
}

/// A checkpoint folder held by this process (the lock goes when it is dropped, or when
/// the process ends).
pub struct CheckpointDir {
    root: PathBuf,
    /// The open `.lock`, locked exclusively.
    _lock: std::fs::File,
}

fn io(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn unusable(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Unusable {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

impl CheckpointDir {
    /// Checks, mends and locks `root` for a run that starts as `start` (see the module).
    pub fn open(root: &Path, start: Start) -> Result<CheckpointDir, CheckpointError> {
        if root.exists() && !root.is_dir() {
            return Err(unusable(root, "it is a file, not a folder"));
        }
        std::fs::create_dir_all(root).map_err(|e| unusable(root, format!("cannot create it: {e}")))?;
        let probe = root.join(format!(".probe-{}", std::process::id()));
        std::fs::write(&probe, b"wgtrain").map_err(|e| unusable(root, format!("cannot write in it: {e}")))?;
        std::fs::remove_file(&probe).map_err(|e| io(&probe, e))?;
        let lock = take_lock(&root.join(LOCK_FILE))?;
        let dir = CheckpointDir {
            root: root.to_path_buf(),
            _lock: lock,
        };
        recover(root)?;
        let steps = dir.steps()?;
        match start {
            Start::Fresh if !steps.is_empty() => {
                return Err(unusable(
                    root,
                    format!(
                        "it holds checkpoints of another run (steps {}); pass --resume {} to continue it, --overwrite to replace them, or choose another checkpoint.dir",
                        steps.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                        root.display()
                    ),
                ));
            }
            Start::Overwrite => {
                for s in steps {
                    let d = root.join(crate::train::checkpoint::step_dir_name(s));
                    std::fs::remove_dir_all(&d).map_err(|e| io(&d, e))?;
                }
                let latest = root.join("latest");
                if latest.exists() {
                    std::fs::remove_file(&latest).map_err(|e| io(&latest, e))?;
                }
            }
            _ => {}
        }
        Ok(dir)
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Steps of the checkpoints in the folder, in order.
    pub fn steps(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut steps: Vec<u64> = std::fs::read_dir(&self.root)
            .map_err(|e| io(&self.root, e))?
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| parse_step_dir(e.file_name().to_str()?))
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }
}

/// Opens and locks `lock` exclusively without waiting; writes this process's pid into
/// it. The file is never removed: removing it while another process opens it would let
/// two processes hold locks on two files of one name.
fn take_lock(lock: &Path) -> Result<std::fs::File, CheckpointError> {
    use std::io::{Seek, Write};
    let root = lock.parent().unwrap_or(lock);
    if std::fs::symlink_metadata(lock).is_ok_and(|m| !m.is_file()) {
        return Err(unusable(root, format!("{} is not a regular file", lock.display())));
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock)
        .map_err(|e| io(lock, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = crate::files::read_text_bounded(lock, 64).unwrap_or_default();
            let who = match holder.trim().parse::<u32>() {
                Ok(pid) => format!("another trainer (pid {pid})"),
                Err(_) => "another process".to_string(),
            };
            return Err(unusable(root, format!("{who} holds it ({}); one run at a time", lock.display())));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(lock, e)),
    }
    file.set_len(0)
        .and_then(|_| file.rewind())
        .and_then(|_| write!(file, "{}", std::process::id()))
        .and_then(|_| file.sync_all())
        .map_err(|e| io(lock, e))?;
    Ok(file)
}

/// Mends what interrupted saves left in `root` (see the module).
pub fn recover(root: &Path) -> Result<(), CheckpointError> {
    let entries: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| io(root, e))?
        .flatten()
        .map(|e| e.path())
        .collect();
    for path in entries {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(rest) = name.strip_prefix('.') {
            if let Some((step_dir, _pid)) = rest.split_once(".old-") {
                let target = root.join(step_dir);
                if !target.join("manifest.json").is_file() && path.join("manifest.json").is_file() {
                    if target.exists() {
                        std::fs::remove_dir_all(&target).map_err(|e| io(&target, e))?;
                    }
                    std::fs::rename(&path, &target).map_err(|e| io(&target, e))?;
                    tracing::warn!("put back {} (a save was interrupted while replacing it)", target.display());
                } else {
                    std::fs::remove_dir_all(&path).map_err(|e| io(&path, e))?;
                }
            } else if rest.contains(".tmp-") {
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.map_err(|e| io(&path, e))?;
                tracing::info!("removed {} (left by an interrupted save)", path.display());
            }
        }
    }
    Ok(())
}
