//! What a checkpoint holds (parameters, optimizer state, the data position, the
//! scaler) and the trainer's save and restore of it; the files themselves are
//! `train::checkpoint`'s.
//!
//! May call: `kernels`, `memory`, `optim`, `tensor`, `train::{checkpoint, error,
//! trainer}`. Called by: `train::run`, the CLI, tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::tensor::Tensor;
use crate::train::checkpoint::{self, CheckpointData, CheckpointError, HostTensor};
use crate::train::config::{Config, ConfigError};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;

impl Trainer {
    /// Everything a checkpoint holds, on the host.
    pub(in crate::train) fn checkpoint_data(&self) -> Result<CheckpointData, TrainError> {
        self.checkpoint_data_with(true)
    }

    /// [`Trainer::checkpoint_data`], with the optimizer's state gathered whole or not
    /// at all (`whole_optimizer`: each MPI rank then writes its own shard).
    fn checkpoint_data_with(&self, whole_optimizer: bool) -> Result<CheckpointData, TrainError> {
        let mut model = Vec::new();
        let mut optimizer = Vec::new();
        for (i, p) in self.params.list.iter().enumerate() {
            // Whole, as one device's: gathered from the shards at ZeRO stage 3.
            model.push(HostTensor {
                name: p.name.clone(),
                shape: self.param_shape(i),
                data: self.param_host(i)?,
            });
            if !whole_optimizer {
                continue;
            }
            // Whole, as one device's: gathered from the shards of a ZeRO run.
            // 8-bit state as the values its codes stand for, and each block's absmax
            // (`NAME.absmax`): the codes come back exactly from both.
            if let Some(s) = self.optimizer_state_host(i)? {
                let names = self.opt.state_names(&p.name);
                let shape = self.param_shape(i);
                optimizer.push(HostTensor {
                    name: names[0].clone(),
                    shape: shape.clone(),
                    data: s.m,
                });
                if let Some(v) = s.v {
                    optimizer.push(HostTensor {
                        name: names[1].clone(),
                        shape,
                        data: v,
                    });
                }
                for (name, absmax) in names.iter().zip(s.absmax.into_iter().flat_map(|(m, v)| [m, v])) {
                    optimizer.push(HostTensor {
                        name: format!("{name}.absmax"),
                        shape: vec![absmax.len()],
                        data: absmax,
                    });
                }
            }
        }
        // Buffers (running statistics): device 0's, as DDP keeps rank 0's.
        for b in &self.params.buffers {
            model.push(HostTensor {
                name: b.name.clone(),
                shape: b.value.shape().to_vec(),
                data: b.value.to_f32_vec(&self.rt)?,
            });
        }
        let trainer = BTreeMap::from([
            ("epoch".to_string(), self.epoch.to_string()),
            ("batch_index".to_string(), self.index.to_string()),
            ("optimizer_step".to_string(), self.opt.step.to_string()),
            ("seed".to_string(), self.config.train.seed.to_string()),
            ("config".to_string(), toml::to_string(&self.config).unwrap_or_default()),
            ("model_signature".to_string(), self.model.signature()),
        ]);
        let mut trainer = trainer;
        if let Some(first) = self.log_first {
            // Exactly: `{:?}` of an f64 parses back to the same bits.
            let text = first.map_or_else(|| "none".to_string(), |(s, t, l)| format!("{s} {t:?} {l:?}"));
            trainer.insert("log_first".into(), text);
        }
        if let Some(sc) = &self.scaler {
            trainer.insert("loss_scale".into(), sc.scale.to_string());
            trainer.insert("scaler_growth_tracker".into(), sc.growth_tracker.to_string());
        }
        Ok(CheckpointData { model, optimizer, trainer })
    }

