//! One run over several devices (`[parallel]`): data parallel with ZeRO stages 0-2.
//!
//! Rank 0 is the trainer's own runtime, parameters, model and optimizer; ranks 1..N are
//! [`Peer`]s built the same way from the same seed, so every rank starts with the same
//! weights. A step gives each rank its share of the batch, one thread per rank. Each
//! rank's gradients are reduced in buckets through the collective layer as backward
//! makes them final (DDP's reducer: the tape's hook reports them), every rank summing
//! in rank order:
//! - zero 0: every rank gets the whole sum and updates every parameter;
//! - zero 1: each rank keeps the sum of its shard only (in its full gradient) and its
//!   optimizer updates only its shard, with state for that shard alone;
//! - zero 2: as 1, and the full gradients are freed as soon as their bucket is reduced:
//!   only shard gradients remain.
//!
//! After a sharded update the ranks gather each other's updated shards (all-gather).
//! With `offload = "optimizer"` (ZeRO-Offload) the reduced shard gradients stay in host
//! memory, where the optimizer state lives and the update runs (`optim::HostOptimizer`);
//! the updated shards go straight from there to every device.
//!
//! GradScaler's inf/NaN check and clipping's global norm span every rank's shard.
//! Checkpoints hold the whole state, as a single device's, so a run resumes onto any
//! number of devices.
//!
//! May call: `autograd`, `data`, `device`, `error`, `kernels`, `memory`, `optim`,
//! `parallel`, `runtime`, `scaler`, `tensor`, `train::{build, config, error, model,
//! step, trainer, world}`. Called by: `train::{open, plan, run, state, step}`.

use std::sync::Arc;

use super::build::{build_model, optimizer_rule};
use super::error::TrainError;
use super::model::Trainable;
use super::reducer::{Reducer, timing, transfer};
use super::step::{read_losses, split_batch};
use super::trainer::Trainer;
use super::world::{Peer, StepPlan, World};
use crate::autograd::{Param, Params, Tape};
use crate::data::HostBatch;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::{Category, MemoryStats};
use crate::optim::{HostOptimizer, Optimizer, Rule, clip_coef, grad_square_sum, scale_grads};
use crate::parallel::{Collective, HostComm, HostGroup, Shards};
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// One parameter's optimizer state on the host: (first moment or momentum, second
/// moment for AdamW).
pub(super) type HostState = (Vec<f32>, Option<Vec<f32>>);

/// What a rank's thread borrows for a step.
struct Rank<'a> {
    rt: &'a Runtime,
    model: &'a dyn Trainable,
    params: &'a mut Params,
    opt: &'a mut Optimizer,
    host: Option<&'a mut HostOptimizer>,
}

impl Trainer {
    /// Joins the devices `rts` (ranks 1..) to this run: each gets the model built from
    /// the same seed (the same initial weights) and an optimizer of the same rule.
    pub fn join(&mut self, rts: Vec<Arc<Runtime>>) -> Result<(), TrainError> {
        let mut peers = Vec::new();
        for rt in rts {
            let mut params = Params::default();
            let model = build_model(&self.config, &rt, self.outputs, &mut params)?;
            peers.push(Peer {
                rt,
                params,
                model,
                opt: Optimizer::new(optimizer_rule(&self.config)),
            });
        }
        let (group, comms) = HostGroup::new(peers.len() + 1);
        self.world = Some(World {
            group,
            comms,
            peers,
            shards: Shards {
                world: self.config.parallel.world(),
                numels: self.params.list.iter().map(|p| p.value.numel()).collect(),
            },
            zero: self.config.parallel.zero,
            bucket_bytes: self.config.parallel.bucket_bytes().max(4),
            offload: if self.config.parallel.offload == "none" {
                Vec::new()
            } else {
                (0..self.config.parallel.world()).map(|_| HostOptimizer::default()).collect()
            },
        });
        Ok(())
    }

