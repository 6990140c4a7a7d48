//! How a trainer becomes a rank of a multi-device run: the other devices of this
//! process joined as peers (one group in host memory), or this process's rank of a run
//! over MPI; and what the run's ranks are asked as a whole (size, memory, who writes,
//! whether to stop).
//!
//! May call: `autograd`, `error`, `memory`, `optim`, `parallel`, `runtime`,
//! `train::{build, error, observe, trainer, world}`, `wgtrain_record`. Called by:
//! `train::{open, parallel, run}`.

use std::sync::Arc;

use crate::autograd::Params;
use crate::error::Error;
use crate::memory::{Category, MemoryStats};
use crate::optim::{HostOptimizer, Optimizer};
use crate::parallel::{Collective, Comm, HostGroup, Shards};
use crate::runtime::Runtime;
use crate::train::build::{build_model, optimizer_rule};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;
use crate::train::world::{Peer, World};

impl Trainer {
    /// Joins the devices `rts` (ranks 1..) to this run: each gets the model built from
    /// the same seed (the same initial weights) and an optimizer of the same rule.
    pub fn join(&mut self, rts: Vec<Arc<Runtime>>) -> Result<(), TrainError> {
        let mut peers = Vec::new();
        for rt in rts {
            let mut params = Params::default();
            let model = build_model(&self.config, &rt, self.build.as_ref(), &mut params)?;
            peers.push(Peer {
                rt,
                params,
                model,
                opt: Optimizer::new(optimizer_rule(&self.config)),
            });
        }
        let (group, comms) = HostGroup::new(peers.len() + 1);
        let comms = comms.into_iter().map(Comm::Host).collect();
        let bn = self.config.parallel.sync_batch_norm.then(|| {
            let (g, c) = HostGroup::new(peers.len() + 1);
            (Some(g), c.into_iter().map(Comm::Host).collect())
        });
        self.join_world(Some(group), comms, bn, peers, 0)
    }

    /// Makes this trainer this process's rank of a run over MPI: no peers in this
    /// process, a communicator of its own for the gradients and one for SyncBatchNorm.
    #[cfg(feature = "mpi")]
    pub fn join_mpi(&mut self, mpi: &crate::parallel::mpi::MpiWorld) -> Result<(), TrainError> {
        let comm = |_| Comm::Mpi(Arc::new(mpi.comm()));
        let bn = self.config.parallel.sync_batch_norm.then(|| (None, vec![comm(())]));
        let main = comm(());
        self.check_same_run(&main)?;
        self.join_world(None, vec![main], bn, Vec::new(), mpi.rank)?;
        if let Some(w) = &mut self.world {
            w.node = Some(mpi.host.clone());
        }
        Ok(())
    }

    /// Over MPI every rank must run the same run, or their exchanges would not match:
    /// the config, the parameters' names and shapes and the data's sizes are compared
    /// once (as DDP compares its parameters' shapes), naming the first difference.
    #[cfg(feature = "mpi")]
    fn check_same_run(&self, comm: &Comm) -> Result<(), TrainError> {
        let params: Vec<_> = self
            .params
            .list
            .iter()
            .map(|p| (p.name.clone(), p.value.shape().to_vec()))
            .collect();
        let mine = serde_json::json!({
            "config": self.config,
            "parameters": params,
            "training examples": self.train.len(),
            "evaluation examples": self.eval.len(),
        });
        let bad = |e: String| Error::invalid("parallel.backend = \"mpi\"", e);
        let all = gather_bytes(comm, mine.to_string().as_bytes()).map_err(|e| bad(e.to_string()))?;
        let runs: Vec<serde_json::Value> = all.iter().map(|b| serde_json::from_slice(b).unwrap_or_default()).collect();
        for (rank, run) in runs.iter().enumerate().skip(1) {
            if let Some((at, first, theirs)) = first_difference(&runs[0], run, "") {
                return Err(bad(format!(
                    "rank {rank} does not run rank 0's run: {at} is {theirs} there, {first} on rank 0 (every rank needs the same config and data)"
                ))
                .into());
            }
        }
        Ok(())
    }

