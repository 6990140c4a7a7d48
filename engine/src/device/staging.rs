//! The staging buffers host transfers keep for reuse (`device::transfer`): mapped
//! buffers pin host memory, which cost more than the copy when every transfer made
//! its own.
//!
//! May call: wgpu. Called by: `device`, `device::transfer`.

use std::sync::{Arc, Mutex};

/// Largest staging buffer.
pub const CHUNK: u64 = 64 << 20;

/// Staging buffers kept per size class: for downloads (unmapped, ready to be copied
/// into) and for uploads (mapped, ready to be written).
#[derive(Default)]
pub struct Pools {
    pub(crate) down: Mutex<Vec<(u64, wgpu::Buffer)>>,
    pub(crate) up: Arc<Mutex<Vec<(u64, wgpu::Buffer)>>>,
}

/// Most buffers a pool keeps per direction.
const KEEP: usize = 48;

/// The size class of a staging buffer for `n` bytes: a power of two from 1 MiB to CHUNK.
fn class(n: u64) -> u64 {
    n.next_power_of_two().clamp(1 << 20, CHUNK)
}

fn take(pool: &Mutex<Vec<(u64, wgpu::Buffer)>>, size: u64) -> Option<wgpu::Buffer> {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    let at = pool.iter().position(|(s, _)| *s == size)?;
    Some(pool.swap_remove(at).1)
}

pub(crate) fn give(pool: &Mutex<Vec<(u64, wgpu::Buffer)>>, size: u64, buffer: wgpu::Buffer) {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < KEEP {
        pool.push((size, buffer));
    }
}

/// A staging buffer of `size`'s class from `pool`, or a new one: for uploads mapped and
/// ready to be written, for downloads ready to be copied into. Returns it and its class.
pub(crate) fn staging_buffer(
    device: &wgpu::Device,
    pool: &Mutex<Vec<(u64, wgpu::Buffer)>>,
    size: u64,
    upload: bool,
) -> (wgpu::Buffer, u64) {
    let c = class(size);
    let buffer = take(pool, c).unwrap_or_else(|| {
        let (label, usage) = if upload {
            ("wgtrain upload", wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC)
        } else {
            ("wgtrain download", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)
        };
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: c,
            usage,
            mapped_at_creation: upload,
        })
    });
    (buffer, c)
}

/// Why bytes `offset..offset + len` of `buffer` cannot be copied (not 4-byte aligned,
/// or outside it), if they cannot.
pub(crate) fn range_error(buffer: &wgpu::Buffer, offset: u64, len: u64) -> Option<String> {
    let a = wgpu::COPY_BUFFER_ALIGNMENT;
    (!offset.is_multiple_of(a) || !len.is_multiple_of(a) || offset + len > buffer.size()).then(|| {
        format!(
            "range {offset}..{} of a {}-byte buffer is not 4-byte aligned or inside it",
            offset + len,
            buffer.size()
        )
    })
}