    /// Saves a checkpoint of the current state into `dir`.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, TrainError> {
        if let Some(ranks) = self.save_ranks() {
            // Over MPI with the optimizer's state sharded: each rank writes its own.
            let data = self.checkpoint_data_with(false)?;
            let shard = self.optimizer_shard()?;
            return Ok(checkpoint::ranks::save_ranks(dir, self.step, &data, &shard, &ranks)?);
        }
        let data = self.checkpoint_data()?;
        if !self.writes() {
            // Over MPI the other ranks gathered their shards into rank 0's data; it writes.
            return Ok(dir.join(checkpoint::step_dir_name(self.step)));
        }
        Ok(checkpoint::save(dir, self.step, &data)?)
    }

    /// Restores parameters, optimizer state and data position from a checkpoint.
    pub fn restore(&mut self, path: &Path) -> Result<u64, TrainError> {
        self.restore_parts(path, true)
    }

    /// Restores the parameters (and the step) alone, for evaluation or generation: the
    /// optimizer's state is not loaded onto the device.
    pub fn restore_weights(&mut self, path: &Path) -> Result<u64, TrainError> {
        self.restore_parts(path, false)
    }

    fn restore_parts(&mut self, path: &Path, optimizer: bool) -> Result<u64, TrainError> {
        let buffers = &self.params.buffers;
        let expect = checkpoint::Expect {
            parameters: (0..self.params.list.len())
                .map(|i| self.param_shape(i).iter().product::<usize>() as u64)
                .sum::<u64>()
                + buffers.iter().map(|b| b.value.numel() as u64).sum::<u64>(),
            tensors: (self.params.list.len() + buffers.len()) as u64,
        };
        let (step, data) = checkpoint::load(path, expect)?;
        // The weights are replaced: their kept f16 copies are made again from them.
        if let Some(h) = &self.halves {
            h.clear();
        }
        let mismatch = |reason: String| CheckpointError::Mismatch {
            path: path.display().to_string(),
            reason,
        };
        // The run's shape and optimizer must be the checkpoint's: n_head changes no
        // tensor's shape but the model, and an optimizer's state means nothing to another.
        // Compared as the configs' text: every key of this run's [model] (a model built
        // from the config), then what decides the batches.
        if let Some(saved) = data.trainer.get("config").and_then(|t| toml::from_str::<toml::Table>(t).ok()) {
            let now = toml::Table::try_from(&self.config).map_err(|e| mismatch(e.to_string()))?;
            let at = |t: &toml::Table, section: &str, key: &str| {
                t.get(section)
                    .and_then(|s| s.get(key))
                    .map_or_else(|| "unset".to_string(), |v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            };
            let mut keys: Vec<(&str, String)> = Vec::new();
            if self.model_from_config {
                if let Some(model) = now.get("model").and_then(toml::Value::as_table) {
                    keys.extend(model.keys().map(|k| ("model", k.clone())));
                }
            }
            keys.extend(
                [
                    ("train", "optimizer"),
                    ("train", "batch_size"),
                    ("train", "seed"),
                    ("data", "train_limit"),
                ]
                .map(|(s, k)| (s, k.to_string())),
            );
            if self.model_from_config {
                keys.push(("data", "kind".into()));
            }
            let mut differ = Vec::new();
            for (section, key) in keys {
                let (was, is) = (at(&saved, section, &key), at(&now, section, &key));
                if was != is {
                    differ.push(format!("{section}.{key} was {was}, is {is}"));
                }
            }
            if let Some(was) = data.trainer.get("model_signature") {
                let is = self.model.signature();
                if *was != is {
                    differ.push(format!("the model was \"{was}\", is \"{is}\""));
                }
            }
            if !differ.is_empty() {
                return Err(mismatch(differ.join("; ")).into());
            }
        }
        let tensors = self.params.list.len() + self.params.buffers.len();
        if data.model.len() != tensors {
            return Err(mismatch(format!("{} tensors, the model has {tensors}", data.model.len())).into());
        }
        for t in &data.model {
            if let Some(i) = self.params.find_buffer(&t.name) {
                let b = &mut self.params.buffers[i];
                if b.value.shape() != t.shape {
                    return Err(mismatch(format!("{} is {:?}, the model has {:?}", t.name, t.shape, b.value.shape())).into());
                }
                b.value.write_f32(&self.rt, &t.data)?;
                continue;
            }
            let i = self
                .params
                .find(&t.name)
                .ok_or_else(|| mismatch(format!("unknown parameter {}", t.name)))?;
            if self.param_shape(i) != t.shape {
                return Err(mismatch(format!("{} is {:?}, the model has {:?}", t.name, t.shape, self.param_shape(i))).into());
            }
            // In place where the weight is whole (nothing allocated again: the memory is
            // the estimate's); a ZeRO-3 shard is replaced by the whole and sharded again.
            let value = &mut self.params.list[i].value;
            if value.shape() == t.shape && value.is_contiguous() && value.offset() == 0 && value.dtype() == crate::tensor::DType::F32 {
                value.write_f32(&self.rt, &t.data)?;
            } else {
                *value = Tensor::from_f32(&self.rt, &t.data, &t.shape, Category::Parameter, &t.name)?;
            }
        }
        let get = |k: &str| -> Result<u64, CheckpointError> {
            data.trainer
                .get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| CheckpointError::Corrupt {
                    path: path.display().to_string(),
                    reason: format!("trainer state lacks {k}"),
                })
        };
        self.epoch = get("epoch")?;
        self.index = get("batch_index")?;
        self.opt.step = get("optimizer_step")? as u32;
        if let Some(sc) = &mut self.scaler {
            // A checkpoint from an fp32 run starts the scaler fresh.
            if let (Some(scale), Some(tracker)) = (data.trainer.get("loss_scale"), data.trainer.get("scaler_growth_tracker")) {
                sc.scale = scale
                    .parse()
                    .map_err(|_| mismatch(format!("loss_scale '{scale}' is not a number")))?;
                sc.growth_tracker = tracker
                    .parse()
                    .map_err(|_| mismatch(format!("scaler_growth_tracker '{tracker}' is not a number")))?;
            }
        }
        // Every device gets the weights; each its part of the optimizer state (any
        // number of devices resumes any checkpoint: the files hold the whole state).
        self.share_weights()?;
        self.opt.state = (0..self.params.list.len()).map(|_| None).collect();
        let by_name: BTreeMap<&str, &HostTensor> = data.optimizer.iter().map(|t| (t.name.as_str(), t)).collect();
        for i in (0..self.params.list.len()).filter(|_| optimizer) {
            let p = &self.params.list[i];
            let names = self.opt.state_names(&p.name);
            let numel = self.param_shape(i).iter().product::<usize>();
            if let Some(m) = by_name.get(names[0].as_str()) {
                let v = by_name.get(names[1].as_str());
                for t in std::iter::once(m).chain(v) {
                    if t.data.len() != numel {
                        return Err(mismatch(format!("{} holds {} values, the parameter {numel}", t.name, t.data.len())).into());
                    }
                }
                let absmax = |k: usize| by_name.get(format!("{}.absmax", names[k]).as_str()).map(|t| t.data.clone());
                let state = crate::optim::StateHost {
                    m: m.data.clone(),
                    v: v.map(|v| v.data.clone()),
                    absmax: absmax(0).zip(absmax(1)),
                };
                self.place_optimizer_state(i, &state)?;
            }
        }
        self.log_first = data.trainer.get("log_first").map(|text| {
            let mut parts = text.split(' ');
            let (s, t, l) = (parts.next(), parts.next(), parts.next());
            s.and_then(|s| s.parse().ok())
                .zip(t.and_then(|t| t.parse().ok()))
                .zip(l.and_then(|l| l.parse().ok()))
                .map(|((s, t), l)| (s, t, l))
        });
        self.step = step;
        Ok(step)
    }
}

