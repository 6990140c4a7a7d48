//! The allocator's snapshot: every page with its blocks, and the event trace (alloc,
//! free, page_alloc, page_free, oom), for the dashboard and for export.

use serde::{Deserialize, Serialize};

use super::pool::{AllocId, Category, PageId, PoolKind};
use super::stats::MemoryStats;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A block was handed out.
    Alloc,
    /// A block was freed.
    Free,
    /// A page was created.
    PageAlloc,
    /// A page was returned to the driver.
    PageFree,
    /// A request failed for lack of memory.
    Oom,
}

/// One entry of the trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The training step at the time.
    pub step: u64,
    /// Microseconds since the allocator was made.
    pub time_us: u64,
    /// The allocation, for alloc and free.
    pub alloc: Option<AllocId>,
    /// The page involved.
    pub page: Option<PageId>,
    /// Offset of the block in its page.
    pub offset: u64,
    /// Bytes of the block or page (for oom, the request).
    pub size: u64,
    /// Bytes asked for (alloc and free).
    pub requested: u64,
    /// The allocation's category.
    pub category: Option<Category>,
    /// The allocation's label.
    pub label: String,
}

/// One block of a page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockView {
    /// Offset in the page.
    pub offset: u64,
    /// Size of the block.
    pub size: u64,
    /// Whether it is live.
    pub allocated: bool,
    /// Bytes asked for (0 if free).
    pub requested: u64,
    /// Category, if live.
    pub category: Option<Category>,
    /// Label, if live.
    pub label: Option<String>,
    /// Allocation id, if live.
    pub alloc: Option<AllocId>,
}

/// One page and its blocks, in offset order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PageView {
    /// The page's id.
    pub id: PageId,
    /// Its size.
    pub size: u64,
    /// Its pool.
    pub pool: PoolKind,
    /// Whether it was made for one large request.
    pub dedicated: bool,
    /// Blocks tiling the page.
    pub blocks: Vec<BlockView>,
}

/// Pages, counters and the event trace at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// Counters at the time.
    pub stats: MemoryStats,
    /// Every page.
    pub pages: Vec<PageView>,
    /// The trace, oldest first.
    pub events: Vec<Event>,
    /// Events dropped from the front of the trace for lack of room.
    pub events_dropped: u64,
}

impl MemorySnapshot {
    /// Checks that pages and counters tell the same story.
    pub fn check_consistent(&self) -> Result<(), String> {
        let reserved: u64 = self.pages.iter().map(|p| p.size).sum();
        let live = self.pages.iter().flat_map(|p| &p.blocks).filter(|b| b.allocated);
        let (mut allocated, mut requested, mut count) = (0, 0, 0);
        for block in live {
            allocated += block.size;
            requested += block.requested;
            count += 1;
        }
        let s = &self.stats;
        if reserved != s.reserved.current
            || allocated != s.allocated.current
            || requested != s.requested.current
            || count != s.blocks.current
        {
            return Err(format!(
                "snapshot disagrees with stats: reserved {reserved}/{}, allocated {allocated}/{}, requested {requested}/{}, blocks {count}/{}",
                s.reserved.current, s.allocated.current, s.requested.current, s.blocks.current
            ));
        }
        Ok(())
    }
}
