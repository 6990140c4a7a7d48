//! The wgpu side of the allocator: pages as storage buffers created inside an
//! OutOfMemory error scope, RAII blocks that free themselves, the cap, and the debug
//! mode's guard bytes (`WGTRAIN_ALLOC_DEBUG=1`).
//!
//! Guard bytes: in debug mode every block is followed, from the end of its request to
//! the end of the block, by at least [`GUARD_BYTES`] bytes filled with [`GUARD_FILL`].
//! A block is bound whole (see [`Block::binding`]), so a kernel writing past its tensor
//! lands in the guard. The guard is read back when the block is freed and, for every
//! live block, at step end ([`Allocator::end_step`]); an overrun names the block.
//!
//! Dry mode (`AllocatorOptions::dry`, used by the memory estimate): the pool does all
//! its bookkeeping (pages, splits, caps, stats, events) exactly as it would, but pages
//! are not created on the device: every block points into one tiny placeholder buffer,
//! and the block I/O chosen at construction ([`DryIo`] instead of [`QueueIo`]) drops
//! writes and reads zeros. The runtime records no launches then (`runtime::record`).
//!
//! May call: `device`, `memory::oom`, `memory::pool`, `memory::snapshot`,
//! `memory::stats`, `wgtrain_record`.

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};

use wgtrain_record::{AllocId, Category, PageId, format_bytes};

use super::oom::{AllocError, BackendOom};
use super::pool::{PageBackend, Placement, Pool, PoolConfig};
use super::snapshot::MemorySnapshot;
use super::stats::MemoryStats;
use crate::device::{DeviceError, Gpu};

/// Guard bytes after each block in debug mode (at least; the rest of the block too).
pub const GUARD_BYTES: u64 = 64;
/// The byte guards are filled with.
pub const GUARD_FILL: u8 = 0xA5;

/// Page buffers on one wgpu device (or, in dry mode, one placeholder for every page).
pub struct WgpuPages {
    device: wgpu::Device,
    placeholder: Option<wgpu::Buffer>,
}

impl PageBackend for WgpuPages {
    type Page = wgpu::Buffer;

    fn create_page(&mut self, size: u64) -> Result<wgpu::Buffer, BackendOom> {
        if let Some(p) = &self.placeholder {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgtrain page"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            Some(err) => {
                buffer.destroy();
                Err(BackendOom { reason: err.to_string() })
            }
            None => Ok(buffer),
        }
    }

    fn destroy_page(&mut self, page: wgpu::Buffer) {
        // Dropped, not destroyed: launches recorded but not yet submitted may still
        // name the page; wgpu frees the memory once no command uses it.
        drop(page);
    }
}

/// Moves bytes between the host and blocks; chosen when the allocator is made.
trait BlockIo: Send + Sync {
    /// Queues a write of `data` at `offset` of `buffer`.
    fn write(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]);
    /// Reads `size` bytes at `offset` of `buffer`.
    fn read(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>, DeviceError>;
}

/// Block I/O through the device's queue.
struct QueueIo(Arc<Gpu>);

impl BlockIo for QueueIo {
    fn write(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        self.0.queue.write_buffer(buffer, offset, data);
    }
    fn read(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>, DeviceError> {
        self.0.read_bytes(buffer, offset, size)
    }
}

/// Block I/O of the dry run: writes are dropped, reads are zeros.
struct DryIo;

impl BlockIo for DryIo {
    fn write(&self, _: &wgpu::Buffer, _: u64, _: &[u8]) {}
    fn read(&self, _: &wgpu::Buffer, _: u64, size: u64) -> Result<Vec<u8>, DeviceError> {
        Ok(vec![0; size as usize])
    }
}

/// The largest cap or budget: 1 PiB (larger is a typo, not a bound).
pub const MAX_CAP: u64 = 1 << 50;
const MAX_CAP_TEXT: &str = "1 PiB";

/// A bound on reserved memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryCap {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction of the device's memory (like
    /// torch.cuda.set_per_process_memory_fraction).
    Fraction(f64),
}

