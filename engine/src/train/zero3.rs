//! ZeRO stage 3: parameters sharded between steps. Each rank keeps its shard of every
//! parameter on its device (for its optimizer) and a copy on the host; a tape gathers a
//! parameter whole when the model asks for it ([`ShardGather`]: the ranks exchange
//! their host shards and the whole value is uploaded), and it is freed when its last
//! user lets it go. With activation checkpointing a block's parameters are gathered for
//! its forward, freed, and gathered again for its recomputation in backward. Gathers
//! are synchronous (no prefetch of the next layer yet).
//!
//! May call: `autograd`, `device::staging`, `error`, `kernels`, `memory`, `parallel`, `runtime`, `tensor`,
//! `train::{trainer, world}`. Called by: `train::{eval, parallel, plan, state}`.

use std::sync::Arc;

use super::trainer::Trainer;
use crate::autograd::{Gather, Params};
use crate::device::staging::{give_f32, take_f32};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::parallel::{Collective, HostComm, Shards};
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// One rank's gathers of whole parameters from every rank's host shards.
pub(super) struct ShardGather {
    pub(super) comm: HostComm,
    pub(super) rt: Arc<Runtime>,
    pub(super) mine: Arc<Vec<Vec<f32>>>,
    pub(super) shapes: Arc<Vec<(Vec<usize>, String)>>,
}

impl Gather for ShardGather {
    fn gather(&self, index: usize) -> Result<Tensor, Error> {
        let all = self
            .comm
            .all_gather_vecs(self.mine[index].clone())
            .map_err(|e| Error::invalid("parameter gather", e.to_string()))?;
        let (shape, name) = &self.shapes[index];
        let n: usize = all.iter().map(Vec::len).sum();
        if n != shape.iter().product::<usize>() {
            return Err(Error::invalid(
                "parameter gather",
                format!("{name}: the shards hold {n} values, the parameter {shape:?}"),
            ));
        }
        // The shards end to end, through the mapped staging buffers (not a queue write,
        // which copies everything once more on one core).
        let mut whole = take_f32(n);
        whole.clear();
        all.iter().for_each(|v| whole.extend_from_slice(v));
        let t = Tensor::empty(&self.rt, shape, DType::F32, Category::Parameter, name)?;
        self.rt.upload(
            &[(t.block(), (t.offset() * 4) as u64, (n * 4) as u64)],
            bytemuck::cast_slice(&whole),
        )?;
        give_f32(whole);
        Ok(t)
    }
}

/// Replaces each whole parameter of `params` by this rank's shard (on the device; an
/// empty tensor when `on_host`: the weights then live in host memory only) and returns
/// the shard's values (for the host copy).
pub(super) fn shard_in_place(
    rt: &Runtime,
    params: &mut Params,
    shards: &Shards,
    rank: usize,
    whole: &[Vec<f32>],
    on_host: bool,
) -> Result<Vec<Vec<f32>>, Error> {
    let mut mine = Vec::with_capacity(params.list.len());
    for (i, p) in params.list.iter_mut().enumerate() {
        let r = shards.range(i, rank);
        let part = whole[i][r].to_vec();
        let kept: &[f32] = if on_host { &[] } else { &part };
        p.value = Tensor::from_f32(rt, kept, &[kept.len()], Category::Parameter, &p.name)?;
        p.grad = None;
        mine.push(part);
    }
    Ok(mine)
}

/// Splits this rank's shards read end to end back into one vector per parameter.
pub(super) fn split_shards(flat: &[f32], shards: &Shards, rank: usize) -> Vec<Vec<f32>> {
    let mut at = 0;
    (0..shards.numels.len())
        .map(|i| {
            let n = shards.range(i, rank).len();
            let v = flat[at..at + n].to_vec();
            at += n;
            v
        })
        .collect()
}

impl Trainer {
    /// Stage 3: shards every rank's parameters, whole on rank 0 now (after the build
    /// or a restore), and keeps the host copies.
    pub(super) fn shard_weights(&mut self) -> Result<(), Error> {
        let whole: Vec<Vec<f32>> = self
            .params
            .list
            .iter()
            .map(|p| p.value.to_f32_vec(&self.rt))
            .collect::<Result<_, _>>()?;
        let Some(w) = self.world.as_mut() else { return Ok(()) };
        let on_host = w.offload_params;
        let mut host = vec![Arc::new(shard_in_place(&self.rt, &mut self.params, &w.shards, 0, &whole, on_host)?)];
        for (k, peer) in w.peers.iter_mut().enumerate() {
            host.push(Arc::new(shard_in_place(
                &peer.rt,
                &mut peer.params,
                &w.shards,
                k + 1,
                &whole,
                on_host,
            )?));
        }
        w.host_shards = host;
        Ok(())
    }

    /// Whether parameters are sharded between steps (stage 3).
    pub(super) fn sharded_weights(&self) -> bool {
        self.world.as_ref().is_some_and(|w| w.zero >= 3)
    }

    /// Parameter `i`'s weights, whole, on the host (gathered from the ranks' host
    /// shards at stage 3).
    pub(super) fn param_host(&self, i: usize) -> Result<Vec<f32>, Error> {
        match self.world.as_ref().filter(|w| w.zero >= 3) {
            Some(w) => Ok(w.host_shards.iter().flat_map(|s| s[i].iter().copied()).collect()),
            None => self.params.list[i].value.to_f32_vec(&self.rt),
        }
    }

    /// Parameter `i`'s whole shape.
    pub(super) fn param_shape(&self, i: usize) -> Vec<usize> {
        match self.world.as_ref().filter(|w| w.zero >= 3) {
            Some(w) => w.shapes[i].0.clone(),
            None => self.params.list[i].value.shape().to_vec(),
        }
    }

    /// How the parameters are cut over the run's devices (one shard each on one device).
    pub fn shards(&self) -> Shards {
        match &self.world {
            Some(w) => w.shards.clone(),
            None => Shards {
                world: 1,
                numels: self.params.list.iter().map(|p| p.value.numel()).collect(),
            },
        }
    }

    /// Parameters in the model (whole, whatever the sharding).
    pub fn parameter_count(&self) -> usize {
        match &self.world {
            Some(w) => w.shards.numels.iter().sum(),
            None => self.params.numel(),
        }
    }

    /// Stage 3: every parameter whole on rank 0, for evaluation (made for it, freed
    /// after); None when the parameters are whole anyway.
    pub(super) fn whole_params(&self) -> Result<Option<Params>, Error> {
        if !self.sharded_weights() {
            return Ok(None);
        }
        let mut out = Params::default();
        for (i, p) in self.params.list.iter().enumerate() {
            let t = Tensor::from_f32(&self.rt, &self.param_host(i)?, &self.param_shape(i), Category::Parameter, &p.name)?;
            out.add(&p.name, t);
        }
        Ok(Some(out))
    }
}
