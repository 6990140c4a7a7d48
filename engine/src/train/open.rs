//! Making a trainer from a config: data first (a missing dataset should not wait for
//! the GPU), then the device (opened here, or a runtime handed in from outside), the
//! precision rule, the plan (`memory.fit`, `memory.checkpoint = "auto"`), the runtime
//! with the plan's cap, and the model.
//!
//! May call: `data`, `device`, `error`, `memory`, `nn`, `runtime`, `train::{build,
//! config, error, model, plan, trainer}`, `wgtrain_record`. Called by: the CLI, tests.

use std::path::Path;
use std::sync::Arc;

use crate::data::Dataset;
use crate::device::Gpu;
use crate::error::Error;
use crate::memory::{AllocatorOptions, MemoryCap, format_bytes};
use crate::runtime::Runtime;
use crate::train::build::{Loaded, load_data, resolve_precision};
use crate::train::config::Config;
use crate::train::error::TrainError;
use crate::train::model::BuildModel;
use crate::train::plan::{dry_runtime, estimate_on, plan};
use crate::train::trainer::Trainer;

impl Trainer {
    /// Loads the data, opens the adapter `adapter` names, and builds the run (after
    /// `memory.fit` or `memory.checkpoint = "auto"` chose the micro-batch and
    /// checkpointing); the runtime's cap is `memory.cap`, else `memory.budget`.
    /// A multi-device run (`parallel.devices`) opens each device it lists instead, with
    /// the same cap on each.
    pub fn new(config: Config, adapter: Option<&str>) -> Result<Trainer, TrainError> {
        let data = load_data(&config)?;
        Trainer::open(config, data, adapter)
    }

    /// A run of a model of the caller's on data of the caller's: `build` makes the model
    /// (the trainer calls it on each device, and for the estimate's dry runs), `train`
    /// and `eval` are the splits. `[model]` and `[data]` of `config` are not used;
    /// everything else is, as for [`Trainer::new`]: the schedule, precision, memory
    /// policy and fit, checkpoints, several devices, the log and the dashboard.
    pub fn custom(
        config: Config,
        build: Arc<BuildModel>,
        (train, eval): (Arc<dyn Dataset>, Arc<dyn Dataset>),
        adapter: Option<&str>,
    ) -> Result<Trainer, TrainError> {
        for (split, set) in [("training", &train), ("evaluation", &eval)] {
            if set.is_empty() {
                return Err(Error::invalid("custom data", format!("the {split} split has no example")).into());
            }
        }
        let data = Loaded {
            model: build,
            from_config: false,
            train,
            eval,
            outputs: 0,
            unigram_entropy: None,
            image: None,
        };
        Trainer::open(config, data, adapter)
    }

    /// This process's rank of a run over MPI (`parallel.backend = "mpi"`, under mpirun
    /// or srun): loads the data, opens the device its local rank picks from
    /// `parallel.devices` (cycling; `adapter` when none is listed) and builds the run
    /// as one device of `mpi.size`, every rank from the same seed.
    #[cfg(feature = "mpi")]
    pub fn over_mpi(mut config: Config, adapter: Option<&str>, mpi: &crate::parallel::mpi::MpiWorld) -> Result<Trainer, TrainError> {
        config.parallel.ranks = Some(mpi.size);
        config.validate()?;
        let data = load_data(&config)?;
        let selector = config.parallel.rank_device(mpi.local_rank, adapter);
        let mut trainer = Trainer::on_one_device(config, data, selector.as_deref())?;
        trainer.join_mpi(mpi)?;
        Ok(trainer)
    }

    /// The run of `config` for generating from its checkpoint: as [`Trainer::new`], but a
    /// token model's files need not be at hand (windows of token 0 stand in; the note
    /// says so). The caller restores the checkpoint.
    pub fn for_generation(config: Config, adapter: Option<&str>) -> Result<(Trainer, Option<String>), TrainError> {
        let (data, note) = crate::train::build::load_data_for_estimate(&config)?;
        Ok((Trainer::open(config, data, adapter)?, note))
    }

