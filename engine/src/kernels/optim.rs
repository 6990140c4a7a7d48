//! Fused optimizer kernels (shaders/optim.wgsl): AdamW and SGD with momentum in one
//! pass over f32 master weights, with an optional gradient unscale and the non-finite
//! check that lets a loss scaler skip a step; AdamW with 8-bit blockwise state
//! (shaders/optim8.wgsl, layout in `optim::blockwise`).
//!
//! May call: `error`, `kernels::{blockwise, common}`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_contiguous, check_tensor};
use crate::error::Error;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/optim.wgsl");
const SOURCE_8BIT: &str = include_str!("../../../shaders/optim8.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct Params {
    n: u32,
    skip_if_found: u32,
    first_step: u32,
    nesterov: u32,
    hyper: Hyper,
    param_offset: u32,
    grad_offset: u32,
    half_offset: u32,
    pad: u32,
}

/// An update's hyperparameters as every optimizer shader reads them (`lr` ..
/// `inv_scale` of their `Params`): one layout for the one-parameter, 8-bit and
/// multi-tensor kernels.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
pub(super) struct Hyper {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2_sqrt: f32,
    inv_scale: f32,
}

impl Hyper {
    /// Nothing but the gradients' multiplier (the checks).
    pub(super) fn scale(inv_scale: f32) -> Hyper {
        Hyper {
            inv_scale,
            ..Default::default()
        }
    }

    /// AdamW's at `step` (counting from 1), with its bias corrections.
    pub(super) fn adamw(h: &AdamW, step: u32, inv_scale: f32) -> Hyper {
        Hyper {
            lr: h.lr,
            beta1: h.betas.0,
            beta2: h.betas.1,
            eps: h.eps,
            weight_decay: h.weight_decay,
            bias_correction1: 1.0 - h.betas.0.powi(step as i32),
            bias_correction2_sqrt: (1.0 - h.betas.1.powi(step as i32)).sqrt(),
            inv_scale,
        }
    }

    /// SGD's (momentum and dampening where AdamW's betas go); nesterov momentum
    /// without a momentum is refused.
    pub(super) fn sgd(h: &Sgd, inv_scale: f32) -> Result<Hyper, Error> {
        if h.momentum == 0.0 && h.nesterov {
            return Err(Error::invalid("sgd", "nesterov momentum requires a momentum"));
        }
        Ok(Hyper {
            lr: h.lr,
            beta1: h.momentum,
            beta2: h.dampening,
            weight_decay: h.weight_decay,
            inv_scale,
            ..Default::default()
        })
    }
}

/// The template values of one variant (0 check, 1 AdamW, 2 SGD; `half`: the f16 copy
/// of the weight written too).
pub fn variant(mode: u32, half: bool) -> Vec<(&'static str, String)> {
    vec![("MODE", mode.to_string()), ("HALF", half.to_string())]
}

/// AdamW hyperparameters (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// (beta1, beta2).
    pub betas: (f32, f32),
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// SGD hyperparameters (PyTorch's defaults, momentum 0 means plain SGD).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor.
    pub momentum: f32,
    /// Dampening for momentum.
    pub dampening: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Where a step reads and writes: one parameter's tensors.
pub struct OptimState<'a> {
    /// f32 master weights (a contiguous view at any offset: a shard of a parameter).
    pub param: &'a Tensor,
    /// f32 gradient, scaled by the loss scale if any (a contiguous view at any offset).
    pub grad: &'a Tensor,
    /// AdamW exp_avg, or SGD's momentum buffer.
    pub m: &'a Tensor,
    /// AdamW exp_avg_sq (SGD: any f32 tensor of the same size).
    pub v: &'a Tensor,
    /// The weights' f16 copy, written with the update (fp16-mixed's kept copies).
    pub half: Option<&'a Tensor>,
}

