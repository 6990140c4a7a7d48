//! Where launches go, chosen when the runtime is made: [`DeviceRecorder`] records them
//! into one command encoder and submits at a flush; [`DryRecorder`] (the memory
//! estimate's dry run) drops them, so nothing is recorded and no device memory is
//! touched.
//!
//! The parameter ring: each launch's parameters take the next [`PARAM_SLOT`]-byte slot of
//! a host copy of the ring; the used part of the ring is written to the device once per
//! submission, just before it (a queue write lands before the submission that follows
//! it). The encoder is submitted every [`SUBMIT_EVERY`] launches (sooner after a wait:
//! [`SUBMIT_FIRST`]) and at a flush, each
//! submission writing only its own slots; after [`RING_SLOTS`] launches the ring starts
//! over.
//!
//! Passes: untimed launches share one compute pass until the next submission or other
//! use of the encoder (each dispatch is its own synchronization scope, so the order of
//! reads and writes holds); a pass per launch cost the host several microseconds each.
//!
//! Timestamps: while timing is on, the timed launches share a compute pass as untimed
//! ones do (so a span of launches is timed as a step runs it), and each pass opened for
//! them writes the shared query set: the first its beginning, every one its end (a pass
//! ends early at a submission or another use of the encoder). While profiling, each
//! launch has a pass of its own with both timestamps. While the busy meter is on
//! (`profile::BusyMeter`), each pass the untimed launches open writes a begin and an end
//! timestamp of its own.
//!
//! May call: `device`, `error`, `runtime::cache`.

use std::num::NonZeroU64;
use std::sync::Arc;

use super::cache::{Kernel, MAX_STORAGE_BINDINGS, PARAM_SLOT};
use super::profile::{BusyMeter, Profiler, StepTrace, Work, read_ticks};
use crate::device::Gpu;
use crate::error::Error;

/// Launches recorded before the ring is reused (the encoder is submitted then too).
pub const RING_SLOTS: u64 = 1024;
/// Launches recorded before the encoder is submitted: the device starts on them while
/// the host records the rest of the step, instead of idling until a read-back.
pub const SUBMIT_EVERY: u64 = 64;
/// After the host has waited for the device (a read-back: the device is idle), the first
/// submission comes after this many launches and each next one after twice as many, up
/// to [`SUBMIT_EVERY`]: the device starts on a step's first launches while the host
/// records the rest, instead of idling for 64 launches' recording.
pub const SUBMIT_FIRST: u64 = 4;

/// What timing a span of launches gave.
pub enum Elapsed {
    /// GPU timestamps: seconds from the first launch's start to the last one's end.
    Gpu(f64),
    /// No timestamps: the caller times the span on the wall clock.
    Wall,
    /// Nothing ran (dry run).
    Nothing,
}

/// What the profiler is told of a launch (only while profiling).
pub struct LaunchMeta {
    /// The label of the tensor it writes.
    pub label: Option<Arc<str>>,
    /// What it does.
    pub work: Work,
}

