//! Conv-net ops on NHWC activations: convolution, BatchNorm (with the fused residual
//! add and ReLU), pooling, and the layout changes at a model's edges (PyTorch's NCHW
//! images in, PyTorch's flatten order out), each with its backward.
//!
//! Under fp16-mixed a convolution reads f16 input and weight (autocast's conv) and
//! writes f16; BatchNorm reads that f16 and computes in f32 with f32 statistics and
//! parameters, writing f16; its input's gradient is f16 (what the convolution before
//! reads), other gradients f32.
//!
//! May call: `autograd::{ops, tape}`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use super::half;
use crate::autograd::tape::{Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::batchnorm::{self, Stats};
use crate::kernels::conv::{self, ConvShape};
use crate::kernels::pool::{Pool, PoolKind};
use crate::kernels::reduce::sum_rows;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

fn nhwc(x: &Tensor, what: &str) -> Result<[usize; 4], Error> {
    x.shape()
        .try_into()
        .map_err(|_| Error::shape(what, "an NHWC activation [N, H, W, C]", format!("{:?}", x.shape())))
}

fn whole(rt: &Runtime, t: &Tensor) -> Result<Tensor, Error> {
    if t.is_contiguous() && t.offset() == 0 {
        Ok(t.clone())
    } else {
        t.contiguous(rt)
    }
}

/// conv2d(x, w) + b on x [N, H, W, C]; `shape` gives the kernel, stride, padding,
/// dilation and groups (its n, h, w, c are taken from x). Output [N, P, Q, K].
pub fn conv2d(tape: &mut Tape, rt: &Runtime, x: &Var, w: &Var, b: Option<&Var>, shape: ConvShape, label: &str) -> Result<Var, Error> {
    let [n, h, wd, c] = nhwc(&x.value, label)?;
    let shape = ConvShape { n, h, w: wd, c, ..shape };
    shape.check(label)?;
    let mixed = tape.half_matmuls();
    let dt = if mixed { DType::F16 } else { DType::F32 };
    let xs = if mixed {
        half(rt, &whole(rt, &x.value)?, Category::Activation, &format!("{label}.x.f16"))?
    } else {
        whole(rt, &x.value)?
    };
    // The weight as the products read it (and in f16 under fp16-mixed: the copy autocast
    // makes anyway).
    let ws = conv::pack_weight(rt, &w.value, &shape, dt)?;
    let out = dt;
    // Images (a model's input) need no gradient: backward skips their product.
    let wants_dx = !tape.is_input(x);
    // Under fp16-mixed an f16 activation's gradient is f16, as autocast's is: the layer
    // before (BatchNorm, a pool, a residual sum) reads and adds f16.
    let dx_dtype = if mixed && x.value.dtype() == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    let y = conv::forward(rt, &xs, &ws, b.map(|b| &b.value), &shape, out, label)?;
    let inputs: Vec<&Var> = std::iter::once(x).chain(std::iter::once(w)).chain(b).collect();
    let has_bias = b.is_some();
    Ok(tape.record(
        y,
        &inputs,
        Box::new(move |rt, dy, cats| {
            let dy = whole(rt, dy)?;
            let dy_mm = if mixed {
                half(rt, &dy, Category::Temporary, "dy.f16")?
            } else {
                dy.clone()
            };
            let dw = conv::backward_weight(rt, &xs, &dy_mm, &shape, cats[1])?;
            let db = if has_bias {
                let k = shape.k;
                Some(sum_rows(rt, &dy.reshape(&[dy.numel() / k, k])?, cats[2], "bias.grad")?)
            } else {
                None
            };
            let dx = wants_dx
                .then(|| conv::backward_input(rt, &dy_mm, &ws, &shape, (dx_dtype, cats[0])))
                .transpose()?;
            let mut out = vec![dx, Some(dw)];
            out.extend(db.map(Some));
            Ok(out)
        }),
    ))
}

/// BatchNorm2d's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Added to the variance.
    pub eps: f32,
    /// How far the running statistics move toward each batch's.
    pub momentum: f32,
    /// A ReLU after the (residual-added) normalisation, fused.
    pub relu: bool,
}

