//! The device layer: find adapters on every backend, choose one, open it with its full
//! limits and every feature the engine can use, and turn wgpu's errors into typed ones.
//!
//! Shader modules are created *trusted*, without wgpu's runtime bounds checks (on an H100
//! they made a tiled matmul 15x slower); every launch validates shapes, strides and
//! ranges on the host instead (see `kernels`).
//!
//! May call: wgpu, `report`, `staging`, `pinned`, `pipeline_cache`. Called by: the allocator, kernels, the CLI.

pub mod budget;
pub mod described;
mod facts;
pub mod host_vec;
#[cfg(not(target_arch = "wasm32"))]
mod pinned;
pub mod pipeline_cache;
pub mod report;
pub mod staging;
pub mod transfer;

use std::sync::{Arc, Mutex};

pub use facts::{ASSUMED_MULTIPROCESSORS, AdapterFacts};
pub use report::{AdapterReport, CoopMatrixConfig, LimitsReport};

/// Errors of the device layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// No adapter on any backend.
    #[error(
        "no GPU adapter found on any backend. On Debian without a GPU, install the software \
         Vulkan driver: `apt-get install mesa-vulkan-drivers`"
    )]
    NoAdapter,
    /// `--adapter` matched nothing.
    #[error("no adapter matches '{selector}'; available: {available}")]
    NoMatch {
        /// What the user asked for.
        selector: String,
        /// The adapters there are.
        available: String,
    },
    /// The adapter refused to open a device.
    #[error("could not open a device on '{adapter}': {reason}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's words.
        reason: String,
    },
    /// The device was lost (driver reset, destroyed).
    #[error("the GPU device was lost: {0}")]
    Lost(String),
    /// wgpu rejected a call: a bug in the engine or a shape the host checks missed.
    #[error("GPU validation error: {0}")]
    Validation(String),
    /// The device ran out of memory outside the allocator.
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),
    /// A shader failed to compile.
    #[error("shader '{label}' failed to compile: {message}")]
    Shader {
        /// The module's label.
        label: String,
        /// The compiler's words.
        message: String,
    },
    /// Reading a buffer back failed.
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    /// A file describing an adapter (`wgtrain devices --json`'s) cannot stand in for one.
    #[error("device description {path}: {reason}")]
    Description {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The operation needs a real device, not a description's stand-in.
    #[error("'{0}' is a described adapter (a stand-in for estimates): it runs no kernels")]
    StandIn(String),
    /// A feature the operation needs is missing.
    #[error("the adapter '{adapter}' lacks {feature}")]
    MissingFeature {
        /// The adapter.
        adapter: String,
        /// The feature's name.
        feature: &'static str,
    },
}

impl DeviceError {
    fn from_wgpu(err: wgpu::Error) -> Self {
        match err {
            wgpu::Error::OutOfMemory { source } => DeviceError::OutOfMemory(source.to_string()),
            wgpu::Error::Validation { description, .. } => DeviceError::Validation(description),
            wgpu::Error::Internal { description, .. } => DeviceError::Validation(description),
        }
    }
}

/// What the opened device was granted; kernels choose their variant from it.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// f16 in shaders.
    pub shader_f16: bool,
    /// Subgroup operations.
    pub subgroup: bool,
    /// `subgroupBarrier()` in shaders.
    pub subgroup_barrier: bool,
    /// Smallest and largest subgroup size.
    pub subgroup_size: (u32, u32),
    /// Timestamps between passes.
    pub timestamps: bool,
    /// Timestamps inside compute passes.
    pub timestamps_inside_passes: bool,
    /// Cooperative matrix configurations granted (empty without the feature).
    pub cooperative_matrix: Vec<CoopMatrixConfig>,
    /// The limits granted (the adapter's best).
    pub limits: wgpu::Limits,
    /// Device-local memory, where the backend tells it.
    pub memory_bytes: Option<u64>,
    /// What kernel plans choose by (from the fields above and the report).
    pub facts: AdapterFacts,
}

