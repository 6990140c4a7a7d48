//! Allocator counters in the manner of torch.cuda.memory_stats, kept per category too,
//! and the readable summary in the manner of torch.cuda.memory_summary().
//!
//! May call: `wgtrain_record`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use wgtrain_record::{Category, format_bytes};

/// A current value and its peak (PyTorch's `.current` / `.peak`, plus the running
/// totals `.allocated` / `.freed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Now.
    pub current: u64,
    /// The largest `current` since creation or the last peak reset.
    pub peak: u64,
    /// Sum of every increase.
    pub allocated: u64,
    /// Sum of every decrease.
    pub freed: u64,
}

impl Stat {
    /// Adds `n`, raising the peak if needed.
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    /// Subtracts `n`.
    pub fn sub(&mut self, n: u64) {
        self.current -= n;
        self.freed += n;
    }
}

/// Counters of one category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryStats {
    /// Bytes of blocks held.
    pub allocated: Stat,
    /// Bytes asked for.
    pub requested: Stat,
    /// Live blocks.
    pub blocks: Stat,
}

impl CategoryStats {
    pub(super) fn add(&mut self, size: u64, requested: u64) {
        self.allocated.add(size);
        self.requested.add(requested);
        self.blocks.add(1);
    }

    pub(super) fn sub(&mut self, size: u64, requested: u64) {
        self.allocated.sub(size);
        self.requested.sub(requested);
        self.blocks.sub(1);
    }
}

/// Every counter of the allocator. Byte figures are exact.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Bytes in live blocks (`allocated_bytes.all`).
    pub allocated: Stat,
    /// Bytes asked for by live allocations (`requested_bytes.all`).
    pub requested: Stat,
    /// Bytes in pages (`reserved_bytes.all`).
    pub reserved: Stat,
    /// Bytes in blocks that may still be used (`active_bytes.all`). One wgpu queue runs
    /// submissions in order, so a freed block is reusable at once and active equals
    /// allocated; it is kept for readers of PyTorch's keys.
    pub active: Stat,
    /// Live blocks (`allocation.all`).
    pub blocks: Stat,
    /// Pages (`segment.all`).
    pub pages: Stat,
    /// Free bytes inside pages that still hold a live block (`inactive_split_bytes`):
    /// memory the cache holds but cannot return, the measure of fragmentation.
    pub inactive_split_bytes: u64,
    /// Free blocks inside such pages (`inactive_split`).
    pub inactive_split_blocks: u64,
    /// The largest cached free block.
    pub largest_free_block: u64,
    /// Successful allocations.
    pub num_allocs: u64,
    /// Frees.
    pub num_frees: u64,
    /// Times the cache was freed to retry an allocation.
    pub num_alloc_retries: u64,
    /// Allocations that failed for lack of memory.
    pub num_ooms: u64,
    /// Pages created.
    pub num_device_alloc: u64,
    /// Pages returned to the driver.
    pub num_device_free: u64,
    /// Counters per category, indexed by `Category::index()`.
    pub by_category: [CategoryStats; Category::ALL.len()],
    /// Allocated bytes per category at the moment `allocated` reached its peak (what
    /// the peak is made of), indexed like `by_category`.
    #[serde(default)]
    pub at_peak: [u64; Category::ALL.len()],
    /// The cap in bytes, if any.
    pub cap: Option<u64>,
    /// The device's memory, if the backend told it.
    pub device_memory: Option<u64>,
    /// The step these counters were read at.
    pub step: u64,
}

impl MemoryStats {
    /// Counters of one category.
    pub fn category(&self, category: Category) -> &CategoryStats {
        &self.by_category[category.index()]
    }

    /// Records the categories' current bytes as the peak's make-up if `allocated` is at
    /// its peak now.
    pub(super) fn note_peak(&mut self) {
        if self.allocated.current == self.allocated.peak {
            for (i, cat) in self.by_category.iter().enumerate() {
                self.at_peak[i] = cat.allocated.current;
            }
        }
    }

    /// Inactive split bytes over reserved bytes (0 when nothing is reserved).
    pub fn fragmentation(&self) -> f64 {
        if self.reserved.current == 0 {
            0.0
        } else {
            self.inactive_split_bytes as f64 / self.reserved.current as f64
        }
    }

