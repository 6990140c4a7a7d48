//! Softmax, log-softmax (optionally causal) and softmax's backward over the last
//! dimension (shaders/softmax.wgsl).
//!
//! May call: `error`, `kernels::common`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{WORKGROUP_REDUCE, check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/softmax.wgsl");

/// Which pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftmaxMode {
    /// y = softmax(x)
    Softmax,
    /// y = log_softmax(x)
    LogSoftmax,
    /// dx = y * (dy - sum(dy * y))
    Backward,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    period: u32,
    pad: u32,
}

/// The template values of one variant: `tx` the input (backward: y), `td` backward's
/// dy (forward binds x there, so `td` = `tx`), `ty` the output (backward: dx).
pub fn variant(mode: SoftmaxMode, tx: DType, td: DType, ty: DType) -> Vec<(&'static str, String)> {
    vec![
        ("WORKGROUP_REDUCE", WORKGROUP_REDUCE.into()),
        ("ENABLE", enables(&[tx, td, ty])),
        ("TX", tx.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("TY", ty.wgsl().into()),
        ("MODE", (mode as u32).to_string()),
    ]
}

fn rows_cols(t: &Tensor) -> (usize, usize) {
    let cols = t.shape().last().copied().unwrap_or(1);
    (t.numel().checked_div(cols).unwrap_or(0), cols)
}

/// Softmax or log-softmax of `x` into `y` (same shape, contiguous). With `causal`, row
/// r sees columns j <= r % T where T is the second-to-last dimension (attention's
/// [.., T, T] scores).
pub fn softmax_into(rt: &Runtime, x: &Tensor, y: &Tensor, log: bool, causal: bool) -> Result<(), Error> {
    check_tensor("softmax x", x, x.dtype())?;
    check_tensor("softmax y", y, y.dtype())?;
    check_contiguous("softmax x", x, x.shape())?;
    check_contiguous("softmax y", y, x.shape())?;
    require_f16(rt, &[x.dtype(), y.dtype()])?;
    let (rows, cols) = rows_cols(x);
    let period = if causal {
        let rank = x.shape().len();
        if rank < 2 {
            return Err(Error::shape("causal softmax", "[.., T, T]", format!("{:?}", x.shape())));
        }
        x.shape()[rank - 2] as u32
    } else {
        0
    };
    let mode = if log { SoftmaxMode::LogSoftmax } else { SoftmaxMode::Softmax };
    let kernel = rt.kernel(
        KernelKey::new("softmax", &[mode as u32, x.dtype() as u32, x.dtype() as u32, y.dtype() as u32]),
        3,
        || name(mode, x.dtype(), y.dtype()),
        || render("softmax", SOURCE, &variant(mode, x.dtype(), x.dtype(), y.dtype())),
    )?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        period,
        pad: 0,
    };
    rt.launch(&kernel, bytemuck::bytes_of(&params), &[x, x, y], grid(rows as u32))
}

/// The profiler's name of a variant: `softmax logsoftmax f32->f32`.
fn name(mode: SoftmaxMode, input: DType, output: DType) -> String {
    format!("softmax {} {}->{}", format!("{mode:?}").to_lowercase(), input.wgsl(), output.wgsl())
}

/// dx = y * (dy - sum(dy * y)) over the last dimension, computing in f32 whatever the
/// dtypes. `dx` may be `dy` itself (each element is read before it is written, by the
/// same invocation), which saves a [.., T, T] buffer in attention's backward.
pub fn softmax_backward_into(rt: &Runtime, y: &Tensor, dy: &Tensor, dx: &Tensor) -> Result<(), Error> {
    for (what, t) in [("softmax y", y), ("softmax dy", dy), ("softmax dx", dx)] {
        check_tensor(what, t, t.dtype())?;
        check_contiguous(what, t, y.shape())?;
    }
    require_f16(rt, &[y.dtype(), dy.dtype(), dx.dtype()])?;
    let (rows, cols) = rows_cols(y);
    let kernel = rt.kernel(
        KernelKey::new(
            "softmax",
            &[SoftmaxMode::Backward as u32, y.dtype() as u32, dy.dtype() as u32, dx.dtype() as u32],
        ),
        3,
        || name(SoftmaxMode::Backward, y.dtype(), dx.dtype()),
        || {
            render(
                "softmax",
                SOURCE,
                &variant(SoftmaxMode::Backward, y.dtype(), dy.dtype(), dx.dtype()),
            )
        },
    )?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        period: 0,
        pad: 0,
    };
    rt.launch(&kernel, bytemuck::bytes_of(&params), &[y, dy, dx], grid(rows as u32))
}
