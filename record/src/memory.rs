//! The memory record of a run as the dashboard reads it: the allocator's event trace
//! and pages (the engine's `memory` module produces them), and each step's timeline of
//! blocks built from them (memory_viz's Active Memory Timeline).
//!
//! May call: `category`, serde. Called by: the engine's allocator and trainer, the dashboard.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::category::{Category, PoolKind};

/// A page's id (unique for the allocator's life).
pub type PageId = u64;
/// An allocation's id (unique for the allocator's life).
pub type AllocId = u64;

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
    /// The phase of the step when it happened ("forward", "backward", "recompute",
    /// "optimizer", ...; empty outside a step).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
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

/// One block's life inside one step, as memory_viz's Active Memory Timeline draws it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// The tensor's label.
    pub label: String,
    /// Its category.
    pub category: Category,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes asked for.
    pub requested: u64,
    /// Microseconds from the step's start when it was allocated (0: before the step).
    pub start_us: u64,
    /// Microseconds from the step's start when it was freed (the step's length if it
    /// outlived the step).
    pub end_us: u64,
    /// The allocation's place among the step's allocator events (0: before the step);
    /// memory_viz's timeline runs over this order rather than over wall time.
    #[serde(default)]
    pub start_seq: u64,
    /// The free's place among the step's events (the event count if it outlived the step).
    #[serde(default)]
    pub end_seq: u64,
    /// The phase of the step that allocated it (empty: alive before the step began).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// The page holding the block.
    #[serde(default)]
    pub page: Option<PageId>,
    /// The block's offset in its page.
    #[serde(default)]
    pub offset: u64,
}

/// A stretch of a step's allocator events spent in one phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSpan {
    /// "forward", "backward", "recompute", "optimizer", "readback", ...
    pub phase: String,
    /// The first event of the stretch.
    pub start_seq: u64,
    /// The last event of the stretch.
    pub end_seq: u64,
}

/// The memory story of one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMemory {
    /// The step (1 after the first).
    pub step: u64,
    /// Length of the step in microseconds.
    pub duration_us: u64,
    /// Allocator events in the step (allocations and frees, numbered from 1).
    #[serde(default)]
    pub events: u64,
    /// Every block live at some time in the step, in allocation order (blocks from
    /// before the step first).
    pub bands: Vec<Band>,
    /// Out-of-memory events in the step: (microseconds from the start, bytes asked, label).
    pub ooms: Vec<(u64, u64, String)>,
    /// Events the allocator's trace dropped (the timeline is then incomplete).
    pub events_dropped: u64,
    /// Pages and their blocks at the step's end.
    pub pages: Vec<PageView>,
    /// The step's phases over its events, in order.
    #[serde(default)]
    pub phases: Vec<PhaseSpan>,
}

impl StepMemory {
    /// Builds a step's timeline from the allocator's events of the step (`start_us` and
    /// `end_us` on the events' clock) and the pages at its end.
    pub fn from_events(step: u64, start_us: u64, end_us: u64, events: &[Event], events_dropped: u64, pages: Vec<PageView>) -> StepMemory {
        let rel = |t: u64| t.saturating_sub(start_us);
        let duration = rel(end_us);
        let mut bands: Vec<Band> = Vec::new();
        let mut open: HashMap<u64, usize> = HashMap::new();
        let mut earlier: Vec<Band> = Vec::new();
        let mut seen_in_step: HashSet<u64> = Default::default();
        let mut ooms = Vec::new();
        let count = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
            .count() as u64;
        let mut seq = 0u64;
        let mut phases: Vec<PhaseSpan> = Vec::new();
        for e in events {
            if matches!(e.kind, EventKind::Alloc | EventKind::Free) {
                seq += 1;
                match phases.last_mut() {
                    Some(last) if last.phase == e.phase => last.end_seq = seq,
                    _ if e.phase.is_empty() => {}
                    _ => phases.push(PhaseSpan {
                        phase: e.phase.clone(),
                        start_seq: seq,
                        end_seq: seq,
                    }),
                }
            }
            let category = e.category.unwrap_or(Category::Other);
            match (e.kind, e.alloc) {
                (EventKind::Alloc, Some(id)) => {
                    open.insert(id, bands.len());
                    seen_in_step.insert(id);
                    bands.push(Band {
                        label: e.label.clone(),
                        category,
                        size: e.size,
                        requested: e.requested,
                        start_us: rel(e.time_us),
                        end_us: duration,
                        start_seq: seq,
                        end_seq: count + 1,
                        phase: e.phase.clone(),
                        page: e.page,
                        offset: e.offset,
                    });
                }
                (EventKind::Free, Some(id)) => match open.remove(&id) {
                    Some(i) => {
                        bands[i].end_us = rel(e.time_us);
                        bands[i].end_seq = seq;
                    }
                    None => {
                        seen_in_step.insert(id);
                        earlier.push(Band {
                            label: e.label.clone(),
                            category,
                            size: e.size,
                            requested: e.requested,
                            start_us: 0,
                            end_us: rel(e.time_us),
                            start_seq: 0,
                            end_seq: seq,
                            phase: String::new(),
                            page: e.page,
                            offset: e.offset,
                        })
                    }
                },
                (EventKind::Oom, _) => ooms.push((rel(e.time_us), e.size, e.label.clone())),
                _ => {}
            }
        }
        // Blocks that lived through the whole step (parameters, optimizer state, ...).
        for page in &pages {
            for b in &page.blocks {
                if let (true, Some(id)) = (b.allocated, b.alloc)
                    && !seen_in_step.contains(&id)
                {
                    earlier.push(Band {
                        label: b.label.clone().unwrap_or_default(),
                        category: b.category.unwrap_or(Category::Other),
                        size: b.size,
                        requested: b.requested,
                        start_us: 0,
                        end_us: duration,
                        start_seq: 0,
                        end_seq: count + 1,
                        phase: String::new(),
                        page: Some(page.id),
                        offset: b.offset,
                    });
                }
            }
        }
        earlier.extend(bands);
        StepMemory {
            step,
            duration_us: duration,
            events: count,
            bands: earlier,
            ooms,
            events_dropped,
            pages,
            phases,
        }
    }
}

