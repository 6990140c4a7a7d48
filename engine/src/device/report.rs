//! What an adapter is and can do: the facts `wgtrain devices` prints and kernels read
//! to choose their variant. The report types are the dashboard protocol's; this file
//! fills them from wgpu.
//!
//! May call: wgpu, `wgtrain_record`.

pub use wgtrain_record::{AdapterReport, CoopMatrixConfig, LimitsReport};

/// The features the engine uses, by the names `wgtrain devices` prints.
pub const ENGINE_FEATURES: [(&str, wgpu::Features); 6] = [
    ("SHADER_F16", wgpu::Features::SHADER_F16),
    ("SUBGROUP", wgpu::Features::SUBGROUP),
    ("SUBGROUP_BARRIER", wgpu::Features::SUBGROUP_BARRIER),
    ("TIMESTAMP_QUERY", wgpu::Features::TIMESTAMP_QUERY),
    ("TIMESTAMP_QUERY_INSIDE_PASSES", wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
    ("EXPERIMENTAL_COOPERATIVE_MATRIX", wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
];

/// The union of [`ENGINE_FEATURES`].
pub fn engine_features() -> wgpu::Features {
    ENGINE_FEATURES.iter().fold(wgpu::Features::empty(), |acc, (_, f)| acc | *f)
}

/// The limits the engine reads, from wgpu's.
pub fn limits_report(l: &wgpu::Limits) -> LimitsReport {
    LimitsReport {
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
    }
}

fn scalar_name(t: wgpu::CooperativeScalarType) -> &'static str {
    match t {
        wgpu::CooperativeScalarType::F32 => "f32",
        wgpu::CooperativeScalarType::F16 => "f16",
        wgpu::CooperativeScalarType::I32 => "i32",
        wgpu::CooperativeScalarType::U32 => "u32",
    }
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

/// Reads an adapter's facts.
pub fn adapter_report(index: usize, adapter: &wgpu::Adapter) -> AdapterReport {
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
        limits: limits_report(&limits),
        cooperative_matrix,
        memory_bytes: device_local_bytes(adapter),
        subgroup_size: Some([info.subgroup_min_size, info.subgroup_max_size]),
        multiprocessors: multiprocessors(adapter, info.device_type),
    }
}

/// The adapter's multiprocessors: a CPU adapter's threads (lavapipe runs a workgroup per
/// thread), else what the Vulkan driver tells through VK_NV_shader_sm_builtins (SMs) or
/// VK_AMD_shader_core_properties2 (active compute units); None elsewhere.
#[cfg(not(target_arch = "wasm32"))]
pub fn multiprocessors(adapter: &wgpu::Adapter, device_type: wgpu::DeviceType) -> Option<u32> {
    use ash::vk;
    if device_type == wgpu::DeviceType::Cpu {
        return std::thread::available_parallelism().ok().map(|n| n.get() as u32);
    }
    // SAFETY: as in `device_local_bytes`: read only, the guard dropped before returning.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let device = hal.raw_physical_device();
    // SAFETY: the physical device belongs to this instance, which outlives the calls.
    let extensions = unsafe { instance.enumerate_device_extension_properties(device) }.ok()?;
    let has = |name: &std::ffi::CStr| extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
    if has(ash::nv::shader_sm_builtins::NAME) {
        let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
        // SAFETY: the extension is supported, so the chained struct is filled in.
        unsafe { instance.get_physical_device_properties2(device, &mut props) };
        return (sm.shader_sm_count > 0).then_some(sm.shader_sm_count);
    }
    if has(ash::amd::shader_core_properties2::NAME) {
        let mut core = vk::PhysicalDeviceShaderCoreProperties2AMD::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut core);
        // SAFETY: as above.
        unsafe { instance.get_physical_device_properties2(device, &mut props) };
        return (core.active_compute_unit_count > 0).then_some(core.active_compute_unit_count);
    }
    None
}

/// Browsers do not tell.
#[cfg(target_arch = "wasm32")]
pub fn multiprocessors(_adapter: &wgpu::Adapter, _device_type: wgpu::DeviceType) -> Option<u32> {
    None
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

/// The adapter's Vulkan memory types: each one's property flags and its heap's size
/// (where host transfers' staging buffers can live); empty on other backends.
#[cfg(not(target_arch = "wasm32"))]
pub fn memory_types(adapter: &wgpu::Adapter) -> Vec<String> {
    // SAFETY: as in `device_local_bytes`: read only, the guard dropped before returning.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
        return Vec::new();
    };
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which outlives the call.
    let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    props.memory_types[..props.memory_type_count as usize]
        .iter()
        .map(|t| {
            let heap = props.memory_heaps[t.heap_index as usize];
            format!(
                "{:?} (heap {}: {:.1} GiB)",
                t.property_flags,
                t.heap_index,
                heap.size as f64 / (1u64 << 30) as f64
            )
        })
        .collect()
}

/// Browsers do not tell.
#[cfg(target_arch = "wasm32")]
pub fn device_local_bytes(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}
