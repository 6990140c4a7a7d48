//! Checkpoints: a folder per save holding model.safetensors (parameters by state-dict
//! name), optimizer.safetensors (its state tensors; or, saved by the ranks of an MPI
//! run, one shard file a rank: `ranks`), trainer.safetensors (step and data position,
//! in its metadata) and manifest.json with each file's sha256.
//!
//! A save is written under a temporary name (`.step-N.tmp-PID`), every file fsynced, the
//! folder renamed into place and fsynced, and only then `latest` is replaced (temp,
//! fsync, rename): a crash at any point leaves the previous checkpoint whole and
//! `latest` pointing at it. Saving a step whose folder exists (resuming a finished run,
//! or an older step in the same folder) first moves the old folder aside
//! (`.step-N.old-PID`), renames the new one in, and removes the old one only after
//! `latest` is durable; a crash between the two renames leaves the old folder whole
//! under its aside name, where [`resolve`] finds it and `checkpoint_dir::recover` puts
//! it back. A load verifies every hash before parsing anything, and refuses a mismatch
//! naming the file.
//!
//! May call: `files`.

pub mod dir;
pub mod ranks;
pub mod state;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Format tag in every manifest.
pub const FORMAT: &str = "wgtrain-checkpoint-1";
/// Checkpoints kept in a folder (older ones are deleted after a successful save).
pub const KEEP: usize = 3;

pub use crate::train::error::CheckpointError;

fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |e| CheckpointError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// A named f32 tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// State-dict name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// What one checkpoint holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointData {
    /// Parameters.
    pub model: Vec<HostTensor>,
    /// Optimizer state tensors.
    pub optimizer: Vec<HostTensor>,
    /// Trainer state (step, epoch, batch index, optimizer step...), as text.
    pub trainer: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    format: String,
    step: u64,
    files: BTreeMap<String, String>,
}

fn to_safetensors(tensors: &[HostTensor], metadata: Option<BTreeMap<String, String>>) -> Result<Vec<u8>, String> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let bytes: &[u8] = bytemuck::cast_slice(&t.data);
            TensorView::new(Dtype::F32, t.shape.clone(), bytes)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let metadata = metadata.map(|m| m.into_iter().collect());
    safetensors::serialize(views, metadata).map_err(|e| e.to_string())
}

fn from_safetensors(bytes: &[u8], path: &Path) -> Result<(Vec<HostTensor>, BTreeMap<String, String>), CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| corrupt(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(corrupt(format!("tensor {name} is {:?}, expected F32", view.dtype())));
        }
        out.push(HostTensor {
            name,
            shape: view.shape().to_vec(),
            data: bytemuck::pod_collect_to_vec(view.data()),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let meta = header.metadata().clone().map(|m| m.into_iter().collect()).unwrap_or_default();
    Ok((out, meta))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(io(path))
}

/// The folder name of the checkpoint at `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:09}")
}

/// Writes a checkpoint of `step` into `root` and points `latest` at it. A save that
/// fails (a full disk) removes its temporary folder and file before returning the error.
pub fn save(root: &Path, step: u64, data: &CheckpointData) -> Result<PathBuf, CheckpointError> {
    let result = save_inner(root, step, data);
    if result.is_err() {
        let pid = std::process::id();
        let _ = std::fs::remove_dir_all(root.join(format!(".{}.tmp-{pid}", step_dir_name(step))));
        let _ = std::fs::remove_file(root.join(format!(".latest.tmp-{pid}")));
    }
    result
}

fn save_inner(root: &Path, step: u64, data: &CheckpointData) -> Result<PathBuf, CheckpointError> {
    let tmp = fresh_tmp(root, step)?;
    let mut trainer_meta = data.trainer.clone();
    trainer_meta.insert("step".into(), step.to_string());
    let mut hashes = BTreeMap::new();
    for (name, bytes) in [
        ("model.safetensors", to_safetensors(&data.model, None)),
        ("optimizer.safetensors", to_safetensors(&data.optimizer, None)),
        ("trainer.safetensors", to_safetensors(&[], Some(trainer_meta))),
    ] {
        let hash = write_file(&tmp, name, bytes, step)?;
        hashes.insert(name.to_string(), hash);
    }
    finish(root, step, &tmp, hashes)
}

