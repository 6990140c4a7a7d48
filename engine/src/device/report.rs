//! What an adapter is and can do: the facts `wgtrain devices` prints and kernels read
//! to choose their variant.

use serde::{Deserialize, Serialize};

/// The features the engine uses, by the names `wgtrain devices` prints.
pub const ENGINE_FEATURES: [(&str, wgpu::Features); 5] = [
    ("SHADER_F16", wgpu::Features::SHADER_F16),
    ("SUBGROUP", wgpu::Features::SUBGROUP),
    ("TIMESTAMP_QUERY", wgpu::Features::TIMESTAMP_QUERY),
    ("TIMESTAMP_QUERY_INSIDE_PASSES", wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
    ("EXPERIMENTAL_COOPERATIVE_MATRIX", wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
];

/// The union of [`ENGINE_FEATURES`].
pub fn engine_features() -> wgpu::Features {
    ENGINE_FEATURES.iter().fold(wgpu::Features::empty(), |acc, (_, f)| acc | *f)
}

/// The limits that matter to the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsReport {
    /// Largest buffer.
    pub max_buffer_size: u64,
    /// Largest range one storage binding may see.
    pub max_storage_buffer_binding_size: u64,
    /// Alignment of storage binding offsets.
    pub min_storage_buffer_offset_alignment: u32,
    /// Bytes of workgroup memory.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
}

impl From<&wgpu::Limits> for LimitsReport {
    fn from(l: &wgpu::Limits) -> Self {
        LimitsReport {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        }
    }
}

/// One cooperative matrix configuration: C[m x n] += A[m x k] * B[k x n].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoopMatrixConfig {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Scalar type of A and B ("f16", "f32", "i32", "u32").
    pub ab: String,
    /// Scalar type of C and the result.
    pub cr: String,
}

fn scalar_name(t: wgpu::CooperativeScalarType) -> &'static str {
    match t {
        wgpu::CooperativeScalarType::F32 => "f32",
        wgpu::CooperativeScalarType::F16 => "f16",
        wgpu::CooperativeScalarType::I32 => "i32",
        wgpu::CooperativeScalarType::U32 => "u32",
    }
}

/// Everything `wgtrain devices` says of one adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterReport {
    /// Position in the enumeration (what `--adapter N` takes).
    pub index: usize,
    /// "vulkan", "metal", "dx12", "gl" or "webgpu".
    pub backend: String,
    /// The adapter's name.
    pub name: String,
    /// "discrete_gpu", "integrated_gpu", "virtual_gpu", "cpu" or "other".
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Which of [`ENGINE_FEATURES`] the adapter offers.
    pub features: Vec<String>,
    /// Limits the engine reads.
    pub limits: LimitsReport,
    /// Cooperative matrix configurations (empty without the feature).
    pub cooperative_matrix: Vec<CoopMatrixConfig>,
    /// Device-local memory in bytes where the backend tells it (Vulkan), else null.
    pub memory_bytes: Option<u64>,
}

/// The lowercase name of a backend ("vulkan", "metal", "dx12", "gl", "webgpu").
pub fn backend_name(backend: wgpu::Backend) -> String {
    backend.to_str().to_string()
}

/// The snake_case name of a device type.
pub fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete_gpu",
        wgpu::DeviceType::IntegratedGpu => "integrated_gpu",
        wgpu::DeviceType::VirtualGpu => "virtual_gpu",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

impl AdapterReport {
    /// Reads an adapter's facts.
    pub fn of(index: usize, adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let features = adapter.features();
        let limits = adapter.limits();
        let cooperative_matrix = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            adapter
                .cooperative_matrix_properties()
                .into_iter()
                .map(|p| CoopMatrixConfig {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    ab: scalar_name(p.ab_type).into(),
                    cr: scalar_name(p.cr_type).into(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let driver = [info.driver.as_str(), info.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        AdapterReport {
            index,
            backend: backend_name(info.backend),
            name: info.name.clone(),
            device_type: device_type_name(info.device_type).into(),
            driver,
            features: ENGINE_FEATURES
                .iter()
                .filter(|(_, f)| features.contains(*f))
                .map(|(n, _)| n.to_string())
                .collect(),
            limits: LimitsReport::from(&limits),
            cooperative_matrix,
            memory_bytes: device_local_bytes(adapter),
        }
    }
}

/// Sum of the device-local memory heaps, read from Vulkan (other backends do not say).
#[cfg(not(target_arch = "wasm32"))]
pub fn device_local_bytes(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: the hal adapter is only read, and the guard is dropped before returning.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which outlives the call.
    let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    let heaps = &props.memory_heaps[..props.memory_heap_count as usize];
    let total: u64 = heaps
        .iter()
        .filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .sum();
    (total > 0).then_some(total)
}

/// Browsers do not tell.
#[cfg(target_arch = "wasm32")]
pub fn device_local_bytes(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}