/// Checks what the update kernels index in `s` and `found`; returns the element count.
pub(super) fn check_state(s: &OptimState, found: &Tensor) -> Result<usize, Error> {
    let n = s.param.numel();
    for (what, t) in [("param", s.param), ("grad", s.grad), ("m", s.m), ("v", s.v)] {
        check_tensor(what, t, DType::F32)?;
        check_contiguous(what, t, s.param.shape())?;
        if t.offset() != 0 && (what == "m" || what == "v") && !std::ptr::eq(t, s.grad) {
            return Err(Error::shape(
                format!("optimizer {what}"),
                "a whole tensor (offset 0)",
                format!("offset {}", t.offset()),
            ));
        }
    }
    if let Some(h) = s.half {
        check_tensor("half copy", h, DType::F16)?;
        check_contiguous("half copy", h, s.param.shape())?;
    }
    check_tensor("found_inf", found, DType::U32)?;
    if found.numel() < 1 || found.offset() != 0 {
        return Err(Error::shape(
            "found_inf",
            "a whole u32 tensor of at least 1 element",
            format!("{:?} at offset {}", found.shape(), found.offset()),
        ));
    }
    Ok(n)
}

/// Unscales `grad` in place (grad *= inv_scale) and sets found[0] to 1 when any result
/// is not finite (found is not cleared): one pass, as torch's
/// `_amp_foreach_non_finite_check_and_unscale_`.
pub fn unscale_and_check(rt: &Runtime, grad: &Tensor, inv_scale: f32, found: &Tensor) -> Result<(), Error> {
    let s = OptimState {
        param: grad,
        grad,
        m: grad,
        v: grad,
        half: None,
    };
    let n = check_state(&s, found)?;
    let kernel = rt.kernel(
        KernelKey::new("optim", &[0]),
        5,
        || "optim unscale + non-finite check".into(),
        || render("optim", SOURCE, &variant(0, false)),
    )?;
    let params = Params {
        n: n as u32,
        hyper: Hyper::scale(inv_scale),
        param_offset: grad.offset() as u32,
        grad_offset: grad.offset() as u32,
        ..Default::default()
    };
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[grad, grad, grad, grad, found],
        grid(n.div_ceil(256) as u32),
    )
}

/// AdamW's uniform values for a step of `n` elements of `s` (`step` counts from 1).
fn adam_params(h: &AdamW, s: &OptimState, n: usize, step: u32, inv_scale: f32, skip_if_found: bool) -> Params {
    Params {
        n: n as u32,
        skip_if_found: skip_if_found as u32,
        first_step: (step == 1) as u32,
        nesterov: 0,
        hyper: Hyper::adamw(h, step, inv_scale),
        param_offset: s.param.offset() as u32,
        grad_offset: s.grad.offset() as u32,
        half_offset: s.half.map_or(0, |h| h.offset() as u32),
        pad: 0,
    }
}

/// One AdamW step (`step` counts from 1). With `skip_if_found`, nothing changes when
/// found[0] != 0.
pub fn adamw_step(
    rt: &Runtime,
    h: &AdamW,
    s: &OptimState,
    step: u32,
    inv_scale: f32,
    found: &Tensor,
    skip_if_found: bool,
) -> Result<(), Error> {
    let n = check_state(s, found)?;
    let params = adam_params(h, s, n, step, inv_scale, skip_if_found);
    launch_update(rt, 1, "optim adamw", s, found, &params)
}

/// The template values of the 8-bit AdamW kernel: `half`, and the maps' bits.
pub fn variant_8bit(half: bool) -> Vec<(&'static str, String)> {
    let bits = |signed: bool| {
        let map = super::blockwise::dynamic_map(signed);
        map.iter().map(|x| format!("{:#010x}u", x.to_bits())).collect::<Vec<_>>().join(", ")
    };
    vec![
        ("HALF", half.to_string()),
        ("SIGNED_BITS", bits(true)),
        ("UNSIGNED_BITS", bits(false)),
    ]
}