/// A new, empty temporary folder for the save of `step` (this process's).
fn fresh_tmp(root: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(root).map_err(io(root))?;
    let tmp = root.join(format!(".{}.tmp-{}", step_dir_name(step), std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    Ok(tmp)
}

/// Writes one file of a save into `tmp`, fsynced; returns its sha256.
fn write_file(tmp: &Path, name: &str, bytes: Result<Vec<u8>, String>, step: u64) -> Result<String, CheckpointError> {
    let bytes = bytes.map_err(|reason| CheckpointError::Corrupt { path: name.into(), reason })?;
    let hash = hex::encode(Sha256::digest(&bytes));
    write_synced(&tmp.join(name), &bytes)?;
    if std::env::var_os("WGTRAIN_TEST_CRASH_IN_SAVE").is_some() {
        // Test hook: die mid-save, as a power cut or `kill -9` would.
        std::process::abort();
    }
    crash_point("file", step);
    Ok(hash)
}

/// The manifest of `hashes` written into `tmp`, the folder renamed into place and
/// `latest` pointed at it (see the module), older checkpoints pruned.
fn finish(root: &Path, step: u64, tmp: &Path, hashes: BTreeMap<String, String>) -> Result<PathBuf, CheckpointError> {
    let final_dir = root.join(step_dir_name(step));
    let manifest = Manifest {
        format: FORMAT.into(),
        step,
        files: hashes,
    };
    let text = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
    write_synced(&tmp.join("manifest.json"), &text)?;
    sync_dir(tmp)?;
    crash_point("written", step);
    // Replace-then-rename: the old folder of this step goes aside, never away, until
    // the new one is in place and `latest` is durable.
    let aside = root.join(format!(".{}.old-{}", step_dir_name(step), std::process::id()));
    let replaced = final_dir.exists();
    if replaced {
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
        }
        std::fs::rename(&final_dir, &aside).map_err(io(&final_dir))?;
        crash_point("old-aside", step);
    }
    std::fs::rename(tmp, &final_dir).map_err(io(&final_dir))?;
    sync_dir(root)?;
    crash_point("new-in-place", step);
    let latest_tmp = root.join(format!(".latest.tmp-{}", std::process::id()));
    write_synced(&latest_tmp, step_dir_name(step).as_bytes())?;
    crash_point("latest-written", step);
    std::fs::rename(&latest_tmp, root.join("latest")).map_err(io(root))?;
    sync_dir(root)?;
    crash_point("latest-in-place", step);
    if replaced {
        std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
    }
    prune(root, step)?;
    Ok(final_dir)
}

/// The most ranks a checkpoint's shards may come from.
const MAX_RANKS: usize = 1 << 16;

/// The file rank `rank` of `ranks` writes its optimizer shard to.
pub fn shard_file(rank: usize, ranks: usize) -> String {
    format!("optimizer-{rank:05}-of-{ranks:05}.safetensors")
}

/// (rank, ranks) of a shard file's name.
fn parse_shard_file(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("optimizer-")?.strip_suffix(".safetensors")?;
    let (r, n) = rest.split_once("-of-")?;
    let all_digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(r) || !all_digits(n) {
        return None;
    }
    let (r, n): (usize, usize) = (r.parse().ok()?, n.parse().ok()?);
    (r < n && n <= MAX_RANKS).then_some((r, n))
}

/// The optimizer state of a checkpoint saved by ranks: each shard file's tensors
/// (read and verified by the caller, in rank order) joined into whole, flat tensors.
fn join_shards(shards: Vec<Vec<HostTensor>>) -> Vec<HostTensor> {
    let mut whole: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for shard in shards {
        for t in shard {
            whole.entry(t.name).or_default().extend_from_slice(&t.data);
        }
    }
    whole
        .into_iter()
        .map(|(name, data)| HostTensor {
            name,
            shape: vec![data.len()],
            data,
        })
        .collect()
}

/// Every point of a save where the fault-injection tests kill the process.
pub const CRASH_POINTS: [&str; 6] = ["file", "written", "old-aside", "new-in-place", "latest-written", "latest-in-place"];

/// Test hook: `WGTRAIN_TEST_CRASH_AT=POINT` aborts the process at that point of a save,
/// as a power cut or `kill -9` would (optionally only at step S: `POINT@S`).
fn crash_point(point: &str, step: u64) {
    let Some(wanted) = std::env::var_os("WGTRAIN_TEST_CRASH_AT") else {
        return;
    };
    let wanted = wanted.to_string_lossy();
    let (at, at_step) = match wanted.split_once('@') {
        Some((p, s)) => (p, s.parse::<u64>().ok()),
        None => (wanted.as_ref(), None),
    };
    if at == point && at_step.is_none_or(|s| s == step) {
        std::process::abort();
    }
}

/// The step of a checkpoint folder name (`step-000000012` -> 12).
pub fn parse_step_dir(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

fn prune(root: &Path, newest: u64) -> Result<(), CheckpointError> {
    let mut steps: Vec<u64> = std::fs::read_dir(root)
        .map_err(io(root))?
        .flatten()
        .filter_map(|e| parse_step_dir(e.file_name().to_str()?))
        .filter(|&s| s <= newest)
        .collect();
    steps.sort_unstable();
    if steps.len() > KEEP {
        for s in &steps[..steps.len() - KEEP] {
            let _ = std::fs::remove_dir_all(root.join(step_dir_name(*s)));
        }
    }
    Ok(())
}

/// The checkpoint folder `path` names: a step folder (with manifest.json), or a root
/// whose `latest` names one. Without `latest` (a run killed between renaming its first
/// checkpoint in and writing `latest`), the newest whole step folder.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join("manifest.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("latest");
    let name = match std::fs::symlink_metadata(&latest) {
        Ok(_) => crate::files::read_text_bounded(&latest, LATEST_MAX).map_err(io(&latest))?,
        Err(e) => {
            let newest = std::fs::read_dir(path)
                .ok()
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| Some((parse_step_dir(e.file_name().to_str()?)?, e.path())))
                .filter(|(_, p)| p.join("manifest.json").is_file())
                .max_by_key(|(s, _)| *s);
            return newest.map(|(_, p)| p).ok_or_else(|| CheckpointError::Io {
                path: format!("{} (neither a checkpoint nor a folder with a 'latest' checkpoint)", path.display()),
                source: e,
            });
        }
    };
    // `latest` names a step folder of this folder, nothing else: no path, no other name.
    let name = name.trim();
    if parse_step_dir(name).is_none_or(|s| step_dir_name(s) != name) {
        return Err(CheckpointError::Corrupt {
            path: latest.display().to_string(),
            reason: format!(
                "names '{}', which is not a step folder of {} (step-NNNNNNNNN)",
                name.escape_debug(),
                path.display()
            ),
        });
    }
    let dir = path.join(name);
    if !dir.join("manifest.json").is_file() {
        // A save that crashed between moving the old folder aside and renaming the new
        // one in: the old folder is whole under its aside name.
        if let Some(aside) = aside_of(path, name) {
            return Ok(aside);
        }
        return Err(CheckpointError::Corrupt {
            path: latest.display().to_string(),
            reason: format!("names '{name}', which has no manifest"),
        });
    }
    Ok(dir)
}

