//! Embedding gather and its deterministic scatter-add backward (shaders/embedding.wgsl).
//!
//! May call: `error`, `kernels::{common, tensor_ops}`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_contiguous, check_tensor, enables, require_f16};
use super::tensor_ops::TensorOps;
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{Kernel, KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/embedding.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    tokens: u32,
    cols: u32,
    vocab: u32,
    chunk: u32,
    chunks: u32,
    pad: [u32; 3],
}

/// Bytes the chunked scatter-add's partial tables may take; above it (large
/// vocabularies) the one-pass walk runs instead.
pub const PARTIAL_BUDGET: usize = 64 << 20;
/// Fewest tokens per chunk of the chunked scatter-add.
const MIN_CHUNK: usize = 256;

/// The template values of one variant (mode 0 gather; 1 and 4 the sorted scatter-add's
/// rank and walk; 2 and 3 the chunked scatter-add's passes).
pub fn variant(mode: u32, dtype: DType) -> Vec<(&'static str, String)> {
    vec![
        ("ENABLE", enables(&[dtype])),
        ("T", dtype.wgsl().into()),
        ("MODE", mode.to_string()),
        ("PARTIALS", (mode == 2 || mode == 3).to_string()),
        ("SORTED", (mode == 1 || mode == 4).to_string()),
    ]
}

/// Chunks of the chunked scatter-add for `n` tokens into a [V, C] table: as many as the
/// tokens allow (at least MIN_CHUNK each) while the partial tables fit
/// [`PARTIAL_BUDGET`]; 1 means the sorted walk instead.
pub fn scatter_chunks(n: usize, v: usize, c: usize) -> usize {
    let fit = PARTIAL_BUDGET / (v * c * 4).max(1);
    (n / MIN_CHUNK).min(fit).clamp(1, 65535)
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
    let kernel = embedding_kernel(rt, 0, table.dtype())?;
    let params = Params {
        tokens: n as u32,
        cols: c as u32,
        vocab: v as u32,
        chunk: 0,
        chunks: 0,
        pad: [0; 3],
    };
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[ids, table, &out],
        grid((n * c).div_ceil(256) as u32),
    )?;
    Ok(out)
}

/// dtable[ids[i], :] += dout[i, :], in token order: chunked into partial tables where
/// they fit [`PARTIAL_BUDGET`], else by a stable sort of the tokens by id.
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
    let chunks = scatter_chunks(n, v, c);
    let params = Params {
        tokens: n as u32,
        cols: c as u32,
        vocab: v as u32,
        chunk: if chunks > 1 { n.div_ceil(chunks) } else { n } as u32,
        chunks: chunks as u32,
        pad: [0; 3],
    };
    let pass = |mode: u32, scratch: &Tensor, groups: [u32; 3]| -> Result<(), Error> {
        let kernel = embedding_kernel(rt, mode, dtable.dtype())?;
        rt.launch(&kernel, bytemuck::bytes_of(&params), &[ids, dtable, dout, scratch], groups)
    };
    if chunks > 1 {
        // Chunks walk their tokens in parallel into their own tables, then each element
        // sums the chunks in order.
        let part = Tensor::full(rt, &[chunks, v, c], DType::F32, 0.0, Category::Temporary, "embedding partials")?;
        pass(2, &part, [c.div_ceil(256) as u32, chunks as u32, 1])?;
        return pass(3, &part, grid((v * c).div_ceil(256) as u32));
    }
    // Sorted: rank the tokens by (id, position), then each id's first position walks its
    // tokens in order, all ids in parallel.
    let perm = Tensor::empty(rt, &[n], DType::I32, Category::Temporary, "embedding order")?;
    pass(1, &perm, grid(n.div_ceil(256) as u32))?;
    pass(4, &perm, grid((n * c).div_ceil(256) as u32))
}

/// The compiled variant `mode` of the embedding kernel (gather binds 3 tensors, the
/// backward passes 4).
fn embedding_kernel(rt: &Runtime, mode: u32, dtype: DType) -> Result<std::sync::Arc<Kernel>, Error> {
    let storage = if mode == 0 { 3 } else { 4 };
    let what = match mode {
        0 => "gather",
        1 => "scatter-add rank",
        4 => "scatter-add sorted walk",
        _ => "scatter-add chunked",
    };
    rt.kernel(
        KernelKey::new("embedding", &[mode, dtype as u32]),
        storage,
        || format!("embedding {what} {}", dtype.wgsl()),
        || render("embedding", SOURCE, &variant(mode, dtype)),
    )
}
