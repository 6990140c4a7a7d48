//! Per-launch GPU timing for the profiler (`wgtrain profile`). While profiling is on,
//! every launch's compute pass writes a begin and an end timestamp into query sets
//! sized to the launches of a step (2048 launches per set of 4096 queries, more sets as
//! a step needs them); the sets are resolved and read back once, at [`collect`], never
//! per launch. Each launch is recorded with its kernel family and variant, the label of
//! the tensor it writes (its last binding, e.g. `h.3.attn.y`), its workgroups, and the
//! work it does where the kernel states it (FLOPs; bytes default to the bound blocks'
//! sizes), and the phase of the step the host was in when it was recorded (forward,
//! backward, optimizer, ...: [`Profiler::mark`], which also keeps the host's spans for
//! the trace). Off by default; without timestamps the runtime refuses to start it.
//!
//! May call: `device`, `error`, `runtime::cache`. Called by: `runtime::record`,
//! `runtime::launch`.
//!
//! [`collect`]: Profiler::collect

use std::sync::Arc;
use std::time::Instant;

use super::cache::KernelKey;
use crate::device::{DeviceError, Gpu};
use crate::error::Error;

/// Launches one query set times (two queries each).
pub const LAUNCHES_PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES / 2;

/// What a launch does, where its kernel knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes read and written.
    pub bytes: f64,
}

/// One timed launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRecord {
    /// The kernel family and variant.
    pub key: KernelKey,
    /// The kernel's readable name, as its family names it.
    pub name: Arc<str>,
    /// The label of the tensor the launch writes (its last binding).
    pub label: Option<Arc<str>>,
    /// Workgroups dispatched.
    pub groups: [u32; 3],
    /// What it does.
    pub work: Work,
    /// The phase of the step the host was in when it was recorded ("" for none).
    pub phase: &'static str,
    /// GPU time at its start, nanoseconds (the device's clock).
    pub start_ns: f64,
    /// GPU time at its end, nanoseconds.
    pub end_ns: f64,
}

/// A span of host time in one phase of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSpan {
    /// The phase ("forward", "backward", "optimizer", "data wait", "readback").
    pub name: &'static str,
    /// When it began.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

/// What one collect returns: the timed launches in order and the host's phases.
#[derive(Clone, Debug, Default)]
pub struct StepTrace {
    /// Every launch since the last collect.
    pub launches: Vec<LaunchRecord>,
    /// The host's phase spans since the last collect.
    pub spans: Vec<HostSpan>,
}

struct Pending {
    key: KernelKey,
    name: Arc<str>,
    phase: &'static str,
    label: Option<Arc<str>>,
    groups: [u32; 3],
    work: Work,
}

/// A set of [`wgpu::QUERY_SET_MAX_QUERIES`] timestamps with its resolve and read buffers.
struct QuerySet {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
}

impl QuerySet {
    fn new(gpu: &Gpu, label: &'static str) -> QuerySet {
        let bytes = u64::from(wgpu::QUERY_SET_MAX_QUERIES) * 8;
        let buffer = |usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        QuerySet {
            set: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some(label),
                ty: wgpu::QueryType::Timestamp,
                count: wgpu::QUERY_SET_MAX_QUERIES,
            }),
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
        }
    }

    /// Records the resolve of the first `n` queries and their copy to the read buffer.
    fn resolve(&self, encoder: &mut wgpu::CommandEncoder, n: u32) {
        encoder.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, u64::from(n) * 8);
    }
}

/// Maps the first `bytes` of `read` (after what was submitted ran), returns them as
/// timestamps and unmaps.
pub(super) fn read_ticks(gpu: &Gpu, read: &wgpu::Buffer, bytes: u64) -> Result<Vec<u64>, Error> {
    read_ticks_after(gpu, read, bytes, None)
}

