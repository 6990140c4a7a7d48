//! Host-side bookkeeping of the paged allocator: pages, blocks, best fit, split,
//! coalesce, the cap, the retry on out-of-memory, and the counters.
//!
//! Nothing here touches the GPU: pages are created and destroyed through a
//! [`PageBackend`], which the wgpu allocator implements with buffers. That keeps this
//! file small enough to property-test against a model (tests/allocator_props.rs).
//!
//! May call: `memory::oom`, `memory::stats`, `wgtrain_record`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use wgtrain_record::{AllocId, Category, Event, EventKind, PageId, PoolKind};

use super::oom::{AllocError, BackendOom, OomReport};
use super::stats::MemoryStats;

/// Granularity of blocks in bytes (PyTorch rounds to 512; WebGPU's default storage
/// offset alignment is 256, so 256 keeps every block bindable at its offset).
pub const BLOCK_ROUND: u64 = 256;
/// Largest request served from the small pool (PyTorch's `kSmallSize`).
pub const SMALL_REQUEST: u64 = 1 << 20;
/// Size of a small-pool page (PyTorch's `kSmallBuffer`).
pub const SMALL_PAGE: u64 = 2 << 20;
/// Largest request that shares a large page; larger ones get a page of their own.
pub const LARGE_REQUEST: u64 = 16 << 20;
/// Size of a shared large-pool page (PyTorch uses 20 MiB for requests under 10 MiB).
pub const LARGE_PAGE: u64 = 32 << 20;
/// Dedicated pages are rounded up to a multiple of this (PyTorch's `kRoundLarge`).
pub const DEDICATED_ROUND: u64 = 2 << 20;
/// How many events the trace keeps before dropping the oldest.
pub const EVENT_CAPACITY: usize = 1 << 20;

/// Creates and destroys pages; the wgpu allocator implements it with buffers.
pub trait PageBackend {
    /// A page's device resource.
    type Page;
    /// Creates a page of `size` bytes, or reports that the device is out of memory.
    fn create_page(&mut self, size: u64) -> Result<Self::Page, BackendOom>;
    /// Returns a page to the driver.
    fn destroy_page(&mut self, page: Self::Page);
}

#[derive(Debug, Clone)]
pub(super) struct LiveInfo {
    pub(super) id: AllocId,
    pub(super) requested: u64,
    pub(super) category: Category,
    pub(super) label: String,
}

#[derive(Debug, Clone)]
pub(super) struct BlockState {
    pub(super) size: u64,
    pub(super) live: Option<LiveInfo>,
}

pub(super) struct Page<P> {
    pub(super) size: u64,
    pub(super) pool: PoolKind,
    pub(super) dedicated: bool,
    pub(super) raw: P,
    /// Blocks by offset; they tile `[0, size)` exactly.
    pub(super) blocks: BTreeMap<u64, BlockState>,
    pub(super) live_blocks: usize,
}

/// Where a live allocation sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The allocation's id (pass it to `free`).
    pub id: AllocId,
    /// The page holding it.
    pub page: PageId,
    /// Byte offset of the block in the page.
    pub offset: u64,
    /// The block's size (at least the request).
    pub size: u64,
    /// Bytes asked for.
    pub requested: u64,
}

/// Tunable sizes; the defaults are the named constants above.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Block granularity (a multiple of the storage offset alignment).
    pub round: u64,
    /// The largest page a binding may see.
    pub max_page: u64,
    /// Bytes of guard after each block's requested range (debug mode), 0 otherwise.
    pub guard_bytes: u64,
}

impl PoolConfig {
    /// A config for an adapter with this offset alignment and binding limit.
    pub fn for_adapter(offset_alignment: u64, max_binding: u64, max_buffer: u64) -> Self {
        let round = BLOCK_ROUND.max(offset_alignment.next_power_of_two());
        let max_page = max_binding.min(max_buffer) / round * round;
        PoolConfig {
            round,
            max_page,
            guard_bytes: 0,
        }
    }
}

/// The allocator's bookkeeping over a page backend.
pub struct Pool<B: PageBackend> {
    pub(super) backend: B,
    pub(super) config: PoolConfig,
    pub(super) pages: BTreeMap<PageId, Page<B::Page>>,
    /// Free blocks per pool, ordered by (size, page, offset) for best fit.
    pub(super) free: [BTreeSet<(u64, PageId, u64)>; 2],
    pub(super) live: HashMap<AllocId, (PageId, u64)>,
    pub(super) next_page: PageId,
    pub(super) next_alloc: AllocId,
    pub(super) cap: Option<u64>,
    pub(super) device_memory: Option<u64>,
    pub(super) stats: MemoryStats,
    pub(super) events: VecDeque<Event>,
    pub(super) events_dropped: u64,
    pub(super) step: u64,
    pub(super) epoch: Instant,
    /// The phase of the step the host is in ("forward", "backward", ...; "" for none).
    pub(super) phase: &'static str,
    /// While a backward op runs, the label of the value it differentiates: the blocks
    /// it allocates are named after it (`h.3.attn.c_attn` + `dx`).
    pub(super) scope: Option<std::sync::Arc<str>>,
}