    /// Devices in the run.
    pub fn world_size(&self) -> usize {
        self.world.as_ref().map_or(1, |w| w.peers.len() + 1)
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

    /// One step over every device: returns the batch's mean loss and whether the update
    /// was skipped (fp16-mixed, an inf or NaN gradient on any device).
    pub(super) fn parallel_step(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        let Trainer {
            rt,
            params,
            model,
            opt,
            scaler,
            config,
            world,
            ..
        } = self;
        let world = world.as_mut().expect("a parallel step has a world");
        let n = world.comms.len();
        let per = batch.examples.div_ceil(n).max(1);
        let mut parts = split_batch(batch, per);
        parts.resize_with(n, || HostBatch {
            position: batch.position,
            ..HostBatch::default()
        });
        let plan = StepPlan {
            shards: &world.shards,
            zero: world.zero,
            bucket_bytes: world.bucket_bytes,
            micro: config.train.micro_batch_size,
            total_targets: batch.targets.len().max(1),
            scaler: scaler.as_ref(),
            grad_clip: config.train.grad_clip,
            lr,
            offload: !world.offload.is_empty(),
        };
        let mut hosts = world.offload.iter_mut().map(Some).collect::<Vec<_>>();
        hosts.resize_with(n, || None);
        let mut hosts = hosts.into_iter();
        let mut ranks = vec![Rank {
            rt,
            model: &**model,
            params,
            opt,
            host: hosts.next().flatten(),
        }];
        for p in &mut world.peers {
            ranks.push(Rank {
                rt: &p.rt,
                model: &*p.model,
                params: &mut p.params,
                opt: &mut p.opt,
                host: hosts.next().flatten(),
            });
        }
        let results: Vec<Result<(f64, bool), Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .zip(&parts)
                .zip(&world.comms)
                .map(|((rank, part), comm)| {
                    let plan = &plan;
                    s.spawn(move || {
                        let out = rank_step(rank, part, comm, plan);
                        if let Err(e) = &out {
                            comm.abort(&e.to_string());
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::invalid("parallel step", "a device's thread panicked")))
                })
                .collect()
        });
        let mut loss = 0.0;
        let mut skipped = false;
        let mut first_error = None;
        for r in results {
            match r {
                Ok((l, s)) => {
                    loss += l;
                    skipped |= s;
                }
                // The rank that failed says why; the others only say that they stopped.
                Err(e) if first_error.is_none() || is_abort(first_error.as_ref()) => first_error = Some(e),
                Err(_) => {}
            }
        }
        if let Some(e) = first_error {
            world.group.reset();
            self.params.zero_grad();
            for p in &mut world.peers {
                p.params.zero_grad();
            }
            return Err(e.into());
        }
        if let Some(sc) = &mut self.scaler {
            sc.update(skipped);
        } else if !loss.is_finite() {
            return Err(TrainError::NonFinite(loss as f32, self.step + 1));
        }
        Ok((loss, skipped))
    }
}

fn is_abort(e: Option<&Error>) -> bool {
    e.is_some_and(|e| e.to_string().contains("another device of the run failed"))
}

/// One rank's step: forward and backward over its part in micro-batches, the buckets
/// reduced as backward finishes them, then the update of what this rank owns.
fn rank_step(rank: Rank, part: &HostBatch, comm: &HostComm, plan: &StepPlan) -> Result<(f64, bool), Error> {
    let Rank {
        rt,
        model,
        params,
        opt,
        host,
    } = rank;
    let n_params = params.list.len();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut reducer = Reducer::new(plan, comm.rank(), n_params, tx);
    let mut losses = Vec::new();
    let gpu = rt.runs_kernels().then(|| rt.gpu.clone());
    let clock = std::time::Instant::now();
    let mut marks = Vec::new();
    // Backward and the buckets' exchanges overlap: this thread records, the transfer
    // thread waits for each bucket's copy and reduces it.
    let host_grads = std::thread::scope(|s| -> Result<_, Error> {
        let worker = s.spawn(|| {
            let out = transfer(rx, comm, gpu, plan.offload, n_params);
            if let Err(e) = &out {
                comm.abort(&e.to_string());
            }
            out
        });
        let recorded = forward_backward(rt, model, params, part, plan, &mut reducer, &mut losses);
        marks.push(clock.elapsed());
        // Whatever happened, the queue closes so the worker ends.
        let finished = recorded.and_then(|_| {
            rt.phase("reduce");
            reducer.finish(rt, params)
        });
        reducer.close();
        marks.push(clock.elapsed());
        let reduced = worker
            .join()
            .unwrap_or_else(|_| Err(Error::invalid("gradient reduction", "the transfer thread panicked")));
        finished?;
        reduced
    })?;
    marks.push(clock.elapsed());
    reducer.restore(params);
    rt.phase("optimizer");
    let skipped = if let Some(host) = host {
        update_on_host(rt, params, opt, host, host_grads, comm, plan)?
    } else if plan.zero == 0 {
        update(rt, params, opt, comm, plan)?
    } else {
        let shard = shard_params(params, &mut reducer, plan, comm.rank())?;
        let skipped = update(rt, &shard, opt, comm, plan)?;
        drop(shard);
        rt.phase("gather");
        gather_params(rt, params, plan.shards, comm, None)?;
        skipped
    };
    params.zero_grad();
    marks.push(clock.elapsed());
    rt.phase("readback");
    let loss = read_losses(rt, &losses).map_err(|e| Error::invalid("parallel step", e.to_string()))?;
    marks.push(clock.elapsed());
    if timing() {
        let ms: Vec<String> = marks.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1e3)).collect();
        eprintln!(
            "{{\"rank\": {}, \"marks_ms\": {{\"backward_recorded\": {}, \"reduce_queued\": {}, \"reduced\": {}, \"updated\": {}, \"loss_read\": {}}}}}",
            comm.rank(),
            ms[0],
            ms[1],
            ms[2],
            ms[3],
            ms[4]
        );
    }
    Ok((loss, skipped))
}

