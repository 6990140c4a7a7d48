//! DDP's reducer for a multi-device step: gradients gathered into buckets in the order
//! backward finishes them; each full bucket's copy to the host is started at once and
//! handed to the rank's transfer thread, which waits for it, exchanges the bucket with
//! the other ranks, sums in rank order (data parallel: the whole bucket, the same bits
//! on every rank; sharded stages: this rank's part) and copies the sums back to the
//! device, while backward goes on. The bucket's copies land in host vectors of the
//! device's pinned memory (`device::host_vec`), which the other ranks read where they
//! lie, and the sums are copied to the device from one: the device's copies alone.
//! Every allocation and free stays on the rank's own thread, in program order, so the
//! memory record (and the estimate) is the same from run to run.
//!
//! May call: `autograd`, `device`, `error`, `kernels`, `memory`, `parallel`, `runtime`,
//! `tensor`, `train::world`. Called by: `train::parallel`.

use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};

use crate::autograd::{Param, Params};
use crate::device::Gpu;
use crate::device::host_vec::HostVec;
use crate::device::staging::take_f32;
use crate::device::transfer::HostDownload;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::parallel::collective::sum_range;
use crate::parallel::{Collective, Comm};
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};
use crate::train::world::StepPlan;

/// Another process's values (MPI) in a plain vector from the staging pool, whose pages
/// are mapped already.
impl crate::parallel::collective::Received for HostVec {
    fn received(values: &[f32]) -> HostVec {
        let mut v = take_f32(values.len());
        crate::parallel::collective::copy_parallel(values, &mut v);
        HostVec::plain(v)
    }
}

/// A bucket on its way: the copy of its gradients, and where each sum goes.
pub(in crate::train) struct Job {
    download: HostDownload,
    /// Per parameter of the bucket: its index, its element count, whether this rank
    /// has a gradient for it (in the download) and the part of it this rank sums.
    entries: Vec<Entry>,
    /// Where the sums go on the device, in entry order (none under offload).
    targets: Vec<(wgpu::Buffer, u64, u64)>,
}

/// What the transfer thread hands back: the reduced shard gradients kept on the host
/// (offload), by parameter.
pub(in crate::train) type HostGrads = Vec<Option<Vec<f32>>>;