/// A whole folder set aside for `step_dir` by an interrupted save, if any.
pub fn aside_of(root: &Path, step_dir: &str) -> Option<PathBuf> {
    let prefix = format!(".{step_dir}.old-");
    std::fs::read_dir(root)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)) && p.join("manifest.json").is_file())
}

/// The most bytes `latest` may hold (a step folder's name).
const LATEST_MAX: u64 = 64;
/// The most bytes a manifest may hold (a format tag, a step and a hash a file: three,
/// or one a rank past two for a save over MPI, up to `MAX_RANKS`).
const MANIFEST_MAX: u64 = 16 << 20;
/// The most bytes trainer.safetensors may hold (its metadata: the step, data position,
/// the scaler and the run's config).
const TRAINER_MAX: u64 = 16 << 20;

/// How large a checkpoint's files may be: what the model's parameters take in f32 (the
/// optimizer's state twice that), plus room for the safetensors header.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// Parameters of the model the checkpoint is loaded into.
    pub parameters: u64,
    /// Tensors of the model (each has a header entry).
    pub tensors: u64,
}

impl Expect {
    fn max_bytes(&self, name: &str) -> u64 {
        // A header entry is well under 1 KiB (name, dtype, shape, offsets).
        let header = (1 << 20) + 1024 * 3 * self.tensors;
        match name {
            "model.safetensors" => 4 * self.parameters + header,
            // The moments, and 8-bit state's absmax values (two per block of 256, a
            // block more per tensor at most).
            "optimizer.safetensors" => 8 * self.parameters + 8 * (self.parameters / 256 + self.tensors) + header,
            shard if parse_shard_file(shard).is_some() => 8 * self.parameters + 8 * (self.parameters / 256 + self.tensors) + header,
            _ => TRAINER_MAX,
        }
    }
}

