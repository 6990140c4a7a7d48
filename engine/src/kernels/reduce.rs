//! Reductions (shaders/reduce.wgsl) over the last dimension and over everything: sum,
//! mean, max, accumulating in f32; and column sums over rows (shaders/sum_rows.wgsl,
//! bias gradients). Results are f32.
//!
//! May call: `error`, `kernels::common`, `kernels::map`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{WORKGROUP_REDUCE, check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/reduce.wgsl");
/// Elements each workgroup of the first pass of a full reduction takes.
const CHUNK: usize = 16384;

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Arithmetic mean.
    Mean,
    /// Maximum (of an empty row: -inf).
    Max,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    total: u32,
    x_offset: u32,
    scale: f32,
    pad: [u32; 3],
}

/// The template values of one variant.
pub fn variant(op: ReduceOp, dtype: DType) -> Vec<(&'static str, String)> {
    let (combine, identity, workgroup_op) = match op {
        ReduceOp::Max => ("max(a, b)", "-3.4028235e38", "workgroup_max"),
        _ => ("a + b", "0.0", "workgroup_sum"),
    };
    vec![
        ("WORKGROUP_REDUCE", WORKGROUP_REDUCE.into()),
        ("ENABLE", enables(&[dtype])),
        ("T", dtype.wgsl().to_string()),
        ("COMBINE", combine.to_string()),
        ("IDENTITY", identity.to_string()),
        ("WORKGROUP_OP", workgroup_op.to_string()),
    ]
}

/// Reduces `rows` rows of `cols` elements of x (the first `total` in play) into out,
/// times `scale`.
fn launch(
    rt: &Runtime,
    op: ReduceOp,
    x: &Tensor,
    (rows, cols, total): (usize, usize, usize),
    scale: f32,
    out: &Tensor,
) -> Result<(), Error> {
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        total: total as u32,
        x_offset: x.offset() as u32,
        scale,
        pad: [0; 3],
    };
    let kernel = rt.kernel(
        KernelKey::new("reduce", &[op as u32, x.dtype() as u32]),
        2,
        || format!("reduce {} {}", format!("{op:?}").to_lowercase(), x.dtype().wgsl()),
        || render("reduce", SOURCE, &variant(op, x.dtype())),
    )?;
    rt.launch(&kernel, bytemuck::bytes_of(&params), &[x, out], grid(rows as u32))
}

/// Reduces over the last dimension: [.., C] -> [..] (f32).
pub fn reduce_last(rt: &Runtime, op: ReduceOp, x: &Tensor, label: &str) -> Result<Tensor, Error> {
    check_tensor("reduce x", x, x.dtype())?;
    require_f16(rt, &[x.dtype()])?;
    if !x.is_contiguous() || x.shape().is_empty() {
        return Err(Error::shape(
            "reduce_last",
            "a contiguous tensor of rank >= 1",
            format!("{:?} strides {:?}", x.shape(), x.strides()),
        ));
    }
    let cols = *x.shape().last().unwrap();
    let rows = x.numel() / cols.max(1);
    let out_shape = &x.shape()[..x.shape().len() - 1];
    let out = Tensor::empty(rt, out_shape, DType::F32, Category::Temporary, label)?;
    let scale = if op == ReduceOp::Mean { 1.0 / cols as f32 } else { 1.0 };
    let rows = if cols == 0 { 0 } else { rows };
    if cols == 0 && !out_shape.is_empty() && out.numel() > 0 {
        // Empty rows: sums and means are 0, maxima -inf.
        super::map::fill(rt, &out, if op == ReduceOp::Max { f32::NEG_INFINITY } else { 0.0 })?;
        return Ok(out);
    }
    launch(rt, op, x, (rows, cols, x.numel()), scale, &out)?;
    Ok(out)
}

/// Reduces every element to one f32 (shape [1]), in two passes.
pub fn reduce_all(rt: &Runtime, op: ReduceOp, x: &Tensor, label: &str) -> Result<Tensor, Error> {
    check_tensor("reduce x", x, x.dtype())?;
    require_f16(rt, &[x.dtype()])?;
    if !x.is_contiguous() {
        return Err(Error::shape(
            "reduce_all",
            "a contiguous tensor",
            format!("{:?} strides {:?}", x.shape(), x.strides()),
        ));
    }
    let n = x.numel();
    let out = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    if n == 0 {
        super::map::fill(rt, &out, if op == ReduceOp::Max { f32::NEG_INFINITY } else { 0.0 })?;
        return Ok(out);
    }
    let scale = if op == ReduceOp::Mean { 1.0 / n as f32 } else { 1.0 };
    let first_op = if op == ReduceOp::Mean { ReduceOp::Sum } else { op };
    let chunks = n.div_ceil(CHUNK);
    if chunks == 1 {
        launch(rt, first_op, x, (1, n, n), scale, &out)?;
        return Ok(out);
    }
    let partial = Tensor::empty(rt, &[chunks], DType::F32, Category::Temporary, "reduce partials")?;
    launch(rt, first_op, x, (chunks, CHUNK, n), 1.0, &partial)?;
    launch(rt, first_op, &partial, (1, chunks, chunks), scale, &out)?;
    Ok(out)
}

