//! Bulk copies between device buffers and host memory, for the collectives of a
//! multi-device run: many ranges gathered into (or scattered from) one host buffer,
//! through mapped staging buffers of at most [`CHUNK`] bytes, all submitted at once.
//! A download is started on one thread and finished on any other (the reducer's
//! transfer thread), so the copy runs while the device goes on with backward. Each
//! staging chunk is its own submission, so the host reads one chunk while the device
//! copies the next; the host side copies with several threads (one core reads and
//! writes mapped memory at a fraction of the link's speed) into freshly zeroed
//! allocations, which the kernel maps lazily, so no page is touched twice.
//! Staging buffers are kept and reused (`Pools`): making a mapped buffer pins host
//! memory, which cost more than the copy itself when every bucket made its own.
//! Uploads go through buffers in host memory where the device can make them
//! (`pinned`: the device's copy engine pulls each chunk while the host writes the next),
//! else through mapped wgpu buffers, which wgpu places in device memory the host
//! writes across PCIe where the adapter has resizable BAR.
//!
//! A download into (or an upload from) a host vector (`host_vec`) of the device's own
//! pinned memory is the device's copy alone: no staging buffer, no host copy.
//!
//! May call: wgpu, rayon, `device`, `device::staging`, `device::pinned`,
//! `device::host_vec`. Called by: `runtime`, `train::parallel`, `train::reducer`.

use std::sync::Arc;

use super::host_vec::HostVec;
pub use super::staging::CHUNK;
use super::staging::{give, range_error, staging_buffer, take_f32};
use super::{DeviceError, Gpu};

/// A range of a device buffer: (buffer, byte offset, bytes), both multiples of 4.
pub type Range<'a> = (&'a wgpu::Buffer, u64, u64);

/// A download in flight: the copies are submitted and the staging buffers' maps asked
/// for; [`Download::finish`] waits for them and returns the bytes in range order.
pub struct Download {
    gpu: Option<Arc<Gpu>>,
    /// (buffer, bytes used, its size class, the submission that fills it).
    staging: Vec<(wgpu::Buffer, u64, u64, wgpu::SubmissionIndex)>,
    len: u64,
}

fn check(buffer: &wgpu::Buffer, offset: u64, len: u64) -> Result<(), DeviceError> {
    range_error(buffer, offset, len).map_or(Ok(()), |e| Err(DeviceError::Readback(e)))
}

/// Checks that `ranges` can be copied and hold exactly `len` bytes (an upload's data).
fn check_upload(ranges: &[Range], len: u64) -> Result<(), DeviceError> {
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    if total != len {
        return Err(DeviceError::Validation(format!("upload of {len} bytes into ranges of {total}")));
    }
    ranges.iter().try_for_each(|&(b, o, l)| check(b, o, l))
}

/// Records the copies between `ranges` and `host` (a host vector's buffer, the ranges
/// laid end to end in it from byte 0): into it, or out of it with `upload`.
fn copy_end_to_end(encoder: &mut wgpu::CommandEncoder, ranges: &[Range], host: &wgpu::Buffer, upload: bool) {
    let mut at = 0;
    for &(buffer, offset, n) in ranges.iter().filter(|r| r.2 > 0) {
        if upload {
            encoder.copy_buffer_to_buffer(host, at, buffer, offset, n);
        } else {
            encoder.copy_buffer_to_buffer(buffer, offset, host, at, n);
        }
        at += n;
    }
}

/// Splits ranges of `lens` bytes laid end to end into staging chunks: calls
/// `copy(range index, offset inside that range, chunk, offset inside the chunk, len)`;
/// returns the chunks' sizes.
fn chunked(lens: impl Iterator<Item = u64>, mut copy: impl FnMut(usize, u64, usize, u64, u64)) -> Vec<u64> {
    let mut sizes = vec![0u64];
    for (r, len) in lens.enumerate() {
        let mut done = 0;
        while done < len {
            let room = CHUNK - sizes.last().copied().unwrap_or(0);
            if room == 0 {
                sizes.push(0);
                continue;
            }
            let n = room.min(len - done);
            let chunk = sizes.len() - 1;
            copy(r, done, chunk, sizes[chunk], n);
            sizes[chunk] += n;
            done += n;
        }
    }
    sizes.retain(|&s| s > 0);
    sizes
}

