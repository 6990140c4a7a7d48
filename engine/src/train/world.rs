//! The devices of a multi-device run beyond the first, and what joins them: the state
//! `train::parallel` steps over, held by the trainer; and what a step's ranks share.
//!
//! May call: `autograd`, `optim`, `parallel`, `runtime`, `scaler`, `train::model`.
//! Called by: `train::{parallel, reducer, trainer}`.

use std::sync::Arc;

use crate::autograd::Params;
use crate::optim::{HostOptimizer, Optimizer};
use crate::parallel::{Comm, HostGroup, Shards};
use crate::runtime::Runtime;
use crate::scaler::GradScaler;
use crate::train::model::Trainable;

/// A device of a multi-device run other than the first.
pub struct Peer {
    /// Its runtime.
    pub rt: Arc<Runtime>,
    /// Its copy of the parameters (whole at stages 0-2; its shards at stage 3).
    pub params: Params,
    pub(super) model: Box<dyn Trainable>,
    pub(super) opt: Optimizer,
}

/// The devices beyond the first and what joins them.
pub struct World {
    /// The one-process group (none over MPI).
    pub(super) group: Option<HostGroup>,
    /// This process's ranks' handles, in rank order.
    pub(super) comms: Vec<Comm>,
    /// SyncBatchNorm's own group (`parallel.sync_batch_norm`): its exchanges happen
    /// inside forward and backward, while the gradient buckets use `comms`.
    pub(super) bn: Option<(Option<HostGroup>, Vec<Comm>)>,
    /// The trainer's own rank: 0 in one process; over MPI, this process's.
    pub(super) base_rank: usize,
    /// Ranks in the run, this process's and (over MPI) every other process's.
    pub(super) size: usize,
    /// Over MPI: the machine this process runs on.
    pub(super) node: Option<String>,
    /// This process's ranks after the trainer's own (ranks base_rank + 1..; none over
    /// MPI).
    pub peers: Vec<Peer>,
    pub(super) shards: Shards,
    pub(super) zero: u8,
    pub(super) bucket_bytes: usize,
    /// This process's ranks' host optimizers (`offload = "optimizer"`), in rank order.
    pub(super) offload: Vec<HostOptimizer>,
    /// Stage 3: the parameters' whole shapes and names, in the model's order.
    pub(super) shapes: Arc<Vec<(Vec<usize>, String)>>,
    /// Stage 3 with `offload = "optimizer+parameters"`: this process's ranks' shards on
    /// the host (their host optimizers' weights), in rank order; empty otherwise.
    pub(super) host_shards: Vec<Arc<Vec<Vec<f32>>>>,
    /// Stage 3: every parameter whole on the host, made from the ranks' shards after
    /// each step (in one process every rank's shards are at hand: across processes this
    /// would be one all-gather per step); what the gathers upload.
    pub(super) host_whole: Arc<Vec<Vec<f32>>>,
    /// `offload = "optimizer+parameters"`: the shards live on the host only.
    pub(super) offload_params: bool,
}

/// What every rank's step shares.
pub(super) struct StepPlan<'a> {
    pub(super) shards: &'a Shards,
    pub(super) zero: u8,
    pub(super) bucket_bytes: usize,
    pub(super) micro: Option<usize>,
    pub(super) total_targets: usize,
    pub(super) scaler: Option<&'a GradScaler>,
    pub(super) grad_clip: f32,
    pub(super) lr: f32,
    pub(super) offload: bool,
    /// Matmuls on f16 inputs (fp16-mixed).
    pub(super) half: bool,
    /// The step's training mode (each micro-batch and rank mix theirs into its seed).
    pub(super) mode: crate::autograd::Mode,
    /// When the step began (the diagnostic timings count from it).
    pub(super) started: std::time::Instant,
    /// Each rank's SyncBatchNorm handle (in rank order), when batch statistics are
    /// shared.
    pub(super) bn: Option<&'a [Comm]>,
    /// The global gradient norm before clipping, set by the ranks that clip (they
    /// agree on it).
    pub(super) grad_norm: std::sync::Mutex<Option<f64>>,
    /// `train.log_update_ratio`: each parameter's sums of squares of its update and of
    /// its new values over every rank's shard, set by rank 0.
    pub(super) update_sums: Option<std::sync::Mutex<Option<Vec<Option<(f64, f64)>>>>>,
}

/// A rank's [`SyncStats`](crate::autograd::SyncStats) over its SyncBatchNorm group.
pub(super) struct BnSync(pub(super) Comm);

impl crate::autograd::SyncStats for BnSync {
    fn all_gather(&self, mine: Vec<f32>) -> Result<Vec<f32>, crate::error::Error> {
        use crate::parallel::Collective;
        let all = self
            .0
            .all_gather_vecs(mine)
            .map_err(|e| crate::error::Error::invalid("SyncBatchNorm", e.to_string()))?;
        Ok(all.iter().flatten().copied().collect())
    }
}
