//! LayerNorm and RMSNorm forward (saving mean and rstd) and backward
//! (shaders/layernorm.wgsl: RMSNorm is its variant without centering and bias; rows of
//! at most 1,024 columns, a multiple of 4, on adapters whose subgroups have one size take
//! shaders/layernorm_rows.wgsl, one subgroup a row). Weights, biases and statistics are
//! f32; activations f32 or f16.
//!
//! May call: `error`, `kernels::{col_sums, common}`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::col_sums;
use super::common::{WORKGROUP_REDUCE, check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/layernorm.wgsl");
const ROWS_SOURCE: &str = include_str!("../../../shaders/layernorm_rows.wgsl");
/// Columns a workgroup of the one-pass weight gradients takes (U in the shader).
const WEIGHT_COLS: usize = 8;
/// Rows a workgroup of the backward with partials takes (R in the shader), the widest
/// rows it takes (PART_COLS), and the lanes summing each column of the partials
/// (`kernels::col_sums`; as many as the pass it replaced had, so the sums are the same
/// bits).
const PART_ROWS: usize = 8;
const PART_COLS: usize = 1024;
const SUM_LANES: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    pad: u32,
}

/// Which normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// (x - mean) * rstd * w + b.
    Layer,
    /// x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
    Rms,
}

impl Norm {
    fn name(self) -> &'static str {
        match self {
            Norm::Layer => "layernorm",
            Norm::Rms => "rmsnorm",
        }
    }
}

/// The template values of one variant (mode 0 forward, 1 input grad, 2 weight grads in
/// one pass, 4 input grad with each chunk's weight-grad partials, whose sums are
/// `kernels::col_sums`').
pub fn variant(mode: u32, dtype: DType, norm: Norm) -> Vec<(&'static str, String)> {
    variant_out(mode, dtype, dtype, norm)
}

/// [`variant`] whose forward writes `out` (f16 for fp16-mixed's products).
pub fn variant_out(mode: u32, dtype: DType, out: DType, norm: Norm) -> Vec<(&'static str, String)> {
    variant_fused(mode, dtype, out, norm, false)
}

/// [`variant_out`], `fused` with the residual add before it (forward) or with the
/// gradient so far (backward).
pub fn variant_fused(mode: u32, dtype: DType, out: DType, norm: Norm, fused: bool) -> Vec<(&'static str, String)> {
    vec![
        ("RES", (fused && mode == 0).to_string()),
        ("ACC", (fused && matches!(mode, 1 | 4)).to_string()),
        ("PARTS", (mode == 4).to_string()),
        ("WORKGROUP_REDUCE", WORKGROUP_REDUCE.into()),
        ("ENABLE", enables(&[dtype, out])),
        ("T", dtype.wgsl().into()),
        ("TY", out.wgsl().into()),
        ("MODE", if mode == 4 { 1 } else { mode }.to_string()),
        ("RMS", (norm == Norm::Rms).to_string()),
    ]
}

/// The shape of the subgroup-a-row kernels (shaders/layernorm_rows.wgsl) on an adapter:
/// lanes a subgroup, invocations a workgroup of the forward (at least 64, so a workgroup
/// holds several rows on adapters of 32 lanes) and the vec4s a lane keeps of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// Lanes a subgroup (the adapter's one subgroup size).
    pub sg: u32,
    /// Invocations a workgroup of the forward.
    pub wg: u32,
    /// vec4s of a row a lane keeps.
    pub maxv: u32,
}

impl RowShape {
    /// The shape for rows `cols` wide on an adapter whose subgroups are `(min, max)`
    /// lanes (`granted`: the adapter has subgroup operations), or None where the
    /// workgroup-a-row kernels run: subgroups of varying or unusual size, rows that are
    /// no multiple of 4 or wider than 1,024 columns.
    pub fn of(granted: bool, (min, max): (u32, u32), cols: usize) -> Option<RowShape> {
        let sg = min;
        let fits = granted && min == max && sg.is_power_of_two() && (4..=128).contains(&sg);
        if !fits || cols == 0 || !cols.is_multiple_of(4) || cols > PART_COLS {
            return None;
        }
        Some(RowShape {
            sg,
            wg: sg.max(64),
            maxv: (cols / 4).div_ceil(sg as usize) as u32,
        })
    }

    /// Invocations a workgroup of `mode` (0 forward: [`RowShape::wg`]; 4 backward: a
    /// subgroup for each row of a chunk).
    pub fn invocations(self, mode: u32) -> u32 {
        if mode == 4 { PART_ROWS as u32 * self.sg } else { self.wg }
    }

    /// Rows the forward's workgroup takes.
    fn rows_per_group(self) -> usize {
        (self.wg / self.sg) as usize
    }
}

