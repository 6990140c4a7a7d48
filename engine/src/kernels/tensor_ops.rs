//! Tensor operations that need a kernel: a filled tensor, a contiguous copy, a cast,
//! and reading back any view. An extension of [`Tensor`] so call sites read as methods
//! (`t.contiguous(rt)`, `Tensor::full(..)`) while `tensor` stays below the kernels.
//!
//! May call: `error`, `memory`, `runtime`, `tensor`, `kernels::map`. Called by: ops,
//! models, optimizers, the trainer, tests.

use super::map::{copy_into, fill};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Operations on tensors that launch kernels.
pub trait TensorOps: Sized {
    /// A contiguous tensor filled with `value`.
    fn full(rt: &Runtime, shape: &[usize], dtype: DType, value: f32, category: Category, label: &str) -> Result<Self, Error>;
    /// A contiguous copy.
    fn contiguous(&self, rt: &Runtime) -> Result<Self, Error>;
    /// A contiguous copy converted to `dtype`.
    fn cast(&self, rt: &Runtime, dtype: DType, category: Category, label: &str) -> Result<Self, Error>;
    /// The elements as f32 (any dtype, any strides).
    fn to_f32_vec(&self, rt: &Runtime) -> Result<Vec<f32>, Error>;
}

impl TensorOps for Tensor {
    fn full(rt: &Runtime, shape: &[usize], dtype: DType, value: f32, category: Category, label: &str) -> Result<Tensor, Error> {
        let t = Tensor::empty(rt, shape, dtype, category, label)?;
        fill(rt, &t, value)?;
        Ok(t)
    }

    fn contiguous(&self, rt: &Runtime) -> Result<Tensor, Error> {
        let out = Tensor::empty(rt, self.shape(), self.dtype(), self.block().category(), "contiguous")?;
        copy_into(rt, self, &out)?;
        Ok(out)
    }

    fn cast(&self, rt: &Runtime, dtype: DType, category: Category, label: &str) -> Result<Tensor, Error> {
        let out = Tensor::empty(rt, self.shape(), dtype, category, label)?;
        copy_into(rt, self, &out)?;
        Ok(out)
    }

    fn to_f32_vec(&self, rt: &Runtime) -> Result<Vec<f32>, Error> {
        if self.is_contiguous() && self.offset() == 0 {
            self.read_f32(rt)
        } else {
            self.contiguous(rt)?.read_f32(rt)
        }
    }
}
