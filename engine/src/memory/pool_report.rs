//! What the pool reports about itself: counters with their derived figures, the page
//! map and event trace (snapshot), and the invariant check the property tests run
//! after every operation.
//!
//! May call: `memory::{pool, stats, snapshot}`, `wgtrain_record`. Called by: the
//! allocator, tests.

use wgtrain_record::{BlockView, Category, PageView};

use super::pool::{PageBackend, Pool, pool_index};
use super::snapshot::MemorySnapshot;
use super::stats::{CategoryStats, MemoryStats};

impl<B: PageBackend> Pool<B> {
    /// Counters, with the derived figures (inactive split bytes, largest free block).
    pub fn stats(&self) -> MemoryStats {
        let mut stats = self.stats.clone();
        let mut inactive_split = 0;
        let mut inactive_split_blocks = 0;
        for page in self.pages.values() {
            if page.live_blocks > 0 {
                for block in page.blocks.values().filter(|b| b.live.is_none()) {
                    inactive_split += block.size;
                    inactive_split_blocks += 1;
                }
            }
        }
        stats.inactive_split_bytes = inactive_split;
        stats.inactive_split_blocks = inactive_split_blocks;
        stats.largest_free_block = self.largest_free_block();
        stats.cap = self.cap;
        stats.device_memory = self.device_memory;
        stats.step = self.step;
        stats
    }

    pub(super) fn largest_free_block(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|set| set.last().map(|&(size, _, _)| size))
            .max()
            .unwrap_or(0)
    }

    /// Per-category counters.
    pub fn category_stats(&self, category: Category) -> CategoryStats {
        self.stats.by_category[category.index()]
    }

    /// Sets every peak to its current value (torch.cuda.reset_peak_memory_stats).
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// Raises every peak to at least `earlier`'s (see `MemoryStats::keep_peaks`).
    pub fn keep_peaks(&mut self, earlier: &MemoryStats) {
        self.stats.keep_peaks(earlier);
    }

    /// Every page with its blocks, and the event trace.
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            stats: self.stats(),
            pages: self.pages_view(),
            events: self.events.iter().cloned().collect(),
            events_dropped: self.events_dropped,
        }
    }

    /// Every page with its blocks.
    pub fn pages_view(&self) -> Vec<PageView> {
        self.pages
            .iter()
            .map(|(&id, page)| PageView {
                id,
                size: page.size,
                pool: page.pool,
                dedicated: page.dedicated,
                blocks: page
                    .blocks
                    .iter()
                    .map(|(&offset, block)| BlockView {
                        offset,
                        size: block.size,
                        allocated: block.live.is_some(),
                        requested: block.live.as_ref().map_or(0, |l| l.requested),
                        category: block.live.as_ref().map(|l| l.category),
                        label: block.live.as_ref().map(|l| l.label.clone()),
                        alloc: block.live.as_ref().map(|l| l.id),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Checks that blocks tile pages, free blocks are coalesced and listed, and the
    /// counters agree with the pages. Tests call it after every operation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut free_listed = 0usize;
        let mut allocated = 0;
        let mut requested = 0;
        let mut reserved = 0;
        let mut live = 0usize;
        for (&id, page) in &self.pages {
            reserved += page.size;
            let mut cursor = 0;
            let mut prev_free = false;
            let mut page_live = 0;
            for (&offset, block) in &page.blocks {
                if offset != cursor {
                    return Err(format!("page {id}: gap or overlap at {offset} (expected {cursor})"));
                }
                if offset % self.config.round != 0 || block.size == 0 {
                    return Err(format!("page {id}: misaligned or empty block at {offset}"));
                }
                cursor += block.size;
                match &block.live {
                    Some(info) => {
                        prev_free = false;
                        page_live += 1;
                        allocated += block.size;
                        requested += info.requested;
                        if self.live.get(&info.id) != Some(&(id, offset)) {
                            return Err(format!("page {id}: block at {offset} not in live map"));
                        }
                    }
                    None => {
                        if prev_free {
                            return Err(format!("page {id}: free blocks not coalesced at {offset}"));
                        }
                        prev_free = true;
                        free_listed += 1;
                        if !self.free[pool_index(page.pool)].contains(&(block.size, id, offset)) {
                            return Err(format!("page {id}: free block at {offset} not listed"));
                        }
                    }
                }
            }
            if cursor != page.size {
                return Err(format!("page {id}: blocks cover {cursor} of {} bytes", page.size));
            }
            if page_live != page.live_blocks {
                return Err(format!("page {id}: live count {} != {page_live}", page.live_blocks));
            }
            live += page_live;
        }
        if free_listed != self.free[0].len() + self.free[1].len() {
            return Err("free sets list blocks that are not free".into());
        }
        if live != self.live.len() {
            return Err("live map disagrees with pages".into());
        }
        let s = &self.stats;
        if s.allocated.current != allocated
            || s.requested.current != requested
            || s.reserved.current != reserved
            || s.blocks.current != live as u64
            || s.pages.current != self.pages.len() as u64
        {
            return Err(format!(
                "counters disagree with pages: allocated {} vs {allocated}, requested {} vs {requested}, reserved {} vs {reserved}",
                s.allocated.current, s.requested.current, s.reserved.current
            ));
        }
        Ok(())
    }
}