    /// The run for generating from a transformers folder (`wgtrain generate --hf-dir`):
    /// GPT2LMHeadModel or LlamaForCausalLM as config.json's `model_type` says, built from
    /// that config (every field the model reads: epsilons, rotary base, heads), on one
    /// device in f32, its weights read from model.safetensors (F32, F16 or BF16) into the
    /// model's own blocks.
    pub fn for_hf_generation(dir: &Path, adapter: Option<&str>) -> Result<Trainer, TrainError> {
        use crate::nn::{Gpt, GptConfig, Llama, LlamaConfig};
        use crate::train::model::Trainable;
        #[derive(serde::Deserialize)]
        struct Kind {
            model_type: Option<String>,
        }
        let bad = |e: String| Error::format(&dir.join("config.json"), e);
        let kind: Kind = crate::nn::hf::read_config(dir)?;
        let (build, vocab, window): (Arc<BuildModel>, usize, usize) = match kind.model_type.as_deref() {
            Some("gpt2") => {
                let c: GptConfig = crate::nn::hf::read_config(dir)?;
                c.validate().map_err(|e| bad(e.to_string()))?;
                let (v, w) = (c.vocab_size, c.n_positions);
                (
                    Arc::new(move |vb| Ok(Box::new(Gpt::build(vb, c.clone())?) as Box<dyn Trainable>)),
                    v,
                    w,
                )
            }
            Some("llama") => {
                let c: LlamaConfig = crate::nn::hf::read_config(dir)?;
                c.validate().map_err(|e| bad(e.to_string()))?;
                let (v, w) = (c.vocab_size, c.max_position_embeddings);
                (
                    Arc::new(move |vb| Ok(Box::new(Llama::build(vb, c.clone())?) as Box<dyn Trainable>)),
                    v,
                    w,
                )
            }
            other => {
                return Err(bad(format!(
                    "model_type {other:?}: GPT-2 (\"gpt2\") and Llama (\"llama\") folders generate"
                ))
                .into());
            }
        };
        // Windows of token 0 stand in for data: generation reads none.
        let stand_in: Arc<dyn Dataset> = Arc::new(crate::data::tokens::ZeroTokens { windows: 1, block: window });
        let data = Loaded {
            model: build,
            from_config: false,
            train: stand_in.clone(),
            eval: stand_in,
            outputs: vocab,
            unigram_entropy: None,
            image: None,
        };
        let mut config = Config::default();
        config.train.batch_size = 1;
        let trainer = Trainer::open(config, data, adapter)?;
        // Every parameter from the file (older GPT-2 files prefix nothing and carry the
        // tied head and attention-mask buffers: skipped), bounded by twice the model in
        // f32 (the masks) and a header.
        let numel: u64 = trainer.params.list.iter().map(|p| p.value.numel() as u64).sum();
        let names: std::collections::BTreeSet<&str> = trainer.params.list.iter().map(|p| p.name.as_str()).collect();
        let values = crate::nn::hf::read_weights_host(dir, 8 * numel + (64 << 20), &|name| {
            [name.to_string(), format!("transformer.{name}")]
                .into_iter()
                .find(|k| names.contains(k.as_str()))
        })?;
        for p in &trainer.params.list {
            let path = dir.join("model.safetensors");
            let (shape, data) = values
                .get(&p.name)
                .ok_or_else(|| Error::format(&path, format!("it lacks {}", p.name)))?;
            if shape.as_slice() != p.value.shape() {
                return Err(Error::format(
                    &path,
                    format!("{} is {shape:?}, the config's model has {:?}", p.name, p.value.shape()),
                )
                .into());
            }
            p.value.write_f32(&trainer.rt, data)?;
        }
        Ok(trainer)
    }

    fn open(config: Config, data: Loaded, adapter: Option<&str>) -> Result<Trainer, TrainError> {
        if config.parallel.backend == crate::train::config::Backend::Mpi {
            return Err(Error::invalid(
                "parallel.backend",
                "\"mpi\" runs one rank per process: start it under mpirun or srun (`mpirun -n 2 wgtrain train CONFIG`), with a wgtrain built with the `mpi` feature",
            )
            .into());
        }
        if config.parallel.enabled() {
            let mut rts = Vec::new();
            let cap = cap_of(&config)?;
            for selector in &config.parallel.devices {
                let gpu = Arc::new(Gpu::open(Some(selector)).map_err(Error::from)?);
                rts.push(Arc::new(Runtime::new(
                    gpu,
                    AllocatorOptions {
                        debug: Some(config.memory.debug),
                        cap,
                        dry: false,
                    },
                )?));
            }
            let mut trainer = Trainer::on_runtimes(config, rts, data)?;
            if adapter.is_some() {
                trainer
                    .notes
                    .push("--adapter is not used: parallel.devices names the devices".into());
            }
            return Ok(trainer);
        }
        Trainer::on_one_device(config, data, adapter)
    }

    /// The run on the one device `selector` names: the precision rule, the plan, then
    /// the runtime with the plan's cap.
    fn on_one_device(config: Config, data: Loaded, selector: Option<&str>) -> Result<Trainer, TrainError> {
        let gpu = Arc::new(Gpu::open(selector).map_err(Error::from)?);
        let (config, mut notes) = resolve_precision(config, &gpu)?;
        let (config, fit_notes) = plan(config, &gpu, &data)?;
        notes.extend(fit_notes);
        let cap = cap_of(&config)?;
        let rt = Arc::new(Runtime::new(
            gpu,
            AllocatorOptions {
                debug: Some(config.memory.debug),
                cap,
                dry: false,
            },
        )?);
        let mut trainer = Trainer::assemble(config, rt, data)?;
        trainer.notes = notes;
        Ok(trainer)
    }

    /// Builds the run on a runtime made by the caller (its allocator, cap and device are
    /// the caller's): loads the data, applies the precision rule and the plan.
    pub fn with_runtime(config: Config, rt: Arc<Runtime>) -> Result<Trainer, TrainError> {
        let data = load_data(&config)?;
        if config.parallel.enabled() {
            return Trainer::on_runtimes(config, vec![rt], data);
        }
        let (config, mut notes) = resolve_precision(config, &rt.gpu)?;
        let (config, fit_notes) = plan(config, &rt.gpu, &data)?;
        notes.extend(fit_notes);
        let mut trainer = Trainer::assemble(config, rt, data)?;
        trainer.notes = notes;
        Ok(trainer)
    }

