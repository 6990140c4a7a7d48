//! The staging buffers host transfers keep for reuse (`device::transfer`): mapped
//! buffers pin host memory, which cost more than the copy when every transfer made
//! its own.
//!
//! May call: wgpu, `device::pinned`. Called by: `device`, `device::transfer`, `device::host_vec`.

use std::sync::{Arc, Mutex};

/// Largest staging buffer.
pub const CHUNK: u64 = 64 << 20;

/// Staging buffers kept per size class: for downloads (unmapped, ready to be copied
/// into) and for uploads (mapped, ready to be written).
#[derive(Default)]
pub struct Pools {
    pub(crate) down: Mutex<Vec<(u64, wgpu::Buffer)>>,
    pub(crate) up: Arc<Mutex<Vec<(u64, wgpu::Buffer)>>>,
    /// Upload buffers in host memory (`pinned`), back here when their copies are done.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) pinned: Arc<Mutex<Vec<(u64, super::pinned::Pinned)>>>,
    /// Whether uploads use them: [`PINNED_UNKNOWN`] until the first upload finds out
    /// whether this device can make them, then [`PINNED_YES`] or [`PINNED_NO`].
    pub(crate) pinned_state: std::sync::atomic::AtomicU8,
    /// Pinned memory kept for host vectors (`host_vec`).
    pub(crate) host: Arc<HostPool>,
}

/// Pinned memory a device made and keeps for its next host vectors (`host_vec`).
#[derive(Default)]
pub(crate) struct HostPool {
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) kept: Mutex<Vec<super::pinned::Pinned>>,
}

pub(crate) const PINNED_UNKNOWN: u8 = 0;
pub(crate) const PINNED_YES: u8 = 1;
pub(crate) const PINNED_NO: u8 = 2;

/// Most bytes a pool keeps per direction: enough for a step's uploads of every
/// gathered parameter (ZeRO 3), which are all in flight while the device catches up.
const KEEP_BYTES: u64 = 1 << 30;

/// The size class of a staging buffer for `n` bytes: a power of two from 1 MiB to CHUNK.
fn class(n: u64) -> u64 {
    n.next_power_of_two().clamp(1 << 20, CHUNK)
}

fn take<T>(pool: &Mutex<Vec<(u64, T)>>, size: u64) -> Option<T> {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    let at = pool.iter().position(|(s, _)| *s == size)?;
    Some(pool.swap_remove(at).1)
}

