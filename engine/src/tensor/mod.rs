//! Tensors: an allocator block, a shape, strides (in elements), an element offset and a
//! dtype. Views (reshape, transpose, slice) share the block without copying when the
//! strides allow. What needs a kernel (fill, contiguous copies, casts, reading back a
//! strided view) is `kernels::TensorOps`.
//!
//! May call: `memory` (blocks), `runtime` (allocation, host writes and reads), `error`.
//! Called by: the kernel layer, ops, models.

pub mod dtype;

use std::sync::Arc;

pub use dtype::DType;

use crate::error::Error;
use crate::memory::{Block, Category};
use crate::runtime::{Bound, Runtime};

/// Uploads of at least this many bytes go through the device's pooled staging
/// (`Runtime::upload`); smaller ones through a queue write.
const UPLOAD_STAGED: usize = 1 << 20;

/// A view of device memory.
#[derive(Clone, Debug)]
pub struct Tensor {
    block: Arc<Block>,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// The number of elements of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    /// An uninitialised contiguous tensor.
    pub fn empty(rt: &Runtime, shape: &[usize], dtype: DType, category: Category, label: &str) -> Result<Tensor, Error> {
        let bytes = (numel(shape) * dtype.size()) as u64;
        rt.settle_before_alloc(bytes)?;
        if rt.alloc.debug() {
            // The guard fill is a queue write: it must not overtake recorded launches
            // that still use a freed block this allocation may reuse (see `kernels`).
            rt.flush();
        }
        let block = rt.alloc.alloc(bytes, category, label)?;
        Ok(Tensor {
            block: Arc::new(block),
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        })
    }

    /// Uploads f32 data.
    pub fn from_f32(rt: &Runtime, data: &[f32], shape: &[usize], category: Category, label: &str) -> Result<Tensor, Error> {
        Self::upload(rt, bytemuck::cast_slice(data), data.len(), shape, DType::F32, category, label)
    }

    /// Uploads f32 data converted to f16.
    pub fn from_f32_as_f16(rt: &Runtime, data: &[f32], shape: &[usize], category: Category, label: &str) -> Result<Tensor, Error> {
        let halves: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
        Self::upload(rt, bytemuck::cast_slice(&halves), data.len(), shape, DType::F16, category, label)
    }

    /// Uploads i32 data (token ids, targets).
    pub fn from_i32(rt: &Runtime, data: &[i32], shape: &[usize], category: Category, label: &str) -> Result<Tensor, Error> {
        Self::upload(rt, bytemuck::cast_slice(data), data.len(), shape, DType::I32, category, label)
    }

    fn upload(
        rt: &Runtime,
        bytes: &[u8],
        len: usize,
        shape: &[usize],
        dtype: DType,
        category: Category,
        label: &str,
    ) -> Result<Tensor, Error> {
        if numel(shape) != len {
            return Err(Error::shape(
                "upload",
                format!("{} values for shape {shape:?}", numel(shape)),
                format!("{len} values"),
            ));
        }
        let t = Tensor::empty(rt, shape, dtype, category, label)?;
        t.write_bytes(rt, bytes)?;
        Ok(t)
    }

    /// Overwrites a whole contiguous f32 tensor at offset 0 with `data`, in place (a
    /// checkpoint's weights restored without allocating again).
    pub fn write_f32(&self, rt: &Runtime, data: &[f32]) -> Result<(), Error> {
        if self.dtype != DType::F32 || !self.is_contiguous() || self.offset != 0 || self.numel() != data.len() {
            return Err(Error::shape(
                "write_f32",
                format!("{} f32 values into a contiguous tensor at offset 0", self.numel()),
                format!(
                    "{} values into {:?} {:?} at offset {}",
                    data.len(),
                    self.dtype,
                    self.shape,
                    self.offset
                ),
            ));
        }
        self.write_bytes(rt, bytemuck::cast_slice(data))
    }