/// Forward and backward over this rank's part in micro-batches; the last backward
/// hands each finished gradient to the reducer.
fn forward_backward(
    rt: &Runtime,
    model: &dyn Trainable,
    params: &mut Params,
    part: &HostBatch,
    plan: &StepPlan,
    reducer: &mut Reducer,
    losses: &mut Vec<(Tensor, f64)>,
) -> Result<(), Error> {
    if part.examples > 0 {
        let micro = plan.micro.filter(|&m| m > 0 && m < part.examples).unwrap_or(part.examples);
        let pieces = split_batch(part, micro);
        let last = pieces.len() - 1;
        for (k, piece) in pieces.iter().enumerate() {
            let weight = piece.targets.len() as f32 / plan.total_targets as f32;
            let seed = weight * plan.scaler.map_or(1.0, |s| s.scale);
            let mut tape = Tape::new().with_half_matmuls(plan.scaler.is_some()).with_grad_prescale(seed);
            rt.phase("forward");
            let loss = model.loss(&mut tape, rt, params, piece)?;
            rt.phase("backward");
            if k == last {
                let mut hook = |rt: &Runtime, i: usize, p: &mut Param| reducer.ready(rt, i, p);
                tape.backward_with_hook(rt, &loss, seed, params, &mut hook)?;
            } else {
                tape.backward_with(rt, &loss, seed, params)?;
            }
            losses.push((loss.value, weight as f64));
        }
    }
    Ok(())
}

/// Unscale and check, clip and update `params` (the whole model at stage 0, this rank's
/// shards above); returns whether any rank found an inf or NaN.
fn update(rt: &Runtime, params: &Params, opt: &mut Optimizer, comm: &HostComm, plan: &StepPlan) -> Result<bool, Error> {
    let found = match plan.scaler {
        Some(sc) => sc.unscale(rt, params)?,
        None => false,
    };
    if comm.any(found).map_err(collective)? {
        return Ok(true);
    }
    if plan.grad_clip > 0.0 {
        let local = grad_square_sum(rt, params)?;
        // Stage 0: every rank holds the whole sum, so the local norm is the global one.
        let total = if plan.zero == 0 {
            local
        } else {
            comm.sum_f64(local).map_err(collective)?
        };
        scale_grads(rt, params, clip_coef(total.sqrt() as f32, plan.grad_clip))?;
    }
    opt.step(rt, params, plan.lr)?;
    Ok(false)
}

fn collective(e: crate::parallel::CollectiveError) -> Error {
    Error::invalid("collective", e.to_string())
}

/// This rank's shard of every parameter: views of its weights, with the reduced shard
/// gradients (empty shards have none, so the optimizer passes them by).
fn shard_params(params: &Params, reducer: &mut Reducer, plan: &StepPlan, rank: usize) -> Result<Params, Error> {
    let mut out = Params::default();
    for (i, p) in params.list.iter().enumerate() {
        let r = plan.shards.range(i, rank);
        let flat = p.value.reshape(&[p.value.numel()])?;
        let value = flat.slice(0, r.start, r.len())?;
        let grad = if r.is_empty() {
            None
        } else if plan.zero == 1 {
            let g = p
                .grad
                .as_ref()
                .ok_or_else(|| Error::invalid("parallel step", format!("{} has no gradient", p.name)))?;
            Some(g.reshape(&[g.numel()])?.slice(0, r.start, r.len())?)
        } else {
            reducer.shard_grads[i].take()
        };
        out.list.push(Param {
            name: p.name.clone(),
            value,
            grad,
        });
    }
    Ok(out)
}