impl Capabilities {
    /// What a device opened with `granted` features and `limits` on the adapter `report`
    /// describes can do.
    pub fn granted(report: &AdapterReport, granted: wgpu::Features, limits: wgpu::Limits) -> Capabilities {
        let subgroup_size = report.subgroup_size.unwrap_or([0, 0]);
        let cooperative_matrix = if granted.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            report.cooperative_matrix.clone()
        } else {
            Vec::new()
        };
        let by_name = |name: &str| report::ENGINE_FEATURES.iter().any(|(n, f)| *n == name && granted.contains(*f));
        let facts = AdapterFacts::from_report(report, by_name, u64::from(limits.max_compute_workgroup_storage_size));
        Capabilities {
            shader_f16: granted.contains(wgpu::Features::SHADER_F16),
            subgroup: granted.contains(wgpu::Features::SUBGROUP),
            subgroup_barrier: granted.contains(wgpu::Features::SUBGROUP_BARRIER),
            subgroup_size: (subgroup_size[0], subgroup_size[1]),
            timestamps: granted.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_inside_passes: granted.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            cooperative_matrix,
            memory_bytes: report.memory_bytes,
            limits,
            facts,
        }
    }

    /// Whether a 16x16x16 f16 x f16 -> f32 cooperative matrix configuration is granted.
    pub fn coop_f16_16x16x16(&self) -> bool {
        self.facts.coop_f16
    }
}

/// Features named in `WGTRAIN_WITHHOLD_FEATURES` (comma-separated wgpu names, like
/// `SHADER_F16,SUBGROUP`): never requested, so a device can be opened as an adapter
/// without them would be (to try fallbacks and their errors on any machine). Unknown
/// names are reported once in the log and ignored.
pub fn withheld_features() -> wgpu::Features {
    let Ok(list) = std::env::var("WGTRAIN_WITHHOLD_FEATURES") else {
        return wgpu::Features::empty();
    };
    let mut out = wgpu::Features::empty();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match wgpu::Features::from_name(name) {
            Some(f) => out |= f,
            None => tracing::warn!("WGTRAIN_WITHHOLD_FEATURES: unknown feature '{name}'"),
        }
    }
    out
}

/// An opened device with its queue and what it was granted.
pub struct Gpu {
    /// The adapter.
    pub adapter: wgpu::Adapter,
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The adapter's facts.
    pub report: AdapterReport,
    /// What was granted.
    pub caps: Capabilities,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Vec<DeviceError>>>,
    /// Staging buffers kept for reuse by host transfers (`transfer`).
    pub(crate) staging: staging::Pools,
    /// Whether this stands in for an adapter that a report describes (see `described`):
    /// the report and capabilities are that adapter's, the device underneath a local one
    /// that only keeps books. Kernels are validated but not compiled for it, so only the
    /// estimate's dry runtimes can use it.
    pub stand_in: bool,
    /// The driver's compiled pipelines kept on disk between runs, where the adapter has
    /// a pipeline cache (`pipeline_cache`).
    pub pipeline_cache: Option<pipeline_cache::DiskCache>,
    /// Whether the backend tells the memory budget (asked once: it is read every step).
    budget_told: bool,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Some(c) = &self.pipeline_cache {
            c.save();
        }
    }
}

fn make_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if std::env::var_os("WGPU_BACKEND").is_none() {
        desc.backends = backends;
    }
    // Validation layers are for debugging wgpu itself; they cost time and print noise.
    desc.flags.remove(wgpu::InstanceFlags::VALIDATION);
    wgpu::Instance::new(desc)
}

fn adapters_on(backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    let instance = make_instance(backends);
    pollster::block_on(instance.enumerate_adapters(backends))
}

/// Every adapter on the native backends (Vulkan, Metal, DX12, WebGPU), in enumeration
/// order (what `--adapter N` indexes); GL's too only when no native one exists. GL is
/// not probed otherwise: on a machine without a display Mesa's EGL prints
/// `XDG_RUNTIME_DIR is invalid` for nothing, and GL lacks most compute features.
pub fn enumerate_adapters() -> Vec<wgpu::Adapter> {
    enumerate_adapters_for(None)
}

/// As [`enumerate_adapters`], with GL's adapters also when `selector` asks for them
/// (the backend name "gl", or an index past the native adapters).
pub fn enumerate_adapters_for(selector: Option<&str>) -> Vec<wgpu::Adapter> {
    let native = adapters_on(wgpu::Backends::all() - wgpu::Backends::GL);
    let sel = selector.map(|s| s.trim().to_ascii_lowercase());
    let wants_gl = match sel.as_deref() {
        Some("gl") => true,
        Some(s) => s.parse::<usize>().is_ok_and(|i| i >= native.len()),
        None => false,
    };
    if native.is_empty() || wants_gl {
        drop(native);
        return adapters_on(wgpu::Backends::all());
    }
    native
}

/// Reports for every adapter.
pub fn list_adapters() -> Vec<AdapterReport> {
    list_adapters_for(None)
}