/// BatchNorm2d over the channels of x [N, H, W, C] (rows N H W), with an optional
/// residual added and ReLU fused after it. In training mode the batch's statistics
/// normalise and the running statistics move (not again in a recomputed segment); in
/// evaluation mode the running statistics normalise. `state`: weight, bias (Vars) and
/// running_mean, running_var, num_batches_tracked (buffers). On a tape that shares
/// statistics ([`Tape::with_sync`]) the batch is every rank's (SyncBatchNorm: the
/// per-chunk statistics in forward and the sums of dy and dy (x - mean) in backward
/// are gathered from every rank; the weight and bias gradients are this rank's share,
/// summed with the rest by the gradient reduction).
pub fn batch_norm(
    tape: &mut Tape,
    rt: &Runtime,
    x: &Var,
    (gamma, beta): (&Var, &Var),
    running: [&Tensor; 3],
    residual: Option<&Var>,
    opts: BatchNormOptions,
    label: &str,
) -> Result<Var, Error> {
    let [n, h, w, c] = nhwc(&x.value, label)?;
    let count = n * h * w;
    let xs = whole(rt, &x.value)?;
    let res = match residual {
        Some(r) if r.value.shape() != xs.shape() => {
            return Err(Error::shape(
                format!("{label} residual"),
                format!("{:?}", xs.shape()),
                format!("{:?}", r.value.shape()),
            ));
        }
        Some(r) if r.value.dtype() != xs.dtype() => Some(r.value.cast(rt, xs.dtype(), Category::Activation, &format!("{label}.res"))?),
        Some(r) => Some(whole(rt, &r.value)?),
        None => None,
    };
    let training = tape.training();
    let state = [&gamma.value, &beta.value, running[0], running[1], running[2]];
    let coef_label = format!("{label}.stats");
    let sync = tape.sync().filter(|_| training);
    let mut total = count;
    let coef = if training {
        let mut part = batchnorm::stats(rt, &xs)?;
        if let Some(s) = &sync {
            // SyncBatchNorm: every rank's (count, mean, M2) chunks, merged as one batch.
            let all = s.all_gather(part.to_f32_vec(rt)?)?;
            total = all.chunks(c).step_by(3).map(|counts| counts[0] as usize).sum();
            part = Tensor::from_f32(rt, &all, &[all.len() / (3 * c), 3, c], Category::Temporary, "bn.stats.all")?;
        }
        let stats = Stats::Batch {
            momentum: opts.momentum,
            update: !tape.recomputing(),
        };
        batchnorm::finalize(rt, Some(&part), state, opts.eps, stats, &coef_label)?
    } else {
        batchnorm::finalize(rt, None, state, opts.eps, Stats::Running, &coef_label)?
    };
    let out = if tape.half_matmuls() { DType::F16 } else { DType::F32 };
    let y = batchnorm::apply(rt, &xs, res.as_ref(), &coef, opts.relu, out, label)?;
    let inputs: Vec<&Var> = [x, gamma, beta].into_iter().chain(residual).collect();
    // Backward reads the ReLU's mask from the output (the next layer keeps it anyway),
    // and needs no residual.
    let relu_out = opts.relu.then(|| y.clone());
    let has_residual = residual.is_some();
    // Under fp16-mixed an f16 input's gradient is f16, as autocast's is (the convolution
    // before reads it as its products' operand: no cast); so is the residual's, written
    // alongside, which meets the f16 gradient of the block's first convolution.
    let dx_dtype = if tape.half_matmuls() && xs.dtype() == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    drop(res);
    Ok(tape.record(
        y,
        &inputs,
        Box::new(move |rt, dy, cats| {
            let dy = whole(rt, dy)?;
            let part = batchnorm::grad_stats(rt, &xs, relu_out.as_ref(), &dy, &coef)?;
            let [mut gcoef, dgamma, dbeta] = batchnorm::grad_finalize(rt, &part, &coef, total, !training, [cats[1], cats[2]])?;
            if let Some(s) = &sync {
                // dx from every rank's sums of dy and dy (x - mean) (PyTorch's sum_dy and
                // sum_dy_xmu, all-reduced); the weight's and bias's gradients stay this
                // rank's, reduced with every other gradient.
                let all = s.all_gather(part.to_f32_vec(rt)?)?;
                let all = Tensor::from_f32(rt, &all, &[all.len() / (2 * c), 2, c], Category::Temporary, "bn.grad_stats.all")?;
                let cat = [Category::Temporary; 2];
                [gcoef, _, _] = batchnorm::grad_finalize(rt, &all, &coef, total, !training, cat)?;
            }
            let res_cat = cats.get(3).copied().unwrap_or(Category::Temporary);
            let (dx, dres) = batchnorm::grad_apply(
                rt,
                &xs,
                relu_out.as_ref(),
                &dy,
                &coef,
                &gcoef,
                has_residual,
                (dx_dtype, [cats[0], res_cat]),
            )?;
            let mut out = vec![Some(dx), Some(dgamma), Some(dbeta)];
            if let Some(d) = dres {
                out.push(Some(d));
            }
            Ok(out)
        }),
    ))
}

