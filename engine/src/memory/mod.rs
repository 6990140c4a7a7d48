//! The paged buffer allocator: every device tensor lives in a block of a page.
//!
//! # Policy
//!
//! The design follows PyTorch's CUDA caching allocator, adapted to wgpu:
//!
//! * **Pages** are wgpu buffers. **Blocks** are byte ranges of a page, carved at a
//!   granularity of [`pool::BLOCK_ROUND`] bytes (raised to the adapter's
//!   `min_storage_buffer_offset_alignment` when that is larger), so every block can be
//!   bound at its offset.
//! * Requests of at most [`pool::SMALL_REQUEST`] bytes come from the *small* pool, whose
//!   pages are [`pool::SMALL_PAGE`] bytes. Larger requests come from the *large* pool:
//!   up to [`pool::LARGE_REQUEST`] they share [`pool::LARGE_PAGE`]-byte pages, beyond
//!   that a request gets a page of its own (rounded to [`pool::DEDICATED_ROUND`]). No
//!   page is larger than the adapter lets one binding see
//!   (`max_storage_buffer_binding_size`), so any block can be bound whole.
//! * A request takes the **best fit**: the smallest cached free block of its pool that
//!   is large enough. The block is **split** when the remainder is worth keeping (at
//!   least one rounding unit in the small pool, more than [`pool::SMALL_REQUEST`] in the
//!   large pool); otherwise the whole block is handed out. On free, a block
//!   **coalesces** with free neighbours and stays **cached** in its page.
//! * A **cap** (bytes, or a fraction of the adapter's memory like
//!   `torch.cuda.set_per_process_memory_fraction`) bounds reserved bytes.
//! * **Out of memory**: a page is created inside a wgpu `OutOfMemory` error scope. If it
//!   fails, or the cap would be passed, every wholly free page is returned to the driver
//!   and the request is tried once more (`num_alloc_retries`); if that fails too the
//!   request fails (`num_ooms`) with a message in the manner of PyTorch's, plus the
//!   fragmentation PyTorch's lacks.
//! * `empty_cache()` returns wholly free pages to the driver.
//!
//! # Binding scheme
//!
//! WebGPU refuses one buffer used as read-only storage and as read-write storage in the
//! same dispatch, and blocks of one page will meet in one kernel (a matmul's input and
//! output often share a page). wgpu's usage tracker merges *identical* usages, so every
//! kernel declares every storage binding `read_write`, and each tensor is bound as its own
//! `(page, offset, size)` range. Two blocks of one page then carry the same usage and the
//! dispatch is valid; blocks never overlap, so the writes never alias. The test
//! `two_blocks_of_one_page_meet_in_one_dispatch` checks this on the real device.
//!
//! # Layout of this module
//! `pool` is the host-side bookkeeping (no GPU calls; property-tested against a model)
//! and `pool_report` what it reports (stats, snapshot, invariants), `oom` the
//! out-of-memory error and report, `stats` the counters, `snapshot` the page map and
//! event trace, `allocator` the wgpu side: pages as buffers, the OOM error scope, RAII
//! blocks and guard bytes. Categories, page and event views and byte formatting are
//! the dashboard protocol's (`wgtrain_record`), re-exported here.
//!
//! May call: `device`, `wgtrain_record`. Called by: `runtime`, `tensor` and above.

pub mod allocator;
pub mod oom;
pub mod pool;
pub mod pool_report;
pub mod snapshot;
pub mod stats;

pub use allocator::{Allocator, AllocatorOptions, Block, GuardError, GuardViolation, MemoryCap};
pub use oom::{AllocError, OomReport};
pub use pool::PoolConfig;
pub use snapshot::MemorySnapshot;
pub use stats::{MemoryStats, Stat};
pub use wgtrain_record::{AllocId, BlockView, Category, Event, EventKind, PageId, PageView, PoolKind, format_bytes};
