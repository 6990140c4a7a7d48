//! Bulk copies between device buffers and host memory, for the collectives of a
//! multi-device run: many ranges gathered into (or scattered from) one host buffer,
//! through mapped staging buffers of at most [`CHUNK`] bytes, all submitted at once.
//! A download is started on one thread and finished on any other (the reducer's
//! transfer thread), so the copy runs while the device goes on with backward.
//! Staging buffers are kept and reused (`Pools`): making a mapped buffer pins host
//! memory, which cost more than the copy itself when every bucket made its own.
//!
//! May call: wgpu, `device`, `device::staging`. Called by: `runtime`, `train::parallel`.

use std::sync::Arc;

pub use super::staging::CHUNK;
use super::staging::{give, range_error, staging_buffer};
use super::{DeviceError, Gpu};

/// A range of a device buffer: (buffer, byte offset, bytes), both multiples of 4.
pub type Range<'a> = (&'a wgpu::Buffer, u64, u64);

/// A download in flight: the copies are submitted and the staging buffers' maps asked
/// for; [`Download::finish`] waits for them and returns the bytes in range order.
pub struct Download {
    gpu: Option<Arc<Gpu>>,
    /// (buffer, bytes used, its size class).
    staging: Vec<(wgpu::Buffer, u64, u64)>,
    index: Option<wgpu::SubmissionIndex>,
    len: u64,
}

fn check(buffer: &wgpu::Buffer, offset: u64, len: u64) -> Result<(), DeviceError> {
    range_error(buffer, offset, len).map_or(Ok(()), |e| Err(DeviceError::Readback(e)))
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
            index: None,
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
        let mut out = Vec::with_capacity(self.len as usize);
        self.finish_into(&mut out)?;
        Ok(out)
    }

    /// Waits for the copies and appends the bytes, as f32 values, to `out`.
    pub fn finish_f32_into(self, out: &mut Vec<f32>) -> Result<(), DeviceError> {
        let start = out.len();
        out.resize(start + (self.len / 4) as usize, 0.0);
        let Some(gpu) = self.gpu.clone() else { return Ok(()) };
        self.read(&gpu, bytemuck::cast_slice_mut(&mut out[start..]))
    }

    fn finish_into(self, out: &mut Vec<u8>) -> Result<(), DeviceError> {
        let start = out.len();
        out.resize(start + self.len as usize, 0);
        let Some(gpu) = self.gpu.clone() else { return Ok(()) };
        self.read(&gpu, &mut out[start..])
    }

    /// Waits for the copies and copies the staging buffers into `out` (their length),
    /// several threads at once: a mapped buffer reads slowly from one core.
    fn read(self, gpu: &Arc<Gpu>, out: &mut [u8]) -> Result<(), DeviceError> {
        use rayon::prelude::*;
        const PIECE: usize = 1 << 20;
        if let Some(index) = self.index {
            gpu.device
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: None,
                })
                .map_err(|e| DeviceError::Lost(e.to_string()))?;
        }
        let mut rest = out;
        for (buffer, size, class) in self.staging {
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

impl Gpu {
    /// Starts copying `ranges` to the host, after everything submitted so far.
    pub fn download(self: &Arc<Self>, ranges: &[Range]) -> Result<Download, DeviceError> {
        for &(b, o, l) in ranges {
            check(b, o, l)?;
        }
        let mut copies = Vec::new();
        let sizes = chunked(ranges.iter().map(|r| r.2), |r, at, chunk, into, n| {
            copies.push((r, at, chunk, into, n))
        });
        let staging: Vec<(wgpu::Buffer, u64, u64)> = sizes
            .iter()
            .map(|&size| {
                let (b, c) = staging_buffer(&self.device, &self.staging.down, size, false);
                (b, size, c)
            })
            .collect();
        let len = sizes.iter().sum();
        if staging.is_empty() {
            return Ok(Download::zeros(0));
        }
        let mut encoder = self.device.create_command_encoder(&Default::default());
        for (r, at, chunk, into, n) in copies {
            let (src, offset, _) = ranges[r];
            encoder.copy_buffer_to_buffer(src, offset + at, &staging[chunk].0, into, n);
        }
        let index = self.queue.submit([encoder.finish()]);
        for (b, size, _) in &staging {
            b.slice(..*size).map_async(wgpu::MapMode::Read, |_| {});
        }
        Ok(Download {
            gpu: Some(self.clone()),
            staging,
            index: Some(index),
            len,
        })
    }

    /// Copies `data` (laid end to end) into `ranges` through mapped staging buffers;
    /// the copies run after everything submitted before.
    pub fn upload(&self, ranges: &[Range], data: &[u8]) -> Result<(), DeviceError> {
        let total: u64 = ranges.iter().map(|r| r.2).sum();
        if total != data.len() as u64 {
            return Err(DeviceError::Validation(format!(
                "upload of {} bytes into ranges of {total}",
                data.len()
            )));
        }
        for &(b, o, l) in ranges {
            check(b, o, l)?;
        }
        let mut copies = Vec::new();
        let sizes = chunked(ranges.iter().map(|r| r.2), |r, at, chunk, into, n| {
            copies.push((r, at, chunk, into, n))
        });
        if sizes.is_empty() {
            return Ok(());
        }
        // Mapped buffers from the pool, or new ones mapped at creation.
        let staging: Vec<(wgpu::Buffer, u64)> = sizes
            .iter()
            .map(|&size| staging_buffer(&self.device, &self.staging.up, size, true))
            .collect();
        let mut at_data = 0usize;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut views: Vec<wgpu::BufferViewMut> = staging
                .iter()
                .map(|(b, _)| b.slice(..).get_mapped_range_mut())
                .collect::<Result<_, _>>()
                .map_err(|e| DeviceError::Validation(e.to_string()))?;
            for &(r, at, chunk, into, n) in &copies {
                let (dst, offset, _) = ranges[r];
                views[chunk]
                    .slice(into as usize..(into + n) as usize)
                    .copy_from_slice(&data[at_data..at_data + n as usize]);
                encoder.copy_buffer_to_buffer(&staging[chunk].0, into, dst, offset + at, n);
                at_data += n as usize;
            }
            drop(views);
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
