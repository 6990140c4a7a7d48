//! The kernel runtime: WGSL templates rendered into variants, a pipeline cache, and
//! launches recorded into one command encoder until a flush.
//!
//! Every kernel's WGSL lives in `shaders/NAME.wgsl` and its launch code in
//! `kernels/NAME.rs`. Variants (element type, workgroup size, features) come from one
//! template: `{{KEY}}` placeholders are replaced by [`render`], and a test renders and
//! validates every variant with naga (`kernels::variants`).
//!
//! Binding layout of every kernel: `@binding(0)` is a uniform `Params` struct read at a
//! dynamic offset of a ring buffer (one 256-byte slot per launch, no allocation per
//! launch); `@binding(1..)` are the tensors, all `storage, read_write` (see
//! `memory`'s binding scheme). Shader modules are created without runtime bounds
//! checks, so every launch checks on the host that what it will index lies inside the
//! bound blocks.
//!
//! Ordering: launches are recorded into one encoder and submitted at a flush, while
//! `queue.write_buffer` (uploads, guard fills) lands at the start of the *next*
//! submission, before launches recorded earlier. A freed block can be reused at once,
//! so every host write first flushes what is recorded (`Tensor` does this); the test
//! `uploads_into_a_reused_block_do_not_overtake_pending_launches` pins it down.
//!
//! May call: `device`, `memory`, `tensor`. Called by: tensor ops, autograd, bench.

pub mod attention;
pub mod cross_entropy;
pub mod embedding;
pub mod layernorm;
pub mod map;
pub mod matmul;
pub mod matmul_coop;
pub mod optim;
pub mod reduce;
pub mod softmax;
pub mod tolerance;
pub mod variants;

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use crate::device::{DeviceError, Gpu};
use crate::memory::{AllocError, Allocator, AllocatorOptions};
use crate::tensor::Tensor;

/// Activation functions shared by kernels (pasted at `{{ACTIVATIONS}}`).
pub const ACTIVATIONS: &str = include_str!("../../../shaders/activations.wgsl");

/// Bytes of one launch's parameters (the uniform slot, and the dynamic offset step).
pub const PARAM_SLOT: u64 = 256;
/// Launches recorded before the encoder is submitted and the ring reused.
pub const RING_SLOTS: u64 = 1024;
/// The most workgroups along one dispatch dimension.
pub const MAX_GROUPS_X: u32 = 65535;

/// Errors of kernel launches.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// Shapes, strides or dtypes that the kernel cannot take.
    #[error("shape error: {0}")]
    Shape(String),
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A template placeholder was left unfilled.
    #[error("template '{0}' has an unfilled placeholder: {1}")]
    Template(String, String),
}

/// Fills `{{KEY}}` placeholders of `source`; a placeholder left over is an error.
pub fn render(name: &str, source: &str, values: &[(&str, String)]) -> Result<String, KernelError> {
    let mut out = source.to_string();
    for (key, value) in values {
        out = out.replace(&format!("{{{{{key}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let end = out[start..].find("}}").map_or(out.len(), |e| start + e + 2);
        return Err(KernelError::Template(name.into(), out[start..end].to_string()));
    }
    Ok(out)
}

/// A compiled variant.
pub struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: Arc<wgpu::BindGroupLayout>,
    storage_bindings: usize,
}

struct Exec {
    encoder: Option<wgpu::CommandEncoder>,
    slot: u64,
    timing: Option<Timing>,
}

struct Timing {
    first: bool,
}

/// The device, its allocator and the kernel machinery: what every op takes.
pub struct Runtime {
    /// The device.
    pub gpu: Arc<Gpu>,
    /// The allocator every tensor lives in.
    pub alloc: Allocator,
    kernels: Mutex<HashMap<String, Arc<Kernel>>>,
    layouts: Mutex<HashMap<usize, Arc<wgpu::BindGroupLayout>>>,
    params: wgpu::Buffer,
    exec: Mutex<Exec>,
    queries: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
}

/// Splits `groups` workgroups into an (x, y) grid within the per-dimension limit;
/// kernels recover the linear index as `wid.x + wid.y * num_workgroups.x`.
pub fn grid(groups: u32) -> [u32; 3] {
    if groups <= MAX_GROUPS_X {
        [groups.max(1), 1, 1]
    } else {
        [MAX_GROUPS_X, groups.div_ceil(MAX_GROUPS_X), 1]
    }
}

