//! Making a trainer from a config: data first (a missing dataset should not wait for
//! the GPU), then the device (opened here, or a runtime handed in from outside), the
//! precision rule, the plan (`memory.fit`, `memory.checkpoint = "auto"`), the runtime
//! with the plan's cap, and the model.
//!
//! May call: `device`, `error`, `memory`, `runtime`, `train::{build, config, error,
//! plan, trainer}`, `wgtrain_protocol`. Called by: the CLI, tests.

use std::sync::Arc;

use super::build::{Loaded, load_data, resolve_precision};
use super::config::Config;
use super::error::TrainError;
use super::plan::plan;
use super::trainer::Trainer;
use crate::device::Gpu;
use crate::error::Error;
use crate::memory::{AllocatorOptions, MemoryCap};
use crate::runtime::Runtime;

impl Trainer {
    /// Loads the data, opens the adapter `adapter` names, and builds the run (after
    /// `memory.fit` or `memory.checkpoint = "auto"` chose the micro-batch and
    /// checkpointing); the runtime's cap is `memory.cap`, else `memory.budget`.
    pub fn new(config: Config, adapter: Option<&str>) -> Result<Trainer, TrainError> {
        let data = load_data(&config)?;
        let gpu = Arc::new(Gpu::open(adapter).map_err(Error::from)?);
        let (config, mut notes) = resolve_precision(config, &gpu)?;
        let (config, fit_notes) = plan(config, &gpu, &data)?;
        notes.extend(fit_notes);
        let limit = config.memory.cap.as_ref().or(config.memory.budget.as_ref());
        let cap = match limit {
            Some(text) => Some(MemoryCap::parse(text).map_err(Error::from)?),
            None => None,
        };
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
        let (config, mut notes) = resolve_precision(config, &rt.gpu)?;
        let (config, fit_notes) = plan(config, &rt.gpu, &data)?;
        notes.extend(fit_notes);
        let mut trainer = Trainer::assemble(config, rt, data)?;
        trainer.notes = notes;
        Ok(trainer)
    }

    /// The estimated peak of this run's config and of each single change of its memory
    /// settings (`plan::what_if`), against the cap, else the device's memory. Advisory:
    /// a failure is logged and gives none.
    pub fn what_if(&self) -> Vec<wgtrain_protocol::WhatIf> {
        let data = Loaded {
            train: self.train.clone(),
            eval: self.eval.clone(),
            outputs: self.outputs,
            unigram_entropy: self.unigram_entropy,
        };
        let limit = self.rt.alloc.stats().cap.or(self.rt.gpu.caps.memory_bytes);
        super::plan::what_if(&self.config, &self.rt, &data, limit).unwrap_or_else(|e| {
            tracing::warn!("the what-if estimates failed: {e}");
            Vec::new()
        })
    }
}