/// The step a checkpoint folder's name gives: `step-N`, or an interrupted save's aside
/// `.step-N.old-PID`.
fn folder_step(dir: &Path) -> Option<u64> {
    let name = dir.file_name()?.to_str()?;
    match name.strip_prefix('.') {
        Some(rest) => parse_step_dir(rest.split_once(".old-")?.0),
        None => parse_step_dir(name),
    }
}

/// The manifest of the checkpoint folder `dir`, read within its bound, and its path.
fn read_manifest(dir: &Path) -> Result<(PathBuf, Manifest), CheckpointError> {
    let manifest_path = dir.join("manifest.json");
    let text = crate::files::read_bounded(&manifest_path, MANIFEST_MAX).map_err(io(&manifest_path))?;
    let manifest = serde_json::from_slice(&text).map_err(|e| CheckpointError::Corrupt {
        path: manifest_path.display().to_string(),
        reason: e.to_string(),
    })?;
    Ok((manifest_path, manifest))
}

/// The config the checkpoint at `path` (see [`resolve`]) was written with: its trainer
/// state read within its bound and checked against the manifest's hash (the whole
/// checkpoint is verified again when it is loaded).
pub fn saved_config(path: &Path) -> Result<String, CheckpointError> {
    let dir = resolve(path)?;
    let (_, manifest) = read_manifest(&dir)?;
    let trainer_path = dir.join("trainer.safetensors");
    let bytes = crate::files::read_bounded(&trainer_path, TRAINER_MAX).map_err(io(&trainer_path))?;
    let got = hex::encode(Sha256::digest(&bytes));
    if manifest.files.get("trainer.safetensors") != Some(&got) {
        return Err(CheckpointError::Corrupt {
            path: trainer_path.display().to_string(),
            reason: "its sha256 does not match the manifest's".into(),
        });
    }
    let (_, trainer) = from_safetensors(&bytes, &trainer_path)?;
    trainer.get("config").cloned().ok_or_else(|| CheckpointError::Mismatch {
        path: dir.display().to_string(),
        reason: "it holds no config (written by an older wgtrain): give the run's config file as well".into(),
    })
}

