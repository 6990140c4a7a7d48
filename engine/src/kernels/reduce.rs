//! Reductions (shaders/reduce.wgsl) over the last dimension and over everything: sum,
//! mean, max, accumulating in f32; and column sums over rows (shaders/sum_rows.wgsl,
//! bias gradients). Results are f32.
//!
//! May call: `error`, `kernels::{col_sums, common}`, `kernels::map`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::col_sums;
use super::common::{ACTIVATIONS, WORKGROUP_REDUCE, check_contiguous, check_tensor, enables, require_f16};
use super::map::MapOp;
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

/// Lanes summing each column's partials (`kernels::col_sums`; as many as the pass it
/// replaced had, so the sums are the same bits).
const SUM_LANES: usize = 16;

/// The derivative's function (shaders/activations.wgsl) of an activation's backward op.
fn derivative(op: MapOp) -> Result<&'static str, Error> {
    match op {
        MapOp::GeluBackward => Ok("gelu_grad"),
        MapOp::GeluErfBackward => Ok("gelu_erf_grad"),
        MapOp::SiluBackward => Ok("silu_grad"),
        other => Err(Error::invalid("sum_rows", format!("{other:?} is no activation's backward"))),
    }
}

/// The activation whose backward op is `op`, as shaders/activations.wgsl names it: what
/// [`sum_rows_through`] writes again when asked.
fn activation(op: MapOp) -> Result<&'static str, Error> {
    match op {
        MapOp::GeluBackward => Ok("gelu"),
        MapOp::GeluErfBackward => Ok("gelu_erf"),
        other => Err(Error::invalid("sum_rows", format!("{other:?}: no activation to write again"))),
    }
}