/// The subgroup-a-row shape for `cols`-wide rows on `rt`'s adapter, where every bound
/// tensor starts its block (the kernels index from the block's start) and the adapter
/// takes the backward's workgroup (eight subgroups).
fn row_shape(rt: &Runtime, cols: usize, bound: &[&Tensor]) -> Option<RowShape> {
    let caps = &rt.gpu.caps;
    let most = caps
        .limits
        .max_compute_invocations_per_workgroup
        .min(caps.limits.max_compute_workgroup_size_x);
    RowShape::of(caps.subgroup, caps.subgroup_size, cols)
        .filter(|shape| shape.invocations(4).max(shape.wg) <= most)
        .filter(|_| bound.iter().all(|t| t.offset() == 0))
}

/// The template values of a subgroup-a-row variant (mode 0 forward, 4 input grad with
/// each chunk's weight-grad partials), `fused` as in [`variant_fused`].
pub fn rows_variant(mode: u32, (dtype, out): (DType, DType), norm: Norm, fused: bool, shape: RowShape) -> Vec<(&'static str, String)> {
    vec![
        ("RES", (fused && mode == 0).to_string()),
        ("ACC", (fused && mode == 4).to_string()),
        ("ENABLE", enables(&[dtype, out])),
        ("T", dtype.wgsl().into()),
        ("TY", out.wgsl().into()),
        ("MODE", if mode == 4 { 1 } else { 0 }.to_string()),
        ("BACKWARD", (mode == 4).to_string()),
        ("RMS", (norm == Norm::Rms).to_string()),
        ("SG", shape.sg.to_string()),
        ("WG", shape.invocations(mode).to_string()),
        ("MAXV", shape.maxv.to_string()),
        ("PART_VECS", (shape.maxv * shape.sg).to_string()),
    ]
}

/// The subgroup-a-row kernel of `mode` (0 or 4), named as the workgroup-a-row one with
/// ` rows` after it.
fn rows_kernel(
    rt: &Runtime,
    mode: u32,
    (dtype, out): (DType, DType),
    norm: Norm,
    fused: bool,
    shape: RowShape,
    name: impl FnOnce() -> String,
) -> Result<std::sync::Arc<crate::runtime::Kernel>, Error> {
    let key = [
        mode,
        dtype as u32,
        norm as u32,
        out as u32,
        fused as u32,
        shape.sg,
        shape.wg,
        shape.maxv,
    ];
    rt.kernel(
        KernelKey::new("layernorm_rows", &key),
        8,
        || format!("{} rows", name()),
        || render("layernorm_rows", ROWS_SOURCE, &rows_variant(mode, (dtype, out), norm, fused, shape)),
    )
}

/// What the forward saves for backward.
pub struct LayerNormSaved {
    /// Per-row mean, f32 [rows].
    pub mean: Tensor,
    /// Per-row 1/sqrt(var + eps), f32 [rows].
    pub rstd: Tensor,
}

fn check(x: &Tensor, w: &Tensor) -> Result<(usize, usize), Error> {
    check_tensor("layernorm x", x, x.dtype())?;
    check_contiguous("layernorm x", x, x.shape())?;
    let cols = x
        .shape()
        .last()
        .copied()
        .ok_or_else(|| Error::shape("layernorm", "rank >= 1", "a scalar"))?;
    check_tensor("layernorm weight", w, DType::F32)?;
    check_contiguous("layernorm weight", w, &[cols])?;
    Ok((x.numel().checked_div(cols).unwrap_or(0), cols))
}

/// y = layernorm(x) * w + b over the last dimension.
pub fn forward(rt: &Runtime, x: &Tensor, w: &Tensor, b: &Tensor, eps: f32, label: &str) -> Result<(Tensor, LayerNormSaved), Error> {
    forward_norm(rt, x, w, Some(b), eps, (Norm::Layer, DType::F32), None, label)
}

/// [`forward`] writing y as `out` (f16: the f32 result rounded as it is written, what a
/// cast after it would give, for fp16-mixed's products).
pub fn forward_as(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f32,
    out: DType,
    label: &str,
) -> Result<(Tensor, LayerNormSaved), Error> {
    forward_norm(rt, x, w, Some(b), eps, (Norm::Layer, out), None, label)
}

/// y = rmsnorm(x) * w over the last dimension (no bias).
pub fn forward_rms(rt: &Runtime, x: &Tensor, w: &Tensor, eps: f32, label: &str) -> Result<(Tensor, LayerNormSaved), Error> {
    forward_norm(rt, x, w, None, eps, (Norm::Rms, DType::F32), None, label)
}