/// One AdamW step over 8-bit state: `s.m` and `s.v` are the moments' u32 words
/// (`kernels::blockwise::words`).
pub fn adamw8bit_step(
    rt: &Runtime,
    h: &AdamW,
    s: &OptimState,
    step: u32,
    inv_scale: f32,
    found: &Tensor,
    skip_if_found: bool,
) -> Result<(), Error> {
    let n = s.param.numel();
    for (what, t) in [("param", s.param), ("grad", s.grad)] {
        check_tensor(what, t, DType::F32)?;
        check_contiguous(what, t, s.param.shape())?;
    }
    let words = super::blockwise::words(n);
    for (what, t) in [("8-bit m", s.m), ("8-bit v", s.v)] {
        check_tensor(what, t, DType::U32)?;
        if t.numel() != words || t.offset() != 0 {
            return Err(Error::shape(
                what,
                format!("{words} words at offset 0"),
                format!("{} at offset {}", t.numel(), t.offset()),
            ));
        }
    }
    if let Some(h) = s.half {
        check_tensor("half copy", h, DType::F16)?;
        check_contiguous("half copy", h, s.param.shape())?;
    }
    check_tensor("found_inf", found, DType::U32)?;
    let params = adam_params(h, s, n, step, inv_scale, skip_if_found);
    let half = s.half.is_some();
    let kernel = rt.kernel(
        KernelKey::new("optim8", &[half as u32]),
        5 + half as usize,
        || {
            if half {
                "optim adamw8bit +f16 copy".into()
            } else {
                "optim adamw8bit".into()
            }
        },
        || render("optim8", SOURCE_8BIT, &variant_8bit(half)),
    )?;
    let groups = grid(super::blockwise::blocks(n).div_ceil(4) as u32);
    match s.half {
        Some(h) => rt.launch(&kernel, bytemuck::bytes_of(&params), &[s.param, s.grad, s.m, s.v, found, h], groups),
        None => rt.launch(&kernel, bytemuck::bytes_of(&params), &[s.param, s.grad, s.m, s.v, found], groups),
    }
}

/// Launches update `mode` (1 AdamW, 2 SGD) over `s`, with the f16 copy where it has one.
fn launch_update(rt: &Runtime, mode: u32, name: &'static str, s: &OptimState, found: &Tensor, params: &Params) -> Result<(), Error> {
    let half = s.half.is_some();
    let kernel = rt.kernel(
        KernelKey::new("optim", &[mode, half as u32]),
        5 + half as usize,
        || if half { format!("{name} +f16 copy") } else { name.into() },
        || render("optim", SOURCE, &variant(mode, half)),
    )?;
    let n = s.param.numel();
    let bindings = [s.param, s.grad, s.m, s.v, found];
    match s.half {
        Some(h) => rt.launch(
            &kernel,
            bytemuck::bytes_of(params),
            &[s.param, s.grad, s.m, s.v, found, h],
            grid(n.div_ceil(256) as u32),
        ),
        None => rt.launch(&kernel, bytemuck::bytes_of(params), &bindings, grid(n.div_ceil(256) as u32)),
    }
}

/// One SGD step; `first_step` initialises the momentum buffer with the gradient.
pub fn sgd_step(
    rt: &Runtime,
    h: &Sgd,
    s: &OptimState,
    first_step: bool,
    inv_scale: f32,
    found: &Tensor,
    skip_if_found: bool,
) -> Result<(), Error> {
    let n = check_state(s, found)?;
    let params = Params {
        n: n as u32,
        skip_if_found: skip_if_found as u32,
        first_step: first_step as u32,
        nesterov: h.nesterov as u32,
        hyper: Hyper::sgd(h, inv_scale)?,
        param_offset: s.param.offset() as u32,
        grad_offset: s.grad.offset() as u32,
        half_offset: s.half.map_or(0, |h| h.offset() as u32),
        ..Default::default()
    };
    launch_update(rt, 2, "optim sgd", s, found, &params)
}