/// The template values of a [`sum_rows`] kernel (mode 0: partials of `dtype` rows, or
/// the sums of one chunk; mode 1: the f32 partials summed), writing a copy of `copy`'s
/// type, and summing x times the derivative `act` (an activation's backward op) at a
/// pre-activation of its type; with `again`, writing the activation at it too.
pub fn sum_rows_variant(
    dtype: DType,
    copy: Option<DType>,
    act: Option<(MapOp, DType)>,
    again: bool,
    width: usize,
) -> Result<Vec<(&'static str, String)>, Error> {
    let vec = |t: DType| {
        if width == 4 {
            format!("vec4<{}>", t.wgsl())
        } else {
            t.wgsl().to_string()
        }
    };
    let mut types = vec![dtype];
    types.extend(copy);
    types.extend(act.map(|a| a.1));
    Ok(vec![
        ("ENABLE", enables(&types)),
        ("COPY", copy.is_some().to_string()),
        ("ACT", act.is_some().to_string()),
        ("ACT_GRAD", act.map_or(Ok("gelu_grad"), |a| derivative(a.0))?.to_string()),
        ("AGAIN", again.to_string()),
        (
            "ACT_FWD",
            act.filter(|_| again).map_or(Ok("gelu"), |a| activation(a.0))?.to_string(),
        ),
        ("ACTIVATIONS", ACTIVATIONS.into()),
        ("W", width.to_string()),
        ("V", vec(DType::F32)),
        ("XT", vec(dtype)),
        ("CT", vec(copy.unwrap_or(DType::F32))),
        ("PT", vec(act.map_or(DType::F32, |a| a.1))),
    ])
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
/// parallel over rows. What a bias gradient is. One invocation sums each column's rows
/// of a chunk in order; beyond one chunk, a second launch sums the chunks' partials in
/// order.
pub fn sum_rows(rt: &Runtime, x: &Tensor, category: Category, label: &str) -> Result<Tensor, Error> {
    sum_rows_fused(rt, x, None, None, category, label)
}

/// [`sum_rows`] of an f32 `x` that also writes `x`'s f16 copy into `half` (a contiguous
/// f16 tensor of x's shape) in the same pass: a linear's bias gradient and the dy its
/// products read under fp16-mixed, from one read of dy.
pub fn sum_rows_and_half(rt: &Runtime, x: &Tensor, half: &Tensor, category: Category, label: &str) -> Result<Tensor, Error> {
    check_tensor("sum_rows f16 copy", half, DType::F16)?;
    sum_rows_fused(rt, x, Some(half), None, category, label)
}

/// The column sums of `x * act'(pre)` (`act` an activation's backward op such as
/// [`MapOp::GeluBackward`], `pre` the activation's input in x's shape), that product
/// also written into `copy` (f16 or f32, x's shape): the bias gradient of a linear
/// followed by the activation, and the dy its products read, from one pass over the
/// activation's output gradient `x` (no pass of the activation's backward of its own).
/// With `again` (pre's type and shape) the activation's output at `pre` is written there
/// too, the values its forward wrote (the same function of the same inputs): the input
/// of the product after it, for that product's weight gradient.
pub fn sum_rows_through(
    rt: &Runtime,
    x: &Tensor,
    (act, pre): (MapOp, &Tensor),
    copy: &Tensor,
    again: Option<&Tensor>,
    category: Category,
    label: &str,
) -> Result<Tensor, Error> {
    derivative(act)?;
    if again.is_some() {
        activation(act)?;
    }
    for (what, t) in [("sum_rows pre-activation", pre), ("sum_rows copy", copy)] {
        if !matches!(t.dtype(), DType::F16 | DType::F32) {
            return Err(Error::shape(what, "f16 or f32", t.dtype()));
        }
    }
    let mut whole = vec![("sum_rows pre-activation", pre)];
    whole.extend(again.map(|a| ("sum_rows activation", a)));
    for (what, t) in whole {
        check_tensor(what, t, pre.dtype())?;
        check_contiguous(what, t, x.shape())?;
        if t.offset() != 0 {
            return Err(Error::shape(what, "a whole tensor (offset 0)", t.offset()));
        }
    }
    sum_rows_fused(rt, x, Some(copy), Some((act, pre, again)), category, label)
}

fn sum_rows_fused(
    rt: &Runtime,
    x: &Tensor,
    copy: Option<&Tensor>,
    act: Option<(MapOp, &Tensor, Option<&Tensor>)>,
    category: Category,
    label: &str,
) -> Result<Tensor, Error> {
    check_tensor("sum_rows x", x, x.dtype())?;
    if let Some(copy) = copy {
        check_tensor("sum_rows x", x, DType::F32)?;
        check_tensor("sum_rows copy", copy, copy.dtype())?;
        check_contiguous("sum_rows copy", copy, x.shape())?;
        if copy.offset() != 0 {
            return Err(Error::shape("sum_rows copy", "a whole tensor (offset 0)", copy.offset()));
        }
    }
    let mut types = vec![x.dtype()];
    types.extend(copy.map(|c| c.dtype()));
    types.extend(act.map(|a| a.1.dtype()));
    require_f16(rt, &types)?;
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
    if chunks > 65535 {
        return Err(Error::shape("sum_rows", format!("at most {} rows", 65535 * ROW_CHUNK), rows));
    }
    let params = SumRowsParams {
        rows: rows as u32,
        cols: cols as u32,
        x_offset: x.offset() as u32,
        pad: 0,
    };
    // Four columns an invocation where whole vectors line up with the rows.
    let width = if cols.is_multiple_of(4) && x.offset().is_multiple_of(4) {
        4
    } else {
        1
    };
    let code = |t: Option<DType>| t.map_or(0, |t| 1 + t as u32);
    let copy_t = copy.map(|c| c.dtype());
    let act_t = act.map(|(op, pre, _)| (op, pre.dtype()));
    let again = matches!(act, Some((_, _, Some(_))));
    let kernel = rt.kernel(
        KernelKey::new(
            "sum_rows",
            &[
                0,
                x.dtype() as u32,
                code(copy_t),
                act_t.map_or(0, |(op, t)| 1 + op as u32 * 16 + t as u32),
                width as u32,
                again as u32,
            ],
        ),
        2 + copy.is_some() as usize + act.is_some() as usize + again as usize,
        || {
            let copy = copy_t.map_or(String::new(), |t| format!(" +{} copy", t.wgsl()));
            let act = act_t.map_or(String::new(), |(op, _)| format!(" x {}", derivative(op).unwrap_or("?")));
            let again = act_t
                .filter(|_| again)
                .map_or(String::new(), |(op, _)| format!(" +{}", activation(op).unwrap_or("?")));
            let vec = if width == 4 { " vec4" } else { "" };
            format!("sum_rows partials {}{vec}{act}{copy}{again}", x.dtype().wgsl())
        },
        || render("sum_rows", SUM_ROWS, &sum_rows_variant(x.dtype(), copy_t, act_t, again, width)?),
    )?;
    // One chunk: the partials are the sums.
    let part = if chunks == 1 {
        out.clone()
    } else {
        Tensor::empty(rt, &[chunks, cols], DType::F32, Category::Temporary, "sum_rows partials")?
    };
    let groups = [(cols / width).div_ceil(256) as u32, chunks as u32, 1];
    let bytes = bytemuck::bytes_of(&params);
    match (copy, act) {
        (Some(c), Some((_, pre, Some(a)))) => rt.launch(&kernel, bytes, &[x, &part, c, pre, a], groups)?,
        (Some(c), Some((_, pre, None))) => rt.launch(&kernel, bytes, &[x, &part, c, pre], groups)?,
        (Some(c), None) => rt.launch(&kernel, bytes, &[x, &part, c], groups)?,
        (None, None) => rt.launch(&kernel, bytes, &[x, &part], groups)?,
        (None, Some(_)) => return Err(Error::invalid("sum_rows", "an activation's derivative without a copy")),
    }
    if chunks == 1 {
        return Ok(out);
    }
    // The chunks' sums, held back to go with other sums (`kernels::col_sums`).
    col_sums::defer(
        rt,
        col_sums::Sum {
            src: part,
            s_off: 0,
            s_rs: cols,
            parts: chunks,
            lanes: SUM_LANES,
            len: cols,
            n: cols,
            dst: out.clone(),
            d_off: 0,
            d_rs: cols,
            alpha: 1.0,
            beta: 0.0,
        },
    )?;
    Ok(out)
}
