//! Export of a run's memory in PyTorch's `torch.cuda.memory._snapshot()` layout, which
//! pytorch.org/memory_viz opens as a pickle: `segments` (our pages, each with its
//! blocks) and `device_traces` (one device's alloc / free_completed events, built from
//! a step's timeline). Addresses are synthetic: page id * 2^40 + offset for segments,
//! and a counter for the trace. A block's label and category become its one frame.
//!
//! May call: `wgtrain_protocol`. Called by: `server`.

use serde::Serialize;
use wgtrain_protocol::{Band, PageView, PoolKind, StepMemory};

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

fn frame(label: &str, category: &str) -> Vec<Frame> {
    vec![Frame {
        filename: format!("wgtrain:{category}"),
        line: 0,
        name: label.to_string(),
    }]
}

/// The snapshot of `pages` (now) and the trace of `steps` (in order).
pub fn snapshot(pages: &[PageView], steps: &[&StepMemory]) -> Snapshot {
    let segments = pages
        .iter()
        .map(|p| {
            let base = p.id << 40;
            let blocks: Vec<VizBlock> = p
                .blocks
                .iter()
                .map(|b| VizBlock {
                    address: base + b.offset,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated { "active_allocated" } else { "inactive" },
                    frames: match (&b.label, b.category) {
                        (Some(l), Some(c)) => frame(l, c.name()),
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
    let (mut base_us, mut next_addr) = (0u64, 1u64 << 60);
    for s in steps {
        // In the step's event order (ties: frees first, as a block is reused); a block
        // that outlives the step is freed at its end so the next step starts clean.
        let mut events: Vec<(u64, bool, u64, u64, &Band)> = Vec::new();
        for b in &s.bands {
            let addr = next_addr;
            next_addr += b.size.max(1);
            events.push((b.start_seq, true, b.start_us, addr, b));
            events.push((b.end_seq, false, b.end_us.min(s.duration_us), addr, b));
        }
        events.sort_by_key(|e| (e.0, e.1));
        for (_, alloc, t, addr, b) in events {
            trace.push(TraceEntry {
                action: if alloc { "alloc" } else { "free_completed" },
                addr,
                size: b.size,
                stream: 0,
                time_us: base_us + t,
                frames: frame(&b.label, b.category.name()),
            });
        }
        base_us += s.duration_us + 1;
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
