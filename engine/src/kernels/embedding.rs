//! Embedding gather and its deterministic scatter-add backward (shaders/embedding.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{KernelError, Runtime, check_contiguous, check_tensor, enables, grid, require_f16};
use crate::memory::Category;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/embedding.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    tokens: u32,
    cols: u32,
    vocab: u32,
    pad: u32,
}

/// The template values of one variant (mode 0 gather, 1 scatter-add).
pub fn variant(mode: u32, dtype: DType) -> Vec<(&'static str, String)> {
    vec![
        ("ENABLE", enables(&[dtype])),
        ("T", dtype.wgsl().into()),
        ("MODE", mode.to_string()),
    ]
}

fn check(ids: &Tensor, table: &Tensor) -> Result<(usize, usize, usize), KernelError> {
    check_tensor("embedding ids", ids, DType::I32)?;
    check_contiguous("embedding ids", ids, ids.shape())?;
    check_tensor("embedding table", table, table.dtype())?;
    let [v, c] = table.shape() else {
        return Err(KernelError::Shape(format!(
            "embedding table must be [V, C], got {:?}",
            table.shape()
        )));
    };
    check_contiguous("embedding table", table, &[*v, *c])?;
    if ids.offset() != 0 || table.offset() != 0 {
        return Err(KernelError::Shape("embedding takes whole tensors (offset 0)".into()));
    }
    Ok((ids.numel(), *v, *c))
}

/// out[.., :] = table[ids[..], :]; shape ids.shape + [C].
pub fn gather(rt: &Runtime, ids: &Tensor, table: &Tensor, label: &str) -> Result<Tensor, KernelError> {
    let (n, v, c) = check(ids, table)?;
    require_f16(rt, &[table.dtype()])?;
    let mut shape = ids.shape().to_vec();
    shape.push(c);
    let out = Tensor::empty(rt, &shape, table.dtype(), Category::Activation, label)?;
    let kernel = rt.kernel("embedding", SOURCE, &variant(0, table.dtype()), 3)?;
    let params = Params {
        tokens: n as u32,
        cols: c as u32,
        vocab: v as u32,
        pad: 0,
    };
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[ids, table, &out],
        grid((n * c).div_ceil(256) as u32),
    )?;
    Ok(out)
}

/// dtable[ids[i], :] += dout[i, :], in token order.
pub fn scatter_add(rt: &Runtime, ids: &Tensor, dout: &Tensor, dtable: &Tensor) -> Result<(), KernelError> {
    let (n, v, c) = check(ids, dtable)?;
    check_tensor("embedding dout", dout, dtable.dtype())?;
    check_contiguous("embedding dout", dout, &[ids.shape(), &[c]].concat())?;
    if dout.offset() != 0 {
        return Err(KernelError::Shape("embedding dout must be a whole tensor".into()));
    }
    require_f16(rt, &[dtable.dtype()])?;
    let kernel = rt.kernel("embedding", SOURCE, &variant(1, dtable.dtype()), 3)?;
    let params = Params {
        tokens: n as u32,
        cols: c as u32,
        vocab: v as u32,
        pad: 0,
    };
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[ids, dtable, dout],
        grid(c.div_ceil(256) as u32),
    )
}