/// Runs on a rank's transfer thread until the reducer is done: each bucket exchanged,
/// summed and written back through `gpu` (none on the estimate's dry run), or kept on
/// the host under offload.
pub(in crate::train) fn transfer(
    jobs: Receiver<Job>,
    comm: &Comm,
    gpu: Option<Arc<Gpu>>,
    plan: &StepPlan,
    n_params: usize,
) -> Result<HostGrads, Error> {
    let offload = plan.offload;
    let mut host: HostGrads = (0..n_params).map(|_| None).collect();
    let mut times = [0.0f64; 4];
    let mut clock = std::time::Instant::now();
    let mut lap = |slot: usize, times: &mut [f64; 4]| {
        times[slot] += clock.elapsed().as_secs_f64() * 1e3;
        clock = std::time::Instant::now();
    };
    let mut moved = 0u64;
    let host_vec = |n: usize| HostVec::on(gpu.as_deref(), n);
    for job in jobs {
        lap(3, &mut times);
        moved += job.download.len();
        // The bucket as every rank lays it out: zeros where this rank has no gradient.
        let total = job.entries.iter().map(|e| e.1).sum();
        let got = job.download.finish()?;
        lap(0, &mut times);
        let flat = if job.entries.iter().all(|e| e.2) {
            got
        } else {
            let mut flat = host_vec(total);
            let (mut at, mut from) = (0, 0);
            for &(_, numel, has, _) in &job.entries {
                if has {
                    flat[at..at + numel].copy_from_slice(&got[from..from + numel]);
                    from += numel;
                } else {
                    flat[at..at + numel].fill(0.0);
                }
                at += numel;
            }
            flat
        };
        if plan.zero == 0 && comm.across_processes() {
            // Over MPI: the sum lands in this rank's own vector, which its device copies
            // from (in rank order, the one-process group's bits).
            let mut flat = flat;
            comm.all_reduce_sum(&mut flat)?;
            lap(1, &mut times);
            if let Some(gpu) = &gpu {
                let ranges: Vec<_> = job.targets.iter().map(|(b, o, l)| (b, *o, *l)).collect();
                gpu.upload_host(&ranges, flat)?;
            }
            lap(2, &mut times);
            continue;
        }
        if plan.zero > 0 && comm.across_processes() {
            // Over MPI: each rank receives only the parts it owns, and sums them.
            let owned = |rank: usize| -> Vec<Range<usize>> {
                let mut start = 0;
                job.entries
                    .iter()
                    .map(|&(i, numel, _, _)| {
                        let r = plan.shards.range(i, rank);
                        start += numel;
                        start - numel + r.start..start - numel + r.end
                    })
                    .collect()
            };
            let mut sums = host_vec(job.entries.iter().map(|e| e.3.len()).sum());
            comm.reduce_scatter_ranges(&flat, &owned, &mut sums)?;
            drop(flat);
            lap(1, &mut times);
            let mut at = 0;
            for (i, _, _, r) in &job.entries {
                if offload && !r.is_empty() {
                    let mut kept = take_f32(r.len());
                    kept.copy_from_slice(&sums[at..at + r.len()]);
                    host[*i] = Some(kept);
                }
                at += r.len();
            }
            if let Some(gpu) = gpu.as_ref().filter(|_| !offload) {
                let ranges: Vec<_> = job.targets.iter().map(|(b, o, l)| (b, *o, *l)).collect();
                gpu.upload_host(&ranges, sums)?;
            }
            lap(2, &mut times);
            continue;
        }
        // The other ranks read this rank's vector where it lies (pinned memory too).
        let all = comm.all_gather(flat)?;
        lap(1, &mut times);
        if let Some((r, v)) = all.iter().enumerate().find(|(_, v)| v.len() != all[0].len()) {
            return Err(Error::invalid(
                "gradient bucket",
                format!("rank {r} sent {} gradient elements where rank 0 sent {}", v.len(), all[0].len()),
            ));
        }
        let ranges: Vec<_> = job.targets.iter().map(|(b, o, l)| (b, *o, *l)).collect();
        if plan.zero == 0 {
            // Data parallel: every rank sums the whole bucket in rank order (the same
            // bits on every rank) into its own host vector, which its device copies from.
            let mut sums = host_vec(total);
            sum_range(&all, 0..total, &mut sums);
            drop(all);
            if let Some(gpu) = &gpu {
                gpu.upload_host(&ranges, sums)?;
            }
        } else {
            // This rank's part of each parameter, summed in rank order, end to end.
            let mut sums = host_vec(job.entries.iter().map(|e| e.3.len()).sum());
            let (mut start, mut at) = (0, 0);
            for (i, numel, _, r) in &job.entries {
                let dst = &mut sums[at..at + r.len()];
                sum_range(&all, start + r.start..start + r.end, dst);
                if offload && !r.is_empty() {
                    let mut kept = take_f32(dst.len());
                    kept.copy_from_slice(dst);
                    host[*i] = Some(kept);
                }
                start += numel;
                at += r.len();
            }
            drop(all);
            if let Some(gpu) = gpu.as_ref().filter(|_| !offload) {
                gpu.upload_host(&ranges, sums)?;
            }
        }
        lap(2, &mut times);
    }
    if timing() {
        eprintln!(
            "{{\"rank\": {}, \"transfer\": {{\"download_ms\": {:.1}, \"exchange_ms\": {:.1}, \"sum_upload_ms\": {:.1}, \"idle_ms\": {:.1}, \"bytes\": {moved}}}}}",
            comm.rank(),
            times[0],
            times[1],
            times[2],
            times[3]
        );
    }
    Ok(host)
}

/// Per parameter of a bucket: its index, its element count, whether this rank has a
/// gradient for it and the part of it this rank sums.
type Entry = (usize, usize, bool, Range<usize>);

/// Whether `WGTRAIN_PARALLEL_TIMES` asks for each rank's host timings of each step on
/// stderr (a diagnostic of the transfer path).
pub(in crate::train) fn timing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("WGTRAIN_PARALLEL_TIMES").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// The rank's side: buckets filled from backward's hook, handed to the transfer thread.
pub(in crate::train) struct Reducer<'a> {
    plan: &'a StepPlan<'a>,
    rank: usize,
    jobs: Option<Sender<Job>>,
    /// (parameter, its gradient if this rank made one, its shape, its name).
    pending: Vec<(usize, Option<Tensor>, Vec<usize>, String)>,
    pending_bytes: usize,
    seen: Vec<bool>,
    /// Whole gradients (stages 0, 1) being reduced in place, put back at the end.
    reduced: Vec<Option<Tensor>>,
    /// Shard gradients (stage 2) the sums are written into.
    pub(in crate::train) shard_grads: Vec<Option<Tensor>>,
}