impl Runtime {
    /// A runtime on `gpu` with a fresh allocator.
    pub fn new(gpu: Arc<Gpu>, options: AllocatorOptions) -> Result<Runtime, KernelError> {
        let alloc = Allocator::new(gpu.clone(), options)?;
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
        Ok(Runtime {
            gpu,
            alloc,
            kernels: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            params,
            exec: Mutex::new(Exec {
                encoder: None,
                slot: 0,
                timing: None,
            }),
            queries,
        })
    }

    /// Opens the adapter `selector` names with an allocator configured from the
    /// environment (`WGTRAIN_ALLOC_DEBUG`).
    pub fn open(selector: Option<&str>) -> Result<Runtime, KernelError> {
        let gpu = Arc::new(Gpu::open(selector)?);
        Runtime::new(gpu, AllocatorOptions::default())
    }

    fn layout(&self, storage: usize) -> Arc<wgpu::BindGroupLayout> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        layouts
            .entry(storage)
            .or_insert_with(|| {
                let mut entries = vec![wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: NonZeroU64::new(PARAM_SLOT),
                    },
                    count: None,
                }];
                for i in 0..storage {
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: 1 + i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: false },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    });
                }
                Arc::new(self.gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("wgtrain kernel layout"),
                    entries: &entries,
                }))
            })
            .clone()
    }

    /// The compiled variant of `name` with these template values (cached).
    pub fn kernel(&self, name: &str, source: &str, values: &[(&str, String)], storage: usize) -> Result<Arc<Kernel>, KernelError> {
        let key = format!("{name}|{values:?}");
        if let Some(k) = self.kernels.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let wgsl = render(name, source, values)?;
        let module = self.gpu.create_module(name, &wgsl)?;
        let layout = self.layout(storage);
        let pipeline_layout = self.gpu.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &[Some(&*layout)],
            immediate_size: 0,
        });
        let pipeline = self.gpu.scoped(wgpu::ErrorFilter::Validation, || {
            self.gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        })?;
        let kernel = Arc::new(Kernel {
            pipeline,
            layout,
            storage_bindings: storage,
        });
        self.kernels.lock().unwrap_or_else(|p| p.into_inner()).insert(key, kernel.clone());
        Ok(kernel)
    }

    /// Records one launch: `params` into the next ring slot, `tensors` bound whole at
    /// bindings 1.., `groups` workgroups.
    pub fn launch(&self, kernel: &Kernel, params: &[u8], tensors: &[&Tensor], groups: [u32; 3]) -> Result<(), KernelError> {
        if tensors.len() != kernel.storage_bindings || params.len() as u64 > PARAM_SLOT {
            return Err(KernelError::Shape(format!(
                "launch with {} tensors and {} param bytes for a kernel of {} bindings",
                tensors.len(),
                params.len(),
                kernel.storage_bindings
            )));
        }
        if groups.contains(&0) || self.alloc.dry() {
            return Ok(());
        }
        let mut exec = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        if exec.slot == RING_SLOTS {
            self.submit(&mut exec);
        }
        let slot = exec.slot;
        exec.slot += 1;
        self.gpu.queue.write_buffer(&self.params, slot * PARAM_SLOT, params);
        let mut entries = Vec::with_capacity(1 + tensors.len());
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.params,
                offset: 0,
                size: NonZeroU64::new(PARAM_SLOT),
            }),
        });
        for (i, t) in tensors.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 1 + i as u32,
                resource: wgpu::BindingResource::Buffer(t.block().binding()),
            });
        }
        let bind = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries,
        });
        let timestamp_writes = match (&mut exec.timing, &self.queries) {
            (Some(t), Some((set, _, _))) => {
                let first = std::mem::replace(&mut t.first, false);
                Some(wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: first.then_some(0),
                    end_of_pass_write_index: Some(1),
                })
            }
            _ => None,
        };
        let encoder = exec
            .encoder
            .get_or_insert_with(|| self.gpu.device.create_command_encoder(&Default::default()));
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes,
        });
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &bind, &[(slot * PARAM_SLOT) as u32]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    fn submit(&self, exec: &mut Exec) {
        if let Some(encoder) = exec.encoder.take() {
            self.gpu.queue.submit([encoder.finish()]);
        }
        exec.slot = 0;
    }

    /// Submits what has been recorded.
    pub fn flush(&self) {
        let mut exec = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        self.submit(&mut exec);
    }

    /// Submits and waits for the device to finish.
    pub fn sync(&self) -> Result<(), KernelError> {
        self.flush();
        Ok(self.gpu.wait()?)
    }

    /// Whether GPU timestamps are available for [`Runtime::time`].
    pub fn has_timestamps(&self) -> bool {
        self.queries.is_some()
    }

    /// Runs `f` (which records launches) and returns the seconds it took: GPU
    /// timestamps from the first launch's start to the last one's end when granted,
    /// else wall clock around the submission and wait.
    pub fn time(&self, f: impl FnOnce() -> Result<(), KernelError>) -> Result<f64, KernelError> {
        if self.alloc.dry() {
            f()?;
            return Ok(0.0);
        }
        self.sync()?;
        let Some((set, resolve, read)) = &self.queries else {
            let start = std::time::Instant::now();
            f()?;
            self.sync()?;
            return Ok(start.elapsed().as_secs_f64());
        };
        self.exec.lock().unwrap_or_else(|p| p.into_inner()).timing = Some(Timing { first: true });
        let result = f();
        let mut exec = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        exec.timing = None;
        result?;
        let encoder = exec
            .encoder
            .get_or_insert_with(|| self.gpu.device.create_command_encoder(&Default::default()));
        encoder.resolve_query_set(set, 0..2, resolve, 0);
        encoder.copy_buffer_to_buffer(resolve, 0, read, 0, 16);
        self.submit(&mut exec);
        drop(exec);
        let (tx, rx) = std::sync::mpsc::channel();
        read.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.gpu.wait()?;
        rx.recv()
            .map_err(|e| DeviceError::Readback(e.to_string()))?
            .map_err(|e| DeviceError::Readback(e.to_string()))?;
        let ticks: [u64; 2] = {
            let view = read
                .slice(..)
                .get_mapped_range()
                .map_err(|e| DeviceError::Readback(e.to_string()))?;
            let v: &[u64] = bytemuck::cast_slice(&view);
            [v[0], v[1]]
        };
        read.unmap();
        let period = self.gpu.queue.get_timestamp_period() as f64;
        Ok(ticks[1].saturating_sub(ticks[0]) as f64 * period * 1e-9)
    }
}

