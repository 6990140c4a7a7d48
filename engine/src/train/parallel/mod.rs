//! One run over several devices (`[parallel]`): data parallel with ZeRO stages 0-3.
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
//!   only shard gradients remain;
//! - zero 3: as 2, and the weights too are kept as shards between uses
//!   (`train::zero3`: the tapes gather each parameter whole when the model asks).
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

pub mod join;
pub mod reducer;
pub mod shard_state;
pub mod zero3;

use std::sync::Arc;

use crate::autograd::{Gather, Param, Params, Tape};
use crate::data::HostBatch;
use crate::device::host_vec::HostVec;
use crate::device::staging::{concat_into, give_f32, scale_all, square_sum, take_f32};
use crate::error::Error;
use crate::optim::{HostOptimizer, Optimizer, clip_coef, grad_square_sum, scale_grads};
use crate::parallel::{Collective, Comm, Shards};
use crate::runtime::Runtime;
use crate::tensor::Tensor;
use crate::train::error::TrainError;
use crate::train::model::Trainable;
use crate::train::parallel::reducer::{Reducer, timing, transfer};
use crate::train::parallel::zero3::{ShardGather, refresh_host_weights};
use crate::train::step::{read_losses, split_batch};
use crate::train::trainer::Trainer;
use crate::train::world::{BnSync, StepPlan};

/// A rank's host shards of every parameter (stage 3), one vector per parameter.
type Shards3 = Vec<Vec<f32>>;

/// A rank's loss, whether it skipped the update, and (stage 3) its updated shards
/// end to end.
type RankOutcome = (f64, bool, Option<Vec<f32>>);

/// What a rank's thread borrows for a step.
struct Rank<'a> {
    rt: &'a Arc<Runtime>,
    model: &'a dyn Trainable,
    params: &'a mut Params,
    opt: &'a mut Optimizer,
    host: Option<&'a mut HostOptimizer>,
    /// Stage 3: where its tapes gather parameters from.
    gather: Option<Arc<dyn Gather>>,
    /// Parameters offloaded: its shards, which live on the host only.
    host_weights: Option<Arc<Shards3>>,
}

