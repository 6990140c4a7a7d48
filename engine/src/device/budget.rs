//! What a device has left, as `torch.cuda.mem_get_info` tells it: the memory budget of
//! this process (what it may use in all, its usage included) and its usage now. Vulkan
//! reports them through VK_EXT_memory_budget, summed over the device-local heaps; a CPU
//! adapter's memory is the host's, so there the usage is this process's resident memory
//! and the budget that plus what the host has available (`/proc`), at most the adapter's
//! heap. Other backends (and a
//! Vulkan driver without the extension) say nothing: None.
//!
//! May call: `device::report`. Called by: `device`, the trainer, the CLI.

/// A device's memory budget for this process and its usage, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// What this process may use in all (its usage included).
    pub budget: u64,
    /// What it uses now.
    pub usage: u64,
}

/// The budget and usage of `adapter`'s memory now, where they are known.
pub fn memory_budget(adapter: &wgpu::Adapter) -> Option<MemoryBudget> {
    if told(adapter) { read(adapter) } else { None }
}

/// [`memory_budget`] of an adapter whose backend [`told`] it can.
#[cfg(not(target_arch = "wasm32"))]
pub fn read(adapter: &wgpu::Adapter) -> Option<MemoryBudget> {
    if adapter.get_info().device_type == wgpu::DeviceType::Cpu {
        // No more than the adapter's own heap, whatever the host has.
        return host_budget().map(|b| MemoryBudget {
            budget: super::report::device_local_bytes(adapter).map_or(b.budget, |heap| b.budget.min(heap)),
            ..b
        });
    }
    vulkan_budget(adapter)
}

/// Browsers do not tell.
#[cfg(target_arch = "wasm32")]
pub fn read(_adapter: &wgpu::Adapter) -> Option<MemoryBudget> {
    None
}

/// Whether `adapter`'s backend can tell the budget (a CPU adapter, or Vulkan with
/// VK_EXT_memory_budget): asked once per device, not every time it is read.
#[cfg(not(target_arch = "wasm32"))]
pub fn told(adapter: &wgpu::Adapter) -> bool {
    if adapter.get_info().device_type == wgpu::DeviceType::Cpu {
        return true;
    }
    // SAFETY: the hal adapter is only read, and the guard is dropped before returning.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
        return false;
    };
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which outlives the call.
    unsafe { instance.enumerate_device_extension_properties(hal.raw_physical_device()) }.is_ok_and(|extensions| {
        extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::memory_budget::NAME))
    })
}

/// Browsers do not tell.
#[cfg(target_arch = "wasm32")]
pub fn told(_adapter: &wgpu::Adapter) -> bool {
    false
}

#[cfg(not(target_arch = "wasm32"))]
fn vulkan_budget(adapter: &wgpu::Adapter) -> Option<MemoryBudget> {
    use ash::vk;
    // SAFETY: the hal adapter is only read, and the guard is dropped before returning.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let device = hal.raw_physical_device();
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
    // SAFETY: the extension is supported, so the chained struct is filled in.
    unsafe { instance.get_physical_device_memory_properties2(device, &mut props) };
    let count = props.memory_properties.memory_heap_count as usize;
    let heaps = props.memory_properties.memory_heaps;
    let local = |i: &usize| heaps[*i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL);
    let total = MemoryBudget {
        budget: (0..count).filter(local).map(|i| budget.heap_budget[i]).sum(),
        usage: (0..count).filter(local).map(|i| budget.heap_usage[i]).sum(),
    };
    (total.budget > 0).then_some(total)
}

/// A CPU adapter's: this process's resident memory, and that plus what the host has
/// available.
fn host_budget() -> Option<MemoryBudget> {
    let kib = |file: &str, key: &str| -> Option<u64> {
        let text = std::fs::read_to_string(file).ok()?;
        let v = text.lines().find_map(|l| l.strip_prefix(key))?;
        Some(v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
    };
    let usage = kib("/proc/self/status", "VmRSS:")?;
    let available = kib("/proc/meminfo", "MemAvailable:")?;
    Some(MemoryBudget {
        budget: usage + available,
        usage,
    })
}