/// Reads and verifies the checkpoint at `path` (see [`resolve`]) for a model of the
/// size `expect` gives: every file a regular file within its bound, every hash the
/// manifest's, and the step the same in the manifest, the trainer state and the
/// folder's name.
pub fn load(path: &Path, expect: Expect) -> Result<(u64, CheckpointData), CheckpointError> {
    let dir = resolve(path)?;
    let (manifest_path, manifest) = read_manifest(&dir)?;
    if manifest.format != FORMAT {
        return Err(CheckpointError::Corrupt {
            path: manifest_path.display().to_string(),
            reason: format!("format '{}', expected '{FORMAT}'", manifest.format),
        });
    }
    // The optimizer's state: one file, or one shard a rank (saved over MPI), every rank
    // of the run's present; the manifest may name nothing else.
    let mut names = vec!["model.safetensors".to_string(), "trainer.safetensors".to_string()];
    let shards: Vec<(usize, usize)> = manifest.files.keys().filter_map(|k| parse_shard_file(k)).collect();
    let whole = manifest.files.contains_key("optimizer.safetensors");
    let complete = shards.iter().enumerate().all(|(i, &(r, n))| r == i && n == shards.len());
    let unknown = manifest
        .files
        .keys()
        .find(|k| !names.contains(k) && k.as_str() != "optimizer.safetensors" && parse_shard_file(k).is_none());
    if let Some(k) = unknown {
        return Err(CheckpointError::Corrupt {
            path: manifest_path.display().to_string(),
            reason: format!("it lists '{k}', which is no file of a checkpoint"),
        });
    }
    if whole == !shards.is_empty() || !complete {
        return Err(CheckpointError::Corrupt {
            path: manifest_path.display().to_string(),
            reason: "it lists neither optimizer.safetensors nor one optimizer shard for every rank".into(),
        });
    }
    names.extend(manifest.files.keys().filter(|k| k.starts_with("optimizer")).cloned());
    let mut read = BTreeMap::new();
    for name in names.iter().map(String::as_str) {
        let path = dir.join(name);
        let bytes = crate::files::read_bounded(&path, expect.max_bytes(name)).map_err(io(&path))?;
        let want = manifest.files.get(name).ok_or_else(|| CheckpointError::Corrupt {
            path: manifest_path.display().to_string(),
            reason: format!("no hash for {name}"),
        })?;
        let got = hex::encode(Sha256::digest(&bytes));
        if &got != want {
            return Err(CheckpointError::Corrupt {
                path: path.display().to_string(),
                reason: format!("sha256 {got} does not match the manifest's {want}"),
            });
        }
        read.insert(name, (path, bytes));
    }
    let (model, _) = from_safetensors(&read["model.safetensors"].1, &read["model.safetensors"].0)?;
    let optimizer = if whole {
        from_safetensors(&read["optimizer.safetensors"].1, &read["optimizer.safetensors"].0)?.0
    } else {
        // In rank order: the manifest's names sort by rank.
        let parts = read
            .iter()
            .filter(|(k, _)| parse_shard_file(k).is_some())
            .map(|(_, (path, bytes))| from_safetensors(bytes, path).map(|(t, _)| t))
            .collect::<Result<Vec<_>, _>>()?;
        join_shards(parts)
    };
    let (_, trainer) = from_safetensors(&read["trainer.safetensors"].1, &read["trainer.safetensors"].0)?;
    // The manifest is not hashed itself: its step must agree with the hashed trainer
    // state and with the folder's name, or an edited manifest would steer the resume.
    let stored = trainer.get("step").and_then(|s| s.parse::<u64>().ok());
    let named = folder_step(&dir);
    if stored != Some(manifest.step) || named.is_some_and(|n| n != manifest.step) {
        return Err(CheckpointError::Corrupt {
            path: manifest_path.display().to_string(),
            reason: format!(
                "its step {} disagrees with the trainer state's ({}) or the folder's name ({})",
                manifest.step,
                stored.map_or("none".into(), |s| s.to_string()),
                named.map_or("none".into(), |s| s.to_string())
            ),
        });
    }
    Ok((manifest.step, CheckpointData { model, optimizer, trainer }))
}