/// Checks on the host that `t` holds `dtype` and that every element it addresses lies
/// inside its block: what the unchecked shader would otherwise overrun.
pub fn check_tensor(what: &str, t: &Tensor, dtype: crate::tensor::DType) -> Result<(), KernelError> {
    if t.dtype() != dtype {
        return Err(KernelError::Shape(format!("{what}: expected {dtype}, got {}", t.dtype())));
    }
    if t.extent() > t.capacity() {
        return Err(KernelError::Shape(format!(
            "{what}: view {:?} (strides {:?}, offset {}) reaches element {} of a {}-element block",
            t.shape(),
            t.strides(),
            t.offset(),
            t.extent(),
            t.capacity()
        )));
    }
    if t.numel() > u32::MAX as usize || t.capacity() > u32::MAX as usize {
        return Err(KernelError::Shape(format!("{what}: more than 2^32 elements")));
    }
    Ok(())
}

/// Checks that `t` is contiguous with shape `shape`.
pub fn check_contiguous(what: &str, t: &Tensor, shape: &[usize]) -> Result<(), KernelError> {
    if t.shape() != shape || !t.is_contiguous() {
        return Err(KernelError::Shape(format!(
            "{what}: expected a contiguous {shape:?}, got {:?} with strides {:?}",
            t.shape(),
            t.strides()
        )));
    }
    Ok(())
}

/// The `enable f16;` line a variant needs for `dtype`.
pub fn enables(dtypes: &[crate::tensor::DType]) -> String {
    if dtypes.contains(&crate::tensor::DType::F16) {
        "enable f16;".into()
    } else {
        String::new()
    }
}

/// Fails clearly when an f16 variant is asked of an adapter without SHADER_F16.
pub fn require_f16(rt: &Runtime, dtypes: &[crate::tensor::DType]) -> Result<(), KernelError> {
    if dtypes.contains(&crate::tensor::DType::F16) && !rt.gpu.caps.shader_f16 {
        return Err(DeviceError::MissingFeature {
            adapter: rt.gpu.report.name.clone(),
            feature: "SHADER_F16",
        }
        .into());
    }
    Ok(())
}