/// [`read_ticks`] waiting only for submission `index` (and those before it), where given.
fn read_ticks_after(gpu: &Gpu, read: &wgpu::Buffer, bytes: u64, index: Option<wgpu::SubmissionIndex>) -> Result<Vec<u64>, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    read.slice(..bytes).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    match index {
        Some(index) => gpu.wait_for(index)?,
        None => gpu.wait()?,
    }
    rx.recv()
        .map_err(|e| DeviceError::Readback(e.to_string()))?
        .map_err(|e| DeviceError::Readback(e.to_string()))?;
    let ticks = {
        let view = read
            .slice(..bytes)
            .get_mapped_range()
            .map_err(|e| DeviceError::Readback(e.to_string()))?;
        bytemuck::cast_slice::<u8, u64>(&view).to_vec()
    };
    read.unmap();
    Ok(ticks)
}

/// How long the GPU was busy over a step, from a begin and an end timestamp per
/// compute pass (the untimed launches of a step share a pass per submission): the
/// union of the passes' spans. Costs two queries per pass, resolved and read once at
/// [`BusyMeter::take`].
pub struct BusyMeter {
    set: QuerySet,
    used: u32,
    overflow: bool,
    /// Queries whose resolve is recorded already (by a read-back's submission).
    resolved: u32,
}

impl BusyMeter {
    /// A meter with its query set.
    pub fn new(gpu: &Gpu) -> BusyMeter {
        BusyMeter {
            set: QuerySet::new(gpu, "wgtrain busy meter"),
            used: 0,
            overflow: false,
            resolved: 0,
        }
    }

    /// Forgets what was metered (a step that failed before its take).
    pub fn clear(&mut self) {
        self.used = 0;
        self.overflow = false;
        self.resolved = 0;
    }

    /// The timestamp writes of the next pass opened, or none when the set is full (the
    /// step then reports no busy time rather than a wrong one).
    pub fn next(&mut self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        if self.used + 2 > wgpu::QUERY_SET_MAX_QUERIES {
            self.overflow = true;
            return None;
        }
        let i = self.used;
        self.used += 2;
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set.set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        })
    }

    /// Records the resolve of the passes metered (the caller submits it).
    pub fn resolve(&mut self, encoder: &mut wgpu::CommandEncoder) {
        if self.used > 0 {
            self.set.resolve(encoder, self.used);
        }
        self.resolved = self.used;
    }

    /// Whether passes were metered since the last resolve.
    pub fn unresolved(&self) -> bool {
        self.resolved != self.used
    }

    /// After the resolve ran: the union of the passes' spans in seconds (none when the
    /// set overflowed), and the meter emptied.
    /// `resolved_in` is the submission holding the resolve (none: wait for everything).
    pub fn take(&mut self, gpu: &Gpu, resolved_in: Option<wgpu::SubmissionIndex>) -> Result<Option<f64>, Error> {
        let (used, overflow) = (std::mem::take(&mut self.used), std::mem::take(&mut self.overflow));
        self.resolved = 0;
        if overflow {
            return Ok(None);
        }
        if used == 0 {
            return Ok(Some(0.0));
        }
        let ticks = read_ticks_after(gpu, &self.set.read, u64::from(used) * 8, resolved_in)?;
        let mut spans: Vec<(u64, u64)> = ticks.chunks_exact(2).map(|t| (t[0], t[1].max(t[0]))).collect();
        let period = f64::from(gpu.queue.get_timestamp_period());
        Ok(Some(union_length(&mut spans) as f64 * period * 1e-9))
    }
}

/// The length of the union of the spans `[start, end)`.
fn union_length(spans: &mut [(u64, u64)]) -> u64 {
    spans.sort_unstable();
    let mut total = 0;
    let mut reach = 0;
    for &(s, e) in spans.iter() {
        let s = s.max(reach);
        if e > s {
            total += e - s;
            reach = e;
        }
    }
    total
}