impl MemoryCap {
    /// Parses "3GiB", "512MiB", "1000000" (bytes) or "0.8" (a fraction, at most 1).
    pub fn parse(text: &str) -> Result<MemoryCap, AllocError> {
        let t = text.trim();
        let bad = || {
            AllocError::InvalidCap(format!(
                "'{text}' is neither a size (like 3GiB, 512MiB, 1000000) of at most {MAX_CAP_TEXT} nor a fraction in (0, 1]"
            ))
        };
        if let Some(bytes) = wgtrain_record::parse_bytes(t, MAX_CAP) {
            return Ok(MemoryCap::Bytes(bytes));
        }
        // A size that is out of range or malformed is not read as a fraction.
        if t.ends_with('B') || t.parse::<u64>().is_ok() {
            return Err(bad());
        }
        match t.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(MemoryCap::Fraction(f)),
            _ => Err(bad()),
        }
    }

    /// The cap in bytes for a device of `memory` bytes.
    pub fn resolve(self, memory: Option<u64>) -> Result<u64, AllocError> {
        match self {
            MemoryCap::Bytes(0) => Err(AllocError::InvalidCap("a cap of 0 bytes".into())),
            MemoryCap::Bytes(b) => Ok(b),
            MemoryCap::Fraction(f) if !(f > 0.0 && f <= 1.0) => Err(AllocError::InvalidCap(format!("fraction {f} is not in (0, 1]"))),
            MemoryCap::Fraction(f) => match memory {
                Some(m) => Ok((m as f64 * f) as u64),
                None => Err(AllocError::InvalidCap(
                    "a fraction needs the device's memory size, which this backend does not report; give the cap in bytes".into(),
                )),
            },
        }
    }
}

/// How to build an allocator.
#[derive(Clone, Debug, Default)]
pub struct AllocatorOptions {
    /// Guard bytes around blocks; `None` reads `WGTRAIN_ALLOC_DEBUG`.
    pub debug: Option<bool>,
    /// A bound on reserved memory.
    pub cap: Option<MemoryCap>,
    /// Bookkeeping only, no device memory (see the module's dry mode).
    pub dry: bool,
}

/// A block whose guard bytes were overwritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardViolation {
    /// The block's label.
    pub label: String,
    /// Its category.
    pub category: Category,
    /// Bytes it asked for.
    pub requested: u64,
    /// The first overwritten guard byte, counted from the end of the request.
    pub first_bad_byte: u64,
    /// How many guard bytes differ.
    pub bad_bytes: u64,
}

/// Guard bytes were overwritten, or could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GuardError {
    /// Kernels wrote past these blocks.
    #[error("{}", describe_violations(.0))]
    Overrun(Vec<GuardViolation>),
    /// The guards could not be read back.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

fn describe_violations(list: &[GuardViolation]) -> String {
    let parts: Vec<String> = list
        .iter()
        .map(|v| {
            format!(
                "'{}' ({}, {}) was overrun: {} guard bytes changed, the first {} bytes past its end",
                v.label,
                v.category,
                format_bytes(v.requested),
                v.bad_bytes,
                v.first_bad_byte
            )
        })
        .collect();
    format!("guard bytes overwritten: {}", parts.join("; "))
}

struct Shared {
    gpu: Arc<Gpu>,
    pool: Mutex<Pool<WgpuPages>>,
    debug: bool,
    io: Box<dyn BlockIo>,
    violations: Mutex<Vec<GuardViolation>>,
}

impl Shared {
    fn pool(&self) -> MutexGuard<'_, Pool<WgpuPages>> {
        // A panic while holding the lock leaves the bookkeeping as it was at the panic;
        // the counters stay readable, which is what a post-mortem wants.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads a block's guard; returns the violation if any byte changed.
    fn check_guard(
        &self,
        buffer: &wgpu::Buffer,
        placement: &Placement,
        category: Category,
        label: &str,
    ) -> Result<Option<GuardViolation>, DeviceError> {
        let start = placement.requested.next_multiple_of(4);
        let bytes = self.gpu.read_bytes(buffer, placement.offset + start, placement.size - start)?;
        let bad: Vec<usize> = bytes
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b != GUARD_FILL)
            .map(|(i, _)| i)
            .collect();
        Ok(bad.first().map(|&first| GuardViolation {
            label: label.to_string(),
            category,
            requested: placement.requested,
            first_bad_byte: first as u64 + (start - placement.requested),
            bad_bytes: bad.len() as u64,
        }))
    }

    fn release(&self, block: &Block) {
        if self.debug {
            let described = self.pool().describe(block.id);
            if let Some((category, label)) = described {
                match self.check_guard(&block.buffer, &block.placement, category, &label) {
                    Ok(Some(violation)) => {
                        tracing::error!("{}", describe_violations(std::slice::from_ref(&violation)));
                        self.violations.lock().unwrap_or_else(|p| p.into_inner()).push(violation);
                    }
                    Ok(None) => {}
                    Err(err) => tracing::error!("guard check of '{label}' failed: {err}"),
                }
            }
        }
        self.pool().free(block.id);
    }
}

/// The paged allocator on one device. Cheap to clone; blocks keep it alive.
#[derive(Clone)]
pub struct Allocator {
    shared: Arc<Shared>,
}

/// A live allocation: a byte range of a page. Freed when dropped.
pub struct Block {
    shared: Arc<Shared>,
    id: AllocId,
    buffer: wgpu::Buffer,
    placement: Placement,
    category: Category,
}

