//! Fused cross-entropy forward and backward over row chunks
//! (shaders/cross_entropy.wgsl), with PyTorch's ignore_index (-100) and mean reduction.
//!
//! May call: `error`, `kernels::common`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{WORKGROUP_REDUCE, check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/cross_entropy.wgsl");
/// PyTorch's default ignore_index.
pub const IGNORE_INDEX: i32 = -100;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    row_offset: u32,
    ignore_index: i32,
    grad_scale: f32,
    ld: u32,
    smoothing: f32,
    pad: u32,
}

/// The template values of one variant.
pub fn variant(dtype: DType, backward: bool, grad: DType, vec: bool) -> Vec<(&'static str, String)> {
    vec![
        ("WORKGROUP_REDUCE", WORKGROUP_REDUCE.into()),
        ("ENABLE", enables(&[dtype, grad])),
        ("T", dtype.wgsl().into()),
        ("TD", grad.wgsl().into()),
        ("BACKWARD", backward.to_string()),
        ("VEC", vec.to_string()),
    ]
}

/// Per-row losses of `logits` [N, V] against `targets` [N] (i32) into `losses` [N] (f32)
/// for rows `rows`; with `dlogits`, also writes (softmax - onehot) * grad_scale
/// (`dlogits` may be `logits` itself, or an f16 tensor laid out as the logits: the
/// gradient rounded to f16 as it is written, for fp16-mixed's products).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows(
    rt: &Runtime,
    logits: &Tensor,
    targets: &Tensor,
    losses: &Tensor,
    dlogits: Option<&Tensor>,
    grad_scale: f32,
    rows: std::ops::Range<usize>,
) -> Result<(), Error> {
    cross_entropy_rows_smoothed(rt, logits, targets, losses, dlogits, (grad_scale, 0.0), rows)
}

/// [`cross_entropy_rows`] with label smoothing `smoothing` in [0, 1) (PyTorch's
/// `label_smoothing`: the target weighted 1 - e, every class e / V).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows_smoothed(
    rt: &Runtime,
    logits: &Tensor,
    targets: &Tensor,
    losses: &Tensor,
    dlogits: Option<&Tensor>,
    (grad_scale, smoothing): (f32, f32),
    rows: std::ops::Range<usize>,
) -> Result<(), Error> {
    if !(0.0..1.0).contains(&smoothing) {
        return Err(Error::invalid(
            "cross_entropy",
            format!("label smoothing must be in [0, 1), not {smoothing}"),
        ));
    }
    check_tensor("cross_entropy logits", logits, logits.dtype())?;
    let [n, v] = logits.shape() else {
        return Err(Error::shape("cross_entropy logits", "[N, V]", format!("{:?}", logits.shape())));
    };
    let (n, v) = (*n, *v);
    // Rows of unit stride, each `ld` apart (padded rows allowed); dlogits laid out alike.
    let ld = logits.strides()[0];
    if logits.strides()[1] != 1 && v > 1 || ld < v && n > 1 {
        return Err(Error::shape(
            "cross_entropy logits",
            "rows of unit stride, at least V apart",
            format!("strides {:?}", logits.strides()),
        ));
    }
    check_tensor("cross_entropy targets", targets, DType::I32)?;
    check_contiguous("cross_entropy targets", targets, &[n])?;
    check_tensor("cross_entropy losses", losses, DType::F32)?;
    check_contiguous("cross_entropy losses", losses, &[n])?;
    if let Some(d) = dlogits {
        let want = if d.dtype() == DType::F16 { DType::F16 } else { logits.dtype() };
        check_tensor("cross_entropy dlogits", d, want)?;
        if d.shape() != logits.shape() || d.strides() != logits.strides() {
            return Err(Error::shape(
                "cross_entropy dlogits",
                format!("the logits' shape and strides {:?} {:?}", logits.shape(), logits.strides()),
                format!("{:?} {:?}", d.shape(), d.strides()),
            ));
        }
    }
    if rows.end > n || rows.start > rows.end {
        return Err(Error::shape(
            "cross_entropy rows",
            format!("a range inside {n} rows"),
            format!("{rows:?}"),
        ));
    }
    let grad_type = dlogits.map_or(logits.dtype(), |d| d.dtype());
    require_f16(rt, &[logits.dtype(), grad_type])?;
    if logits.offset() != 0 || targets.offset() != 0 || losses.offset() != 0 || dlogits.is_some_and(|d| d.offset() != 0) {
        return Err(Error::shape("cross_entropy", "whole tensors (offset 0)", "a view at an offset"));
    }
    let ld = ld.max(v);
    // Four elements a load where every row starts on a multiple of four and the blocks
    // hold each row's last four (the rows' padding, read and masked off).
    let reach = (n.max(1) - 1) * ld + v.next_multiple_of(4);
    let vec = ld.is_multiple_of(4) && reach <= logits.capacity() && dlogits.is_none_or(|d| reach <= d.capacity());
    let kernel = rt.kernel(
        KernelKey::new(
            "cross_entropy",
            &[
                logits.dtype() as u32,
                u32::from(dlogits.is_some()),
                grad_type as u32,
                u32::from(vec),
            ],
        ),
        4,
        || {
            let backward = match dlogits {
                Some(_) if grad_type != logits.dtype() => format!(" +backward ->{}", grad_type.wgsl()),
                Some(_) => " +backward".into(),
                None => String::new(),
            };
            format!(
                "cross_entropy {}{backward}{}",
                logits.dtype().wgsl(),
                if vec { " vec4" } else { "" }
            )
        },
        || render("cross_entropy", SOURCE, &variant(logits.dtype(), dlogits.is_some(), grad_type, vec)),
    )?;
    let params = Params {
        rows: rows.len() as u32,
        cols: v as u32,
        row_offset: rows.start as u32,
        ignore_index: IGNORE_INDEX,
        grad_scale,
        ld: ld as u32,
        smoothing,
        pad: 0,
    };
    let d = dlogits.unwrap_or(logits);
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[logits, targets, losses, d],
        grid(rows.len() as u32),
    )
}