/// x + residual, then [`forward_as`] of the sum, in one launch: returns the sum (an
/// activation labelled `sum_label`), y and what backward needs (the sum is its x).
#[allow(clippy::too_many_arguments)]
pub fn add_forward_as(
    rt: &Runtime,
    (x, residual): (&Tensor, &Tensor),
    w: &Tensor,
    b: &Tensor,
    eps: f32,
    out: DType,
    (sum_label, label): (&str, &str),
) -> Result<(Tensor, Tensor, LayerNormSaved), Error> {
    check_tensor("layernorm residual", residual, DType::F32)?;
    check_contiguous("layernorm residual", residual, x.shape())?;
    // Allocated first, as the add it replaces did.
    let sum = Tensor::empty(rt, x.shape(), DType::F32, Category::Activation, sum_label)?;
    let (y, saved) = forward_norm(rt, x, w, Some(b), eps, (Norm::Layer, out), Some((residual, &sum)), label)?;
    Ok((sum, y, saved))
}

#[allow(clippy::too_many_arguments)]
fn forward_norm(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    eps: f32,
    (norm, out): (Norm, DType),
    residual: Option<(&Tensor, &Tensor)>,
    label: &str,
) -> Result<(Tensor, LayerNormSaved), Error> {
    let (rows, cols) = check(x, w)?;
    if let Some(b) = b {
        check_tensor("layernorm bias", b, DType::F32)?;
        check_contiguous("layernorm bias", b, &[cols])?;
    }
    if x.dtype() != DType::F32 {
        // The bias binding shares the activation type; keep the parameters f32.
        return Err(Error::shape("layernorm forward", "f32 activations", x.dtype()));
    }
    if out != DType::F32 && out != DType::F16 {
        return Err(Error::shape("layernorm forward output", "f32 or f16", out));
    }
    require_f16(rt, &[x.dtype(), out])?;
    let y = Tensor::empty(rt, x.shape(), out, Category::Activation, label)?;
    let mean = Tensor::empty(rt, &[rows], DType::F32, Category::Activation, &format!("{label}.mean"))?;
    let rstd = Tensor::empty(rt, &[rows], DType::F32, Category::Activation, &format!("{label}.rstd"))?;
    let fused = residual.is_some();
    let name = || {
        let to = if out == x.dtype() {
            String::new()
        } else {
            format!(" ->{}", out.wgsl())
        };
        let add = if fused { " +residual" } else { "" };
        format!("{} forward {}{add}{to}", norm.name(), x.dtype().wgsl())
    };
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        eps,
        pad: 0,
    };
    let bound = [
        x,
        w,
        b.unwrap_or(w),
        &y,
        &mean,
        &rstd,
        residual.map_or(w, |r| r.0),
        residual.map_or(w, |r| r.1),
    ];
    if let Some(shape) = row_shape(rt, cols, &bound).filter(|_| rows > 0) {
        let kernel = rows_kernel(rt, 0, (x.dtype(), out), norm, fused, shape, name)?;
        rt.launch(
            &kernel,
            bytemuck::bytes_of(&params),
            &bound,
            grid(rows.div_ceil(shape.rows_per_group()) as u32),
        )?;
        return Ok((y, LayerNormSaved { mean, rstd }));
    }
    let kernel = rt.kernel(
        KernelKey::new("layernorm", &[0, x.dtype() as u32, norm as u32, out as u32, fused as u32]),
        8,
        name,
        || render("layernorm", SOURCE, &variant_fused(0, x.dtype(), out, norm, fused)),
    )?;
    rt.launch(&kernel, bytemuck::bytes_of(&params), &bound, grid(rows as u32))?;
    Ok((y, LayerNormSaved { mean, rstd }))
}

/// dx from dy; writes the weight and bias gradients into `(dw, db)`.
pub fn backward(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    saved: &LayerNormSaved,
    dy: &Tensor,
    (dw, db): (&Tensor, &Tensor),
    label: &str,
) -> Result<Tensor, Error> {
    backward_norm(rt, x, w, saved, dy, (dw, db), (Norm::Layer, None), label)
}

/// [`backward`] that returns `so_far + dx` (x's gradient from its other uses, f32 in
/// x's shape) from the same launch.
#[allow(clippy::too_many_arguments)]
pub fn backward_adding(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    saved: &LayerNormSaved,
    dy: &Tensor,
    (dw, db): (&Tensor, &Tensor),
    so_far: &Tensor,
    label: &str,
) -> Result<Tensor, Error> {
    check_tensor("layernorm gradient so far", so_far, DType::F32)?;
    check_contiguous("layernorm gradient so far", so_far, x.shape())?;
    if x.dtype() != DType::F32 {
        return Err(Error::shape("layernorm backward adding", "f32 activations", x.dtype()));
    }
    backward_norm(rt, x, w, saved, dy, (dw, db), (Norm::Layer, Some(so_far)), label)
}

