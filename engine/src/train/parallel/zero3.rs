//! ZeRO stage 3: parameters sharded between steps. Each rank keeps its shard of every
//! parameter on its device (for its optimizer); the host keeps every rank's shards and
//! the whole weights made from them after each step (`refresh_host_weights`). A tape
//! gathers a parameter whole when the model asks for it ([`ShardGather`]: an upload of
//! the host's whole value, queued as the tape records, ahead of the device, so the next
//! layers' weights are on their way while the device runs this one), and it is freed
//! when its last user lets it go. With activation checkpointing a block's parameters
//! are gathered for its forward, freed, and gathered again for its recomputation in
//! backward.
//!
//! May call: `autograd`, `device::staging`, `error`, `kernels`, `memory`, `parallel`, `runtime`, `tensor`,
//! `train::{trainer, world}`. Called by: `train::{eval, parallel, plan, state}`.

use std::sync::Arc;

use crate::autograd::{Gather, Params};
use crate::device::staging::{concat_into, give_f32};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::parallel::{Collective, Shards};
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};
use crate::train::trainer::Trainer;
use crate::train::world::World;

/// One rank's gathers of whole parameters: uploads of the whole weights the host
/// holds (rebuilt from every rank's shards after each step, `refresh_host_weights`). The
/// uploads are queued as the tape records, ahead of the device, so every layer's
/// parameters are on their way before the device reaches it.
pub(in crate::train) struct ShardGather {
    pub(in crate::train) rt: Arc<Runtime>,
    pub(in crate::train) whole: Arc<Vec<Vec<f32>>>,
    pub(in crate::train) shapes: Arc<Vec<(Vec<usize>, String)>>,
}

impl Gather for ShardGather {
    fn gather(&self, index: usize) -> Result<Tensor, Error> {
        let (shape, name) = &self.shapes[index];
        let whole = self.whole.get(index).map_or(&[][..], |w| &w[..]);
        if whole.len() != shape.iter().product::<usize>() {
            return Err(Error::invalid(
                "parameter gather",
                format!("{name}: the shards hold {} values, the parameter {shape:?}", whole.len()),
            ));
        }
        // Through the mapped staging buffers (a queue write copies everything once more
        // on one core).
        let t = Tensor::empty(&self.rt, shape, DType::F32, Category::Parameter, name)?;
        let bytes = (whole.len() * 4) as u64;
        self.rt
            .upload(&[(t.block(), (t.offset() * 4) as u64, bytes)], bytemuck::cast_slice(whole))?;
        Ok(t)
    }
}

