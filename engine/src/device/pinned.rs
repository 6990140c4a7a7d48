//! Buffers in the host's memory (Vulkan): pinned, mapped for good and copied from (and
//! into) by the device's copy engine, as PyTorch's pinned host tensors are: upload
//! staging buffers, and the memory of host vectors (`device::host_vec`).
//! wgpu puts a `MAP_WRITE` buffer in device-local memory the host can see where the
//! adapter has it (resizable BAR on the H100), so an upload through it is the host's
//! own writes across PCIe: 28-31 GB/s alone and 18-21 GB/s per device with two
//! devices writing at once (CHANGELOG.md). Here the host writes into its own
//! memory, and the device pulls each chunk with a DMA copy while the host writes the
//! next. The buffer is made through wgpu's Vulkan interop and handed to wgpu as a
//! transfer buffer it does not map; the memory is freed when wgpu drops the buffer.
//!
//! May call: wgpu (its Vulkan hal), ash. Called by: `device::staging`,
//! `device::transfer`, `device::host_vec`.

use ash::vk;

/// A host-memory buffer the device copies from (and, for host vectors, into), with its
/// mapping.
pub(crate) struct Pinned {
    pub(crate) buffer: wgpu::Buffer,
    ptr: *mut u8,
    len: usize,
}

/// What a [`Pinned`] buffer is for: the host writes an upload buffer only (write-combined
/// memory first); the host reads a host vector too (cached memory first).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Use {
    Upload,
    HostVec,
}

// SAFETY: the mapping is host memory owned by this value; a `&mut Pinned` is needed to
// write it, and the pool hands one out only once the device's copies from it are done.
unsafe impl Send for Pinned {}
// SAFETY: as above; shared references never touch the mapping.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// A `size`-byte buffer in host memory that `device` can copy from (and into, for
    /// a host vector), or None where the device is not Vulkan or has no such memory (the
    /// caller falls back to a mapped wgpu buffer or a plain vector), or
    /// `WGTRAIN_PINNED_UPLOADS=0`.
    pub(crate) fn new(device: &wgpu::Device, size: u64, kind: Use) -> Option<Pinned> {
        if std::env::var("WGTRAIN_PINNED_UPLOADS").is_ok_and(|v| v == "0") {
            return None;
        }
        let len = usize::try_from(size).ok()?;
        // SAFETY: the hal device is used only to create, bind and map objects this
        // value owns; the guard is dropped before wgpu takes the buffer.
        let (raw, buffer) = unsafe {
            let hal = device.as_hal::<wgpu::hal::api::Vulkan>()?;
            let raw = hal.raw_device().clone();
            let props = hal
                .shared_instance()
                .raw_instance()
                .get_physical_device_memory_properties(hal.raw_physical_device());
            let made = make(&raw, &props, size, kind);
            drop(hal);
            (raw, made?)
        };
        let (vk_buffer, memory, ptr) = buffer;
        // SAFETY: wgpu destroys the hal buffer only when no submission uses it any more
        // (and before the device); the callback then frees what `make` made, once.
        let hal_buffer = unsafe {
            wgpu::hal::vulkan::Buffer::from_raw_externally_owned(
                vk_buffer,
                Box::new(move || {
                    raw.destroy_buffer(vk_buffer, None);
                    raw.free_memory(memory, None);
                }),
            )
        };
        let (label, usage) = match kind {
            Use::Upload => ("wgtrain upload (host memory)", wgpu::BufferUsages::COPY_SRC),
            Use::HostVec => ("wgtrain host vector", wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST),
        };
        // SAFETY: the buffer is a buffer of `size` bytes with the transfer usages the
        // descriptor names, bound to memory; it is never mapped through wgpu.
        let buffer = unsafe {
            device.create_buffer_from_hal::<wgpu::hal::api::Vulkan>(
                hal_buffer,
                &wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage,
                    mapped_at_creation: false,
                },
            )
        };
        tracing::debug!(bytes = size, label, "new buffer in host memory");
        Some(Pinned { buffer, ptr, len })
    }

    /// Its bytes, to write (no copy from it is in flight: see `Pools`).
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes of host-coherent memory owned by this value,
        // alive as long as `buffer`; `&mut self` makes the slice exclusive on the host,
        // and no submission that reads it is in flight (the pool takes it back only
        // when the queue's work up to its copy is done).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Its mapping and length in bytes (for `host_vec`, which keeps the same rules).
    pub(crate) fn raw(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }
}

