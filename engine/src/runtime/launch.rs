//! The runtime: the device, its allocator, the pipeline cache and the recorder that
//! every launch goes through. The only place that records and submits GPU work.
//!
//! Ordering: launches are recorded into one encoder and submitted at a flush, while
//! queue writes (uploads, guard fills) land at the start of the *next* submission,
//! before launches recorded earlier. A freed block can be reused at once, so every host
//! write and read goes through [`Runtime::write`] and [`Runtime::read`], which submit
//! what is recorded first; the test
//! `uploads_into_a_reused_block_do_not_overtake_pending_launches` pins this down.
//!
//! Launches are checked on the host (shader modules have no runtime bounds checks):
//! the kernel layer checks what each kernel indexes; here the binding count and the
//! parameter size are checked against the kernel.
//!
//! May call: `device`, `memory`, `error`, `runtime::{cache, record}`. Called by:
//! `tensor`, the kernel layer, bench.

use std::sync::{Arc, Mutex, MutexGuard};

use super::cache::{Kernel, KernelKey, MAX_STORAGE_BINDINGS, PARAM_SLOT, PipelineCache};
use super::profile::{StepTrace, Work};
use super::record::{DeviceRecorder, DryRecorder, Elapsed, LaunchMeta, Recorder};
use crate::device::host_vec::HostVec;
use crate::device::transfer::{Download, HostDownload};
use crate::device::{DeviceError, Gpu};
use crate::error::Error;
use crate::memory::{Allocator, AllocatorOptions, Block};

/// The most workgroups along one dispatch dimension.
pub const MAX_GROUPS_X: u32 = 65535;

/// Splits `groups` workgroups into an (x, y) grid within the per-dimension limit;
/// kernels recover the linear index as `wid.x + wid.y * num_workgroups.x` and return
/// past `groups`. The rows are as even as they can be, so fewer than `y` workgroups of
/// the grid are past `groups` (65,537 took 65,538, not 131,070 as full rows of 65,535).
pub fn grid(groups: u32) -> [u32; 3] {
    if groups <= MAX_GROUPS_X {
        [groups.max(1), 1, 1]
    } else {
        let rows = groups.div_ceil(MAX_GROUPS_X);
        [groups.div_ceil(rows), rows, 1]
    }
}

/// Checks a launch's binding count and parameter size against its kernel.
fn launchable(kernel: &Kernel, params: &[u8], bindings: usize) -> Result<(), Error> {
    if bindings != kernel.storage_bindings || bindings == 0 || params.len() as u64 > PARAM_SLOT {
        return Err(Error::invalid(
            "launch",
            format!(
                "{bindings} bindings and {} parameter bytes for a kernel of {} bindings and {PARAM_SLOT} parameter bytes",
                params.len(),
                kernel.storage_bindings
            ),
        ));
    }
    Ok(())
}

/// What a launch binds: anything that lives in an allocator block (a tensor).
pub trait Bound {
    /// The block bound whole (at its offset, with its size).
    fn block(&self) -> &Block;
}

/// Launches held back so that several are recorded as one (the column sums of
/// `kernels::col_sums`): the runtime records them before any launch that binds a block
/// they read or write, before any transfer, read or wait, before an allocation that
/// would raise the peak, and when asked ([`Runtime::settle`]: the tape does at the end of
/// backward). What they hold stays allocated until then, on the dry run as on the
/// device, so the estimate sees the same peak.
pub trait Deferred: Send {
    /// Whether `block` overlaps a block the held launches read or write.
    fn touches(&self, block: &Block) -> bool;
    /// Records the held launches (the runtime has taken them out of its slot).
    fn record(self: Box<Self>, rt: &Runtime) -> Result<(), Error>;
    /// For [`Runtime::defer`]'s look at its own kind.
    fn as_any(&mut self) -> &mut dyn std::any::Any;
}

/// Whether blocks `a` and `b` share a byte of one page.
pub fn overlap(a: &Block, b: &Block) -> bool {
    a.page() == b.page() && a.offset() < b.offset() + b.size() && b.offset() < a.offset() + a.size()
}

/// Variants forced for benchmarks and tests, through the runtime (never the
/// environment): production runs leave them empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelOverrides {
    /// The register-tiled attention's tuning spec (`kernels::flash_attention_tiled`:
    /// e.g. `fwd=64x64x4p,q=64x32x4p,kv=lane`, `unroll`, or `off`); empty: the plan's
    /// own choice.
    pub attention_tiles: String,
}