impl Trainer {
    /// One step over every device: returns the batch's mean loss and whether the update
    /// was skipped (fp16-mixed, an inf or NaN gradient on any device).
    pub(in crate::train) fn parallel_step(&mut self, batch: &HostBatch, lr: f32) -> Result<(f64, bool), TrainError> {
        let mode = self.step_mode();
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
        let started = std::time::Instant::now();
        let world = world.as_mut().expect("a parallel step has a world");
        // Every rank's share of the batch; this process steps its own ranks' shares.
        let n = world.size;
        let per = batch.examples.div_ceil(n).max(1);
        let mut parts = split_batch(batch, per);
        parts.resize_with(n, || {
            std::borrow::Cow::Owned(HostBatch {
                position: batch.position,
                ..HostBatch::default()
            })
        });
        let parts = &parts[world.base_rank..world.base_rank + world.comms.len()];
        if world.bn.is_some() {
            // SyncBatchNorm exchanges inside every micro-batch's forward and backward:
            // every rank must run as many.
            let pieces = |p: &HostBatch| match config.train.micro_batch_size {
                Some(m) if m > 0 => p.examples.div_ceil(m),
                _ => usize::from(p.examples > 0),
            };
            if parts.iter().any(|p| pieces(p) != pieces(&parts[0]) || p.examples == 0) {
                return Err(TrainError::Config(crate::train::config::ConfigError::Invalid(format!(
                    "parallel.sync_batch_norm: a batch of {} examples over {n} devices gives them unequal micro-batch counts; use a train.batch_size (and micro_batch_size) that splits evenly",
                    batch.examples
                ))));
            }
        }
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
            mode,
            half: config.memory.precision == crate::train::config::Precision::Fp16Mixed,
            started,
            bn: world.bn.as_ref().map(|(_, c)| c.as_slice()),
            grad_norm: std::sync::Mutex::new(None),
            update_sums: config.train.log_update_ratio.then(|| std::sync::Mutex::new(None)),
        };
        let mut hosts = world.offload.iter_mut().map(Some).collect::<Vec<_>>();
        hosts.resize_with(n, || None);
        let mut hosts = hosts.into_iter();
        // Stage 3: each rank's tape gathers parameters from the host's whole weights.
        let (shapes, whole) = (world.shapes.clone(), world.host_whole.clone());
        let gather = |rt: &Arc<Runtime>| -> Option<Arc<dyn Gather>> {
            (world.zero >= 3).then(|| {
                Arc::new(ShardGather {
                    rt: rt.clone(),
                    whole: whole.clone(),
                    shapes: shapes.clone(),
                }) as Arc<dyn Gather>
            })
        };
        let mut ranks = vec![Rank {
            rt,
            model: &**model,
            params,
            opt,
            host: hosts.next().flatten(),
            gather: gather(rt),
            host_weights: world.offload_params.then(|| world.host_shards[0].clone()),
        }];
        for (k, p) in world.peers.iter_mut().enumerate() {
            let g = gather(&p.rt);
            let host_weights = world.offload_params.then(|| world.host_shards[k + 1].clone());
            ranks.push(Rank {
                rt: &p.rt,
                model: &*p.model,
                params: &mut p.params,
                opt: &mut p.opt,
                host: hosts.next().flatten(),
                gather: g,
                host_weights,
            });
        }
        // Only the ranks' gathers hold the whole weights now: after the step they are
        // rewritten in place.
        drop(whole);
        let results: Vec<Result<RankOutcome, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .zip(parts)
                .zip(&world.comms)
                .enumerate()
                .map(|(local, ((rank, part), comm))| {
                    let plan = &plan;
                    s.spawn(move || {
                        let out = rank_step(rank, part, comm, plan);
                        if let Err(e) = &out {
                            comm.abort(&e.to_string());
                            if let Some(bn) = plan.bn {
                                bn[local].abort(&e.to_string());
                            }
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
        self.grad_norm = plan.grad_norm.lock().unwrap_or_else(|e| e.into_inner()).take();
        let sums = plan
            .update_sums
            .as_ref()
            .and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.update_ratio = sums.map(|s| crate::train::step::update_ratios(&self.params, &s));
        let mut loss = 0.0f64;
        let mut skipped = false;
        let mut first_error = None;
        let mut shards = Vec::new();
        for r in results {
            match r {
                Ok((l, s, mine)) => {
                    loss += l;
                    skipped |= s;
                    shards.extend(mine);
                }
                // The rank that failed says why; the others only say that they stopped.
                Err(e) if first_error.is_none() || is_abort(first_error.as_ref()) => first_error = Some(e),
                Err(_) => {}
            }
        }
        if let Some(e) = first_error {
            if let Some(g) = &world.group {
                g.reset();
            }
            if let Some((Some(g), _)) = &world.bn {
                g.reset();
            }
            self.params.zero_grad();
            for p in &mut world.peers {
                p.params.zero_grad();
            }
            return Err(e.into());
        }
        if world.comms.len() < n {
            // Over MPI: the batch's loss is every process's ranks' losses, summed in
            // rank order.
            loss = world.comms[0]
                .sum_f64(loss)
                .map_err(|e| Error::invalid("parallel step", e.to_string()))?;
        }
        if !shards.is_empty() {
            refresh_host_weights(world, shards)?;
        }
        if timing() {
            eprintln!("{{\"step_done_ms\": {:.1}}}", started.elapsed().as_secs_f64() * 1e3);
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
fn rank_step(rank: Rank, part: &HostBatch, comm: &Comm, plan: &StepPlan) -> Result<RankOutcome, Error> {
    let Rank {
        rt,
        model,
        params,
        opt,
        host,
        gather,
        host_weights,
    } = rank;
    let n_params = params.list.len();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut reducer = Reducer::new(plan, comm.rank(), n_params, tx);
    let mut losses = Vec::new();
    let gpu = rt.runs_kernels().then(|| rt.gpu.clone());
    let clock = plan.started;
    let mut marks = vec![clock.elapsed()];
    // Backward and the buckets' exchanges overlap: this thread records, the transfer
    // thread waits for each bucket's copy and reduces it.
    let host_grads = std::thread::scope(|s| -> Result<_, Error> {
        let worker = s.spawn(|| {
            let out = transfer(rx, comm, gpu, plan, n_params);
            if let Err(e) = &out {
                comm.abort(&e.to_string());
            }
            out
        });
        let recorded = forward_backward(rt, model, params, (part, comm.rank()), plan, gather, &mut reducer, &mut losses);
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
    let mut new_shards = None;
    let skipped = if let Some(host) = host {
        let (skipped, mine) = update_on_host(rt, params, opt, host, host_grads, host_weights, comm, plan)?;
        new_shards = mine;
        skipped
    } else if plan.zero == 0 {
        update(rt, params, opt, comm, plan)?
    } else {
        let shard = shard_params(params, &mut reducer, plan, comm.rank())?;
        let skipped = update(rt, &shard, opt, comm, plan)?;
        drop(shard);
        rt.phase("gather");
        if plan.zero >= 3 {
            // The shards stay sharded; the host copy the next gathers read is refreshed.
            let flat = read_shards(rt, params, plan, comm.rank())?;
            new_shards = Some(flat);
        } else {
            gather_params(rt, params, plan.shards, comm, None)?;
        }
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
            "{{\"rank\": {}, \"marks_ms\": {{\"rank_started\": {}, \"backward_recorded\": {}, \"reduce_queued\": {}, \"reduced\": {}, \"updated\": {}, \"loss_read\": {}}}}}",
            comm.rank(),
            ms[0],
            ms[1],
            ms[2],
            ms[3],
            ms[4],
            ms[5]
        );
    }
    Ok((loss, skipped, new_shards))
}

/// Forward and backward over this rank's part in micro-batches; the last backward
/// hands each finished gradient to the reducer.
#[allow(clippy::too_many_arguments)]
fn forward_backward(
    rt: &Runtime,
    model: &dyn Trainable,
    params: &mut Params,
    (part, rank): (&HostBatch, usize),
    plan: &StepPlan,
    gather: Option<Arc<dyn Gather>>,
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
            let mut tape = Tape::new()
                .with_mode(plan.mode.fork(&[k as u64, rank as u64]))
                .with_half_matmuls(plan.half)
                .with_grad_prescale(seed)
                .with_gather(gather.clone())
                .with_sync(
                    plan.bn
                        .map(|c| Arc::new(BnSync(c[rank].clone())) as Arc<dyn crate::autograd::SyncStats>),
                );
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
fn update(rt: &Runtime, params: &Params, opt: &mut Optimizer, comm: &Comm, plan: &StepPlan) -> Result<bool, Error> {
    let found = match plan.scaler {
        Some(sc) => sc.unscale(rt, params)?,
        None => false,
    };
    if comm.any(found)? {
        return Ok(true);
    }
    if plan.grad_clip > 0.0 {
        let local = grad_square_sum(rt, params)?;
        // Stage 0: every rank holds the whole sum, so the local norm is the global one.
        let total = if plan.zero == 0 { local } else { comm.sum_f64(local)? };
        *plan.grad_norm.lock().unwrap_or_else(|e| e.into_inner()) = Some(total.sqrt());
        scale_grads(rt, params, clip_coef(total.sqrt() as f32, plan.grad_clip))?;
    }
    if plan.update_sums.is_some() {
        let sums = opt.step_measured(rt, params, plan.lr)?;
        // Stage 0: every rank updates the whole model, so its sums are the model's.
        keep_update_sums(sums, plan.zero > 0, comm, plan)?;
    } else {
        opt.step(rt, params, plan.lr)?;
    }
    Ok(false)
}

/// `train.log_update_ratio`: this rank's per-parameter sums of squares of the update
/// and of the new weights, summed over the ranks when each holds a shard, kept by rank 0.
fn keep_update_sums(sums: Vec<Option<(f64, f64)>>, sharded: bool, comm: &Comm, plan: &StepPlan) -> Result<(), Error> {
    let Some(keep) = &plan.update_sums else { return Ok(()) };
    let sums = if sharded {
        // A parameter counts when any rank's shard of it was updated.
        let flat: Vec<f64> = sums.iter().flat_map(|s| s.map_or([0.0; 3], |(u, w)| [1.0, u, w])).collect();
        let total = comm.sum_f64s(&flat).map_err(|e| Error::invalid("parallel step", e.to_string()))?;
        total.chunks_exact(3).map(|t| (t[0] > 0.0).then_some((t[1], t[2]))).collect()
    } else {
        sums
    };
    if comm.rank() == 0 {
        *keep.lock().unwrap_or_else(|e| e.into_inner()) = Some(sums);
    }
    Ok(())
}

/// This rank's shard of every parameter: views of its weights, with the reduced shard
/// gradients (empty shards have none, so the optimizer passes them by).
fn shard_params(params: &Params, reducer: &mut Reducer, plan: &StepPlan, rank: usize) -> Result<Params, Error> {
    let mut out = Params::default();
    for (i, p) in params.list.iter().enumerate() {
        let r = plan.shards.range(i, rank);
        // Stage 3 holds the shard itself; below, it is a view of the whole weights.
        let value = if plan.zero >= 3 {
            p.value.clone()
        } else {
            p.value.reshape(&[p.value.numel()])?.slice(0, r.start, r.len())?
        };
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
#[allow(clippy::too_many_arguments)]
fn update_on_host(
    rt: &Runtime,
    params: &Params,
    opt: &mut Optimizer,
    host: &mut HostOptimizer,
    mut grads: Vec<Option<Vec<f32>>>,
    host_weights: Option<Arc<Shards3>>,
    comm: &Comm,
    plan: &StepPlan,
) -> Result<(bool, Option<Vec<f32>>), Error> {
    let rank = comm.rank();
    let mut found = false;
    if let Some(sc) = plan.scaler {
        scale_all(grads.iter_mut().flatten(), 1.0 / sc.scale);
        found = !square_sum(grads.iter().flatten().map(|g| &g[..])).is_finite();
    }
    if comm.any(found)? {
        return Ok((true, None));
    }
    if plan.grad_clip > 0.0 {
        let local = square_sum(grads.iter().flatten().map(|g| &g[..]));
        let norm = comm.sum_f64(local)?.sqrt();
        *plan.grad_norm.lock().unwrap_or_else(|e| e.into_inner()) = Some(norm);
        let coef = clip_coef(norm as f32, plan.grad_clip);
        if coef < 1.0 {
            scale_all(grads.iter_mut().flatten(), coef);
        }
    }
    opt.step += 1;
    // The weights to update: from the host when they live there, else read back.
    let mut mine = match &host_weights {
        Some(w) => {
            let pieces: Vec<&[f32]> = w.iter().map(|v| &v[..]).collect();
            let mut mine = take_f32(pieces.iter().map(|p| p.len()).sum());
            concat_into(&mut mine, &pieces);
            mine
        }
        None => read_shards(rt, params, plan, rank)?,
    };
    let mut at = 0;
    let mut sums = Vec::with_capacity(grads.len());
    for (i, g) in grads.iter().enumerate() {
        let r = plan.shards.range(i, rank);
        let w = &mut mine[at..at + r.len()];
        at += r.len();
        // The estimate's dry run has no values to update (and must not hold the state).
        let Some(g) = g.as_ref().filter(|_| rt.runs_kernels()) else {
            sums.push(None);
            continue;
        };
        if plan.update_sums.is_some() {
            let before = w.to_vec();
            host.update(&opt.rule, i, plan.shards.numels[i], w, g, plan.lr, opt.step);
            let change = w.iter().zip(&before).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
            sums.push(Some((change, w.iter().map(|a| (*a as f64).powi(2)).sum())));
        } else {
            host.update(&opt.rule, i, plan.shards.numels[i], w, g, plan.lr, opt.step);
        }
    }
    keep_update_sums(sums, true, comm, plan)?;
    grads.into_iter().flatten().for_each(give_f32);
    rt.phase("gather");
    if host_weights.is_some() {
        return Ok((false, Some(mine)));
    }
    if plan.zero >= 3 {
        // Stage 3: this rank's device shards take the update; the host copy is it.
        let ranges: Vec<_> = params
            .list
            .iter()
            .filter(|p| p.value.numel() > 0)
            .map(|p| (p.value.block(), (p.value.offset() * 4) as u64, (p.value.numel() * 4) as u64))
            .collect();
        rt.upload(&ranges, bytemuck::cast_slice(&mine))?;
        return Ok((false, Some(mine)));
    }
    gather_params(rt, params, plan.shards, comm, Some(mine))?;
    Ok((false, None))
}

/// All-gather of the updated shards: this rank's shards (read back, or `mine` when the
/// host holds them) exchanged and every rank's written into this rank's weights (its
/// own too when they come from the host). The shards read back land in pinned memory of
/// this rank's device, which the other ranks read where it lies, and the others' are
/// laid end to end in another, which the device copies from (`device::host_vec`).
fn gather_params(rt: &Runtime, params: &Params, shards: &Shards, comm: &Comm, mine: Option<Vec<f32>>) -> Result<(), Error> {
    let rank = comm.rank();
    let from_host = mine.is_some();
    let mine = match mine {
        Some(v) => HostVec::plain(v),
        None => {
            let ranges: Vec<_> = params
                .list
                .iter()
                .enumerate()
                .map(|(i, p)| (p, shards.range(i, rank)))
                .filter(|(_, r)| !r.is_empty())
                .map(|(p, r)| (p.value.block(), ((p.value.offset() + r.start) * 4) as u64, (r.len() * 4) as u64))
                .collect();
            rt.download_host(&ranges)?.finish()?
        }
    };
    let all = comm.all_gather(mine)?;
    // Every other rank's shards (and this rank's own when they come from the host),
    // in one upload: each rank's vector is its shards end to end.
    let mut ranges = Vec::new();
    let mut pieces: Vec<&[f32]> = Vec::new();
    for (other, theirs) in all.iter().enumerate() {
        if other == rank && !from_host {
            continue;
        }
        let mut need = 0;
        for (i, p) in params.list.iter().enumerate() {
            let r = shards.range(i, other);
            if !r.is_empty() {
                ranges.push((p.value.block(), ((p.value.offset() + r.start) * 4) as u64, (r.len() * 4) as u64));
                need += r.len();
            }
        }
        let values = theirs
            .get(..need)
            .ok_or_else(|| Error::invalid("all-gather", format!("rank {other} sent too few weights")))?;
        pieces.push(values);
    }
    let mut data = rt.host_vec(pieces.iter().map(|p| p.len()).sum());
    concat_into(&mut data, &pieces);
    drop(pieces);
    drop(all);
    rt.upload_host(&ranges, data)
}

/// This rank's shard of every parameter's weights, end to end, in one download.
fn read_shards(rt: &Runtime, params: &Params, plan: &StepPlan, rank: usize) -> Result<Vec<f32>, Error> {
    let ranges: Vec<_> = params
        .list
        .iter()
        .enumerate()
        // Stage 3's weights are the shards themselves (from element 0).
        .map(|(i, p)| {
            (
                p,
                if plan.zero >= 3 {
                    0..p.value.numel()
                } else {
                    plan.shards.range(i, rank)
                },
            )
        })
        .filter(|(_, r)| !r.is_empty())
        .map(|(p, r)| (p.value.block(), ((p.value.offset() + r.start) * 4) as u64, (r.len() * 4) as u64))
        .collect();
    Ok(rt.download(&ranges)?.finish_f32()?)
}