    /// Makes this trainer rank `base_rank` of a run whose other ranks are `peers` (in
    /// this process, after it) and whatever `comms` reach beyond this process.
    fn join_world(
        &mut self,
        group: Option<HostGroup>,
        comms: Vec<Comm>,
        bn: Option<(Option<HostGroup>, Vec<Comm>)>,
        peers: Vec<Peer>,
        base_rank: usize,
    ) -> Result<(), TrainError> {
        let size = comms.first().map_or(1, |c| c.world());
        let local = peers.len() + 1;
        let shapes: Vec<_> = self
            .params
            .list
            .iter()
            .map(|p| (p.value.shape().to_vec(), p.name.clone()))
            .collect();
        self.step_kind = crate::train::trainer::StepKind::Parallel;
        // Whether a shard keeps 8-bit state is its whole parameter's size's to say.
        let numels: Vec<usize> = self.params.list.iter().map(|p| p.value.numel()).collect();
        self.opt.whole_numels = numels.clone();
        let mut peers = peers;
        peers.iter_mut().for_each(|p| p.opt.whole_numels = numels.clone());
        // Kept f16 copies are one device's: over several, each step casts (shards
        // update apart from their copies).
        self.halves = None;
        self.opt.halves = None;
        self.world = Some(World {
            group,
            comms,
            bn,
            base_rank,
            size,
            node: None,
            peers,
            shards: Shards {
                world: self.config.parallel.world(),
                numels: self.params.list.iter().map(|p| p.value.numel()).collect(),
                // 8-bit state's shards cut at its blocks' bounds, so that a shard's
                // blocks are the whole parameter's (the same state on any number of
                // devices).
                align: self.opt.rule.shard_align(),
            },
            zero: self.config.parallel.zero,
            bucket_bytes: self.config.parallel.bucket_bytes().max(4),
            offload: if self.config.parallel.offload == crate::train::config::Offload::None {
                Vec::new()
            } else {
                (0..local).map(|_| HostOptimizer::default()).collect()
            },
            shapes: Arc::new(shapes),
            host_shards: Vec::new(),
            host_whole: Arc::default(),
            offload_params: self.config.parallel.offload == crate::train::config::Offload::OptimizerParameters,
        });
        if self.config.parallel.zero >= 3 {
            self.shard_weights()?;
        }
        Ok(())
    }

    /// Whether this process writes the run's files: always, except over MPI where rank
    /// 0 does (the others take part in the exchanges only).
    pub fn writes(&self) -> bool {
        self.world.as_ref().is_none_or(|w| w.base_rank == 0)
    }

    /// Whether the run stops now: `mine`, or over MPI whether any rank was asked to
    /// (every rank asks between the same steps, so all stop after the same one).
    pub(in crate::train) fn stop_agreed(&self, mine: bool) -> Result<bool, Error> {
        match self.world.as_ref().filter(|w| w.comms.len() < w.size) {
            Some(w) => w.comms[0].any(mine).map_err(|e| Error::invalid("stopping", e.to_string())),
            None => Ok(mine),
        }
    }