pub(crate) fn give<T>(pool: &Mutex<Vec<(u64, T)>>, size: u64, buffer: T) {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.iter().map(|(s, _)| s).sum::<u64>() + size <= KEEP_BYTES {
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

/// An upload buffer in host memory of `size`'s class from `pool`, or a new one; None
/// where the device cannot make them. Returns it and its class.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn pinned_buffer(
    device: &wgpu::Device,
    pool: &Mutex<Vec<(u64, super::pinned::Pinned)>>,
    size: u64,
) -> Option<(super::pinned::Pinned, u64)> {
    let c = class(size);
    take(pool, c)
        .or_else(|| super::pinned::Pinned::new(device, c, super::pinned::Use::Upload))
        .map(|p| (p, c))
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

/// Host vectors kept for reuse by transfers and collectives: a new vector of hundreds
/// of megabytes costs more than the copy into it (the kernel faults in and zeroes each
/// page), and a step asks for the same lengths every time (as PyTorch's caching host
/// allocator keeps pinned blocks).
static HOST_VECS: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// Most bytes kept; vectors under [`HOST_VEC_MIN`] bytes are not kept (cheap to make).
const HOST_VECS_BYTES: usize = 8 << 30;
const HOST_VEC_MIN: usize = 1 << 20;

/// A vector of `len` f32 values, reused when one of about that size was given back:
/// its contents are arbitrary (the caller writes all of it).
pub fn take_f32(len: usize) -> Vec<f32> {
    if len * 4 >= HOST_VEC_MIN {
        let mut kept = HOST_VECS.lock().unwrap_or_else(|e| e.into_inner());
        let best = (kept.iter().enumerate())
            .filter(|(_, v)| v.capacity() >= len && v.capacity() <= 2 * len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut v = kept.swap_remove(i);
            drop(kept);
            v.resize(len, 0.0);
            return v;
        }
    }
    vec![0.0; len]
}

/// Gives a vector back for [`take_f32`] to reuse (the oldest kept go first when
/// more than [`HOST_VECS_BYTES`] would be kept).
pub fn give_f32(v: Vec<f32>) {
    let bytes = v.capacity() * 4;
    if !(HOST_VEC_MIN..=HOST_VECS_BYTES).contains(&bytes) {
        return;
    }
    let mut kept = HOST_VECS.lock().unwrap_or_else(|e| e.into_inner());
    let mut total: usize = kept.iter().map(|k| k.capacity() * 4).sum::<usize>() + bytes;
    while total > HOST_VECS_BYTES && !kept.is_empty() {
        total -= kept.remove(0).capacity() * 4;
    }
    kept.push(v);
}

/// Copies `pieces` end to end into `out` (exactly their total length), several
/// threads at once: one core copies a fresh vector at a fraction of memory's speed.
pub fn concat_into(out: &mut [f32], pieces: &[&[f32]]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 18;
    let mut jobs = Vec::new();
    let mut rest = out;
    for piece in pieces {
        for src in piece.chunks(PIECE) {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(src.len());
            jobs.push((dst, src));
            rest = tail;
        }
    }
    debug_assert!(rest.is_empty(), "concat_into: {} values left over", rest.len());
    jobs.into_par_iter().for_each(|(d, s)| d.copy_from_slice(s));
}

/// The sum of the squares of `values` in f64, the same whatever the threads: fixed
/// pieces summed apart, then the pieces' sums in order.
pub fn square_sum<'a>(values: impl Iterator<Item = &'a [f32]>) -> f64 {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 16;
    let pieces: Vec<&[f32]> = values.flat_map(|v| v.chunks(PIECE)).collect();
    let sums: Vec<f64> = pieces
        .par_iter()
        .map(|p| p.iter().map(|&x| x as f64 * x as f64).sum::<f64>())
        .collect();
    sums.iter().sum()
}

/// Multiplies `values` by `k`, several threads at once.
pub fn scale_all<'a>(values: impl Iterator<Item = &'a mut Vec<f32>>, k: f32) {
    use rayon::prelude::*;
    let pieces: Vec<&mut [f32]> = values.flat_map(|v| v.chunks_mut(1 << 16)).collect();
    pieces.into_par_iter().for_each(|p| p.iter_mut().for_each(|x| *x *= k));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_vectors_are_reused_at_their_length() {
        let n = HOST_VEC_MIN; // 4 MiB of f32
        let v = take_f32(n);
        assert_eq!(v.len(), n);
        let at = v.as_ptr();
        give_f32(v);
        // A slightly shorter request reuses it, cut to its length.
        let again = take_f32(n - 8);
        assert_eq!(again.len(), n - 8);
        assert_eq!(again.as_ptr(), at);
        // One over twice the request is not handed out.
        give_f32(again);
        let small = take_f32(n / 4);
        assert_ne!(small.as_ptr(), at);
        assert_eq!(small.len(), n / 4);
    }

    #[test]
    fn pieces_are_laid_end_to_end_and_sums_do_not_depend_on_threads() {
        // Small integers: every grouping of the sum is exact, so the expected value is one.
        let a: Vec<f32> = (0..300_000).map(|i| (i % 1000) as f32).collect();
        let b = vec![-1.0f32; 5];
        let mut out = vec![0.0; a.len() + b.len()];
        concat_into(&mut out, &[&a, &[], &b]);
        assert_eq!(&out[..a.len()], &a[..]);
        assert_eq!(&out[a.len()..], &b[..]);
        let expect: f64 = out
            .chunks(1 << 16)
            .map(|p| p.iter().map(|&x| (x as f64).powi(2)).sum::<f64>())
            .sum();
        assert_eq!(square_sum([&a[..], &b[..]].into_iter()), expect);
        let mut vs = [a.clone(), b.clone()];
        scale_all(vs.iter_mut(), 0.5);
        assert_eq!(vs[0][999], 499.5);
        assert_eq!(vs[1][4], -0.5);
    }
}