pub(super) fn pool_index(kind: PoolKind) -> usize {
    match kind {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

impl<B: PageBackend> Pool<B> {
    /// A pool with no pages.
    pub fn new(backend: B, config: PoolConfig) -> Self {
        Pool {
            backend,
            config,
            pages: BTreeMap::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            live: HashMap::new(),
            next_page: 0,
            next_alloc: 0,
            cap: None,
            device_memory: None,
            stats: MemoryStats::default(),
            events: VecDeque::new(),
            events_dropped: 0,
            step: 0,
            epoch: Instant::now(),
            phase: "",
            scope: None,
        }
    }

    /// The phase that events are stamped with from now on.
    pub fn set_phase(&mut self, phase: &'static str) {
        self.phase = phase;
    }

    /// Names the blocks allocated from now on after `scope` (None: as asked); returns
    /// the scope it replaces.
    pub fn set_scope(&mut self, scope: Option<std::sync::Arc<str>>) -> Option<std::sync::Arc<str>> {
        std::mem::replace(&mut self.scope, scope)
    }

    /// The sizing in use.
    pub fn config(&self) -> PoolConfig {
        self.config
    }

    /// The backend (the wgpu allocator reaches its device through it).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The device's memory in bytes, when the backend knows it (for fraction caps).
    pub fn set_device_memory(&mut self, bytes: Option<u64>) {
        self.device_memory = bytes;
    }

    /// Bounds reserved bytes; `None` lifts the bound. Pages already reserved stay.
    pub fn set_cap(&mut self, cap: Option<u64>) {
        self.cap = cap;
    }

    /// The cap in bytes, if any.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// The device's memory in bytes, if known.
    pub fn device_memory(&self) -> Option<u64> {
        self.device_memory
    }

    /// The training step that events are stamped with.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// The current step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The block size a request of `requested` bytes takes.
    pub fn block_size_for(&self, requested: u64) -> u64 {
        round_up(requested.max(1).next_multiple_of(4) + self.config.guard_bytes, self.config.round)
    }

    /// The pool a block of `size` bytes comes from.
    pub fn pool_for(size: u64) -> PoolKind {
        if size <= SMALL_REQUEST { PoolKind::Small } else { PoolKind::Large }
    }

    fn page_size_for(&self, size: u64, pool: PoolKind) -> (u64, bool) {
        match pool {
            PoolKind::Small => (SMALL_PAGE.min(self.config.max_page), false),
            PoolKind::Large if size <= LARGE_REQUEST && LARGE_PAGE <= self.config.max_page => (LARGE_PAGE, false),
            PoolKind::Large => {
                let rounded = round_up(size, DEDICATED_ROUND);
                if rounded <= self.config.max_page {
                    (rounded, true)
                } else {
                    (size, true)
                }
            }
        }
    }

    /// Allocates `requested` bytes; the returned block is at least that large.
    pub fn alloc(&mut self, requested: u64, category: Category, label: &str) -> Result<Placement, AllocError> {
        let scoped;
        let label = match &self.scope {
            Some(scope) if !label.starts_with(&**scope) => {
                scoped = format!("{scope}.{label}");
                scoped.as_str()
            }
            _ => label,
        };
        let size = self.block_size_for(requested);
        if size > self.config.max_page {
            return Err(AllocError::TooLarge {
                requested,
                max_page: self.config.max_page,
                category,
                label: label.to_string(),
            });
        }
        let pool = Self::pool_for(size);
        let found = match self.best_fit(pool, size) {
            Some(found) => Some(found),
            None => match self.grow(size, pool) {
                Ok(found) => Some(found),
                Err(first) => {
                    // Free the cache and try once more, as PyTorch does.
                    self.stats.num_alloc_retries += 1;
                    self.release_free_pages();
                    match self.grow(size, pool) {
                        Ok(found) => Some(found),
                        Err(second) => {
                            let report = self.oom_report(requested, category, label, second.or(first));
                            self.stats.num_ooms += 1;
                            self.push_event(Event {
                                kind: EventKind::Oom,
                                size: requested,
                                category: Some(category),
                                label: label.to_string(),
                                ..self.event_base()
                            });
                            return Err(AllocError::OutOfMemory(Box::new(report)));
                        }
                    }
                }
            },
        };
        let (page_id, offset) = found.expect("a block was found or the function returned");
        Ok(self.take_block(page_id, offset, size, pool, requested, category, label))
    }

    /// The smallest free block of `pool` holding `size` bytes.
    fn best_fit(&self, pool: PoolKind, size: u64) -> Option<(PageId, u64)> {
        self.free[pool_index(pool)]
            .range((size, 0, 0)..)
            .next()
            .map(|&(_, page, offset)| (page, offset))
    }

    /// Creates a page for a block of `size` bytes; Err carries the backend's reason,
    /// or None when the cap refused. When the pool's usual page does not fit under the
    /// cap or on the device, a page of just the block's size is tried before giving up.
    fn grow(&mut self, size: u64, pool: PoolKind) -> Result<(PageId, u64), Option<String>> {
        let (usual, dedicated) = self.page_size_for(size, pool);
        let tight = match pool {
            PoolKind::Small => size,
            PoolKind::Large => round_up(size, DEDICATED_ROUND).min(usual),
        };
        let mut candidates = vec![(usual, dedicated)];
        if tight < usual {
            candidates.push((tight, true));
        }
        let mut refusal = None;
        for (page_size, dedicated) in candidates {
            if let Some(cap) = self.cap
                && self.stats.reserved.current + page_size > cap
            {
                continue;
            }
            match self.backend.create_page(page_size) {
                Ok(raw) => return Ok(self.add_page(raw, page_size, pool, dedicated)),
                Err(oom) => refusal = Some(oom.reason),
            }
        }
        Err(refusal)
    }

    fn add_page(&mut self, raw: B::Page, page_size: u64, pool: PoolKind, dedicated: bool) -> (PageId, u64) {
        let id = self.next_page;
        self.next_page += 1;
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            BlockState {
                size: page_size,
                live: None,
            },
        );
        self.pages.insert(
            id,
            Page {
                size: page_size,
                pool,
                dedicated,
                raw,
                blocks,
                live_blocks: 0,
            },
        );
        self.free[pool_index(pool)].insert((page_size, id, 0));
        self.stats.reserved.add(page_size);
        self.stats.pages.add(1);
        self.stats.num_device_alloc += 1;
        self.push_event(Event {
            kind: EventKind::PageAlloc,
            page: Some(id),
            size: page_size,
            ..self.event_base()
        });
        (id, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn take_block(
        &mut self,
        page_id: PageId,
        offset: u64,
        size: u64,
        pool: PoolKind,
        requested: u64,
        category: Category,
        label: &str,
    ) -> Placement {
        let round = self.config.round;
        let page = self.pages.get_mut(&page_id).expect("free set names a live page");
        let block = page.blocks.get_mut(&offset).expect("free set names a block");
        let block_size = block.size;
        self.free[pool_index(pool)].remove(&(block_size, page_id, offset));
        let remainder = block_size - size;
        let split = match pool {
            PoolKind::Small => remainder >= round,
            PoolKind::Large => remainder > SMALL_REQUEST,
        };
        let taken = if split { size } else { block_size };
        let id = self.next_alloc;
        self.next_alloc += 1;
        block.size = taken;
        block.live = Some(LiveInfo {
            id,
            requested,
            category,
            label: label.to_string(),
        });
        if split {
            page.blocks.insert(
                offset + size,
                BlockState {
                    size: remainder,
                    live: None,
                },
            );
            self.free[pool_index(pool)].insert((remainder, page_id, offset + size));
        }
        page.live_blocks += 1;
        self.live.insert(id, (page_id, offset));
        self.stats.allocated.add(taken);
        self.stats.requested.add(requested);
        self.stats.active.add(taken);
        self.stats.blocks.add(1);
        self.stats.num_allocs += 1;
        self.stats.by_category[category.index()].add(taken, requested);
        self.stats.note_peak();
        self.push_event(Event {
            kind: EventKind::Alloc,
            alloc: Some(id),
            page: Some(page_id),
            offset,
            size: taken,
            requested,
            category: Some(category),
            label: label.to_string(),
            ..self.event_base()
        });
        Placement {
            id,
            page: page_id,
            offset,
            size: taken,
            requested,
        }
    }

    /// Frees a live allocation; its block coalesces with free neighbours. Unknown ids
    /// (already freed) return None.
    pub fn free(&mut self, id: AllocId) -> Option<Placement> {
        let (page_id, offset) = self.live.remove(&id)?;
        let page = self.pages.get_mut(&page_id).expect("live map names a page");
        let pool = pool_index(page.pool);
        let block = page.blocks.get_mut(&offset).expect("live map names a block");
        let info = block.live.take().expect("block of a live id is live");
        let size = block.size;
        page.live_blocks -= 1;
        // Coalesce with the next block, then the previous one.
        let mut start = offset;
        let mut merged = size;
        if let Some(next) = page.blocks.get(&(offset + size))
            && next.live.is_none()
        {
            let next_size = next.size;
            self.free[pool].remove(&(next_size, page_id, offset + size));
            page.blocks.remove(&(offset + size));
            merged += next_size;
        }
        if let Some((&prev_offset, prev)) = page.blocks.range(..offset).next_back()
            && prev.live.is_none()
        {
            let prev_size = prev.size;
            self.free[pool].remove(&(prev_size, page_id, prev_offset));
            page.blocks.remove(&offset);
            start = prev_offset;
            merged += prev_size;
        }
        page.blocks.insert(start, BlockState { size: merged, live: None });
        self.free[pool].insert((merged, page_id, start));
        self.stats.allocated.sub(size);
        self.stats.requested.sub(info.requested);
        self.stats.active.sub(size);
        self.stats.blocks.sub(1);
        self.stats.num_frees += 1;
        self.stats.by_category[info.category.index()].sub(size, info.requested);
        self.push_event(Event {
            kind: EventKind::Free,
            alloc: Some(id),
            page: Some(page_id),
            offset,
            size,
            requested: info.requested,
            category: Some(info.category),
            label: info.label,
            ..self.event_base()
        });
        Some(Placement {
            id,
            page: page_id,
            offset,
            size,
            requested: info.requested,
        })
    }

    /// Returns every wholly free page to the driver; returns the bytes released.
    pub fn release_free_pages(&mut self) -> u64 {
        let empty: Vec<PageId> = self.pages.iter().filter(|(_, p)| p.live_blocks == 0).map(|(&id, _)| id).collect();
        let mut released = 0;
        for id in empty {
            let page = self.pages.remove(&id).expect("id from the page map");
            self.free[pool_index(page.pool)].remove(&(page.size, id, 0));
            released += page.size;
            self.stats.reserved.sub(page.size);
            self.stats.pages.sub(1);
            self.stats.num_device_free += 1;
            self.push_event(Event {
                kind: EventKind::PageFree,
                page: Some(id),
                size: page.size,
                ..self.event_base()
            });
            self.backend.destroy_page(page.raw);
        }
        released
    }

    /// The page resource and placement of a live allocation.
    pub fn page_of(&self, page: PageId) -> Option<&B::Page> {
        self.pages.get(&page).map(|p| &p.raw)
    }

    /// Placements of every live allocation, with their labels.
    pub fn live_blocks(&self) -> Vec<(Placement, Category, String)> {
        let mut out = Vec::with_capacity(self.live.len());
        for (&page_id, page) in &self.pages {
            for (&offset, block) in &page.blocks {
                if let Some(info) = &block.live {
                    out.push((
                        Placement {
                            id: info.id,
                            page: page_id,
                            offset,
                            size: block.size,
                            requested: info.requested,
                        },
                        info.category,
                        info.label.clone(),
                    ));
                }
            }
        }
        out
    }

    /// Label and category of a live allocation.
    pub fn describe(&self, id: AllocId) -> Option<(Category, String)> {
        let (page, offset) = self.live.get(&id)?;
        let info = self.pages[page].blocks[offset].live.as_ref()?;
        Some((info.category, info.label.clone()))
    }

    /// Drops the trace's events (the dashboard drains them per step).
    pub fn clear_events(&mut self) {
        self.events.clear();
    }

    /// Takes the trace's events, oldest first, leaving it empty; also returns how many
    /// were dropped for lack of room since the last take.
    pub fn take_events(&mut self) -> (Vec<Event>, u64) {
        let dropped = std::mem::take(&mut self.events_dropped);
        (self.events.drain(..).collect(), dropped)
    }

    /// Microseconds since the pool was made (the events' clock).
    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn event_base(&self) -> Event {
        Event {
            kind: EventKind::Alloc,
            step: self.step,
            time_us: self.epoch.elapsed().as_micros() as u64,
            alloc: None,
            page: None,
            offset: 0,
            size: 0,
            requested: 0,
            category: None,
            label: String::new(),
            phase: self.phase.to_string(),
        }
    }

    fn push_event(&mut self, event: Event) {
        if self.events.len() == EVENT_CAPACITY {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        self.events.push_back(event);
    }

    fn oom_report(&self, requested: u64, category: Category, label: &str, backend_reason: Option<String>) -> OomReport {
        OomReport {
            requested,
            category,
            label: label.to_string(),
            allocated: self.stats.allocated.current,
            reserved: self.stats.reserved.current,
            free_in_cache: self.stats.reserved.current - self.stats.allocated.current,
            largest_free_block: self.largest_free_block(),
            cap: self.cap,
            device_memory: self.device_memory,
            backend_reason,
            device_budget: None,
            device_usage: None,
        }
    }
}

impl<B: PageBackend> Drop for Pool<B> {
    fn drop(&mut self) {
        let pages = std::mem::take(&mut self.pages);
        for (_, page) in pages {
            self.backend.destroy_page(page.raw);
        }
    }
}