/// Receives the launches of a runtime (see the module).
pub trait Recorder: Send {
    /// Records one launch of `kernel` with `params` and these block bindings (`meta`
    /// while profiling).
    fn record(&mut self, kernel: &Kernel, params: &[u8], bindings: &[wgpu::BufferBinding<'_>], groups: [u32; 3], meta: Option<LaunchMeta>);
    /// Starts timing every launch (a profiler of its own); false where it cannot.
    fn start_profiling(&mut self) -> bool {
        false
    }
    /// Stops nothing: submits, waits, and returns the launches timed since the last
    /// call (empty when not profiling).
    fn collect_profile(&mut self) -> Result<StepTrace, Error> {
        Ok(StepTrace::default())
    }
    /// The host enters phase `name` of a step (while profiling; "" ends the phase).
    fn mark(&mut self, _name: &'static str) {}
    /// Stops timing launches.
    fn stop_profiling(&mut self) {}
    /// Starts metering how long the GPU is busy (a begin and an end timestamp per
    /// compute pass); false where it cannot (no timestamps, or the dry run).
    fn start_meter(&mut self) -> bool {
        false
    }
    /// Stops metering: the passes recorded since [`Recorder::start_meter`] are the
    /// span of the returned ticket (none when not metering), whose resolve is submitted
    /// here (or rode in a read-back's submission). Metering may start again at once:
    /// an ended meter waits for [`Recorder::read_meter`] while the next one runs.
    fn end_meter(&mut self) -> Option<u64> {
        None
    }
    /// Waits for the ended meter `ticket`'s resolve (not for what was submitted after
    /// it) and returns the seconds the GPU was busy with its passes (none when they
    /// overflowed the meter or the ticket is unknown). Ended meters older than the
    /// ticket are dropped unread.
    fn read_meter(&mut self, _ticket: u64) -> Result<Option<f64>, Error> {
        Ok(None)
    }
    /// [`Recorder::end_meter`] and [`Recorder::read_meter`]: submits, waits, and
    /// returns the seconds the GPU was busy with the passes recorded since
    /// [`Recorder::start_meter`] (none when not metering).
    fn take_meter(&mut self) -> Result<Option<f64>, Error> {
        match self.end_meter() {
            Some(ticket) => self.read_meter(ticket),
            None => Ok(None),
        }
    }
    /// Submits what has been recorded.
    fn submit(&mut self);
    /// The host has waited for the device, which is idle now (see [`SUBMIT_FIRST`]).
    fn idle(&mut self) {}
    /// A read-back is about to be submitted: while metering, the meter's resolve goes
    /// with it, so that [`Recorder::take_meter`] after it has nothing to wait for.
    fn before_read(&mut self) {}
    /// Waits for the device to finish what was submitted.
    fn wait(&mut self) -> Result<(), Error>;
    /// Starts timing the launches recorded from now on.
    fn begin_timing(&mut self);
    /// Stops timing, submits, waits, and says how long the timed launches took.
    fn end_timing(&mut self) -> Result<Elapsed, Error>;
}

/// Records into a command encoder on the device.
pub struct DeviceRecorder {
    gpu: Arc<Gpu>,
    params: wgpu::Buffer,
    staged: Vec<u8>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass launches share while nothing times them (ended before any other
    /// use of the encoder and at a submit).
    pass: Option<wgpu::ComputePass<'static>>,
    slot: u64,
    /// Slots below this one are already written to the device.
    written: u64,
    queries: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
    timing: Option<bool>,
    profiler: Option<Profiler>,
    /// The busy meter (made at its first use) and whether it is on.
    meter: Option<BusyMeter>,
    metering: bool,
    /// Ended meters waiting to be read: ticket, meter, the submission holding its
    /// resolve; and meters read, for reuse.
    ended: std::collections::VecDeque<(u64, BusyMeter, Option<wgpu::SubmissionIndex>)>,
    spare: Vec<BusyMeter>,
    tickets: u64,
    /// The last submission (an ended meter's resolve is in it or before it).
    last_submission: Option<wgpu::SubmissionIndex>,
    /// Launches the next submission waits for (see [`SUBMIT_FIRST`]).
    batch: u64,
}

impl DeviceRecorder {
    /// A recorder on `gpu` with its parameter ring and (when granted) timestamp queries.
    pub fn new(gpu: Arc<Gpu>) -> DeviceRecorder {
        let params = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgtrain launch params"),
            size: PARAM_SLOT * RING_SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let queries = gpu.caps.timestamps.then(|| {
            let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgtrain timing"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgtrain timing resolve"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let read = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgtrain timing read"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (set, resolve, read)
        });
        DeviceRecorder {
            gpu,
            params,
            staged: vec![0; (PARAM_SLOT * RING_SLOTS) as usize],
            encoder: None,
            pass: None,
            slot: 0,
            written: 0,
            queries,
            timing: None,
            profiler: None,
            meter: None,
            metering: false,
            ended: Default::default(),
            spare: Vec::new(),
            tickets: 0,
            last_submission: None,
            batch: SUBMIT_FIRST,
        }
    }

    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        let device = &self.gpu.device;
        self.encoder
            .get_or_insert_with(|| device.create_command_encoder(&Default::default()))
    }
}

impl Recorder for DeviceRecorder {
    fn record(&mut self, kernel: &Kernel, params: &[u8], bindings: &[wgpu::BufferBinding<'_>], groups: [u32; 3], meta: Option<LaunchMeta>) {
        // Only kernels looked up by dry runtimes lack a pipeline (a stand-in's runtimes
        // are all dry, refused otherwise in `Runtime::new`; a device's runtime compiles
        // what it looks up): nothing of them reaches a device.
        let Some(pipeline) = &kernel.pipeline else {
            return;
        };
        if self.slot == RING_SLOTS {
            self.submit();
        }
        let slot = self.slot;
        self.slot += 1;
        let at = (slot * PARAM_SLOT) as usize;
        self.staged[at..at + params.len()].copy_from_slice(params);
        let ring = wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.params,
                offset: 0,
                size: NonZeroU64::new(PARAM_SLOT),
            }),
        };
        // No allocation: the entries live on the stack (unused ones are never read).
        let entries: [wgpu::BindGroupEntry; MAX_STORAGE_BINDINGS + 1] = std::array::from_fn(|i| match i {
            0 => ring.clone(),
            i if i <= bindings.len() => wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(bindings[i - 1].clone()),
            },
            _ => ring.clone(),
        });
        let bind = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries[..1 + bindings.len()],
        });
        let open = self.pass.is_some();
        let timestamp_writes = match (&mut self.profiler, meta, &mut self.timing, &self.queries) {
            (Some(profiler), Some(meta), _, _) => {
                Some(profiler.next(&self.gpu, kernel.key, kernel.name.clone(), meta.label, groups, meta.work))
            }
            (_, _, Some(first), Some((set, _, _))) if !open => Some(wgpu::ComputePassTimestampWrites {
                query_set: set,
                beginning_of_pass_write_index: std::mem::replace(first, false).then_some(0),
                end_of_pass_write_index: Some(1),
            }),
            (None, _, None, _) if !open && self.metering => self.meter.as_mut().and_then(BusyMeter::next),
            _ => None,
        };
        // The query set is borrowed by the pass descriptor; take the encoder apart from self.
        let device = &self.gpu.device;
        let offset = [(slot * PARAM_SLOT) as u32];
        if timestamp_writes.is_none() {
            // Untimed launches share one pass (each dispatch is still its own
            // synchronization scope): a pass per launch costs the host time.
            let pass = match &mut self.pass {
                Some(pass) => pass,
                None => {
                    let encoder = self
                        .encoder
                        .get_or_insert_with(|| device.create_command_encoder(&Default::default()));
                    self.pass.insert(encoder.begin_compute_pass(&Default::default()).forget_lifetime())
                }
            };
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &offset);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        } else {
            self.pass = None;
            let encoder = self
                .encoder
                .get_or_insert_with(|| device.create_command_encoder(&Default::default()));
            let mut pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                })
                .forget_lifetime();
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &offset);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            // A timed or metered span's pass stays open for its next launches; a
            // profiled launch's pass is its own.
            if self.profiler.is_none() {
                self.pass = Some(pass);
            }
        }
        if self.slot - self.written >= self.batch {
            self.submit();
        }
    }

    fn submit(&mut self) {
        self.pass = None;
        if let Some(encoder) = self.encoder.take() {
            if self.slot > self.written {
                let (from, to) = ((self.written * PARAM_SLOT) as usize, (self.slot * PARAM_SLOT) as usize);
                self.gpu.queue.write_buffer(&self.params, from as u64, &self.staged[from..to]);
            }
            self.last_submission = Some(self.gpu.queue.submit([encoder.finish()]));
            self.batch = (2 * self.batch).min(SUBMIT_EVERY);
        }
        self.written = self.slot;
        if self.slot == RING_SLOTS {
            self.slot = 0;
            self.written = 0;
        }
    }

    fn wait(&mut self) -> Result<(), Error> {
        self.idle();
        Ok(self.gpu.wait()?)
    }

    fn idle(&mut self) {
        self.batch = SUBMIT_FIRST;
    }

    fn begin_timing(&mut self) {
        // Launches recorded before are not timed: their pass ends here.
        self.pass = None;
        self.timing = self.queries.is_some().then_some(true);
    }

    fn end_timing(&mut self) -> Result<Elapsed, Error> {
        self.timing = None;
        let Some((set, resolve, read)) = &self.queries else {
            return Ok(Elapsed::Wall);
        };
        let (set, resolve, read) = (set.clone(), resolve.clone(), read.clone());
        let encoder = self.encoder();
        encoder.resolve_query_set(&set, 0..2, &resolve, 0);
        encoder.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
        self.submit();
        let ticks = read_ticks(&self.gpu, &read, 16)?;
        let period = self.gpu.queue.get_timestamp_period() as f64;
        Ok(Elapsed::Gpu(ticks[1].saturating_sub(ticks[0]) as f64 * period * 1e-9))
    }

    fn start_profiling(&mut self) -> bool {
        if self.queries.is_none() {
            return false;
        }
        self.profiler.get_or_insert_with(Profiler::new);
        true
    }

    fn collect_profile(&mut self) -> Result<StepTrace, Error> {
        let Some(profiler) = self.profiler.as_mut() else {
            return Ok(StepTrace::default());
        };
        if profiler.pending() == 0 {
            return Ok(StepTrace {
                launches: Vec::new(),
                spans: profiler.take_spans(),
            });
        }
        self.submit();
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        self.profiler.as_ref().expect("checked above").resolve(&mut encoder);
        self.gpu.queue.submit([encoder.finish()]);
        let gpu = self.gpu.clone();
        self.profiler.as_mut().expect("checked above").read(&gpu)
    }

    fn mark(&mut self, name: &'static str) {
        if let Some(p) = &mut self.profiler {
            p.mark(name);
        }
    }

    fn stop_profiling(&mut self) {
        self.profiler = None;
    }

    fn start_meter(&mut self) -> bool {
        if self.queries.is_none() {
            return false;
        }
        // Launches recorded before are not metered: their pass ends here.
        self.pass = None;
        if self.meter.is_none() {
            let gpu = &self.gpu;
            self.meter = Some(self.spare.pop().unwrap_or_else(|| BusyMeter::new(gpu)));
        }
        self.meter.as_mut().expect("just made").clear();
        self.metering = true;
        true
    }

    fn end_meter(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.metering) {
            return None;
        }
        let mut meter = self.meter.take()?;
        if meter.unresolved() {
            meter.resolve(self.encoder());
        }
        self.submit();
        self.tickets += 1;
        self.ended.push_back((self.tickets, meter, self.last_submission.clone()));
        Some(self.tickets)
    }

    fn read_meter(&mut self, ticket: u64) -> Result<Option<f64>, Error> {
        while let Some((t, meter, at)) = self.ended.pop_front() {
            if t > ticket {
                self.ended.push_front((t, meter, at));
                break;
            }
            let mut meter = meter;
            let read = if t == ticket { meter.take(&self.gpu, at) } else { Ok(None) };
            meter.clear();
            self.spare.push(meter);
            if t == ticket {
                return read;
            }
        }
        Ok(None)
    }

    fn before_read(&mut self) {
        if !self.metering || !self.meter.as_ref().is_some_and(BusyMeter::unresolved) {
            return;
        }
        // The open pass ends here (a later launch opens and meters another).
        self.encoder();
        let encoder = self.encoder.as_mut().expect("just made");
        if let Some(meter) = self.meter.as_mut() {
            meter.resolve(encoder);
        }
    }
}

/// Drops every launch: the dry run of the memory estimate.
pub struct DryRecorder;

impl Recorder for DryRecorder {
    fn record(&mut self, _: &Kernel, _: &[u8], _: &[wgpu::BufferBinding<'_>], _: [u32; 3], _: Option<LaunchMeta>) {}
    fn submit(&mut self) {}
    fn wait(&mut self) -> Result<(), Error> {
        Ok(())
    }
    fn begin_timing(&mut self) {}
    fn end_timing(&mut self) -> Result<Elapsed, Error> {
        Ok(Elapsed::Nothing)
    }
}
