//! The conv-net layers: Conv2d, BatchNorm2d (with running statistics as buffers and an
//! optional fused residual add + ReLU), MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and
//! Flatten, with PyTorch's names, layouts and default initialisation. Activations
//! between them are NHWC ([N, H, W, C]); [`images`] turns PyTorch's NCHW images into
//! that, and [`Flatten`] gives back PyTorch's (C, H, W) order.
//!
//! May call: `autograd`, `error`, `kernels::{conv, pool}`, `nn::{builder, layers}`,
//! `runtime`, `tensor`.

use super::builder::{BufferId, Builder, Ctx, Fill, ParamId};
use super::layers::Module;
use crate::autograd::Var;
use crate::autograd::ops::{self, BatchNormOptions};
use crate::error::Error;
use crate::kernels::conv::ConvShape;
use crate::kernels::pool::{Pool, PoolKind};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// PyTorch's NCHW images (f32 values [N, C, H, W], flattened) as the NHWC input of a
/// conv net.
pub fn images(rt: &Runtime, pixels: &[f32], [n, c, h, w]: [usize; 4]) -> Result<Tensor, Error> {
    if pixels.len() != n * c * h * w {
        return Err(Error::shape("images", format!("{n} x {c} x {h} x {w} values"), pixels.len()));
    }
    let x = Tensor::from_f32(rt, pixels, &[n, c, h, w], Category::Input, "batch.images")?;
    ops::nchw_to_nhwc(rt, &x, "batch.images.nhwc")
}

/// How a [`Conv2d`] is made (PyTorch's defaults: stride 1, no padding, dilation 1, one
/// group, a bias).
#[derive(Clone, Copy, Debug)]
pub struct ConvOptions {
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Zero padding (height, width).
    pub padding: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
    /// With a bias.
    pub bias: bool,
    /// The weight's fill (None: PyTorch's default, uniform in +-1/sqrt(fan_in)).
    pub weight: Option<Fill>,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
            weight: None,
        }
    }
}

/// torch.nn.Conv2d: `weight` [out, in / groups, kh, kw] and `bias` [out].
pub struct Conv2d {
    weight: ParamId,
    bias: Option<ParamId>,
    shape: ConvShape,
    label: String,
}

impl Conv2d {
    /// Conv2d(inputs, outputs, kernel) as `options` says, under `vb`.
    pub fn new(vb: &mut Builder, inputs: usize, outputs: usize, kernel: [usize; 2], options: ConvOptions) -> Result<Conv2d, Error> {
        let shape = ConvShape {
            n: 1,
            h: kernel[0] + 2 * options.padding[0],
            w: kernel[1] + 2 * options.padding[1],
            c: inputs,
            k: outputs,
            r: kernel[0],
            s: kernel[1],
            stride: options.stride,
            pad: options.padding,
            dilation: options.dilation,
            groups: options.groups,
        };
        // The sizes alone (any input at least the kernel's size).
        ConvShape {
            h: shape.h.max(options.dilation[0] * (kernel[0].max(1) - 1) + 1),
            w: shape.w.max(options.dilation[1] * (kernel[1].max(1) - 1) + 1),
            ..shape
        }
        .check(&vb.path("weight"))?;
        let fan_in = shape.per_group();
        let default = Fill::Uniform(1.0 / (fan_in as f32).sqrt());
        let weight = vb.param("weight", &shape.weight_shape(), options.weight.unwrap_or(default))?;
        let bias = options.bias.then(|| vb.param("bias", &[outputs], default)).transpose()?;
        Ok(Conv2d {
            weight,
            bias,
            shape,
            label: vb.path(""),
        })
    }

    /// Output channels.
    pub fn outputs(&self) -> usize {
        self.shape.k
    }

    /// Multiply-adds of one image of `h` x `w`, and the output's height and width.
    pub fn macs(&self, h: usize, w: usize) -> (f64, usize, usize) {
        let s = ConvShape { n: 1, h, w, ..self.shape };
        if s.check("").is_err() {
            return (0.0, 0, 0);
        }
        let (p, q) = s.out_hw();
        ((p * q * s.k * s.per_group()) as f64, p, q)
    }

    /// Its parameters (weight, then bias).
    pub fn params(&self) -> Vec<ParamId> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}