/// The update under `offload = "optimizer"`: the reduced shard gradients are on the
/// host already; unscale and check, clip and update there, then every rank writes
/// every rank's updated shard into its weights.
fn update_on_host(
    rt: &Runtime,
    params: &Params,
    opt: &mut Optimizer,
    host: &mut HostOptimizer,
    mut grads: Vec<Option<Vec<f32>>>,
    comm: &HostComm,
    plan: &StepPlan,
) -> Result<bool, Error> {
    let rank = comm.rank();
    let mut found = false;
    if let Some(sc) = plan.scaler {
        let inv = 1.0 / sc.scale;
        for g in grads.iter_mut().flatten() {
            g.iter_mut().for_each(|x| *x *= inv);
            found |= g.iter().any(|x| !x.is_finite());
        }
    }
    if comm.any(found).map_err(collective)? {
        return Ok(true);
    }
    if plan.grad_clip > 0.0 {
        let local: f64 = grads.iter().flatten().flat_map(|g| g.iter()).map(|&x| x as f64 * x as f64).sum();
        let coef = clip_coef(comm.sum_f64(local).map_err(collective)?.sqrt() as f32, plan.grad_clip);
        if coef < 1.0 {
            grads.iter_mut().flatten().for_each(|g| g.iter_mut().for_each(|x| *x *= coef));
        }
    }
    opt.step += 1;
    let mut mine = read_shards(rt, params, plan.shards, rank)?;
    let mut at = 0;
    for (i, g) in grads.iter().enumerate() {
        let r = plan.shards.range(i, rank);
        let w = &mut mine[at..at + r.len()];
        at += r.len();
        // The estimate's dry run has no values to update (and must not hold the state).
        if let Some(g) = g.as_ref().filter(|_| rt.runs_kernels()) {
            host.update(&opt.rule, i, w, g, plan.lr, opt.step);
        }
    }
    rt.phase("gather");
    gather_params(rt, params, plan.shards, comm, Some(mine))?;
    Ok(false)
}

/// All-gather of the updated shards: this rank's shards (read back, or `mine` when the
/// host holds them) exchanged and every rank's written into this rank's weights (its
/// own too when they come from the host).
fn gather_params(rt: &Runtime, params: &Params, shards: &Shards, comm: &HostComm, mine: Option<Vec<f32>>) -> Result<(), Error> {
    let rank = comm.rank();
    let from_host = mine.is_some();
    let mine = match mine {
        Some(v) => v,
        None => read_shards(rt, params, shards, rank)?,
    };
    let all = comm.all_gather_vecs(mine).map_err(collective)?;
    // Every other rank's shards (and this rank's own when they come from the host),
    // in one upload.
    let mut ranges = Vec::new();
    let mut data: Vec<f32> = Vec::new();
    for (other, theirs) in all.iter().enumerate() {
        if other == rank && !from_host {
            continue;
        }
        let mut at = 0;
        for (i, p) in params.list.iter().enumerate() {
            let r = shards.range(i, other);
            if r.is_empty() {
                continue;
            }
            let values = theirs
                .get(at..at + r.len())
                .ok_or_else(|| Error::invalid("all-gather", format!("rank {other} sent too few weights")))?;
            ranges.push((p.value.block(), ((p.value.offset() + r.start) * 4) as u64, (r.len() * 4) as u64));
            data.extend_from_slice(values);
            at += r.len();
        }
    }
    rt.upload(&ranges, bytemuck::cast_slice(&data))
}

/// This rank's shard of every parameter's weights, end to end, in one download.
fn read_shards(rt: &Runtime, params: &Params, shards: &Shards, rank: usize) -> Result<Vec<f32>, Error> {
    let ranges: Vec<_> = params
        .list
        .iter()
        .enumerate()
        .map(|(i, p)| (p, shards.range(i, rank)))
        .filter(|(_, r)| !r.is_empty())
        .map(|(p, r)| (p.value.block(), ((p.value.offset() + r.start) * 4) as u64, (r.len() * 4) as u64))
        .collect();
    let bytes = rt.download(&ranges)?.finish()?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}