    /// Builds a multi-device run on runtimes made by the caller, one per entry of
    /// `parallel.devices`, in rank order. Every device must be able to run the
    /// precision the first one runs.
    pub fn with_runtimes(config: Config, rts: Vec<Arc<Runtime>>) -> Result<Trainer, TrainError> {
        let data = load_data(&config)?;
        Trainer::on_runtimes(config, rts, data)
    }

    fn on_runtimes(config: Config, rts: Vec<Arc<Runtime>>, data: Loaded) -> Result<Trainer, TrainError> {
        if rts.len() != config.parallel.world() {
            return Err(Error::invalid(
                "parallel.devices",
                format!("{} devices listed but {} runtimes given", config.parallel.world(), rts.len()),
            )
            .into());
        }
        let (config, mut notes) = resolve_precision(config, &rts[0].gpu)?;
        // `memory.fit` chooses the stage and offload too; every device gets the same cap.
        let (config, fit_notes) = plan(config, &rts[0].gpu, &data)?;
        notes.extend(fit_notes);
        for rt in &rts[1..] {
            // A device that cannot run what the first runs cannot join.
            let (theirs, _) = resolve_precision(config.clone(), &rt.gpu)?;
            if theirs.memory.precision != config.memory.precision {
                return Err(TrainError::NoF16(rt.gpu.report.name.clone()));
            }
        }
        // Nor can one too small for its share: when the devices differ in size, each
        // one's estimated peak is checked against it before anything is built.
        let sizes: Vec<(String, Option<u64>)> = rts.iter().map(|r| (r.gpu.report.name.clone(), r.gpu.caps.memory_bytes)).collect();
        if sizes.iter().any(|s| s.1 != sizes[0].1) {
            let e = estimate_on(&dry_runtime(rts[0].gpu.clone())?, &config, &data)?;
            if let Some(why) = too_small(&e.device_peaks, &sizes) {
                return Err(Error::invalid("parallel.devices", why).into());
            }
        }
        let mut rts = rts.into_iter();
        let first = rts.next().expect("at least one device");
        let mut trainer = Trainer::assemble(config, first, data)?;
        trainer.join(rts.collect())?;
        trainer.notes = notes;
        Ok(trainer)
    }

    /// The estimated peak of this run's config and of each single change of its memory
    /// settings (`plan::what_if`), against the cap, else the device's memory. Advisory:
    /// a failure is logged and gives none.
    pub fn what_if(&self) -> Vec<wgtrain_record::WhatIf> {
        let data = Loaded {
            model: self.build.clone(),
            from_config: self.model_from_config,
            train: self.train.clone(),
            eval: self.eval.clone(),
            outputs: self.outputs,
            unigram_entropy: self.unigram_entropy,
            image: None,
        };
        let limit = self.rt.alloc.stats().cap.or(self.rt.gpu.caps.memory_bytes);
        crate::train::plan::what_if(&self.config, &self.rt, &data, limit).unwrap_or_else(|e| {
            tracing::warn!("the what-if estimates failed: {e}");
            Vec::new()
        })
    }
}

/// Why a device cannot take its share, if one cannot: the first whose known memory is
/// below its estimated peak (`peaks` and `sizes` in rank order: name, memory).
fn too_small(peaks: &[u64], sizes: &[(String, Option<u64>)]) -> Option<String> {
    peaks.iter().zip(sizes).enumerate().find_map(|(rank, (&peak, (name, size)))| {
        size.filter(|&s| s < peak).map(|s| {
            format!(
                "device {rank} ({name}) has {} of memory but its share of this run needs {} (the estimate of its peak); \
                 raise parallel.zero, offload, checkpoint, or leave it out",
                format_bytes(s),
                format_bytes(peak)
            )
        })
    })
}

/// The allocator cap a config asks for: `memory.cap`, else `memory.budget`.
fn cap_of(config: &Config) -> Result<Option<MemoryCap>, TrainError> {
    let limit = config.memory.cap.as_ref().or(config.memory.budget.as_ref());
    Ok(match limit {
        Some(text) => Some(MemoryCap::parse(text).map_err(Error::from)?),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::too_small;

    #[test]
    fn a_device_smaller_than_its_share_is_named() {
        let sizes = |a: Option<u64>, b: Option<u64>| vec![("big".to_string(), a), ("small".to_string(), b)];
        assert_eq!(too_small(&[100, 90], &sizes(Some(200), Some(100))), None);
        let why = too_small(&[100, 90], &sizes(Some(200), Some(80))).expect("the second is too small");
        assert!(why.starts_with("device 1 (small)"), "{why}");
        // A device that does not say its size is not refused.
        assert_eq!(too_small(&[100, 90], &sizes(Some(200), None)), None);
    }
}