/// `GET /api/runs/NAME/peak`: what is alive at a step's peak, largest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeakView {
    /// The step.
    pub step: u64,
    /// Bytes alive at the peak (the log's `mem.peak` of the step).
    pub peak_bytes: u64,
    /// The allocator event after which the peak holds (0: at the step's start).
    pub event: u64,
    /// Those bytes by category.
    pub by_category: BTreeMap<String, u64>,
    /// The blocks alive then, largest first.
    pub blocks: Vec<PeakBlock>,
}

/// A block alive at the peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakBlock {
    /// The tensor's label.
    pub label: String,
    /// Its category.
    pub category: Category,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes asked for.
    pub requested: u64,
    /// Whether the step allocated it (false: it was alive when the step began).
    pub in_step: bool,
    /// The phase that allocated it ("forward", "backward", "recompute", "optimizer";
    /// "before the step" for blocks alive when it began).
    pub phase: String,
}

impl StepMemory {
    /// The blocks alive at the step's peak: the last event after which the live bytes
    /// are largest, as the allocator's `at_peak` counts it (a band is alive from its
    /// allocation's event to before its free's).
    pub fn peak(&self) -> PeakView {
        let mut deltas: Vec<(u64, i128)> = Vec::with_capacity(2 * self.bands.len());
        for b in &self.bands {
            deltas.push((b.start_seq, i128::from(b.size)));
            deltas.push((b.end_seq, -i128::from(b.size)));
        }
        deltas.sort_unstable_by_key(|d| d.0);
        let (mut live, mut best, mut at) = (0i128, -1i128, 0u64);
        let mut i = 0;
        while i < deltas.len() {
            let seq = deltas[i].0;
            while i < deltas.len() && deltas[i].0 == seq {
                live += deltas[i].1;
                i += 1;
            }
            // The last moment at the largest total, as the allocator's `at_peak` is (a
            // later moment with the same total can hold other categories).
            if live >= best {
                (best, at) = (live, seq);
            }
        }
        let mut blocks: Vec<PeakBlock> = self
            .bands
            .iter()
            .filter(|b| b.start_seq <= at && at < b.end_seq)
            .map(|b| PeakBlock {
                label: b.label.clone(),
                category: b.category,
                size: b.size,
                requested: b.requested,
                in_step: b.start_seq > 0,
                phase: if b.start_seq == 0 || b.phase.is_empty() {
                    "before the step".into()
                } else {
                    b.phase.clone()
                },
            })
            .collect();
        blocks.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.label.cmp(&b.label)));
        let mut by_category = BTreeMap::new();
        for b in &blocks {
            *by_category.entry(b.category.name().to_string()).or_insert(0) += b.size;
        }
        PeakView {
            step: self.step,
            peak_bytes: best.max(0) as u64,
            event: at,
            by_category,
            blocks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(label: &str, category: Category, size: u64, (start_seq, end_seq): (u64, u64)) -> Band {
        Band {
            label: label.into(),
            category,
            size,
            requested: size,
            start_us: start_seq,
            end_us: end_seq,
            start_seq,
            end_seq,
            phase: "forward".into(),
            page: None,
            offset: 0,
        }
    }

    /// Two moments with the same total: the later one is the peak, as the allocator's
    /// `at_peak` (updated whenever allocated bytes equal their peak) has it.
    #[test]
    fn the_peak_is_the_last_moment_at_the_largest_total() {
        let t = StepMemory {
            step: 1,
            duration_us: 10,
            events: 6,
            bands: vec![
                band("a", Category::Activation, 16, (1, 3)),
                band("b", Category::Temporary, 4, (2, 6)),
                band("c", Category::Activation, 14, (4, 6)),
                band("d", Category::Temporary, 2, (5, 6)),
            ],
            ooms: Vec::new(),
            events_dropped: 0,
            pages: Vec::new(),
            phases: Vec::new(),
        };
        let p = t.peak();
        assert_eq!((p.peak_bytes, p.event), (20, 5));
        assert_eq!(p.by_category["activation"], 14);
        assert_eq!(p.by_category["temporary"], 6);
    }
}