/// A command buffer that makes the device's transfer writes so far (in submission
/// order) visible to the host's reads, as Vulkan asks before the host reads memory a
/// copy wrote (wgpu does this for its own mapped buffers, not for these); None where
/// the device is not Vulkan.
pub(crate) fn host_read_barrier(device: &wgpu::Device) -> Option<wgpu::CommandBuffer> {
    // SAFETY: the hal device outlives this call; the ash device is a copy of its table.
    let raw = unsafe { device.as_hal::<wgpu::hal::api::Vulkan>() }?.raw_device().clone();
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("wgtrain host read barrier"),
    });
    let barrier = vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(vk::AccessFlags::HOST_READ);
    // SAFETY: the encoder is fresh and used through the hal only (wgpu forbids mixing);
    // one barrier is recorded into its open command buffer.
    let recorded = unsafe {
        encoder.as_hal_mut::<wgpu::hal::api::Vulkan, _, _>(|enc| {
            let enc = enc?;
            raw.cmd_pipeline_barrier(
                enc.raw_handle(),
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
            Some(())
        })
    };
    recorded.map(|()| encoder.finish())
}

/// Makes a transfer buffer of `size` bytes for `kind` in host-visible, host-coherent
/// memory and maps it; undoes what it did on any failure.
///
/// # Safety
/// `raw` is a live device whose physical device has memory properties `props`.
unsafe fn make(
    raw: &ash::Device,
    props: &vk::PhysicalDeviceMemoryProperties,
    size: u64,
    kind: Use,
) -> Option<(vk::Buffer, vk::DeviceMemory, *mut u8)> {
    let usage = match kind {
        Use::Upload => vk::BufferUsageFlags::TRANSFER_SRC,
        Use::HostVec => vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST,
    };
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(usage)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY (this block and the calls below): valid create infos for a live device;
    // every object made is destroyed on the failure paths.
    let buffer = unsafe { raw.create_buffer(&info, None) }.ok()?;
    let req = unsafe { raw.get_buffer_memory_requirements(buffer) };
    let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let types = &props.memory_types[..props.memory_type_count as usize];
    // Host memory: for uploads write-combined first (the host only writes it), then
    // cached; for host vectors cached first (the host reads them). Where every
    // host-visible type is device-local (one memory: lavapipe, integrated GPUs), one of
    // those.
    let pick = |local: bool, cached: bool| {
        types.iter().enumerate().position(|(i, t)| {
            let f = t.property_flags;
            req.memory_type_bits & (1 << i) != 0
                && f.contains(host)
                && f.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL) == local
                && f.contains(vk::MemoryPropertyFlags::HOST_CACHED) == cached
        })
    };
    let any_host = types
        .iter()
        .any(|t| t.property_flags.contains(host) && !t.property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL));
    let cached_first = kind == Use::HostVec;
    let found = if any_host {
        pick(false, cached_first).or_else(|| pick(false, !cached_first))
    } else {
        pick(true, true).or_else(|| pick(true, false))
    };
    let Some(ty) = found else {
        unsafe { raw.destroy_buffer(buffer, None) };
        return None;
    };
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(req.size)
        .memory_type_index(ty as u32);
    let Ok(memory) = (unsafe { raw.allocate_memory(&alloc, None) }) else {
        unsafe { raw.destroy_buffer(buffer, None) };
        return None;
    };
    let mapped = unsafe { raw.bind_buffer_memory(buffer, memory, 0) }
        .and_then(|()| unsafe { raw.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) });
    match mapped {
        Ok(ptr) if !ptr.is_null() => Some((buffer, memory, ptr as *mut u8)),
        _ => {
            unsafe {
                raw.destroy_buffer(buffer, None);
                raw.free_memory(memory, None);
            }
            None
        }
    }
}
