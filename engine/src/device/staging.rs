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
pub(crate) fn class(n: u64) -> u64 {
    n.next_power_of_two().clamp(1 << 20, CHUNK)
}

pub(crate) fn take(pool: &Mutex<Vec<(u64, wgpu::Buffer)>>, size: u64) -> Option<wgpu::Buffer> {
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