/// The config to resume the checkpoint at `path` with, from the checkpoint alone: the
/// config it was written with, and `overrides` on top. An override of what makes the
/// model or the batches (`[model]`, `data.kind`, `data.token_dtype`, `data.train_limit`,
/// the batch size or the seed) is refused; one of the run's length is said in the notes.
pub fn resume_config(path: &Path, overrides: &[String]) -> Result<(Config, Vec<String>), TrainError> {
    let text = checkpoint::saved_config(path)?;
    let saved = Config::parse(&text, &[])?;
    // A run's length is its steps, else its epochs: `--set train.epochs` alone asks for a
    // length in epochs, so the saved step count gives way to it.
    let sets = |key: &str| overrides.iter().any(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == key));
    let text = if sets("train.epochs") && !sets("train.steps") {
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if let Some(train) = table.get_mut("train").and_then(toml::Value::as_table_mut) {
            train.remove("steps");
        }
        toml::to_string(&table).map_err(|e| ConfigError::Invalid(e.to_string()))?
    } else {
        text
    };
    let config = Config::parse(&text, overrides)?;
    // What makes the model or the batches must stay the checkpoint's.
    let table = |c: &Config| toml::Table::try_from(c).unwrap_or_default();
    let (was, now) = (table(&saved), table(&config));
    let at = |t: &toml::Table, s: &str, k: &str| t.get(s).and_then(|v| v.get(k)).cloned();
    let mut fixed: Vec<(String, String)> = Vec::new();
    for key in was.get("model").and_then(|m| m.as_table()).into_iter().flat_map(|m| m.keys()) {
        fixed.push(("model".into(), key.clone()));
    }
    for (s, k) in [
        ("data", "kind"),
        ("data", "token_dtype"),
        ("data", "train_limit"),
        ("train", "batch_size"),
        ("train", "seed"),
    ] {
        fixed.push((s.into(), k.into()));
    }
    if let Some((s, k)) = fixed.iter().find(|(s, k)| at(&was, s, k) != at(&now, s, k)) {
        let show = |v: Option<toml::Value>| match v {
            Some(toml::Value::String(text)) => text,
            Some(other) => other.to_string(),
            None => "unset".into(),
        };
        return Err(ConfigError::Invalid(format!(
            "--set {s}.{k}: the checkpoint's model and batches are fixed by its run ({s}.{k} was {}, is {}); resume without it, or start a new run",
            show(at(&was, s, k)),
            show(at(&now, s, k))
        ))
        .into());
    }
    let mut notes = vec![format!("resuming with the config saved in {}", path.display())];
    if (config.train.steps, config.train.epochs) != (saved.train.steps, saved.train.epochs) {
        let length = |c: &Config| match c.train.steps {
            Some(s) => format!("{s} steps"),
            None => format!("{} epochs", c.train.epochs),
        };
        notes.push(format!("the run's length changes from {} to {}", length(&saved), length(&config)));
    }
    Ok((config, notes))
}