impl Download {
    /// A download that yields `len` zero bytes (the estimate's dry run).
    pub fn zeros(len: u64) -> Download {
        Download {
            gpu: None,
            staging: Vec::new(),
            len,
        }
    }

    /// Bytes it yields.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it yields nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the copies and reads the bytes back.
    pub fn finish(self) -> Result<Vec<u8>, DeviceError> {
        // Zeroed by the allocator (fresh pages from the kernel), first written by the copy.
        let mut out = vec![0u8; self.len as usize];
        self.finish_into(&mut out)?;
        Ok(out)
    }

    /// Waits for the copies and reads the bytes back as f32 values, into a vector from
    /// the reused ones (`staging::give_f32` takes it back).
    pub fn finish_f32(self) -> Result<Vec<f32>, DeviceError> {
        let mut out = take_f32((self.len / 4) as usize);
        self.finish_into(bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Waits for the copies and reads the bytes into `out`, which holds exactly
    /// [`Download::len`] bytes (a buffer the caller reuses).
    pub fn finish_into(self, out: &mut [u8]) -> Result<(), DeviceError> {
        if out.len() as u64 != self.len {
            return Err(DeviceError::Readback(format!(
                "a download of {} bytes read into {} bytes",
                self.len,
                out.len()
            )));
        }
        let Some(gpu) = self.gpu.clone() else {
            out.fill(0);
            return Ok(());
        };
        self.read(&gpu, out)
    }

    /// Waits for each chunk's copy in turn and copies it into `out` (their length),
    /// several threads at once, while the device copies the next chunks.
    fn read(self, gpu: &Arc<Gpu>, out: &mut [u8]) -> Result<(), DeviceError> {
        use rayon::prelude::*;
        const PIECE: usize = 1 << 20;
        let mut rest = out;
        for (buffer, size, class, index) in self.staging {
            gpu.device
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: None,
                })
                .map_err(|e| DeviceError::Lost(e.to_string()))?;
            let view = buffer
                .slice(..size)
                .get_mapped_range()
                .map_err(|e| DeviceError::Readback(e.to_string()))?;
            let (dst, tail) = rest.split_at_mut(size as usize);
            rest = tail;
            dst.par_chunks_mut(PIECE)
                .zip(view.par_chunks(PIECE))
                .for_each(|(d, s)| d.copy_from_slice(s));
            drop(view);
            buffer.unmap();
            give(&gpu.staging.down, class, buffer);
        }
        gpu.check()
    }
}

/// A download into a host vector in flight: [`HostDownload::finish`] waits for it and
/// hands the vector out.
pub struct HostDownload {
    gpu: Option<Arc<Gpu>>,
    vec: Option<HostVec>,
    wait: Wait,
}

enum Wait {
    /// Nothing to wait for (the estimate's dry run).
    Done,
    /// The device's copy into the vector's pinned memory.
    Copy(wgpu::SubmissionIndex),
    /// A download through staging buffers, read into the (plain) vector at the end.
    Staged(Download),
}

impl HostDownload {
    /// A download that yields `len` zero values (the estimate's dry run).
    pub fn zeros(len: usize) -> HostDownload {
        HostDownload {
            gpu: None,
            vec: Some(HostVec::zeros(len)),
            wait: Wait::Done,
        }
    }

    /// Bytes it yields.
    pub fn len(&self) -> u64 {
        self.vec.as_ref().map_or(0, |v| (v.len() * 4) as u64)
    }

    /// Whether it yields nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the copy and hands the values out.
    pub fn finish(mut self) -> Result<HostVec, DeviceError> {
        let mut vec = self.vec.take().expect("an unfinished download holds its vector");
        match std::mem::replace(&mut self.wait, Wait::Done) {
            Wait::Done => {}
            Wait::Copy(index) => {
                let gpu = self.gpu.as_ref().expect("a copy has its device");
                gpu.device
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(index),
                        timeout: None,
                    })
                    .map_err(|e| DeviceError::Lost(e.to_string()))?;
                gpu.check()?;
            }
            Wait::Staged(d) => d.finish_into(bytemuck::cast_slice_mut(&mut vec))?,
        }
        Ok(vec)
    }
}