impl<'a> Reducer<'a> {
    pub(in crate::train) fn new(plan: &'a StepPlan<'a>, rank: usize, n: usize, jobs: Sender<Job>) -> Reducer<'a> {
        Reducer {
            plan,
            rank,
            jobs: Some(jobs),
            pending: Vec::new(),
            pending_bytes: 0,
            seen: vec![false; n],
            reduced: (0..n).map(|_| None).collect(),
            shard_grads: (0..n).map(|_| None).collect(),
        }
    }

    /// A parameter's gradient is final on this rank: into the bucket with it.
    pub(in crate::train) fn ready(&mut self, rt: &Runtime, i: usize, p: &mut Param) -> Result<(), Error> {
        if std::mem::replace(&mut self.seen[i], true) {
            return Ok(());
        }
        self.pending_bytes += self.plan.shards.numels[i] * 4;
        self.pending.push((i, p.grad.take(), p.value.shape().to_vec(), p.name.clone()));
        if self.pending_bytes >= self.plan.bucket_bytes {
            self.flush(rt)?;
        }
        Ok(())
    }

    /// Parameters backward never reported (unused, or no backward on an empty share),
    /// then the last bucket; closes the transfer thread's queue.
    pub(in crate::train) fn finish(&mut self, rt: &Runtime, params: &mut Params) -> Result<(), Error> {
        for (i, p) in params.list.iter_mut().enumerate() {
            self.ready(rt, i, p)?;
        }
        self.flush(rt)?;
        self.jobs = None;
        Ok(())
    }

    /// Closes the transfer thread's queue (also when the step failed on the way).
    pub(in crate::train) fn close(&mut self) {
        self.jobs = None;
    }

    /// Once the transfer thread is done: the reduced whole gradients go back into
    /// `params`.
    pub(in crate::train) fn restore(&mut self, params: &mut Params) {
        for (p, g) in params.list.iter_mut().zip(&mut self.reduced) {
            p.grad = g.take();
        }
    }

    /// Starts the bucket's copy to the host and hands it to the transfer thread; the
    /// tensors the sums will land in are made (stage 2) or kept (stages 0, 1) here.
    fn flush(&mut self, rt: &Runtime) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(self.pending.len());
        let mut sources = Vec::new();
        let mut dests: Vec<(Tensor, u64, u64)> = Vec::new();
        for (i, g, shape, name) in self.pending.drain(..) {
            let numel = self.plan.shards.numels[i];
            // Each rank sums its part (at stage 0 too, where the parts are then
            // exchanged).
            let r = self.plan.shards.range(i, self.rank);
            let g = match g {
                Some(t) if !(t.is_contiguous() && t.offset() == 0) => Some(t.contiguous(rt)?),
                other => other,
            };
            entries.push((i, numel, g.is_some(), r.clone()));
            if let Some(t) = &g {
                sources.push(t.clone());
            }
            if self.plan.offload {
                continue;
            }
            let label = format!("{name}.grad");
            match self.plan.zero {
                0 | 1 => {
                    // The sum lands in this rank's own gradient (its whole or its shard).
                    let t = match g {
                        Some(t) => t,
                        None => Tensor::full(rt, &shape, DType::F32, 0.0, Category::Gradient, &label)?,
                    };
                    if self.plan.zero == 0 && numel > 0 {
                        dests.push((t.clone(), 0, (numel * 4) as u64));
                    } else if self.plan.zero == 1 && !r.is_empty() {
                        dests.push((t.clone(), (r.start * 4) as u64, (r.len() * 4) as u64));
                    }
                    self.reduced[i] = Some(t);
                }
                _ => {
                    if !r.is_empty() {
                        let t = Tensor::empty(rt, &[r.len()], DType::F32, Category::Gradient, &format!("{label}.shard"))?;
                        dests.push((t.clone(), 0, (r.len() * 4) as u64));
                        self.shard_grads[i] = Some(t);
                    }
                }
            }
        }
        let ranges: Vec<_> = sources.iter().map(|t| (t.block(), 0u64, (t.numel() * 4) as u64)).collect();
        let download = rt.download_host(&ranges)?;
        // Stage 2 and offload: the whole gradients go now (the copy was recorded first).
        drop(sources);
        let targets = dests
            .iter()
            .map(|(t, o, l)| rt.target(t.block(), *o, *l))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        drop(dests);
        self.pending_bytes = 0;
        let job = Job {
            download,
            entries,
            targets,
        };
        match &self.jobs {
            Some(tx) => tx
                .send(job)
                .map_err(|_| Error::invalid("gradient reduction", "the transfer thread stopped")),
            None => Err(Error::invalid("gradient reduction", "a bucket after the last")),
        }
    }
}