/// Reports for the adapters [`enumerate_adapters_for`] finds.
pub fn list_adapters_for(selector: Option<&str>) -> Vec<AdapterReport> {
    enumerate_adapters_for(selector)
        .iter()
        .enumerate()
        .map(|(i, a)| report::adapter_report(i, a))
        .collect()
}

/// [`list_adapters_for`] with each adapter's memory budget and this process's usage
/// now, where the backend tells them (live state, so not part of a report).
pub fn list_adapters_with_budget(selector: Option<&str>) -> Vec<(AdapterReport, Option<budget::MemoryBudget>)> {
    enumerate_adapters_for(selector)
        .iter()
        .enumerate()
        .map(|(i, a)| (report::adapter_report(i, a), budget::memory_budget(a)))
        .collect()
}

fn preference(report: &AdapterReport) -> (u32, u32) {
    let device = match report.device_type.as_str() {
        "discrete_gpu" => 0,
        "integrated_gpu" => 1,
        "virtual_gpu" => 2,
        "cpu" => 3,
        _ => 4,
    };
    // GL lacks most compute features; prefer the native APIs.
    let backend = if report.backend == "gl" { 1 } else { 0 };
    (backend, device)
}

/// Picks an adapter: `selector` is an index, a backend name or part of the adapter's
/// name (case-insensitive); without one, the most capable (discrete GPU first, GL last).
pub fn choose_adapter(adapters: &[wgpu::Adapter], selector: Option<&str>) -> Result<usize, DeviceError> {
    let reports: Vec<AdapterReport> = adapters.iter().enumerate().map(|(i, a)| report::adapter_report(i, a)).collect();
    choose_report(&reports, selector)
}

