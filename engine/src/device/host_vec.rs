//! Host vectors that a device copies into and out of directly: f32 values in pinned host
//! memory made by that device (`pinned`), which its copy engine writes and reads
//! without the host copying the bytes through staging buffers (PyTorch's pinned host
//! tensors). Every other thread reads them where they lie, so a collective exchanges
//! them without copying. Where the device cannot make such memory (not Vulkan,
//! `WGTRAIN_PINNED_UPLOADS=0`, or small vectors) a host vector is a plain vector, and
//! its transfers go through the staging buffers (`transfer`).
//!
//! May call: wgpu, `device`, `device::pinned`, `device::staging`. Called by:
//! `device::transfer`, `runtime`, `train::{parallel, reducer}`.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::Gpu;
use super::staging::{HostPool, give_f32, take_f32};

/// Vectors under this many bytes are plain: their copy through staging costs less than
/// a pinned allocation, and they would spend the device's allocation count.
const PINNED_MIN: usize = 64 << 10;

/// Most bytes of pinned memory a device keeps for reuse.
const KEEP_BYTES: usize = 2 << 30;

/// f32 values in host memory: pinned memory of one device, or a plain vector.
pub struct HostVec {
    len: usize,
    store: Store,
}

enum Store {
    #[cfg(not(target_arch = "wasm32"))]
    Pinned(Option<super::pinned::Pinned>, Arc<HostPool>),
    Plain(Vec<f32>),
}

impl HostVec {
    /// A plain vector as a host vector (transfers go through staging).
    pub fn plain(v: Vec<f32>) -> HostVec {
        HostVec {
            len: v.len(),
            store: Store::Plain(v),
        }
    }

    /// `len` zeros in a plain vector.
    pub fn zeros(len: usize) -> HostVec {
        let mut v = take_f32(len);
        v.fill(0.0);
        HostVec::plain(v)
    }

    /// A host vector of `len` values for `gpu` ([`Gpu::host_vec`]), or `len` zeros in a
    /// plain vector where there is no device (the estimate's dry run).
    pub fn on(gpu: Option<&Gpu>, len: usize) -> HostVec {
        gpu.map_or_else(|| HostVec::zeros(len), |g| g.host_vec(len))
    }

    /// Whether the values are in memory `gpu` copies into and out of directly.
    pub fn is_pinned_for(&self, gpu: &Gpu) -> bool {
        self.buffer_for(gpu).is_some()
    }

    /// The device buffer over the values, where they are pinned memory of `gpu`.
    pub(crate) fn buffer_for(&self, gpu: &Gpu) -> Option<&wgpu::Buffer> {
        match &self.store {
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(Some(p), pool) if Arc::ptr_eq(pool, &gpu.staging.host) => Some(&p.buffer),
            _ => None,
        }
    }
}

impl Deref for HostVec {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.store {
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(Some(p), _) => {
                let (ptr, bytes) = p.raw();
                debug_assert!(self.len * 4 <= bytes && (ptr as usize).is_multiple_of(4));
                // SAFETY: the mapping holds at least `len` f32 values (aligned: a
                // mapping starts at minMemoryMapAlignment, at least 64 bytes) and lives as
                // long as `p`; no copy into it is in flight while the vector is reachable
                // (a download hands it out only once its copy is done, an upload takes
                // it by value until its copy is done).
                unsafe { std::slice::from_raw_parts(ptr as *const f32, self.len) }
            }
            Store::Plain(v) => v,
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(None, _) => &[],
        }
    }
}

impl DerefMut for HostVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.store {
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(Some(p), _) => {
                let (ptr, _) = p.raw();
                // SAFETY: as in `deref`, and `&mut self` makes the slice exclusive.
                unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, self.len) }
            }
            Store::Plain(v) => v,
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(None, _) => &mut [],
        }
    }
}

impl Drop for HostVec {
    fn drop(&mut self) {
        match &mut self.store {
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(p, pool) => {
                let Some(p) = p.take() else { return };
                let mut kept = pool.kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.iter().map(|k| k.raw().1).sum::<usize>() + p.raw().1 <= KEEP_BYTES {
                    kept.push(p);
                }
            }
            Store::Plain(v) => give_f32(std::mem::take(v)),
        }
    }
}

impl std::fmt::Debug for HostVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.store {
            #[cfg(not(target_arch = "wasm32"))]
            Store::Pinned(..) => "pinned",
            Store::Plain(_) => "plain",
        };
        write!(f, "HostVec({kind}, {} values)", self.len)
    }
}

impl Gpu {
    /// A host vector of `len` f32 values that this device copies into and out of
    /// directly where it can make pinned memory (a plain vector otherwise); its
    /// contents are arbitrary (the caller writes all of it).
    pub fn host_vec(&self, len: usize) -> HostVec {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(p) = self.pinned_host(len * 4) {
            return HostVec {
                len,
                store: Store::Pinned(Some(p), self.staging.host.clone()),
            };
        }
        HostVec::plain(take_f32(len))
    }

    /// Pinned memory of at least `bytes` from the pool (the smallest that fits, up to
    /// twice the request), or new; None where vectors of this size stay plain or the
    /// device cannot make it.
    #[cfg(not(target_arch = "wasm32"))]
    fn pinned_host(&self, bytes: usize) -> Option<super::pinned::Pinned> {
        use super::staging::PINNED_NO;
        if bytes < PINNED_MIN || self.staging.pinned_state.load(std::sync::atomic::Ordering::Relaxed) == PINNED_NO {
            return None;
        }
        let mut kept = self.staging.host.kept.lock().unwrap_or_else(|e| e.into_inner());
        let best = (kept.iter().enumerate())
            .filter(|(_, p)| (bytes..=2 * bytes).contains(&p.raw().1))
            .min_by_key(|(_, p)| p.raw().1)
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Some(kept.swap_remove(i));
        }
        drop(kept);
        let size = bytes.next_multiple_of(64 << 10) as u64;
        super::pinned::Pinned::new(&self.device, size, super::pinned::Use::HostVec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_host_vectors_hold_their_values() {
        let mut v = HostVec::plain(vec![1.0, 2.0, 3.0]);
        v[1] = 5.0;
        assert_eq!(&v[..], &[1.0, 5.0, 3.0]);
        assert_eq!(&HostVec::zeros(4)[..], &[0.0; 4]);
    }
}
