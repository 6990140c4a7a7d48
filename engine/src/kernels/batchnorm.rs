//! BatchNorm2d over NHWC activations seen as [M, C] (shaders/batchnorm.wgsl): batch
//! statistics in training (exact per-chunk partials merged with Chan's formula, running
//! statistics moved as PyTorch moves them), running statistics in evaluation, and the
//! fused residual add + ReLU whose backward keeps the BN input and reads the ReLU's
//! mask from the output (which the next layer keeps anyway). SyncBatchNorm
//! merges every device's partials (`part` from [`stats`]) before [`finalize`].
//!
//! May call: `error`, `kernels::common`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/batchnorm.wgsl");

/// Rows per chunk of the partial statistics.
pub const CHUNK_ROWS: usize = 512;

/// The kernel's passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Per-chunk (count, mean, M2).
    Stats,
    /// The merge, the running statistics, the coefficients.
    Final,
    /// y = relu?(x scale + shift + res?).
    Apply,
    /// Per-chunk sums of g and g (x - mean).
    GradStats,
    /// Their merge: dgamma, dbeta and dx's coefficients.
    GradFinal,
    /// dx (and the residual's gradient).
    GradApply,
}

impl Pass {
    /// Every pass.
    pub const ALL: [Pass; 6] = [
        Pass::Stats,
        Pass::Final,
        Pass::Apply,
        Pass::GradStats,
        Pass::GradFinal,
        Pass::GradApply,
    ];

    fn key(self) -> &'static str {
        match self {
            Pass::Stats => "STATS",
            Pass::Final => "FINAL",
            Pass::Apply => "APPLY",
            Pass::GradStats => "GSTATS",
            Pass::GradFinal => "GFINAL",
            Pass::GradApply => "GAPPLY",
        }
    }

    fn bindings(self) -> usize {
        match self {
            Pass::Stats => 2,
            Pass::Final => 7,
            Pass::Apply => 4,
            Pass::GradStats => 5,
            Pass::GradFinal => 5,
            Pass::GradApply => 7,
        }
    }
}

/// The fused epilogue: a residual added before the ReLU, the ReLU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epilogue {
    /// relu(... ).
    pub relu: bool,
    /// ... + residual.
    pub residual: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct Params {
    m: u32,
    c: u32,
    rows: u32,
    chunks: u32,
    eps: f32,
    momentum: f32,
    update: u32,
    eval: u32,
    count: f32,
    total: u32,
    pad: [u32; 2],
}