impl Trainer {
    /// Parameter `i`'s optimizer state on the host, whole (gathered from the ranks'
    /// shards above stage 0): (first moment or momentum, second moment for AdamW).
    pub(super) fn optimizer_state_host(&self, i: usize) -> Result<Option<HostState>, Error> {
        let adam = matches!(self.opt.rule, Rule::AdamW(_));
        if let Some(w) = self.world.as_ref().filter(|w| !w.offload.is_empty()) {
            let (mut m_all, mut v_all, mut any) = (Vec::new(), Vec::new(), false);
            for host in &w.offload {
                if let Some(Some((m, v))) = host.state.get(i) {
                    any = true;
                    m_all.extend_from_slice(m);
                    v_all.extend_from_slice(v);
                }
            }
            return Ok(any.then_some((m_all, adam.then_some(v_all))));
        }
        let mut sources: Vec<(&Runtime, &Optimizer)> = vec![(&self.rt, &self.opt)];
        if let Some(w) = self.world.as_ref().filter(|w| w.zero > 0) {
            sources.extend(w.peers.iter().map(|p| (&*p.rt, &p.opt)));
        }
        let (mut m_all, mut v_all, mut any) = (Vec::new(), Vec::new(), false);
        for (rt, opt) in sources {
            if let Some(Some((m, v))) = opt.state.get(i) {
                any = true;
                m_all.extend(m.to_f32_vec(rt)?);
                if adam {
                    v_all.extend(v.to_f32_vec(rt)?);
                }
            }
        }
        Ok(any.then_some((m_all, adam.then_some(v_all))))
    }

    /// Installs parameter `i`'s whole optimizer state on every rank (each rank's shard
    /// of it above stage 0).
    pub(super) fn place_optimizer_state(&mut self, i: usize, m: &[f32], v: Option<&[f32]>) -> Result<(), Error> {
        let p = &self.params.list[i];
        let names = self.opt.state_names(&p.name);
        let shape = p.value.shape().to_vec();
        let zero = self.world.as_ref().map_or(0, |w| w.zero);
        let world = self.world_size();
        if let Some(w) = self.world.as_mut().filter(|w| !w.offload.is_empty()) {
            for (rank, host) in w.offload.iter_mut().enumerate() {
                let r = crate::parallel::shard_range(m.len(), rank, world);
                if host.state.len() <= i {
                    host.state.resize_with(i + 1, || None);
                }
                host.state[i] = (!r.is_empty()).then(|| (m[r.clone()].to_vec(), v.map(|v| v[r].to_vec()).unwrap_or_default()));
            }
            return Ok(());
        }
        let mut targets: Vec<(&Runtime, &mut Optimizer)> = vec![(&self.rt, &mut self.opt)];
        if let Some(w) = &mut self.world {
            targets.extend(w.peers.iter_mut().map(|p| (&*p.rt, &mut p.opt)));
        }
        for (rank, (rt, opt)) in targets.into_iter().enumerate() {
            let (range, shape) = if zero == 0 {
                (0..m.len(), shape.clone())
            } else {
                let r = crate::parallel::shard_range(m.len(), rank, world);
                let len = r.len();
                (r, vec![len])
            };
            if opt.state.len() <= i {
                opt.state.resize_with(i + 1, || None);
            }
            if range.is_empty() {
                opt.state[i] = None;
                continue;
            }
            let mt = Tensor::from_f32(rt, &m[range.clone()], &shape, Category::OptimizerState, &names[0])?;
            let vt = match v {
                Some(v) => Tensor::from_f32(rt, &v[range], &shape, Category::OptimizerState, &names[1])?,
                None => mt.clone(),
            };
            opt.state[i] = Some((mt, vt));
        }
        Ok(())
    }

    /// Gives every rank rank 0's weights and optimizer step count (after a restore).
    pub(super) fn share_weights(&mut self) -> Result<(), Error> {
        let Some(w) = &mut self.world else { return Ok(()) };
        for (i, p) in self.params.list.iter().enumerate() {
            let host = p.value.to_f32_vec(&self.rt)?;
            for peer in &mut w.peers {
                let q = &mut peer.params.list[i];
                q.value = Tensor::from_f32(&peer.rt, &host, p.value.shape(), Category::Parameter, &p.name)?;
            }
        }
        w.offload.iter_mut().for_each(|h| h.state.clear());
        for peer in &mut w.peers {
            peer.opt.step = self.opt.step;
            peer.opt.state = (0..peer.params.list.len()).map(|_| None).collect();
        }
        Ok(())
    }
}
