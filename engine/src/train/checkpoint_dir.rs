//! The checkpoint folder's rules, applied before the first step so a bad folder costs
//! no training:
//!
//! * The folder is created if missing; a path that is a file, or a folder that cannot
//!   be written, is an error now rather than at the first save.
//! * One trainer at a time: a `.lock` file holds the holder's pid. A lock whose process
//!   is gone (a killed run) is taken over; a live holder is an error naming its pid.
//! * What interrupted saves left is mended: an old folder moved aside
//!   (`.step-N.old-PID`) whose step folder is missing is put back; stale temporary
//!   folders and files (`.step-N.tmp-PID`, `.latest.tmp-PID`, asides of steps that are
//!   in place) are removed.
//! * A fresh run (no `--resume`) into a folder that holds checkpoints is refused, so it
//!   never replaces another run's checkpoints silently, unless the caller asks to
//!   overwrite them (`wgtrain train --overwrite`): they are deleted first.
//!
//! May call: `train::checkpoint`. Called by: `train::run`.

use std::path::{Path, PathBuf};

use super::checkpoint::{CheckpointError, parse_step_dir};

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

/// A checkpoint folder held by this process (the lock goes when it is dropped).
pub struct CheckpointDir {
    root: PathBuf,
    lock: PathBuf,
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

/// Whether a process with this pid runs (Linux's /proc; elsewhere a lock is trusted).
fn alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let proc = Path::new("/proc");
    if !proc.is_dir() {
        return true;
    }
    proc.join(pid.to_string()).exists()
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
        let lock = root.join(LOCK_FILE);
        take_lock(&lock)?;
        let dir = CheckpointDir {
            root: root.to_path_buf(),
            lock,
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
                    let d = root.join(super::checkpoint::step_dir_name(s));
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

impl Drop for CheckpointDir {
    fn drop(&mut self) {
        // Only our own lock: read it back before removing.
        if std::fs::read_to_string(&self.lock).is_ok_and(|t| t.trim() == std::process::id().to_string()) {
            let _ = std::fs::remove_file(&self.lock);
        }
    }
}

fn take_lock(lock: &Path) -> Result<(), CheckpointError> {
    for _ in 0..3 {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(lock) {
            Ok(mut f) => {
                use std::io::Write;
                write!(f, "{}", std::process::id())
                    .and_then(|_| f.sync_all())
                    .map_err(|e| io(lock, e))?;
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(lock).unwrap_or_default();
                match holder.trim().parse::<u32>() {
                    Ok(pid) if alive(pid) => {
                        return Err(unusable(
                            lock.parent().unwrap_or(lock),
                            format!("another trainer (pid {pid}) holds it ({}); one run at a time", lock.display()),
                        ));
                    }
                    // A killed run's lock (or one cut short while being written).
                    _ => {
                        let _ = std::fs::remove_file(lock);
                    }
                }
            }
            Err(e) => return Err(io(lock, e)),
        }
    }
    Err(unusable(lock.parent().unwrap_or(lock), "could not take its lock"))
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