/// RMSNorm's dx from dy; writes the weight gradient into `dw`.
pub fn backward_rms(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    saved: &LayerNormSaved,
    dy: &Tensor,
    dw: &Tensor,
    label: &str,
) -> Result<Tensor, Error> {
    let cols = w.numel();
    // The kernels sum a bias gradient too; RMSNorm has none, so it lands in scratch.
    let db = Tensor::empty(rt, &[cols], DType::F32, Category::Temporary, "rms db scratch")?;
    backward_norm(rt, x, w, saved, dy, (dw, &db), (Norm::Rms, None), label)
}

#[allow(clippy::too_many_arguments)]
fn backward_norm(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    saved: &LayerNormSaved,
    dy: &Tensor,
    (dw, db): (&Tensor, &Tensor),
    (norm, so_far): (Norm, Option<&Tensor>),
    label: &str,
) -> Result<Tensor, Error> {
    let (rows, cols) = check(x, w)?;
    check_tensor("layernorm dy", dy, x.dtype())?;
    check_contiguous("layernorm dy", dy, x.shape())?;
    for (what, t) in [("layernorm dw", dw), ("layernorm db", db)] {
        check_tensor(what, t, DType::F32)?;
        check_contiguous(what, t, &[cols])?;
    }
    for (what, t) in [("layernorm mean", &saved.mean), ("layernorm rstd", &saved.rstd)] {
        check_tensor(what, t, DType::F32)?;
        check_contiguous(what, t, &[rows])?;
    }
    require_f16(rt, &[x.dtype()])?;
    let dx = Tensor::empty(rt, x.shape(), x.dtype(), Category::Temporary, label)?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        eps: 0.0,
        pad: 0,
    };
    let fused = so_far.is_some();
    let so_far = so_far.unwrap_or(db);
    // One backward kernel of `mode` (named after its pass, `tail` after the type),
    // launched over `groups`.
    let run = |mode: u32, (pass, tail): (&str, &str), bindings: &[&Tensor], groups: [u32; 3]| -> Result<(), Error> {
        let fused = fused && matches!(mode, 1 | 4);
        let kernel = rt.kernel(
            KernelKey::new("layernorm", &[mode, x.dtype() as u32, norm as u32, fused as u32]),
            8,
            || {
                format!(
                    "{} {pass} {}{}{tail}",
                    norm.name(),
                    x.dtype().wgsl(),
                    if fused { " +grad" } else { "" }
                )
            },
            || render("layernorm", SOURCE, &variant_fused(mode, x.dtype(), x.dtype(), norm, fused)),
        )?;
        rt.launch(&kernel, bytemuck::bytes_of(&params), bindings, groups)
    };
    if cols <= PART_COLS {
        // dx and each chunk's weight-gradient partials from one read of x and dy, then
        // the partials summed.
        let chunks = rows.div_ceil(PART_ROWS).max(1);
        let parts = Tensor::empty(rt, &[chunks, 2, cols], DType::F32, Category::Temporary, "ln dw partials")?;
        let (mean, rstd) = (&saved.mean, &saved.rstd);
        let bound = [x, w, dy, &dx, mean, rstd, &parts, so_far];
        if let Some(shape) = row_shape(rt, cols, &bound) {
            let name = || {
                let acc = if fused { " +grad" } else { "" };
                format!("{} backward {}{acc} +dw partials", norm.name(), x.dtype().wgsl())
            };
            let kernel = rows_kernel(rt, 4, (x.dtype(), x.dtype()), norm, fused, shape, name)?;
            rt.launch(&kernel, bytemuck::bytes_of(&params), &bound, grid(chunks as u32))?;
        } else {
            run(4, ("backward", " +dw partials"), &bound, grid(chunks as u32))?;
        }
        // The partials' sums, held back to go with other sums (`kernels::col_sums`):
        // weights and biases interleave by chunk, [chunk][2][cols].
        for (half, out) in [(0, dw), (1, db)] {
            col_sums::defer(
                rt,
                col_sums::Sum {
                    src: parts.clone(),
                    s_off: half * cols,
                    s_rs: 2 * cols,
                    parts: chunks,
                    lanes: SUM_LANES,
                    len: cols,
                    n: cols,
                    dst: out.clone(),
                    d_off: out.offset(),
                    d_rs: cols,
                    alpha: 1.0,
                    beta: 0.0,
                },
            )?;
        }
        return Ok(dx);
    }
    let (mean, rstd) = (&saved.mean, &saved.rstd);
    run(1, ("backward", ""), &[x, w, dy, &dx, mean, rstd, dw, so_far], grid(rows as u32))?;
    // Weight and bias gradients in one deterministic pass over the rows.
    run(
        2,
        ("dw", ""),
        &[x, w, dy, &dx, mean, rstd, dw, db],
        grid(cols.div_ceil(WEIGHT_COLS) as u32),
    )?;
    Ok(dx)
}