impl Drop for HostDownload {
    /// A download dropped unfinished (a failed step) keeps its vector until the copy
    /// into it is done, so the memory is not handed out again while the device writes it.
    fn drop(&mut self) {
        if let (Some(vec), Wait::Copy(_), Some(gpu)) = (self.vec.take(), &self.wait, &self.gpu) {
            gpu.queue.on_submitted_work_done(move || drop(vec));
        }
    }
}

impl Gpu {
    /// Starts copying `ranges` (end to end) into a host vector, after everything
    /// submitted so far: straight into the device's pinned memory where it makes it
    /// (one copy, no staging), else through staging buffers.
    pub fn download_host(self: &Arc<Self>, ranges: &[Range]) -> Result<HostDownload, DeviceError> {
        for &(b, o, l) in ranges {
            check(b, o, l)?;
        }
        let len: u64 = ranges.iter().map(|r| r.2).sum();
        let vec = self.host_vec((len / 4) as usize);
        let wait = match vec.buffer_for(self) {
            Some(dst) => {
                let mut encoder = self.device.create_command_encoder(&Default::default());
                copy_end_to_end(&mut encoder, ranges, dst, false);
                #[cfg(not(target_arch = "wasm32"))]
                let barrier = super::pinned::host_read_barrier(&self.device);
                #[cfg(target_arch = "wasm32")]
                let barrier = None;
                Wait::Copy(self.queue.submit(std::iter::once(encoder.finish()).chain(barrier)))
            }
            None => Wait::Staged(self.download(ranges)?),
        };
        Ok(HostDownload {
            gpu: Some(self.clone()),
            vec: Some(vec),
            wait,
        })
    }

    /// Copies `data` (laid end to end) into `ranges`, after everything submitted so far:
    /// straight from its memory where it is this device's pinned memory (the vector is
    /// let go once the copy is done), else through staging buffers.
    pub fn upload_host(&self, ranges: &[Range], data: HostVec) -> Result<(), DeviceError> {
        let Some(src) = data.buffer_for(self) else {
            return self.upload(ranges, bytemuck::cast_slice(&data));
        };
        check_upload(ranges, (data.len() * 4) as u64)?;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        copy_end_to_end(&mut encoder, ranges, src, true);
        self.queue.submit([encoder.finish()]);
        self.queue.on_submitted_work_done(move || drop(data));
        self.check()
    }

    /// Starts copying `ranges` to the host, after everything submitted so far.
    pub fn download(self: &Arc<Self>, ranges: &[Range]) -> Result<Download, DeviceError> {
        for &(b, o, l) in ranges {
            check(b, o, l)?;
        }
        let mut copies = Vec::new();
        let sizes = chunked(ranges.iter().map(|r| r.2), |r, at, chunk, into, n| {
            copies.push((r, at, chunk, into, n))
        });
        let len = sizes.iter().sum();
        // One submission per chunk, so the first can be read while the next is copied.
        let mut staging = Vec::with_capacity(sizes.len());
        let mut copies = copies.into_iter().peekable();
        for (chunk, &size) in sizes.iter().enumerate() {
            let (buffer, class) = staging_buffer(&self.device, &self.staging.down, size, false);
            let mut encoder = self.device.create_command_encoder(&Default::default());
            while let Some((r, at, _, into, n)) = copies.next_if(|c| c.2 == chunk) {
                let (src, offset, _) = ranges[r];
                encoder.copy_buffer_to_buffer(src, offset + at, &buffer, into, n);
            }
            let index = self.queue.submit([encoder.finish()]);
            buffer.slice(..size).map_async(wgpu::MapMode::Read, |_| {});
            staging.push((buffer, size, class, index));
        }
        Ok(Download {
            gpu: Some(self.clone()),
            staging,
            len,
        })
    }