/// The device, its allocator and the kernel machinery: what every op takes.
pub struct Runtime {
    /// The device.
    pub gpu: Arc<Gpu>,
    /// The allocator every tensor lives in.
    pub alloc: Allocator,
    cache: Arc<PipelineCache>,
    recorder: Mutex<Box<dyn Recorder>>,
    // Whether launches run (not a dry run's recorder): read at every kernel lookup.
    runs: bool,
    timestamps: bool,
    profiling: std::sync::atomic::AtomicBool,
    overrides: KernelOverrides,
    deferred: Mutex<Option<Box<dyn Deferred>>>,
    // Whether `deferred` holds anything (read at every launch without the lock).
    holding: std::sync::atomic::AtomicBool,
}

impl Runtime {
    /// A runtime on `gpu` with a fresh allocator. With `options.dry` it is the memory
    /// estimate's dry run: the allocator keeps its books only and launches are dropped.
    pub fn new(gpu: Arc<Gpu>, options: AllocatorOptions) -> Result<Runtime, Error> {
        Runtime::with_cache(gpu, options, Arc::default())
    }

    /// A dry runtime (the estimate's) on this runtime's device that shares its compiled
    /// pipelines: what the estimate compiles, the run reuses, and the other way round.
    pub fn dry_beside(&self) -> Result<Runtime, Error> {
        let options = AllocatorOptions {
            debug: Some(false),
            cap: None,
            dry: true,
        };
        let mut dry = Runtime::with_cache(self.gpu.clone(), options, self.cache.clone())?;
        dry.overrides = self.overrides.clone();
        Ok(dry)
    }

    /// The variants forced on this runtime (empty in production).
    pub fn overrides(&self) -> &KernelOverrides {
        &self.overrides
    }

    /// Forces variants on this runtime, for benchmarks and tests.
    pub fn set_overrides(&mut self, overrides: KernelOverrides) {
        self.overrides = overrides;
    }