    /// Peaks at least `earlier`'s (after a reset that measured a part of the run alone,
    /// the run's peaks as if there had been none).
    pub(super) fn keep_peaks(&mut self, earlier: &MemoryStats) {
        if earlier.allocated.peak > self.allocated.peak {
            self.at_peak = earlier.at_peak;
        }
        for (stat, old) in [
            (&mut self.allocated, &earlier.allocated),
            (&mut self.requested, &earlier.requested),
            (&mut self.reserved, &earlier.reserved),
            (&mut self.active, &earlier.active),
            (&mut self.blocks, &earlier.blocks),
            (&mut self.pages, &earlier.pages),
        ] {
            stat.peak = stat.peak.max(old.peak);
        }
        for (cat, old) in self.by_category.iter_mut().zip(&earlier.by_category) {
            cat.allocated.peak = cat.allocated.peak.max(old.allocated.peak);
            cat.requested.peak = cat.requested.peak.max(old.requested.peak);
            cat.blocks.peak = cat.blocks.peak.max(old.blocks.peak);
        }
    }

    pub(super) fn reset_peaks(&mut self) {
        for stat in [
            &mut self.allocated,
            &mut self.requested,
            &mut self.reserved,
            &mut self.active,
            &mut self.blocks,
            &mut self.pages,
        ] {
            stat.peak = stat.current;
        }
        for (i, cat) in self.by_category.iter().enumerate() {
            self.at_peak[i] = cat.allocated.current;
        }
        for cat in &mut self.by_category {
            cat.allocated.peak = cat.allocated.current;
            cat.requested.peak = cat.requested.current;
            cat.blocks.peak = cat.blocks.current;
        }
    }

    /// A readable table like torch.cuda.memory_summary().
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let rule = "=".repeat(79);
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(out, " wgtrain memory summary (step {})", self.step);
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(
            out,
            " {:<28}|{:>12} |{:>12} |{:>11} |{:>11}",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        );
        let _ = writeln!(out, "{}", "-".repeat(79));
        let bytes_row = |out: &mut String, name: &str, s: &Stat| {
            let _ = writeln!(
                out,
                " {:<28}|{:>12} |{:>12} |{:>11} |{:>11}",
                name,
                format_bytes(s.current),
                format_bytes(s.peak),
                format_bytes(s.allocated),
                format_bytes(s.freed)
            );
        };
        bytes_row(&mut out, "Allocated memory", &self.allocated);
        for cat in Category::ALL {
            let s = &self.category(cat).allocated;
            if s.allocated > 0 {
                bytes_row(&mut out, &format!("  from {cat}"), s);
            }
        }
        bytes_row(&mut out, "Requested memory", &self.requested);
        bytes_row(&mut out, "Reserved memory", &self.reserved);
        let count_row = |out: &mut String, name: &str, s: &Stat| {
            let _ = writeln!(
                out,
                " {:<28}|{:>12} |{:>12} |{:>11} |{:>11}",
                name, s.current, s.peak, s.allocated, s.freed
            );
        };
        count_row(&mut out, "Allocations (blocks)", &self.blocks);
        count_row(&mut out, "Pages (segments)", &self.pages);
        let _ = writeln!(out, "{}", "-".repeat(79));
        let _ = writeln!(
            out,
            " Non-releasable (inactive split): {} in {} blocks; fragmentation {:.1}%",
            format_bytes(self.inactive_split_bytes),
            self.inactive_split_blocks,
            100.0 * self.fragmentation()
        );
        let _ = writeln!(
            out,
            " Largest free block: {}; cap: {}; device memory: {}",
            format_bytes(self.largest_free_block),
            self.cap.map_or("none".into(), format_bytes),
            self.device_memory.map_or("unknown".into(), format_bytes)
        );
        let _ = writeln!(
            out,
            " allocs {} | frees {} | device allocs {} | device frees {} | retries {} | OOMs {}",
            self.num_allocs, self.num_frees, self.num_device_alloc, self.num_device_free, self.num_alloc_retries, self.num_ooms
        );
        let _ = writeln!(out, "{rule}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_peaks_are_the_larger_of_the_two_spans() {
        let mut earlier = MemoryStats::default();
        earlier.allocated = Stat {
            current: 5,
            peak: 10,
            ..Default::default()
        };
        earlier.reserved = Stat {
            current: 20,
            peak: 20,
            ..Default::default()
        };
        earlier.at_peak[0] = 7;
        let mut now = earlier.clone();
        now.reset_peaks();
        assert_eq!(now.allocated.peak, 5);
        // A later span that peaks lower in allocated, higher in reserved.
        now.allocated.peak = 8;
        now.reserved.peak = 40;
        now.at_peak[0] = 3;
        now.keep_peaks(&earlier);
        assert_eq!((now.allocated.peak, now.reserved.peak), (10, 40));
        assert_eq!(now.at_peak[0], 7, "the categories at the larger peak");
    }
}