    /// Whether uploads go through buffers in host memory that the device copies from
    /// (None before the first upload has found out whether this device can make them).
    pub fn pinned_uploads(&self) -> Option<bool> {
        use super::staging::{PINNED_NO, PINNED_YES};
        match self.staging.pinned_state.load(std::sync::atomic::Ordering::Relaxed) {
            PINNED_YES => Some(true),
            PINNED_NO => Some(false),
            _ => None,
        }
    }

    /// Whether uploads from now on may go through buffers in host memory (where the
    /// device can make them) or only through mapped wgpu buffers: to compare the two
    /// ways in tests and benchmarks. `WGTRAIN_PINNED_UPLOADS=0` turns them off for a run.
    pub fn set_pinned_uploads(&self, on: bool) {
        use super::staging::{PINNED_NO, PINNED_UNKNOWN};
        let state = if on { PINNED_UNKNOWN } else { PINNED_NO };
        self.staging.pinned_state.store(state, std::sync::atomic::Ordering::Relaxed);
    }

    /// Copies `data` (laid end to end) into `ranges` through staging buffers;
    /// the copies run after everything submitted before.
    pub fn upload(&self, ranges: &[Range], data: &[u8]) -> Result<(), DeviceError> {
        check_upload(ranges, data.len() as u64)?;
        let mut copies = Vec::new();
        let sizes = chunked(ranges.iter().map(|r| r.2), |r, at, chunk, into, n| {
            copies.push((r, at, chunk, into, n))
        });
        if sizes.is_empty() {
            return Ok(());
        }
        #[cfg(not(target_arch = "wasm32"))]
        if self.upload_pinned(ranges, data, &copies, &sizes)? {
            return self.check();
        }
        // Buffers whose copies are done come back to the pool now (their maps' callbacks
        // run in a poll), so a run of uploads reuses them instead of pinning new ones.
        let _ = self.device.poll(wgpu::PollType::Poll);
        // Mapped buffers from the pool, or new ones mapped at creation.
        let staging: Vec<(wgpu::Buffer, u64)> = sizes
            .iter()
            .map(|&size| staging_buffer(&self.device, &self.staging.up, size, true))
            .collect();
        // The chunks are filled end to end from `data`: each is one contiguous piece of
        // it, written by several threads at once.
        let mut at_data = 0usize;
        for ((b, _), &size) in staging.iter().zip(&sizes) {
            use rayon::prelude::*;
            const PIECE: usize = 1 << 20;
            let mut view = b
                .slice(..size)
                .get_mapped_range_mut()
                .map_err(|e| DeviceError::Validation(e.to_string()))?;
            let src = &data[at_data..at_data + size as usize];
            // Mapped memory is write-only: cut into whole pieces the threads write (a
            // piece of fixed size can cross threads) and the tail, written here.
            let (pieces, mut tail) = view.slice(..).into_chunks::<PIECE>();
            let whole = pieces.len() * PIECE;
            let pieces: Vec<wgpu::WriteOnly<[u8; PIECE]>> = pieces.into_iter().collect();
            pieces
                .into_par_iter()
                .zip(src[..whole].par_chunks(PIECE))
                .for_each(|(d, s)| wgpu::WriteOnly::<[u8]>::from(d).copy_from_slice(s));
            tail.copy_from_slice(&src[whole..]);
            at_data += size as usize;
        }
        let mut encoder = self.device.create_command_encoder(&Default::default());
        for &(r, at, chunk, into, n) in &copies {
            let (dst, offset, _) = ranges[r];
            encoder.copy_buffer_to_buffer(&staging[chunk].0, into, dst, offset + at, n);
        }
        for (b, _) in &staging {
            b.unmap();
        }
        self.queue.submit([encoder.finish()]);
        // Each buffer goes back to the pool once the copy is done and it is mapped again.
        for (b, c) in staging {
            let pool = self.staging.up.clone();
            let again = b.clone();
            b.slice(..).map_async(wgpu::MapMode::Write, move |r| {
                if r.is_ok() {
                    give(&pool, c, again);
                }
            });
        }
        self.check()
    }