impl Block {
    /// The page's buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The label it was allocated under.
    pub fn label(&self) -> Option<String> {
        self.shared.pool().describe(self.id).map(|(_, label)| label)
    }

    /// Byte offset of the block in its page (aligned for storage binding).
    pub fn offset(&self) -> u64 {
        self.placement.offset
    }

    /// Bytes asked for.
    pub fn requested(&self) -> u64 {
        self.placement.requested
    }

    /// Bytes the block holds (at least the request).
    pub fn size(&self) -> u64 {
        self.placement.size
    }

    /// The page holding the block.
    pub fn page(&self) -> PageId {
        self.placement.page
    }

    /// The allocation's id.
    pub fn id(&self) -> AllocId {
        self.id
    }

    /// The allocation's category.
    pub fn category(&self) -> Category {
        self.category
    }

    /// The whole block as a storage binding (read_write, see the module's binding
    /// scheme). The block never exceeds `max_storage_buffer_binding_size`.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.placement.offset,
            size: NonZeroU64::new(self.placement.size),
        }
    }

    /// Writes `data` at `byte_offset` inside the block's request.
    pub fn write(&self, byte_offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let end = byte_offset + data.len() as u64;
        if end > self.placement.requested.next_multiple_of(4) || !byte_offset.is_multiple_of(4) || !data.len().is_multiple_of(4) {
            return Err(DeviceError::Validation(format!(
                "write of {} bytes at {byte_offset} outside a {}-byte block or not 4-byte aligned",
                data.len(),
                self.placement.requested
            )));
        }
        self.shared.io.write(&self.buffer, self.placement.offset + byte_offset, data);
        Ok(())
    }

    /// Reads the requested bytes back (rounded up to 4).
    pub fn read(&self) -> Result<Vec<u8>, DeviceError> {
        self.shared
            .io
            .read(&self.buffer, self.placement.offset, self.placement.requested.next_multiple_of(4))
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        shared.release(self);
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("id", &self.id)
            .field("page", &self.placement.page)
            .field("offset", &self.placement.offset)
            .field("size", &self.placement.size)
            .field("requested", &self.placement.requested)
            .field("category", &self.category)
            .finish()
    }
}

/// Whether `WGTRAIN_ALLOC_DEBUG` asks for guard bytes.
pub fn debug_from_env() -> bool {
    std::env::var("WGTRAIN_ALLOC_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0")
}