    fn with_cache(gpu: Arc<Gpu>, options: AllocatorOptions, cache: Arc<PipelineCache>) -> Result<Runtime, Error> {
        let dry = options.dry;
        if gpu.stand_in && !dry {
            return Err(crate::device::DeviceError::StandIn(gpu.report.name.clone()).into());
        }
        let alloc = Allocator::new(gpu.clone(), options)?;
        let recorder: Box<dyn Recorder> = if dry {
            Box::new(DryRecorder)
        } else {
            Box::new(DeviceRecorder::new(gpu.clone()))
        };
        Ok(Runtime {
            runs: !dry,
            timestamps: gpu.caps.timestamps && !dry,
            gpu,
            alloc,
            cache,
            recorder: Mutex::new(recorder),
            profiling: std::sync::atomic::AtomicBool::new(false),
            overrides: KernelOverrides::default(),
            deferred: Mutex::new(None),
            holding: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Opens the adapter `selector` names with an allocator configured from the
    /// environment (`WGTRAIN_ALLOC_DEBUG`).
    pub fn open(selector: Option<&str>) -> Result<Runtime, Error> {
        let gpu = Arc::new(Gpu::open(selector)?);
        Runtime::new(gpu, AllocatorOptions::default())
    }

    fn recorder(&self) -> MutexGuard<'_, Box<dyn Recorder>> {
        self.recorder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether launches really run (false for the estimate's dry run).
    pub fn runs_kernels(&self) -> bool {
        self.runs
    }

    /// The compiled variant `key` binding `storage` tensors; `name` (the variant's
    /// readable name, from its family's plan: the profiler's table and trace show it)
    /// and `wgsl` (its source) are called only on the first use of the variant.
    pub fn kernel(
        &self,
        key: KernelKey,
        storage: usize,
        name: impl FnOnce() -> String,
        wgsl: impl FnOnce() -> Result<String, Error>,
    ) -> Result<Arc<Kernel>, Error> {
        self.cache.get(&self.gpu, key, storage, self.runs, name, wgsl)
    }

    /// Records one launch: `params` into the next ring slot, the blocks of `blocks`
    /// bound whole at bindings 1.., `groups` workgroups.
    pub fn launch<T: Bound>(&self, kernel: &Kernel, params: &[u8], blocks: &[&T], groups: [u32; 3]) -> Result<(), Error> {
        self.launch_with_work(kernel, params, blocks, groups, None, blocks.len().saturating_sub(1))
    }

    /// [`Runtime::launch`], telling the profiler the FLOPs the launch does and which
    /// binding it writes (named by that tensor's label; bytes default to the bound
    /// blocks' requested sizes).
    pub fn launch_with_work<T: Bound>(
        &self,
        kernel: &Kernel,
        params: &[u8],
        blocks: &[&T],
        groups: [u32; 3],
        flops: Option<f64>,
        written: usize,
    ) -> Result<(), Error> {
        launchable(kernel, params, blocks.len())?;
        if groups.contains(&0) {
            return Ok(());
        }
        self.settle_touching(blocks)?;
        let bindings: [wgpu::BufferBinding<'_>; MAX_STORAGE_BINDINGS] =
            std::array::from_fn(|i| blocks[i.min(blocks.len() - 1)].block().binding());
        // Only while profiling: the written tensor's label and the work (a pool lookup).
        let meta = self.profiling.load(std::sync::atomic::Ordering::Relaxed).then(|| {
            let out = blocks[written.min(blocks.len() - 1)].block();
            LaunchMeta {
                label: self.alloc.label_of(out).map(Arc::from),
                work: Work {
                    flops: flops.unwrap_or(0.0),
                    bytes: blocks.iter().map(|b| b.block().requested() as f64).sum(),
                },
            }
        });
        self.recorder().record(kernel, params, &bindings[..blocks.len()], groups, meta);
        Ok(())
    }

    /// Records one launch over raw buffer ranges (whole pages, for kernels that index
    /// several tensors of a page through a table they bind too): the caller has checked
    /// every index the kernel makes against the ranges, as for any launch.
    pub fn launch_bindings(
        &self,
        kernel: &Kernel,
        params: &[u8],
        bindings: &[wgpu::BufferBinding<'_>],
        groups: [u32; 3],
    ) -> Result<(), Error> {
        launchable(kernel, params, bindings.len())?;
        if groups.contains(&0) {
            return Ok(());
        }
        // Raw ranges are not blocks: whatever is held goes first.
        self.settle()?;
        let meta = self.profiling.load(std::sync::atomic::Ordering::Relaxed).then(|| LaunchMeta {
            label: None,
            work: Work { flops: 0.0, bytes: 0.0 },
        });
        self.recorder().record(kernel, params, bindings, groups, meta);
        Ok(())
    }

    /// Submits what has been recorded (held launches stay held: see [`Deferred`]).
    pub fn flush(&self) {
        self.recorder().submit();
    }

    fn deferred_slot(&self) -> MutexGuard<'_, Option<Box<dyn Deferred>>> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds a launch back: `f` gets this runtime's held launches of kind `D` (made by
    /// `Default` when none are held; held launches of another kind are recorded first)
    /// and says whether they are to be recorded now (say, when they are as many as one
    /// launch takes).
    pub fn defer<D: Deferred + Default + 'static>(&self, f: impl FnOnce(&mut D) -> Result<bool, Error>) -> Result<(), Error> {
        let mut slot = self.deferred_slot();
        if slot.as_mut().is_some_and(|d| d.as_any().downcast_mut::<D>().is_none()) {
            drop(slot);
            self.settle()?;
            slot = self.deferred_slot();
        }
        let held = slot.get_or_insert_with(|| Box::new(D::default()));
        self.holding.store(true, std::sync::atomic::Ordering::Relaxed);
        let now = f(held.as_any().downcast_mut::<D>().expect("the slot holds D"))?;
        drop(slot);
        if now { self.settle() } else { Ok(()) }
    }

    /// Records the launches held back (see [`Deferred`]) if they read or write any of
    /// `blocks`.
    pub fn settle_touching<T: Bound>(&self, blocks: &[&T]) -> Result<(), Error> {
        if self.holding.load(std::sync::atomic::Ordering::Relaxed) {
            let touched = self
                .deferred_slot()
                .as_ref()
                .is_some_and(|d| blocks.iter().any(|b| d.touches(b.block())));
            if touched {
                self.settle()?;
            }
        }
        Ok(())
    }

    /// Records the launches held back before an allocation of `bytes` that would raise
    /// the peak, so that what they hold never does (the peak is the one it would be
    /// without holding, on the device and in the estimate alike).
    pub fn settle_before_alloc(&self, bytes: u64) -> Result<(), Error> {
        if self.holding.load(std::sync::atomic::Ordering::Relaxed) && self.alloc.would_raise_peak(bytes) {
            self.settle()?;
        }
        Ok(())
    }

    /// Records the launches held back (see [`Deferred`]), if any.
    pub fn settle(&self) -> Result<(), Error> {
        if !self.holding.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let held = self.deferred_slot().take();
        self.holding.store(false, std::sync::atomic::Ordering::Relaxed);
        match held {
            Some(d) => d.record(self),
            None => Ok(()),
        }
    }

    /// Submits and waits for the device to finish.
    pub fn sync(&self) -> Result<(), Error> {
        self.settle()?;
        let mut recorder = self.recorder();
        recorder.submit();
        recorder.wait()
    }

    /// Writes `bytes` (a multiple of 4) at `byte_offset` of `block`, after what is
    /// recorded (see the module's ordering).
    pub fn write(&self, block: &Block, byte_offset: u64, bytes: &[u8]) -> Result<(), Error> {
        self.settle()?;
        self.flush();
        Ok(block.write(byte_offset, bytes)?)
    }

    /// Starts copying byte ranges (block, offset, length) to the host, after what is
    /// recorded; finish it on any thread. A dry runtime's yields zeros.
    pub fn download(&self, ranges: &[(&Block, u64, u64)]) -> Result<Download, Error> {
        let len = ranges.iter().map(|r| r.2).sum();
        self.settle()?;
        self.recorder().before_read();
        let download = self.copy(ranges, || Download::zeros(len), |r| self.gpu.download(r));
        // A download is waited for: the device goes idle (see `record::SUBMIT_FIRST`).
        self.recorder().idle();
        download
    }

    /// Starts copying byte ranges (block, offset, length) into a host vector, straight
    /// into the device's pinned memory where it can (see `Gpu::download_host`), after
    /// what is recorded; finish it on any thread. A dry runtime's yields zeros.
    pub fn download_host(&self, ranges: &[(&Block, u64, u64)]) -> Result<HostDownload, Error> {
        let len = (ranges.iter().map(|r| r.2).sum::<u64>() / 4) as usize;
        self.settle()?;
        self.recorder().before_read();
        let download = self.copy(ranges, || HostDownload::zeros(len), |r| self.gpu.download_host(r));
        self.recorder().idle();
        download
    }

    /// A host vector of `len` values this runtime's device copies into and out of
    /// directly where it can (see `Gpu::host_vec`); zeros on a dry runtime.
    pub fn host_vec(&self, len: usize) -> HostVec {
        HostVec::on(self.runs_kernels().then_some(&*self.gpu), len)
    }

    /// Copies a host vector into byte ranges (block, offset, length) laid end to end,
    /// straight from its memory where it is the device's pinned memory (see
    /// `Gpu::upload_host`), after what is recorded (nothing on a dry runtime).
    pub fn upload_host(&self, ranges: &[(&Block, u64, u64)], data: HostVec) -> Result<(), Error> {
        self.copy(ranges, || (), |r| self.gpu.upload_host(r, data))
    }

    /// Copies `data` into byte ranges (block, offset, length) laid end to end, after
    /// what is recorded (nothing on a dry runtime).
    pub fn upload(&self, ranges: &[(&Block, u64, u64)], data: &[u8]) -> Result<(), Error> {
        self.copy(ranges, || (), |r| self.gpu.upload(r, data))
    }

    /// A transfer of byte ranges (block, offset, length) after what is recorded: `run`
    /// with the ranges' buffers, or `dry` on a dry runtime (which has none).
    fn copy<T>(
        &self,
        ranges: &[(&Block, u64, u64)],
        dry: impl FnOnce() -> T,
        run: impl FnOnce(&[(&wgpu::Buffer, u64, u64)]) -> Result<T, DeviceError>,
    ) -> Result<T, Error> {
        self.settle()?;
        self.flush();
        if !self.runs_kernels() {
            return Ok(dry());
        }
        let raw = ranges
            .iter()
            .map(|&(b, o, l)| self.target(b, o, l).map(|t| t.expect("a runtime that runs has buffers")))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<_> = raw.iter().map(|(b, o, l)| (b, *o, *l)).collect();
        Ok(run(&refs)?)
    }

    /// A byte range of `block` as (buffer, absolute offset, length), checked to lie
    /// inside its request, for copies made on another thread (`Gpu::upload`); None on a
    /// dry runtime, which has no buffers to copy.
    pub fn target(&self, block: &Block, byte_offset: u64, len: u64) -> Result<Option<(wgpu::Buffer, u64, u64)>, Error> {
        if byte_offset + len > block.requested().next_multiple_of(4) {
            return Err(Error::invalid(
                "copy",
                format!(
                    "bytes {byte_offset}..{} outside a {}-byte block",
                    byte_offset + len,
                    block.requested()
                ),
            ));
        }
        if !self.runs_kernels() {
            return Ok(None);
        }
        Ok(Some((block.buffer().clone(), block.offset() + byte_offset, len)))
    }

    /// Reads `block`'s requested bytes back, after what is recorded.
    pub fn read(&self, block: &Block) -> Result<Vec<u8>, Error> {
        self.settle()?;
        self.recorder().before_read();
        self.flush();
        self.recorder().idle();
        Ok(block.read()?)
    }

    /// Starts timing every launch (the profiler); an error where the adapter has no
    /// timestamps, rather than numbers that would be wrong.
    pub fn start_profiling(&self) -> Result<(), Error> {
        if !self.recorder().start_profiling() {
            return Err(Error::invalid(
                "profile",
                format!(
                    "the adapter '{}' grants no GPU timestamps (TIMESTAMP_QUERY), so launches cannot be timed",
                    self.gpu.report.name
                ),
            ));
        }
        self.profiling.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Submits, waits, and returns every launch timed since the last call, in order,
    /// with the host's phase spans.
    pub fn collect_profile(&self) -> Result<StepTrace, Error> {
        self.settle()?;
        self.recorder().collect_profile()
    }

    /// The host enters phase `name` of a step ("forward", "backward", "recompute",
    /// "optimizer", "data wait", "readback"; "" ends the phase): the allocator's events
    /// carry it from now on and, while profiling, so do the launches recorded, and the
    /// profiler keeps the host's span.
    pub fn phase(&self, name: &'static str) {
        self.alloc.set_phase(name);
        if self.profiling.load(std::sync::atomic::Ordering::Relaxed) {
            self.recorder().mark(name);
        }
    }

    /// Stops timing launches.
    pub fn stop_profiling(&self) {
        self.profiling.store(false, std::sync::atomic::Ordering::Relaxed);
        self.recorder().stop_profiling();
    }

    /// Starts metering how long the GPU is busy with the launches recorded from now on
    /// (a begin and an end timestamp per compute pass, which untimed launches share);
    /// false where the adapter has no timestamps or nothing runs.
    pub fn start_meter(&self) -> bool {
        self.recorder().start_meter()
    }

    /// Submits, waits, and returns the seconds the GPU was busy since
    /// [`Runtime::start_meter`] (the union of the passes' spans; none when not metering
    /// or when a step opened more passes than the meter holds); stops metering.
    pub fn take_meter(&self) -> Result<Option<f64>, Error> {
        self.settle()?;
        self.recorder().take_meter()
    }

    /// Stops metering without waiting: the ticket [`Runtime::read_meter`] reads the
    /// span's busy time with later (none when not metering). Metering may start again
    /// at once, for launches recorded while the span still runs.
    pub fn end_meter(&self) -> Result<Option<u64>, Error> {
        self.settle()?;
        Ok(self.recorder().end_meter())
    }

    /// The busy seconds of the span [`Runtime::end_meter`] gave `ticket` for, waiting
    /// for that span alone (none when its passes overflowed the meter).
    pub fn read_meter(&self, ticket: u64) -> Result<Option<f64>, Error> {
        self.recorder().read_meter(ticket)
    }

    /// Whether GPU timestamps are available for [`Runtime::time`].
    pub fn has_timestamps(&self) -> bool {
        self.timestamps
    }

    /// Runs `f` (which records launches) and returns the seconds it took: GPU
    /// timestamps from the first launch's start to the last one's end when granted,
    /// else wall clock around the submission and wait; 0 on the dry run.
    pub fn time(&self, f: impl FnOnce() -> Result<(), Error>) -> Result<f64, Error> {
        self.sync()?;
        let start = std::time::Instant::now();
        self.recorder().begin_timing();
        let result = f().and_then(|()| self.settle());
        let elapsed = self.recorder().end_timing();
        result?;
        Ok(match elapsed? {
            Elapsed::Gpu(seconds) => seconds,
            Elapsed::Wall => {
                self.sync()?;
                start.elapsed().as_secs_f64()
            }
            Elapsed::Nothing => 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_GROUPS_X, grid};

    #[test]
    fn grids_cover_the_groups_with_fewer_spare_workgroups_than_rows() {
        for groups in [1, 2, 65_535, 65_536, 65_537, 131_070, 131_071, 1 << 20, 3 << 24, u32::MAX / 2] {
            let [x, y, z] = grid(groups);
            let all = x as u64 * y as u64;
            assert!(x <= MAX_GROUPS_X && y <= MAX_GROUPS_X && z == 1, "{groups}: {x} x {y}");
            assert!(all >= groups as u64 && all - (groups as u64) < y as u64, "{groups}: {x} x {y}");
        }
        assert_eq!(grid(0), [1, 1, 1]);
        assert_eq!(grid(65_537), [32_769, 2, 1]);
    }
}