/// [`choose_adapter`] over reports: the `index` of the report `selector` picks.
pub fn choose_report(reports: &[AdapterReport], selector: Option<&str>) -> Result<usize, DeviceError> {
    if reports.is_empty() {
        return Err(DeviceError::NoAdapter);
    }
    let candidates: Vec<&AdapterReport> = match selector.map(str::trim) {
        None | Some("") => reports.iter().collect(),
        Some(sel) => {
            if let Ok(index) = sel.parse::<usize>() {
                reports.iter().filter(|r| r.index == index).collect()
            } else {
                let lower = sel.to_ascii_lowercase();
                let by_backend: Vec<_> = reports.iter().filter(|r| r.backend == lower).collect();
                if by_backend.is_empty() {
                    reports.iter().filter(|r| r.name.to_ascii_lowercase().contains(&lower)).collect()
                } else {
                    by_backend
                }
            }
        }
    };
    candidates
        .into_iter()
        .min_by_key(|r| (preference(r), r.index))
        .map(|r| r.index)
        .ok_or_else(|| DeviceError::NoMatch {
            selector: selector.unwrap_or_default().to_string(),
            available: reports
                .iter()
                .map(|r| format!("{}: {} ({})", r.index, r.name, r.backend))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl Gpu {
    /// The device's memory budget for this process and its usage now, where the
    /// backend tells them (`budget`); none for a described adapter's stand-in.
    pub fn memory_budget(&self) -> Option<budget::MemoryBudget> {
        if self.stand_in || !self.budget_told {
            return None;
        }
        budget::read(&self.adapter)
    }

    /// The memory a cap's fraction and `memory.fit`'s default bound are taken of: this
    /// process's budget where the backend tells it (what other processes hold is not
    /// ours to take), else the device's memory.
    pub fn usable_memory(&self) -> Option<u64> {
        self.memory_budget().map(|b| b.budget).or(self.caps.memory_bytes)
    }

    /// Opens the adapter `selector` names (see [`choose_adapter`]).
    pub fn open(selector: Option<&str>) -> Result<Gpu, DeviceError> {
        let mut adapters = enumerate_adapters_for(selector);
        let index = choose_adapter(&adapters, selector)?;
        let adapter = adapters.swap_remove(index);
        Gpu::open_adapter(index, adapter)
    }

    /// Opens a device on `adapter` with its full limits and the engine's features (less
    /// any named in `WGTRAIN_WITHHOLD_FEATURES`).
    pub fn open_adapter(index: usize, adapter: wgpu::Adapter) -> Result<Gpu, DeviceError> {
        let report = report::adapter_report(index, &adapter);
        // The engine's features, and a pipeline cache where the adapter keeps one.
        let granted = adapter.features() & (report::engine_features() | wgpu::Features::PIPELINE_CACHE) & !withheld_features();
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgtrain"),
            required_features: granted,
            required_limits: limits.clone(),
            // SAFETY: cooperative matrices are experimental in wgpu 30; the engine uses
            // them only through kernels validated on the host and tested on hardware.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| DeviceError::RequestDevice {
            adapter: report.name.clone(),
            reason: e.to_string(),
        })?;
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut slot) = lost_cb.lock() {
                *slot = Some(format!("{reason:?}: {message}"));
            }
        });
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |err: wgpu::Error| {
            tracing::error!("uncaptured GPU error: {err}");
            if let Ok(mut errors) = sink.lock() {
                errors.push(DeviceError::from_wgpu(err));
            }
        }));
        let caps = Capabilities::granted(&report, granted, limits);
        tracing::info!(
            adapter = %report.name,
            backend = %report.backend,
            features = ?report.features,
            "opened GPU device"
        );
        let pipeline_cache = pipeline_cache::DiskCache::open(&device, &adapter.get_info());
        let budget_told = budget::told(&adapter);
        Ok(Gpu {
            adapter,
            device,
            queue,
            report,
            caps,
            lost,
            uncaptured,
            staging: Default::default(),
            stand_in: false,
            budget_told,
            pipeline_cache,
        })
    }

    /// Errors wgpu reported outside any scope since the last call, and device loss.
    pub fn check(&self) -> Result<(), DeviceError> {
        if let Some(reason) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(DeviceError::Lost(reason));
        }
        let mut errors = self
            .uncaptured
            .lock()
            .map_err(|_| DeviceError::Lost("error sink poisoned".into()))?;
        match errors.drain(..).next() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Runs `f` inside a validation error scope and returns its error, typed.
    pub fn scoped<T>(&self, filter: wgpu::ErrorFilter, f: impl FnOnce() -> T) -> Result<T, DeviceError> {
        let scope = self.device.push_error_scope(filter);
        let value = f();
        match pollster::block_on(scope.pop()) {
            Some(err) => Err(DeviceError::from_wgpu(err)),
            None => Ok(value),
        }
    }

    /// Parses and validates a WGSL module with naga (every capability allowed).
    pub fn validate_module(&self, label: &str, wgsl: &str) -> Result<(), DeviceError> {
        let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| DeviceError::Shader {
            label: label.into(),
            message: e.emit_to_string(wgsl),
        })?;
        let caps = naga::valid::Capabilities::all();
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .map_err(|e| DeviceError::Shader {
                label: label.into(),
                message: e.emit_to_string(wgsl),
            })?;
        Ok(())
    }

    /// Compiles a WGSL module without runtime bounds checks; launches check on the host.
    /// wgpu parses and validates it with naga (a bad shader is a [`DeviceError::Shader`]
    /// with naga's message), so it is not parsed twice.
    pub fn create_module(&self, label: &str, wgsl: &str) -> Result<wgpu::ShaderModule, DeviceError> {
        self.scoped(wgpu::ErrorFilter::Validation, || {
            // SAFETY: every kernel's launch checks on the host that its indices stay
            // inside the bound ranges (see `kernels`), which is what the runtime checks
            // would otherwise guard.
            unsafe {
                self.device.create_shader_module_trusted(
                    wgpu::ShaderModuleDescriptor {
                        label: Some(label),
                        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
                    },
                    wgpu::ShaderRuntimeChecks::unchecked(),
                )
            }
        })
        .map_err(|e| DeviceError::Shader {
            label: label.into(),
            message: e.to_string(),
        })
    }

    /// Waits for submission `index` and those before it (not for later ones).
    pub fn wait_for(&self, index: wgpu::SubmissionIndex) -> Result<(), DeviceError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| DeviceError::Lost(e.to_string()))?;
        self.check()
    }

    /// Blocks until the queue is idle.
    pub fn wait(&self) -> Result<(), DeviceError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| DeviceError::Lost(e.to_string()))?;
        self.check()
    }

    /// Copies `size` bytes at `offset` of `buffer` back to the host; both multiples of 4.
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>, DeviceError> {
        if size == 0 {
            return Ok(Vec::new());
        }
        if let Some(e) = staging::range_error(buffer, offset, size) {
            return Err(DeviceError::Readback(e));
        }
        let padded = size;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgtrain readback"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, padded);
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|e| DeviceError::Readback(e.to_string()))?
            .map_err(|e| DeviceError::Readback(e.to_string()))?;
        let data = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| DeviceError::Readback(e.to_string()))?[..size as usize]
            .to_vec();
        staging.unmap();
        Ok(data)
    }
}
