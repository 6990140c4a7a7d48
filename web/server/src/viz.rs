//! Export of a run's memory in PyTorch's `torch.cuda.memory._snapshot()` layout, which
//! pytorch.org/memory_viz opens as a pickle: `segments` (our pages at a step's end,
//! each with its blocks) and `device_traces` (that step's alloc / free_completed
//! events). Addresses are (page id + 1) * 2^40 + offset, in the segments and the trace
//! alike, so every traced block lies inside its segment. A block's label gives its
//! frames (the label and each enclosing module path).
//!
//! May call: `wgtrain_record`. Called by: `server`.

use serde::Serialize;
use wgtrain_record::{Band, PageView, PoolKind, StepMemory};

/// One stack frame (memory_viz shows it on hover).
#[derive(Serialize)]
pub struct Frame {
    filename: String,
    line: u64,
    name: String,
}

/// A block of a segment.
#[derive(Serialize)]
pub struct VizBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<Frame>,
}

/// A segment (one of our pages).
#[derive(Serialize)]
pub struct Segment {
    device: u64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<VizBlock>,
}

/// One trace entry.
#[derive(Serialize)]
pub struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: u64,
    frames: Vec<Frame>,
}

/// The whole snapshot.
#[derive(Serialize)]
pub struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEntry>>,
}

/// Where page `id` sits in the exported address space (never 0).
fn page_base(id: u64) -> u64 {
    (id + 1) << 40
}

/// A block's frames, innermost first as memory_viz lists a stack: the label, then each
/// enclosing module path (`h.3.attn.c_attn.dx`, `h.3.attn.c_attn`, `h.3.attn`, `h.3`,
/// `h`), so its stack view groups blocks by layer and op. The file names the category
/// and the phase that allocated it.
fn frames(label: &str, category: &str, phase: &str) -> Vec<Frame> {
    let filename = if phase.is_empty() {
        format!("wgtrain/{category}")
    } else {
        format!("wgtrain/{category}/{phase}")
    };
    let mut out = vec![Frame {
        filename: filename.clone(),
        line: 0,
        name: label.to_string(),
    }];
    let mut rest = label;
    while let Some(i) = rest.rfind('.') {
        rest = &rest[..i];
        out.push(Frame {
            filename: filename.clone(),
            line: 0,
            name: rest.to_string(),
        });
    }
    out
}

/// The snapshot of one step: its pages at the step's end as segments, and its
/// allocations and frees as the trace, at the blocks' own addresses (page base +
/// offset), so memory_viz can replay the trace back from the segments: blocks alive
/// across the whole step are in the segments only, blocks made in the step have their
/// `alloc`, blocks freed in it their `free_completed`. Without a step, the segments
/// alone (`pages`).
pub fn snapshot(pages: &[PageView], step: Option<&StepMemory>) -> Snapshot {
    let pages = step.map_or(pages, |s| s.pages.as_slice());
    let segments = pages
        .iter()
        .map(|p| {
            let base = page_base(p.id);
            let blocks: Vec<VizBlock> = p
                .blocks
                .iter()
                .map(|b| VizBlock {
                    address: base + b.offset,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated { "active_allocated" } else { "inactive" },
                    frames: match (&b.label, b.category) {
                        (Some(l), Some(c)) => frames(l, c.name(), ""),
                        _ => Vec::new(),
                    },
                })
                .collect();
            let allocated: u64 = p.blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum();
            Segment {
                device: 0,
                address: base,
                total_size: p.size,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: p.blocks.iter().map(|b| b.requested).sum(),
                stream: 0,
                segment_type: if p.pool == PoolKind::Small { "small" } else { "large" },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: Vec::new(),
                blocks,
            }
        })
        .collect();
    let mut trace = Vec::new();
    if let Some(s) = step {
        // In the step's event order; at one event, a free before an allocation.
        let mut events: Vec<(u64, bool, u64, &Band)> = Vec::new();
        for b in &s.bands {
            if b.start_seq > 0 {
                events.push((b.start_seq, true, b.start_us, b));
            }
            if b.end_seq <= s.events {
                events.push((b.end_seq, false, b.end_us.min(s.duration_us), b));
            }
        }
        events.sort_by_key(|e| (e.0, e.1));
        for (_, alloc, t, b) in events {
            trace.push(TraceEntry {
                action: if alloc { "alloc" } else { "free_completed" },
                addr: b.page.map_or(0, page_base) + b.offset,
                size: b.size,
                stream: 0,
                time_us: t,
                frames: frames(&b.label, b.category.name(), &b.phase),
            });
        }
    }
    Snapshot {
        segments,
        device_traces: vec![trace],
    }
}

/// The snapshot as a pickle (protocol 3), as memory_viz loads it.
pub fn to_pickle(s: &Snapshot) -> Result<Vec<u8>, String> {
    serde_pickle::to_vec(s, serde_pickle::SerOptions::new()).map_err(|e| e.to_string())
}