/// Replaces each whole parameter of `params` by this rank's shard (on the device; an
/// empty tensor when `on_host`: the weights then live in host memory only) and returns
/// the shard's values (for the host copy).
pub(in crate::train) fn shard_in_place(
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

/// Splits this rank's shards read end to end back into one vector per parameter
/// (several threads at once); `flat` goes back to the reused host vectors.
pub(in crate::train) fn split_shards(flat: Vec<f32>, shards: &Shards, rank: usize) -> Vec<Vec<f32>> {
    use rayon::prelude::*;
    let out = shard_ranges(shards, rank).into_par_iter().map(|r| flat[r].to_vec()).collect();
    give_f32(flat);
    out
}

/// Where each parameter's shard of `rank` lies in its shards read end to end.
fn shard_ranges(shards: &Shards, rank: usize) -> Vec<std::ops::Range<usize>> {
    let mut at = 0;
    (0..shards.numels.len())
        .map(|i| {
            let n = shards.range(i, rank).len();
            at += n;
            at - n..at
        })
        .collect()
}

/// After a stage-3 step: the whole weights made from each rank's updated shards (end
/// to end, in rank order), and under parameter offload the host shards (the host
/// optimizer's weights), written in place when no one holds them any more (the step's
/// gathers are done), so a step makes no new host memory (fresh pages cost more than
/// the copy).
pub(in crate::train) fn refresh_host_weights(world: &mut World, mut flats: Vec<Vec<f32>>) -> Result<(), Error> {
    use rayon::prelude::*;
    let clock = std::time::Instant::now();
    let mut reused = [true; 2];
    if flats.len() < world.size {
        // Over MPI: every process's ranks' shards, gathered.
        let mine = flats.pop().ok_or_else(|| Error::invalid("stage 3", "no shards to gather"))?;
        let all = world.comms[0]
            .all_gather(mine)
            .map_err(|e| Error::invalid("stage 3 all-gather", e.to_string()))?;
        flats = Arc::try_unwrap(all).unwrap_or_else(|all| (*all).clone());
    }
    let gathered = clock.elapsed();
    let ranges: Vec<_> = (0..flats.len()).map(|r| shard_ranges(&world.shards, r)).collect();
    let fill = |i: usize, whole: &mut [f32]| {
        let pieces: Vec<&[f32]> = flats.iter().zip(&ranges).map(|(f, r)| &f[r[i].clone()]).collect();
        concat_into(whole, &pieces);
    };
    let numels = &world.shards.numels;
    match Arc::get_mut(&mut world.host_whole) {
        Some(whole) if whole.iter().map(Vec::len).eq(numels.iter().copied()) => {
            whole.par_iter_mut().enumerate().for_each(|(i, w)| fill(i, w));
        }
        _ => {
            reused[0] = false;
            // Drop the old whole weights first: the new ones take their place.
            world.host_whole = Arc::default();
            let whole = (0..numels.len())
                .into_par_iter()
                .map(|i| {
                    let mut w = vec![0.0; numels[i]];
                    fill(i, &mut w);
                    w
                })
                .collect();
            world.host_whole = Arc::new(whole);
        }
    }
    let local = world.base_rank..world.base_rank + world.comms.len();
    for (rank, (flat, ranges)) in flats.into_iter().zip(ranges).enumerate() {
        if !world.offload_params || !local.contains(&rank) {
            give_f32(flat);
            continue;
        }
        let slot = rank - world.base_rank;
        match world.host_shards.get_mut(slot).and_then(Arc::get_mut) {
            Some(mine) if mine.iter().map(Vec::len).eq(ranges.iter().map(|r| r.len())) => {
                mine.par_iter_mut().zip(ranges).for_each(|(m, r)| m.copy_from_slice(&flat[r]));
                give_f32(flat);
            }
            _ => {
                reused[1] = false;
                let split = Arc::new(split_shards(flat, &world.shards, rank));
                match world.host_shards.get_mut(slot) {
                    Some(slot) => *slot = split,
                    None => world.host_shards.push(split),
                }
            }
        }
    }
    if super::reducer::timing() {
        eprintln!(
            "{{\"refresh_ms\": {:.1}, \"gathered_ms\": {:.1}, \"whole_reused\": {}, \"shards_reused\": {}}}",
            clock.elapsed().as_secs_f64() * 1e3,
            gathered.as_secs_f64() * 1e3,
            reused[0],
            reused[1]
        );
    }
    Ok(())
}

impl Trainer {
    /// Stage 3: shards every rank's parameters, whole on rank 0 now (after the build
    /// or a restore), and keeps the host copies.
    pub(in crate::train) fn shard_weights(&mut self) -> Result<(), Error> {
        let whole: Vec<Vec<f32>> = self
            .params
            .list
            .iter()
            .map(|p| p.value.to_f32_vec(&self.rt))
            .collect::<Result<_, _>>()?;
        let Some(w) = self.world.as_mut() else { return Ok(()) };
        let on_host = w.offload_params;
        let base = w.base_rank;
        let mut host = vec![Arc::new(shard_in_place(
            &self.rt,
            &mut self.params,
            &w.shards,
            base,
            &whole,
            on_host,
        )?)];
        for (k, peer) in w.peers.iter_mut().enumerate() {
            host.push(Arc::new(shard_in_place(
                &peer.rt,
                &mut peer.params,
                &w.shards,
                base + k + 1,
                &whole,
                on_host,
            )?));
        }
        // The whole weights read back are the host's copy the gathers upload; the shards
        // stay on the host only where the host optimizer updates them.
        w.host_shards = if on_host { host } else { Vec::new() };
        w.host_whole = Arc::new(whole);
        Ok(())
    }

    /// Whether parameters are sharded between steps (stage 3).
    pub(in crate::train) fn sharded_weights(&self) -> bool {
        self.world.as_ref().is_some_and(|w| w.zero >= 3)
    }

    /// Parameter `i`'s weights, whole, on the host (gathered from the ranks' host
    /// shards at stage 3).
    pub(in crate::train) fn param_host(&self, i: usize) -> Result<Vec<f32>, Error> {
        match self.world.as_ref().filter(|w| w.zero >= 3) {
            Some(w) => Ok(w.host_whole[i].clone()),
            None => self.params.list[i].value.to_f32_vec(&self.rt),
        }
    }

    /// Parameter `i`'s whole shape.
    pub(in crate::train) fn param_shape(&self, i: usize) -> Vec<usize> {
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
                align: 1,
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
    pub(in crate::train) fn whole_params(&self) -> Result<Option<Params>, Error> {
        if !self.sharded_weights() {
            return Ok(None);
        }
        let mut out = self.params.buffers_only();
        for (i, p) in self.params.list.iter().enumerate() {
            let t = Tensor::from_f32(&self.rt, &self.param_host(i)?, &self.param_shape(i), Category::Parameter, &p.name)?;
            out.add(&p.name, t);
        }
        Ok(Some(out))
    }
}