const SUM_ROWS: &str = include_str!("../../../shaders/sum_rows.wgsl");
/// Rows a chunk of [`sum_rows`] takes (ROW_CHUNK in shaders/sum_rows.wgsl).
const ROW_CHUNK: usize = 64;

/// Column units of W columns a one-pass [`sum_rows`] workgroup takes (U in the shader:
/// 32 bytes of a row).
fn one_pass_units(width: usize) -> usize {
    8 / width
}

/// The template values of a [`sum_rows`] kernel (mode 0: x of one chunk of rows; mode 2:
/// every row in one pass).
pub fn sum_rows_variant(mode: u32, dtype: DType, half: bool, width: usize) -> Vec<(&'static str, String)> {
    let t = dtype.wgsl();
    let vec = |s: &str| if width == 4 { format!("vec4<{s}>") } else { s.to_string() };
    vec![
        ("ENABLE", enables(&[dtype])),
        ("T", t.to_string()),
        ("SUMS", (mode == 1).to_string()),
        ("ONE", (mode == 2).to_string()),
        ("HALF", half.to_string()),
        ("W", width.to_string()),
        ("V", vec("f32")),
        ("XT", vec(t)),
        ("HT", vec("f16")),
    ]
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SumRowsParams {
    rows: u32,
    cols: u32,
    x_offset: u32,
    pad: u32,
}

/// The column sums of a contiguous [N, C] x: a new [C] f32 tensor, deterministic and
/// parallel over rows. What a bias gradient is. Up to a chunk of rows, one invocation
/// sums each column's rows in order; beyond, one launch gives every 32 bytes of columns
/// a workgroup whose lanes sum every lanes-th row in order, then add up pairwise in a
/// fixed tree (no partials and no second launch).
pub fn sum_rows(rt: &Runtime, x: &Tensor, category: Category, label: &str) -> Result<Tensor, Error> {
    sum_rows_into_half(rt, x, None, category, label)
}

/// [`sum_rows`] of an f32 `x` that also writes `x`'s f16 copy into `half` (a contiguous
/// f16 tensor of x's shape) in the same pass: a linear's bias gradient and the dy its
/// products read under fp16-mixed, from one read of dy.
pub fn sum_rows_and_half(rt: &Runtime, x: &Tensor, half: &Tensor, category: Category, label: &str) -> Result<Tensor, Error> {
    check_tensor("sum_rows x", x, DType::F32)?;
    check_tensor("sum_rows f16 copy", half, DType::F16)?;
    check_contiguous("sum_rows f16 copy", half, x.shape())?;
    if half.offset() != 0 {
        return Err(Error::shape("sum_rows f16 copy", "a whole tensor (offset 0)", half.offset()));
    }
    sum_rows_into_half(rt, x, Some(half), category, label)
}

fn sum_rows_into_half(rt: &Runtime, x: &Tensor, half: Option<&Tensor>, category: Category, label: &str) -> Result<Tensor, Error> {
    check_tensor("sum_rows x", x, x.dtype())?;
    require_f16(rt, &[x.dtype()])?;
    let [rows, cols] = *x.shape() else {
        return Err(Error::shape("sum_rows", "a [rows, cols] tensor", format!("{:?}", x.shape())));
    };
    if !x.is_contiguous() {
        return Err(Error::shape(
            "sum_rows",
            "a contiguous tensor",
            format!("strides {:?}", x.strides()),
        ));
    }
    let out = Tensor::empty(rt, &[cols], DType::F32, category, label)?;
    let chunks = rows.div_ceil(ROW_CHUNK);
    if chunks == 0 || cols == 0 {
        super::map::fill(rt, &out, 0.0)?;
        return Ok(out);
    }
    let params = SumRowsParams {
        rows: rows as u32,
        cols: cols as u32,
        x_offset: x.offset() as u32,
        pad: 0,
    };
    let with_half = half.is_some();
    // Four columns an invocation where whole vectors line up with the rows.
    let width = if cols.is_multiple_of(4) && x.offset().is_multiple_of(4) {
        4
    } else {
        1
    };
    // One chunk: the partials pass writes the sums; more: the one-pass kernel.
    let mode = if chunks == 1 { 0 } else { 2 };
    let kernel = rt.kernel(
        KernelKey::new("sum_rows", &[mode, x.dtype() as u32, with_half as u32, width as u32]),
        2 + with_half as usize,
        || {
            let copy = if with_half { " +f16 copy" } else { "" };
            let vec = if width == 4 { " vec4" } else { "" };
            let pass = if mode == 0 { "partials" } else { "one pass" };
            format!("sum_rows {pass} {}{vec}{copy}", x.dtype().wgsl())
        },
        || render("sum_rows", SUM_ROWS, &sum_rows_variant(mode, x.dtype(), with_half, width)),
    )?;
    let groups = if mode == 0 {
        [(cols / width).div_ceil(256) as u32, 1, 1]
    } else {
        grid((cols / width).div_ceil(one_pass_units(width)) as u32)
    };
    match half {
        Some(h) => rt.launch(&kernel, bytemuck::bytes_of(&params), &[x, &out, h], groups)?,
        None => rt.launch(&kernel, bytemuck::bytes_of(&params), &[x, &out], groups)?,
    }
    Ok(out)
}