/// The template values of one variant: x (and residual), the output as backward reads
/// it, dy, and what is written; `w` elements a thread in the elementwise passes.
pub fn variant(pass: Pass, [tx, ty, tg, td]: [DType; 4], ep: Epilogue, w: u32) -> Vec<(&'static str, String)> {
    let vec = |t: DType| {
        if w == 4 {
            format!("vec4<{}>", t.wgsl())
        } else {
            t.wgsl().to_string()
        }
    };
    let mut v = vec![
        ("W", w.to_string()),
        ("VEC", (w == 4).to_string()),
        ("VX", vec(tx)),
        ("VY", vec(ty)),
        ("VG", vec(tg)),
        ("VD", vec(td)),
        ("VF", vec(DType::F32)),
        ("ENABLE", enables(&[tx, ty, tg, td])),
        ("TX", tx.wgsl().into()),
        ("TY", ty.wgsl().into()),
        ("TG", tg.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("RELU", ep.relu.to_string()),
        ("RES", ep.residual.to_string()),
    ];
    for p in Pass::ALL {
        v.push((p.key(), (p == pass).to_string()));
    }
    v
}

fn launch(rt: &Runtime, pass: Pass, dts: [DType; 4], ep: Epilogue, params: &Params, ts: &[&Tensor], groups: [u32; 3]) -> Result<(), Error> {
    let w = if matches!(pass, Pass::Apply | Pass::GradApply | Pass::Stats) && params.c % 4 == 0 {
        4
    } else {
        1
    };
    let mut params = *params;
    let mut groups = groups;
    if w == 4 && pass != Pass::Stats {
        params.total /= 4;
        groups = grid(params.total.div_ceil(256));
    }
    require_f16(rt, &dts)?;
    for t in ts {
        if t.offset() != 0 || !t.is_contiguous() {
            return Err(Error::invalid("batch norm", "whole contiguous tensors (offset 0)"));
        }
        check_tensor("batch norm operand", t, t.dtype())?;
    }
    let kernel = rt.kernel(
        KernelKey::new(
            "batchnorm",
            &[
                pass as u32,
                dts[0] as u32,
                dts[1] as u32,
                dts[2] as u32,
                dts[3] as u32,
                u32::from(ep.relu) | u32::from(ep.residual) << 1 | w << 2,
            ],
        ),
        pass.bindings(),
        || {
            format!(
                "batchnorm {} {}{}",
                pass.key().to_lowercase(),
                dts[0].wgsl(),
                if ep.relu { " relu" } else { "" }
            )
        },
        || render("batchnorm", SOURCE, &variant(pass, dts, ep, w)),
    )?;
    rt.launch(&kernel, bytemuck::bytes_of(&params), ts, groups)
}

/// Rows and channels of an NHWC tensor.
pub fn rows_channels(x: &Tensor) -> (usize, usize) {
    let c = *x.shape().last().unwrap_or(&1);
    (x.numel() / c.max(1), c)
}

fn chunks(m: usize) -> usize {
    m.div_ceil(CHUNK_ROWS).max(1)
}

fn base(m: usize, c: usize) -> Params {
    Params {
        m: m as u32,
        c: c as u32,
        rows: CHUNK_ROWS as u32,
        chunks: chunks(m) as u32,
        count: m as f32,
        total: (m * c) as u32,
        ..Default::default()
    }
}

/// This device's partial statistics of x [.., C]: [chunks, 3, C] (count, mean, M2).
pub fn stats(rt: &Runtime, x: &Tensor) -> Result<Tensor, Error> {
    let (m, c) = rows_channels(x);
    if m * c > u32::MAX as usize {
        return Err(Error::shape("batch norm", "fewer than 2^32 elements", m * c));
    }
    let part = Tensor::empty(rt, &[chunks(m), 3, c], DType::F32, Category::Temporary, "bn.stats")?;
    let dt = x.dtype();
    launch(
        rt,
        Pass::Stats,
        [dt, dt, dt, dt],
        Epilogue::default(),
        &base(m, c),
        &[x, &part],
        [c.div_ceil(64) as u32, chunks(m) as u32, 1],
    )?;
    Ok(part)
}

/// What [`finalize`] does to the running statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stats {
    /// Batch statistics; the running ones move by `momentum` when `update`.
    Batch {
        /// PyTorch's momentum.
        momentum: f32,
        /// Whether the running statistics move (not in a recomputed segment).
        update: bool,
    },
    /// The running statistics (evaluation, or frozen).
    Running,
}

/// The coefficients [4, C] (scale, shift, mean, invstd) from `part` (every device's
/// partials, [chunks, 3, C]) or, for [`Stats::Running`], from the running statistics.
/// `state` is weight, bias, running_mean, running_var and num_batches_tracked (one
/// value, counting batches where the running statistics move).
pub fn finalize(rt: &Runtime, part: Option<&Tensor>, state: [&Tensor; 5], eps: f32, stats: Stats, label: &str) -> Result<Tensor, Error> {
    let c = state[0].numel();
    let affine = &state[..4];
    if state[4].dtype() != DType::F32 || state[4].numel() != 1 {
        return Err(Error::shape(
            "batch norm num_batches_tracked",
            "one f32 value",
            format!("{:?}", state[4].shape()),
        ));
    }
    for (what, t) in ["weight", "bias", "running_mean", "running_var"].iter().zip(affine.iter().copied()) {
        if t.dtype() != DType::F32 || t.numel() != c {
            return Err(Error::shape(
                format!("batch norm {what}"),
                format!("{c} f32 values"),
                format!("{:?} {}", t.shape(), t.dtype()),
            ));
        }
    }
    let coef = Tensor::empty(rt, &[4, c], DType::F32, Category::Activation, label)?;
    let (chunks, part) = match (stats, part) {
        (Stats::Running, _) => (0, affine[0]),
        (Stats::Batch { .. }, Some(p)) => (p.shape()[0], p),
        (Stats::Batch { .. }, None) => return Err(Error::invalid("batch norm", "batch statistics need their partials")),
    };
    let (momentum, update, eval) = match stats {
        Stats::Batch { momentum, update } => (momentum, update, false),
        Stats::Running => (0.0, false, true),
    };
    let params = Params {
        c: c as u32,
        chunks: chunks as u32,
        eps,
        momentum,
        update: u32::from(update),
        eval: u32::from(eval),
        ..Default::default()
    };
    let f = DType::F32;
    launch(
        rt,
        Pass::Final,
        [f, f, f, f],
        Epilogue::default(),
        &params,
        &[part, state[0], state[1], state[2], state[3], &coef, state[4]],
        grid(c as u32),
    )?;
    Ok(coef)
}