    /// The upload through buffers in host memory (`pinned`): each chunk written by
    /// several threads, then its copy submitted, so the device copies one chunk while the
    /// host writes the next. Returns false where the device cannot make such buffers (or
    /// cannot make one more): the caller then uploads everything through mapped buffers.
    #[cfg(not(target_arch = "wasm32"))]
    fn upload_pinned(
        &self,
        ranges: &[Range],
        data: &[u8],
        copies: &[(usize, u64, usize, u64, u64)],
        sizes: &[u64],
    ) -> Result<bool, DeviceError> {
        use super::staging::{PINNED_NO, PINNED_UNKNOWN, PINNED_YES, pinned_buffer};
        use rayon::prelude::*;
        const PIECE: usize = 1 << 20;
        let pool = &self.staging.pinned;
        use std::sync::atomic::Ordering::Relaxed;
        let state = &self.staging.pinned_state;
        if state.load(Relaxed) == PINNED_NO {
            return Ok(false);
        }
        let mut at_data = 0usize;
        // The copies come in chunk order: each chunk's are taken as it is submitted.
        let mut copies = copies.iter().peekable();
        for (chunk, &size) in sizes.iter().enumerate() {
            // Buffers whose copies are done come back to the pool in a poll.
            let _ = self.device.poll(wgpu::PollType::Poll);
            let Some((mut stage, class)) = pinned_buffer(&self.device, pool, size) else {
                // The first upload finds out that this device cannot make them; later a
                // buffer can fail to be made (the host's pinned memory is spent): this
                // upload then goes through mapped buffers, all of it again (the chunks
                // already queued write the same bytes first).
                if state.load(Relaxed) == PINNED_UNKNOWN {
                    state.store(PINNED_NO, Relaxed);
                    tracing::info!("uploads go through mapped wgpu buffers: no host-memory buffers here");
                } else {
                    tracing::warn!("no {size}-byte upload buffer in host memory; this upload goes through mapped buffers");
                }
                return Ok(false);
            };
            state.store(PINNED_YES, Relaxed);
            let src = &data[at_data..at_data + size as usize];
            let dst = &mut stage.bytes()[..size as usize];
            dst.par_chunks_mut(PIECE)
                .zip(src.par_chunks(PIECE))
                .for_each(|(d, s)| d.copy_from_slice(s));
            let mut encoder = self.device.create_command_encoder(&Default::default());
            while let Some(&(r, at, _, into, n)) = copies.next_if(|c| c.2 == chunk) {
                let (dst, offset, _) = ranges[r];
                encoder.copy_buffer_to_buffer(&stage.buffer, into, dst, offset + at, n);
            }
            self.queue.submit([encoder.finish()]);
            // Back to the pool once the queue's work up to this copy is done.
            let back = pool.clone();
            self.queue.on_submitted_work_done(move || give(&back, class, stage));
            at_data += size as usize;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_into_chunks_end_to_end() {
        let lens = [CHUNK / 2, CHUNK, 8, CHUNK + 4, 0, 12];
        let mut pieces = Vec::new();
        let sizes = chunked(lens.iter().copied(), |r, at, chunk, into, n| pieces.push((r, at, chunk, into, n)));
        assert!(sizes.iter().all(|&s| s > 0 && s <= CHUNK), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<u64>(), lens.iter().sum::<u64>());
        // Each range is covered once, in order, and each chunk is filled end to end.
        for (r, &len) in lens.iter().enumerate() {
            let mine: Vec<_> = pieces.iter().filter(|p| p.0 == r).collect();
            let mut next = 0;
            for p in &mine {
                assert_eq!(p.1, next);
                next += p.4;
            }
            assert_eq!(next, len);
        }
        for (c, &size) in sizes.iter().enumerate() {
            let mut next = 0;
            for p in pieces.iter().filter(|p| p.2 == c) {
                assert_eq!(p.3, next);
                next += p.4;
            }
            assert_eq!(next, size);
        }
    }
}
