//! Embedding gather and its deterministic scatter-add backward (shaders/embedding.wgsl).
//!
//! May call: `error`, `kernels::common`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
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

fn check(ids: &Tensor, table: &Tensor) -> Result<(usize, usize, usize), Error> {
    check_tensor("embedding ids", ids, DType::I32)?;
    check_contiguous("embedding ids", ids, ids.shape())?;
    check_tensor("embedding table", table, table.dtype())?;
    let [v, c] = table.shape() else {
        return Err(Error::shape("embedding table", "[V, C]", format!("{:?}", table.shape())));
    };
    check_contiguous("embedding table", table, &[*v, *c])?;
    if ids.offset() != 0 || table.offset() != 0 {
        return Err(Error::shape("embedding", "whole tensors (offset 0)", "a view at an offset"));
    }
    Ok((ids.numel(), *v, *c))
}

/// out[.., :] = table[ids[..], :]; shape ids.shape + [C].
pub fn gather(rt: &Runtime, ids: &Tensor, table: &Tensor, label: &str) -> Result<Tensor, Error> {
    let (n, v, c) = check(ids, table)?;
    require_f16(rt, &[table.dtype()])?;
    let mut shape = ids.shape().to_vec();
    shape.push(c);
    let out = Tensor::empty(rt, &shape, table.dtype(), Category::Activation, label)?;
    let kernel = rt.kernel(KernelKey::new("embedding", &[0, table.dtype() as u32]), 3, || {
        render("embedding", SOURCE, &variant(0, table.dtype()))
    })?;
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
pub fn scatter_add(rt: &Runtime, ids: &Tensor, dout: &Tensor, dtable: &Tensor) -> Result<(), Error> {
    let (n, v, c) = check(ids, dtable)?;
    check_tensor("embedding dout", dout, dtable.dtype())?;
    check_contiguous("embedding dout", dout, &[ids.shape(), &[c]].concat())?;
    if dout.offset() != 0 {
        return Err(Error::shape(
            "embedding dout",
            "a whole tensor (offset 0)",
            format!("offset {}", dout.offset()),
        ));
    }
    require_f16(rt, &[dtable.dtype()])?;
    let kernel = rt.kernel(KernelKey::new("embedding", &[1, dtable.dtype() as u32]), 3, || {
        render("embedding", SOURCE, &variant(1, dtable.dtype()))
    })?;
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
