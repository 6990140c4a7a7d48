//! The allocator's snapshot: counters, every page with its blocks, and the event trace
//! (alloc, free, page_alloc, page_free, oom), for the dashboard and for export. The
//! page, block and event types are the dashboard protocol's (`wgtrain_record`).
//!
//! May call: `memory::stats`, `wgtrain_record`. Called by: `memory::pool_report`,
//! the allocator, tests.

use serde::{Deserialize, Serialize};
use wgtrain_record::{Event, PageView};

use super::stats::MemoryStats;

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