    /// Writes `bytes` at the start of this tensor's block.
    fn write_bytes(&self, rt: &Runtime, bytes: &[u8]) -> Result<(), Error> {
        // Both ways submit what is recorded first: the bytes land before every launch
        // recorded after. Large uploads (a batch of images) go through the device's
        // pooled, pinned staging, filled by several threads; a queue write made a
        // staging buffer of its own each time, filled by one thread (tens of ms a step
        // for ResNet-50's 154 MB batch on the H100).
        let write = |bytes: &[u8]| -> Result<(), Error> {
            if bytes.len() >= UPLOAD_STAGED {
                rt.upload(&[(&self.block, 0, bytes.len() as u64)], bytes)
            } else {
                rt.write(&self.block, 0, bytes)
            }
        };
        if bytes.len().is_multiple_of(4) {
            write(bytes)?;
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4), 0);
            write(&padded)?;
        }
        Ok(())
    }

    /// Reads a contiguous tensor at offset 0 back as f32 (any dtype); strided views are
    /// read through `kernels::TensorOps::to_f32_vec`, which copies them first.
    pub fn read_f32(&self, rt: &Runtime) -> Result<Vec<f32>, Error> {
        if !self.is_contiguous() || self.offset != 0 {
            return Err(Error::shape(
                "read_f32",
                "a contiguous tensor at offset 0",
                format!("view {:?} strides {:?} offset {}", self.shape, self.strides, self.offset),
            ));
        }
        let bytes = rt.read(&self.block)?;
        let n = self.numel();
        // A copy into typed vectors: the byte buffer carries no alignment guarantee.
        Ok(match self.dtype {
            DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)[..n].to_vec(),
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, half::f16>(&bytes)[..n]
                .iter()
                .map(|h| h.to_f32())
                .collect(),
            DType::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(&bytes)[..n]
                .iter()
                .map(|&v| v as f32)
                .collect(),
            DType::U32 => bytemuck::pod_collect_to_vec::<u8, u32>(&bytes)[..n]
                .iter()
                .map(|&v| v as f32)
                .collect(),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the view in its block.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Elements in the view.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether no other tensor shares this one's block (so it may be written in place).
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.block) == 1
    }

    /// The block holding the data.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// Elements the block can hold (bound range for kernels' host checks).
    pub fn capacity(&self) -> usize {
        self.block.requested() as usize / self.dtype.size()
    }

    /// Whether the view is row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        let expected = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&expected))
            .all(|(&d, (&s, &e))| d <= 1 || s == e)
    }

    /// The largest element index the view touches, plus one (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }

    /// The same elements in a new shape; the view must be contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, Error> {
        if numel(shape) != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!("{} elements for {shape:?}", numel(shape)),
                format!("{:?} ({} elements)", self.shape, self.numel()),
            ));
        }
        if !self.is_contiguous() {
            return Err(Error::shape(
                "reshape",
                "a contiguous view (call contiguous first)",
                format!("{:?} with strides {:?}", self.shape, self.strides),
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            ..self.clone()
        })
    }

    /// Swaps two dimensions (no copy).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor, Error> {
        let rank = self.shape.len();
        if a >= rank || b >= rank {
            return Err(Error::shape(
                format!("transpose({a}, {b})"),
                format!("rank above {}", a.max(b)),
                format!("rank {rank}"),
            ));
        }
        let mut t = self.clone();
        t.shape.swap(a, b);
        t.strides.swap(a, b);
        Ok(t)
    }

    /// `len` elements of dimension `dim` from `start` (no copy).
    pub fn slice(&self, dim: usize, start: usize, len: usize) -> Result<Tensor, Error> {
        if dim >= self.shape.len() || start + len > self.shape[dim] {
            return Err(Error::shape(
                format!("slice {start}..{} of dim {dim}", start + len),
                "a range inside the dimension",
                format!("{:?}", self.shape),
            ));
        }
        let mut t = self.clone();
        t.offset += start * self.strides[dim];
        t.shape[dim] = len;
        Ok(t)
    }

    /// A view with explicit shape, strides and element offset over the same block;
    /// refused if it would reach past the block.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor, Error> {
        if shape.len() != strides.len() {
            return Err(Error::shape(
                "as_strided",
                format!("strides of rank {}", shape.len()),
                format!("{strides:?}"),
            ));
        }
        let t = Tensor {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
            ..self.clone()
        };
        if t.extent() > t.capacity() {
            return Err(Error::shape(
                "as_strided",
                format!("a view inside its {}-element block", t.capacity()),
                format!("view {shape:?} strides {strides:?} offset {offset} reaching element {}", t.extent()),
            ));
        }
        Ok(t)
    }
}

impl Bound for Tensor {
    fn block(&self) -> &Block {
        &self.block
    }
}