impl Allocator {
    /// An allocator on `gpu`'s device.
    pub fn new(gpu: Arc<Gpu>, options: AllocatorOptions) -> Result<Allocator, AllocError> {
        let limits = &gpu.caps.limits;
        let debug = options.debug.unwrap_or_else(debug_from_env) && !options.dry;
        let mut config = PoolConfig::for_adapter(
            limits.min_storage_buffer_offset_alignment as u64,
            limits.max_storage_buffer_binding_size,
            limits.max_buffer_size,
        );
        if debug {
            config.guard_bytes = GUARD_BYTES;
        }
        let mut pool = Pool::new(
            WgpuPages {
                device: gpu.device.clone(),
                placeholder: options.dry.then(|| {
                    gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("wgtrain dry-run placeholder"),
                        size: 256,
                        usage: wgpu::BufferUsages::STORAGE,
                        mapped_at_creation: false,
                    })
                }),
            },
            config,
        );
        pool.set_device_memory(gpu.caps.memory_bytes);
        if let Some(cap) = options.cap {
            pool.set_cap(Some(cap.resolve(gpu.usable_memory())?));
        }
        let io: Box<dyn BlockIo> = if options.dry {
            Box::new(DryIo)
        } else {
            Box::new(QueueIo(gpu.clone()))
        };
        Ok(Allocator {
            shared: Arc::new(Shared {
                gpu,
                pool: Mutex::new(pool),
                debug,
                io,
                violations: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The device this allocator serves.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.shared.gpu
    }

    /// The label a live block was allocated under (the profiler names launches by
    /// the tensor they write).
    pub fn label_of(&self, block: &Block) -> Option<String> {
        self.shared.pool().describe(block.id).map(|(_, label)| label)
    }

    /// Stamps the allocator's events with the step's phase from now on.
    pub fn set_phase(&self, phase: &'static str) {
        self.shared.pool().set_phase(phase);
    }

    /// Names the blocks allocated from now on after `scope` (`scope.label`), or as
    /// asked with None; returns the scope it replaces (autograd sets it per backward op).
    pub fn set_scope(&self, scope: Option<std::sync::Arc<str>>) -> Option<std::sync::Arc<str>> {
        self.shared.pool().set_scope(scope)
    }

    /// Whether guard bytes are on.
    pub fn debug(&self) -> bool {
        self.shared.debug
    }

    /// Allocates `bytes` for a tensor of `category` named `label`.
    pub fn alloc(&self, bytes: u64, category: Category, label: &str) -> Result<Block, AllocError> {
        let mut pool = self.shared.pool();
        let placement = match pool.alloc(bytes, category, label) {
            // The report says what the device has left for this process, where told.
            Err(AllocError::OutOfMemory(mut report)) => {
                drop(pool);
                if let Some(b) = self.shared.gpu.memory_budget() {
                    (report.device_budget, report.device_usage) = (Some(b.budget), Some(b.usage));
                }
                return Err(AllocError::OutOfMemory(report));
            }
            other => other?,
        };
        let buffer = pool.page_of(placement.page).expect("a fresh placement names a live page").clone();
        drop(pool);
        if self.shared.debug {
            let start = placement.requested.next_multiple_of(4);
            let guard = vec![GUARD_FILL; (placement.size - start) as usize];
            self.shared.gpu.queue.write_buffer(&buffer, placement.offset + start, &guard);
        }
        Ok(Block {
            shared: self.shared.clone(),
            id: placement.id,
            buffer,
            placement,
            category,
        })
    }

    /// Sets or lifts the cap.
    pub fn set_cap(&self, cap: Option<MemoryCap>) -> Result<(), AllocError> {
        let resolved = match cap {
            Some(c) => Some(c.resolve(self.shared.gpu.usable_memory())?),
            None => None,
        };
        self.shared.pool().set_cap(resolved);
        Ok(())
    }

    /// Returns every wholly free page to the driver; returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.shared.pool().release_free_pages()
    }

    /// Checks the pool's structural invariants (blocks tile pages, free blocks are
    /// coalesced and listed, counters agree); for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.shared.pool().check_invariants()
    }

    /// The pool's sizing (block rounding, largest page, guard bytes).
    pub fn config(&self) -> PoolConfig {
        self.shared.pool().config()
    }

    /// Every counter.
    pub fn stats(&self) -> MemoryStats {
        self.shared.pool().stats()
    }

    /// Whether a request of `bytes` would raise the peak of allocated bytes.
    pub fn would_raise_peak(&self, bytes: u64) -> bool {
        let pool = self.shared.pool();
        pool.stats.allocated.current + pool.block_size_for(bytes) > pool.stats.allocated.peak
    }

    /// Sets peaks to current values.
    pub fn reset_peaks(&self) {
        self.shared.pool().reset_peaks();
    }

    /// Raises every peak to at least `earlier`'s: after measuring a part of the run
    /// alone (a reset before it), the peaks are the run's again.
    pub fn keep_peaks(&self, earlier: &MemoryStats) {
        self.shared.pool().keep_peaks(earlier);
    }

    /// A readable table of the counters.
    pub fn summary(&self) -> String {
        self.stats().summary()
    }

    /// Pages, blocks and the event trace.
    pub fn snapshot(&self) -> MemorySnapshot {
        self.shared.pool().snapshot()
    }

    /// Pages and their blocks now (no events, no counters).
    pub fn snapshot_pages(&self) -> Vec<wgtrain_record::PageView> {
        self.shared.pool().pages_view()
    }

    /// Drops the event trace (after the dashboard has read it).
    pub fn clear_events(&self) {
        self.shared.pool().clear_events();
    }

    /// Takes the event trace (oldest first) and the count dropped since the last take.
    pub fn take_events(&self) -> (Vec<wgtrain_record::Event>, u64) {
        self.shared.pool().take_events()
    }

    /// Microseconds on the events' clock.
    pub fn now_us(&self) -> u64 {
        self.shared.pool().now_us()
    }

    /// The step events are stamped with.
    pub fn step(&self) -> u64 {
        self.shared.pool().step()
    }

    /// Ends a step: in debug mode checks every live block's guard and reports overruns
    /// seen since the last call (including blocks freed meanwhile); then advances the step.
    pub fn end_step(&self) -> Result<(), GuardError> {
        let result = self.check_guards();
        let mut pool = self.shared.pool();
        let next = pool.step() + 1;
        pool.set_step(next);
        result
    }

    /// In debug mode, checks every live block's guard bytes now.
    pub fn check_guards(&self) -> Result<(), GuardError> {
        if !self.shared.debug {
            return Ok(());
        }
        let live = self.shared.pool().live_blocks();
        let mut found: Vec<GuardViolation> = std::mem::take(&mut *self.shared.violations.lock().unwrap_or_else(|p| p.into_inner()));
        for (placement, category, label) in live {
            let buffer = match self.shared.pool().page_of(placement.page) {
                Some(b) => b.clone(),
                None => continue,
            };
            if let Some(v) = self.shared.check_guard(&buffer, &placement, category, &label)? {
                found.push(v);
            }
        }
        if found.is_empty() {
            Ok(())
        } else {
            Err(GuardError::Overrun(found))
        }
    }
}