    /// A step line's memory: this process's devices; over MPI every rank's, each with
    /// its rank and machine (every rank calls this after each step: an exchange).
    pub(in crate::train) fn step_memory(&self) -> Result<wgtrain_record::MemLog, Error> {
        let budget = self.rt.gpu.memory_budget();
        let mem = wgtrain_record::MemLog {
            host: self.host_bytes(),
            device_budget: budget.map(|b| b.budget),
            device_usage: budget.map(|b| b.usage),
            ..crate::train::observe::log::mem_log_devices(&self.device_stats())
        };
        let Some(w) = self.world.as_ref().filter(|w| w.comms.len() < w.size) else {
            return Ok(mem);
        };
        let mine = wgtrain_record::MemLog {
            rank: Some(w.base_rank as u32),
            node: w.node.clone(),
            ..mem
        };
        let bytes = serde_json::to_vec(&mine).map_err(|e| Error::invalid("memory log", e.to_string()))?;
        let all = gather_bytes(&w.comms[0], &bytes).map_err(|e| Error::invalid("memory log", e.to_string()))?;
        let devices = all
            .iter()
            .map(|bytes| serde_json::from_slice::<wgtrain_record::MemLog>(bytes).map_err(|e| Error::invalid("memory log", e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(wgtrain_record::MemLog {
            devices: devices.clone(),
            ..devices[w.base_rank].clone()
        })
    }

    /// Devices in the run.
    pub fn world_size(&self) -> usize {
        self.world.as_ref().map_or(1, |w| w.size)
    }

    /// Every device's memory statistics, in rank order.
    pub fn device_stats(&self) -> Vec<MemoryStats> {
        let mut out = vec![self.rt.alloc.stats()];
        if let Some(w) = &self.world {
            out.extend(w.peers.iter().map(|p| p.rt.alloc.stats()));
        }
        out
    }

    /// Host memory of the run by category (the offloaded optimizer state), if any.
    pub fn host_bytes(&self) -> std::collections::BTreeMap<String, u64> {
        let state: u64 = self.world.iter().flat_map(|w| &w.offload).map(HostOptimizer::bytes).sum();
        let mut out = std::collections::BTreeMap::new();
        if self.world.as_ref().is_some_and(|w| !w.offload.is_empty()) {
            out.insert(Category::OptimizerState.name().to_string(), state);
        }
        if let Some(w) = self.world.as_ref().filter(|w| w.offload_params) {
            let weights: usize = w.host_shards.iter().flat_map(|s| s.iter()).map(Vec::len).sum();
            out.insert(Category::Parameter.name().to_string(), 4 * weights as u64);
        }
        out
    }

    /// Every device's runtime, in rank order.
    pub fn runtimes(&self) -> Vec<Arc<Runtime>> {
        let mut out = vec![self.rt.clone()];
        if let Some(w) = &self.world {
            out.extend(w.peers.iter().map(|p| p.rt.clone()));
        }
        out
    }
}

/// Every rank's `bytes`, in rank order (a byte a value: exact in f32).
pub(in crate::train) fn gather_bytes(comm: &Comm, bytes: &[u8]) -> Result<Vec<Vec<u8>>, crate::parallel::CollectiveError> {
    let all = comm.all_gather_vecs(bytes.iter().map(|&b| f32::from(b)).collect())?;
    Ok(all.iter().map(|v| v.iter().map(|&f| f as u8).collect()).collect())
}

/// Where `a` and `b` first differ (their path, as `config.model.n_embd`, and both values
/// written short), walking objects by key and arrays by index.
#[cfg(feature = "mpi")]
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Option<(String, String, String)> {
    use serde_json::Value;
    let short = |v: Option<&Value>| {
        let t = v.map_or("missing".to_string(), |v| v.to_string());
        if t.chars().count() > 80 {
            t.chars().take(77).collect::<String>() + "..."
        } else {
            t
        }
    };
    let join = |k: &dyn std::fmt::Display| if at.is_empty() { k.to_string() } else { format!("{at}.{k}") };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.keys()
                .chain(y.keys().filter(|k| !x.contains_key(*k)))
                .find_map(|k| match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => first_difference(p, q, &join(k)),
                    (p, q) => Some((join(k), short(p), short(q))),
                })
        }
        (Value::Array(x), Value::Array(y)) => (0..x.len().max(y.len())).find_map(|i| match (x.get(i), y.get(i)) {
            (Some(p), Some(q)) => first_difference(p, q, &format!("{at}[{i}]")),
            (p, q) => Some((format!("{at}[{i}]"), short(p), short(q))),
        }),
        _ => (a != b).then(|| (at.to_string(), short(Some(a)), short(Some(b)))),
    }
}