impl Module for Conv2d {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let w = cx.param(self.weight)?;
        let b = self.bias.map(|b| cx.param(b)).transpose()?;
        ops::conv2d(cx.tape, cx.rt, x, &w, b.as_ref(), self.shape, &self.label)
    }
}

/// torch.nn.BatchNorm2d: `weight` (1), `bias` (0), and the buffers `running_mean` (0),
/// `running_var` (1), `num_batches_tracked` (0). With `relu`, a ReLU is fused after it
/// (and [`BatchNorm2d::forward_add`] adds a residual before that ReLU).
pub struct BatchNorm2d {
    weight: ParamId,
    bias: ParamId,
    running: [BufferId; 3],
    options: BatchNormOptions,
    label: String,
}

impl BatchNorm2d {
    /// BatchNorm2d(channels) with PyTorch's eps 1e-5 and momentum 0.1, under `vb`.
    pub fn new(vb: &mut Builder, channels: usize, relu: bool) -> Result<BatchNorm2d, Error> {
        if channels == 0 {
            return Err(Error::shape(vb.path("weight"), "at least one channel", 0));
        }
        Ok(BatchNorm2d {
            weight: vb.param("weight", &[channels], Fill::Constant(1.0))?,
            bias: vb.param("bias", &[channels], Fill::Constant(0.0))?,
            running: [
                vb.buffer("running_mean", &[channels], 0.0)?,
                vb.buffer("running_var", &[channels], 1.0)?,
                vb.buffer("num_batches_tracked", &[], 0.0)?,
            ],
            options: BatchNormOptions {
                eps: 1e-5,
                momentum: 0.1,
                relu,
            },
            label: vb.path(""),
        })
    }

    /// Its parameters (weight, bias).
    pub fn params(&self) -> Vec<ParamId> {
        vec![self.weight, self.bias]
    }

    /// relu?(bn(x) + residual).
    pub fn forward_add(&self, cx: &mut Ctx, x: &Var, residual: Option<&Var>) -> Result<Var, Error> {
        let (g, b) = (cx.param(self.weight)?, cx.param(self.bias)?);
        let running = self.running.map(|id| cx.buffer(id).clone());
        let running = [&running[0], &running[1], &running[2]];
        ops::batch_norm(cx.tape, cx.rt, x, (&g, &b), running, residual, self.options, &self.label)
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        self.forward_add(cx, x, None)
    }
}

/// A pooling layer (MaxPool2d, AvgPool2d, AdaptiveAvgPool2d).
pub struct Pool2d {
    pool: Pool,
    label: String,
}

impl Pool2d {
    /// MaxPool2d(kernel, stride, padding).
    pub fn max(kernel: usize, stride: usize, padding: usize, label: &str) -> Pool2d {
        Pool2d::with(PoolKind::Max, kernel, stride, padding, label)
    }

    /// AvgPool2d(kernel, stride, padding) (count_include_pad, as PyTorch's default).
    pub fn avg(kernel: usize, stride: usize, padding: usize, label: &str) -> Pool2d {
        Pool2d::with(PoolKind::Avg { include_pad: true }, kernel, stride, padding, label)
    }

    /// AdaptiveAvgPool2d((h, w)).
    pub fn adaptive_avg(out: [usize; 2], label: &str) -> Pool2d {
        Pool2d {
            pool: Pool {
                kind: PoolKind::AdaptiveAvg,
                kernel: [1, 1],
                stride: [1, 1],
                pad: [0, 0],
                out,
            },
            label: label.to_string(),
        }
    }

    fn with(kind: PoolKind, kernel: usize, stride: usize, padding: usize, label: &str) -> Pool2d {
        Pool2d {
            pool: Pool {
                kind,
                kernel: [kernel; 2],
                stride: [stride; 2],
                pad: [padding; 2],
                out: [0, 0],
            },
            label: label.to_string(),
        }
    }
}

impl Module for Pool2d {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        ops::pool2d(cx.tape, cx.rt, x, self.pool, &self.label)
    }
}

/// torch.flatten(x, 1) of an NHWC activation, in PyTorch's (C, H, W) order.
pub struct Flatten {
    label: String,
}

impl Flatten {
    /// A flatten named `label`.
    pub fn new(label: &str) -> Flatten {
        Flatten { label: label.to_string() }
    }
}

impl Module for Flatten {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        ops::flatten_nchw(cx.tape, cx.rt, x, &self.label)
    }
}