/// y = relu?(x scale + shift + res?) in `out`.
pub fn apply(rt: &Runtime, x: &Tensor, res: Option<&Tensor>, coef: &Tensor, relu: bool, out: DType, label: &str) -> Result<Tensor, Error> {
    let (m, c) = rows_channels(x);
    if let Some(r) = res
        && (r.shape() != x.shape() || r.dtype() != x.dtype())
    {
        return Err(Error::shape(
            "batch norm residual",
            format!("{:?} {}", x.shape(), x.dtype()),
            format!("{:?} {}", r.shape(), r.dtype()),
        ));
    }
    let y = Tensor::empty(rt, x.shape(), out, Category::Activation, label)?;
    let ep = Epilogue {
        relu,
        residual: res.is_some(),
    };
    launch(
        rt,
        Pass::Apply,
        [x.dtype(), out, out, out],
        ep,
        &base(m, c),
        &[x, res.unwrap_or(x), coef, &y],
        grid((m * c).div_ceil(256) as u32),
    )?;
    Ok(y)
}

/// This device's backward partials [chunks, 2, C]: sums of g and g (x - mean), g the
/// upstream gradient through the ReLU's mask when `relu_out` (the forward's output) is
/// given.
pub fn grad_stats(rt: &Runtime, x: &Tensor, relu_out: Option<&Tensor>, dy: &Tensor, coef: &Tensor) -> Result<Tensor, Error> {
    let (m, c) = rows_channels(x);
    for t in std::iter::once(dy).chain(relu_out) {
        if t.shape() != x.shape() {
            return Err(Error::shape(
                "batch norm gradient",
                format!("{:?}", x.shape()),
                format!("{:?}", t.shape()),
            ));
        }
    }
    let part = Tensor::empty(rt, &[chunks(m), 2, c], DType::F32, Category::Temporary, "bn.grad_stats")?;
    let ep = Epilogue {
        relu: relu_out.is_some(),
        residual: false,
    };
    let y = relu_out.unwrap_or(x);
    launch(
        rt,
        Pass::GradStats,
        [x.dtype(), y.dtype(), dy.dtype(), DType::F32],
        ep,
        &base(m, c),
        &[x, y, dy, coef, &part],
        [c.div_ceil(64) as u32, chunks(m) as u32, 1],
    )?;
    Ok(part)
}

/// (dx's coefficients [2, C], dgamma, dbeta) from every device's backward partials;
/// `count` rows over every device; `frozen` for running statistics.
pub fn grad_finalize(
    rt: &Runtime,
    part: &Tensor,
    coef: &Tensor,
    count: usize,
    frozen: bool,
    cats: [Category; 2],
) -> Result<[Tensor; 3], Error> {
    let c = coef.shape()[1];
    let gcoef = Tensor::empty(rt, &[2, c], DType::F32, Category::Temporary, "bn.gcoef")?;
    let dgamma = Tensor::empty(rt, &[c], DType::F32, cats[0], "dweight")?;
    let dbeta = Tensor::empty(rt, &[c], DType::F32, cats[1], "dbias")?;
    let params = Params {
        c: c as u32,
        chunks: part.shape()[0] as u32,
        eval: u32::from(frozen),
        count: count as f32,
        ..Default::default()
    };
    let f = DType::F32;
    launch(
        rt,
        Pass::GradFinal,
        [f, f, f, f],
        Epilogue::default(),
        &params,
        &[part, coef, &gcoef, &dgamma, &dbeta],
        grid(c as u32),
    )?;
    Ok([gcoef, dgamma, dbeta])
}

/// dx (in `out`, `cats[0]`) and, with `residual`, the residual's gradient (`cats[1]`,
/// in `out` too); the ReLU's mask from `relu_out` when given.
#[allow(clippy::too_many_arguments)]
pub fn grad_apply(
    rt: &Runtime,
    x: &Tensor,
    relu_out: Option<&Tensor>,
    dy: &Tensor,
    coef: &Tensor,
    gcoef: &Tensor,
    residual: bool,
    (out, cats): (DType, [Category; 2]),
) -> Result<(Tensor, Option<Tensor>), Error> {
    let (m, c) = rows_channels(x);
    require_f16(rt, &[out])?;
    let dx = Tensor::empty(rt, x.shape(), out, cats[0], "dx")?;
    let dres = residual.then(|| Tensor::empty(rt, x.shape(), out, cats[1], "dres")).transpose()?;
    let ep = Epilogue {
        relu: relu_out.is_some(),
        residual,
    };
    let y = relu_out.unwrap_or(x);
    launch(
        rt,
        Pass::GradApply,
        [x.dtype(), y.dtype(), dy.dtype(), out],
        ep,
        &base(m, c),
        &[x, y, dy, coef, gcoef, &dx, dres.as_ref().unwrap_or(&dx)],
        grid((m * c).div_ceil(256) as u32),
    )?;
    Ok((dx, dres))
}