/// A max, average or adaptive average pool over x [N, H, W, C]; backward keeps x (and a
/// max pool its output, which the next layer keeps anyway: most windows then need no
/// search for their argmax).
pub fn pool2d(tape: &mut Tape, rt: &Runtime, x: &Var, pool: Pool, label: &str) -> Result<Var, Error> {
    nhwc(&x.value, label)?;
    let xs = whole(rt, &x.value)?;
    let y = pool.forward(rt, &xs, xs.dtype(), label)?;
    let kept = (pool.kind == PoolKind::Max).then(|| y.clone());
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |rt, dy, cats| {
            let dy = whole(rt, dy)?;
            Ok(vec![Some(pool.backward(rt, &xs, kept.as_ref(), &dy, cats[0])?)])
        }),
    ))
}

/// PyTorch's NCHW images [N, C, H, W] as the NHWC activations the conv ops take (a
/// copy in the images' dtype; an input, so no gradient).
pub fn nchw_to_nhwc(rt: &Runtime, x: &Tensor, label: &str) -> Result<Tensor, Error> {
    let [n, c, h, w]: [usize; 4] = x
        .shape()
        .try_into()
        .map_err(|_| Error::shape(label, "images [N, C, H, W]", format!("{:?}", x.shape())))?;
    let x = whole(rt, x)?;
    let view = x.as_strided(&[n, h, w, c], &[c * h * w, w, 1, h * w], 0)?;
    let out = Tensor::empty(rt, &[n, h, w, c], x.dtype(), Category::Input, label)?;
    crate::kernels::map::copy_into(rt, &view, &out)?;
    Ok(out)
}

/// x [N, H, W, C] flattened in PyTorch's order (C, H, W) to [N, C H W]: what a Linear
/// after torch.flatten(x, 1) expects.
pub fn flatten_nchw(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    let [n, h, w, c] = nhwc(&x.value, label)?;
    let xs = whole(rt, &x.value)?;
    let y = if h * w == 1 {
        xs.reshape(&[n, c])?
    } else {
        let view = xs.as_strided(&[n, c, h, w], &[h * w * c, 1, w * c, c], 0)?;
        let out = Tensor::empty(rt, &[n, c * h * w], xs.dtype(), Category::Activation, label)?;
        crate::kernels::map::copy_into(rt, &view, &out.reshape(&[n, c, h, w])?)?;
        out
    };
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |rt, dy, cats| {
            let dy = whole(rt, dy)?;
            if h * w == 1 {
                return Ok(vec![Some(dy.reshape(&[n, 1, 1, c])?)]);
            }
            let view = dy.as_strided(&[n, h, w, c], &[c * h * w, w, 1, h * w], 0)?;
            let dx = Tensor::empty(rt, &[n, h, w, c], DType::F32, cats[0], "dx")?;
            crate::kernels::map::copy_into(rt, &view, &dx)?;
            Ok(vec![Some(dx)])
        }),
    ))
}