/// The query sets and the launches recorded since the last collect.
pub struct Profiler {
    sets: Vec<QuerySet>,
    pending: Vec<Pending>,
    spans: Vec<HostSpan>,
    open: Option<(&'static str, Instant)>,
}

impl Profiler {
    /// An empty profiler (sets are made as launches need them).
    pub fn new() -> Profiler {
        Profiler {
            sets: Vec::new(),
            pending: Vec::new(),
            spans: Vec::new(),
            open: None,
        }
    }

    /// The host enters phase `name` (ending the one it was in); "" ends the phase only.
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        if let Some((open, start)) = self.open.take() {
            self.spans.push(HostSpan {
                name: open,
                start,
                end: now,
            });
        }
        if !name.is_empty() {
            self.open = Some((name, now));
        }
    }

    fn phase(&self) -> &'static str {
        self.open.map_or("", |(name, _)| name)
    }

    /// Records a launch's facts and returns the pass's timestamp writes.
    pub fn next(
        &mut self,
        gpu: &Gpu,
        key: KernelKey,
        name: Arc<str>,
        label: Option<Arc<str>>,
        groups: [u32; 3],
        work: Work,
    ) -> wgpu::ComputePassTimestampWrites<'_> {
        let i = self.pending.len() as u32;
        let set = (i / LAUNCHES_PER_SET) as usize;
        while self.sets.len() <= set {
            self.sets.push(QuerySet::new(gpu, "wgtrain profile"));
        }
        let phase = self.phase();
        self.pending.push(Pending {
            key,
            name,
            phase,
            label,
            groups,
            work,
        });
        let slot = (i % LAUNCHES_PER_SET) * 2;
        wgpu::ComputePassTimestampWrites {
            query_set: &self.sets[set].set,
            beginning_of_pass_write_index: Some(slot),
            end_of_pass_write_index: Some(slot + 1),
        }
    }

    /// Launches recorded since the last collect.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Records the resolves of every used set into `encoder` (the caller submits it and
    /// waits, then calls [`Profiler::read`]).
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = self.pending.len() as u32;
        for (s, set) in self.sets.iter().enumerate() {
            let used = n.saturating_sub(s as u32 * LAUNCHES_PER_SET).min(LAUNCHES_PER_SET);
            if used == 0 {
                break;
            }
            set.resolve(encoder, used * 2);
        }
    }

    /// Reads the resolved timestamps (after the resolves ran) and returns the launches
    /// in order and the host's closed phase spans, emptying the profiler (the open
    /// phase stays open).
    pub fn read(&mut self, gpu: &Gpu) -> Result<StepTrace, Error> {
        let n = self.pending.len() as u32;
        let period = f64::from(gpu.queue.get_timestamp_period());
        let mut ticks: Vec<u64> = Vec::with_capacity(2 * n as usize);
        for (s, set) in self.sets.iter().enumerate() {
            let used = n.saturating_sub(s as u32 * LAUNCHES_PER_SET).min(LAUNCHES_PER_SET);
            if used == 0 {
                break;
            }
            ticks.extend(read_ticks(gpu, &set.read, u64::from(used) * 16)?);
        }
        let launches = std::mem::take(&mut self.pending)
            .into_iter()
            .enumerate()
            .map(|(i, p)| LaunchRecord {
                key: p.key,
                name: p.name.clone(),
                phase: p.phase,
                label: p.label,
                groups: p.groups,
                work: p.work,
                start_ns: ticks[2 * i] as f64 * period,
                end_ns: ticks[2 * i + 1].max(ticks[2 * i]) as f64 * period,
            })
            .collect();
        Ok(StepTrace {
            launches,
            spans: std::mem::take(&mut self.spans),
        })
    }

    /// Takes the host's closed phase spans (when no launch was timed).
    pub fn take_spans(&mut self) -> Vec<HostSpan> {
        std::mem::take(&mut self.spans)
    }
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler::new()
    }
}
