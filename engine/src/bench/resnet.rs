//! Benchmarks at the convolutions a ResNet-50 training step really runs (torchvision's
//! layout: the stride on the 3x3 convolution; batch 128 at 224x224): each layer's
//! forward, input gradient (dgrad) and weight gradient (wgrad), in f32 and, where the
//! adapter has f16, with f16 operands (the tensor-core path when granted), on NHWC
//! activations. The weight is packed once, outside the timing (a step packs it once for
//! the forward and both gradients). Each row is checked against an f64 reference at
//! sampled outputs; rows are named `resnet50.<layer>.{fwd,dgrad,wgrad}` and
//! scripts/torch_kernels.py times cuDNN (channels_last) at the same shapes.
//!
//! May call: `bench::{measure, record}`, `error`, `kernels`, `memory`, `runtime`,
//! `tensor`.

use super::measure::{Rng, Row, SAMPLES, record, stored, time, upload};
use super::record::BenchRecord;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::conv::{self, ConvShape};
use crate::kernels::tolerance::{tensor_core_tolerance, tolerance};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// ResNet-50's convolutions by kind (name, input side, C, K, kernel, stride, padding):
/// the stem, each stage's 3x3 (the first strided), and the 1x1s that widen and narrow.
pub const LAYERS: [(&str, usize, usize, usize, usize, usize, usize); 8] = [
    ("stem", 224, 3, 64, 7, 2, 3),
    ("layer1.conv2", 56, 64, 64, 3, 1, 1),
    ("layer1.conv3", 56, 64, 256, 1, 1, 0),
    ("layer2.conv2.s2", 56, 128, 128, 3, 2, 1),
    ("layer2.conv1", 28, 512, 128, 1, 1, 0),
    ("layer3.conv2", 14, 256, 256, 3, 1, 1),
    ("layer4.conv2", 7, 512, 512, 3, 1, 1),
    ("layer4.conv3", 7, 512, 2048, 1, 1, 0),
];

/// One layer's shape at `n` images (the side and the channels past 8 divided by
/// `shrink` for quick runs).
fn shape(n: usize, (side, c, k, ks, stride, pad): (usize, usize, usize, usize, usize, usize), shrink: usize) -> ConvShape {
    let side = (side / shrink).max(ks);
    let narrow = |ch: usize| if ch > 8 { (ch / shrink).max(8) } else { ch };
    let (c, k) = (narrow(c), narrow(k));
    ConvShape {
        n,
        h: side,
        w: side,
        c,
        k,
        r: ks,
        s: ks,
        stride: [stride; 2],
        pad: [pad; 2],
        dilation: [1, 1],
        groups: 1,
    }
}

/// Which product of a convolution a row times.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Forward,
    Dgrad,
    Wgrad,
}

/// The input row or column that output row or column `o` reads at tap `t` (`None` in
/// the padding).
fn tap(o: usize, t: usize, stride: usize, pad: usize, len: usize) -> Option<usize> {
    (o * stride + t).checked_sub(pad).filter(|&i| i < len)
}

/// The output row or column that reads input `i` at tap `t`, if any.
fn reader(i: usize, t: usize, stride: usize, pad: usize, len: usize) -> Option<usize> {
    (i + pad)
        .checked_sub(t)
        .filter(|o| o % stride == 0)
        .map(|o| o / stride)
        .filter(|&o| o < len)
}

/// One row: `pass` of the convolution `sh` in `dtype`.
fn row(rt: &Runtime, name: &str, sh: ConvShape, dtype: DType, pass: Pass) -> Result<BenchRecord, Error> {
    sh.check("benchmark convolution")?;
    let (p, q) = sh.out_hw();
    let (n, c, k, rs) = (sh.n, sh.c, sh.k, sh.r * sh.s);
    let mut rng = Rng(11);
    let xs = rng.vec(n * sh.h * sh.w * c, -1.0, 1.0);
    let ws = rng.vec(k * c * rs, -1.0, 1.0);
    let dys = rng.vec(n * p * q * k, -1.0, 1.0);
    let at_x = |b: usize, h: usize, w: usize, ch: usize| stored(xs[((b * sh.h + h) * sh.w + w) * c + ch], dtype);
    let at_w = |kk: usize, ch: usize, r: usize, s: usize| stored(ws[((kk * c + ch) * sh.r + r) * sh.s + s], dtype);
    let at_dy = |b: usize, pp: usize, qq: usize, kk: usize| stored(dys[((b * p + pp) * q + qq) * k + kk], dtype);
    let x = upload(rt, &xs, &[n, sh.h, sh.w, c], dtype)?;
    let w = Tensor::from_f32(rt, &ws, &sh.weight_shape(), Category::Input, "bench")?;
    let packed = conv::pack_weight(rt, &w, &sh, dtype)?;
    let dy = upload(rt, &dys, &[n, p, q, k], dtype)?;
    let mut last: Option<Tensor> = None;
    let timing = time(rt, || {
        last = Some(match pass {
            Pass::Forward => conv::forward(rt, &x, &packed, None, &sh, dtype, "bench.y")?,
            Pass::Dgrad => conv::backward_input(rt, &dy, &packed, &sh, (dtype, Category::Temporary))?,
            Pass::Wgrad => conv::backward_weight(rt, &x, &dy, &sh, Category::Temporary)?,
        });
        Ok(())
    })?;
    let out = last.expect("timed at least once").to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let samples = SAMPLES.min(32);
    let len = match pass {
        Pass::Forward => c * rs,
        Pass::Dgrad => k * rs,
        Pass::Wgrad => n * p * q,
    };
    for _ in 0..samples {
        let mut sum = 0.0;
        let st = sh.stride[0];
        match pass {
            Pass::Forward => {
                let (b, pp, qq, kk) = (rng.index(n), rng.index(p), rng.index(q), rng.index(k));
                for (r, s) in (0..sh.r).flat_map(|r| (0..sh.s).map(move |s| (r, s))) {
                    if let (Some(h), Some(ww)) = (tap(pp, r, st, sh.pad[0], sh.h), tap(qq, s, st, sh.pad[1], sh.w)) {
                        sum += (0..c).map(|ch| at_x(b, h, ww, ch) * at_w(kk, ch, r, s)).sum::<f64>();
                    }
                }
                got.push(out[((b * p + pp) * q + qq) * k + kk]);
            }
            Pass::Dgrad => {
                let (b, h, ww, ch) = (rng.index(n), rng.index(sh.h), rng.index(sh.w), rng.index(c));
                for (r, s) in (0..sh.r).flat_map(|r| (0..sh.s).map(move |s| (r, s))) {
                    if let (Some(pp), Some(qq)) = (reader(h, r, st, sh.pad[0], p), reader(ww, s, st, sh.pad[1], q)) {
                        sum += (0..k).map(|kk| at_dy(b, pp, qq, kk) * at_w(kk, ch, r, s)).sum::<f64>();
                    }
                }
                got.push(out[((b * sh.h + h) * sh.w + ww) * c + ch]);
            }
            Pass::Wgrad => {
                let (kk, ch, r, s) = (rng.index(k), rng.index(c), rng.index(sh.r), rng.index(sh.s));
                for (b, pp) in (0..n).flat_map(|b| (0..p).map(move |pp| (b, pp))) {
                    let Some(h) = tap(pp, r, st, sh.pad[0], sh.h) else { continue };
                    for qq in 0..q {
                        if let Some(ww) = tap(qq, s, st, sh.pad[1], sh.w) {
                            sum += at_x(b, h, ww, ch) * at_dy(b, pp, qq, kk);
                        }
                    }
                }
                got.push(out[((kk * c + ch) * sh.r + r) * sh.s + s]);
            }
        }
        want.push(sum);
    }
    let coop = dtype == DType::F16 && rt.gpu.caps.coop_f16_16x16x16();
    let (atol, rtol) = if coop {
        tensor_core_tolerance(len)
    } else {
        tolerance(DType::F32, len)
    };
    // A forward in f16 stores f16 outputs; an input gradient in f16 too, after summing
    // up to R S f16 columns.
    let stored = match pass {
        Pass::Forward => 1,
        Pass::Dgrad => rs,
        Pass::Wgrad => 0,
    };
    let tol = if dtype == DType::F16 && stored > 0 {
        let (a, r) = tolerance(DType::F16, stored);
        (atol + a, rtol + r)
    } else {
        (atol, rtol)
    };
    let flops = 2.0 * (n * p * q * k * c * rs) as f64;
    let bytes = ((x.numel() + dy.numel()) * dtype.size() + packed.numel() * dtype.size()) as f64;
    let what = match pass {
        Pass::Forward => "fwd",
        Pass::Dgrad => "dgrad",
        Pass::Wgrad => "wgrad",
    };
    Ok(record(
        &format!("resnet50.{name}.{what}"),
        dtype,
        &[n, sh.h, sh.w, c, k, sh.r, sh.s, sh.stride[0]],
        &timing,
        Row {
            flops,
            bytes,
            got: &got,
            want: &want,
            tol,
        },
    ))
}

/// Every ResNet-50 convolution row whose name passes `wanted`; `quick` uses 2 images
/// at an eighth of the side and of the channels.
pub fn run_all(rt: &Runtime, quick: bool, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<BenchRecord>, Error> {
    let (n, shrink) = if quick { (2, 8) } else { (128, 1) };
    let mut dtypes = vec![DType::F32];
    if rt.gpu.caps.shader_f16 {
        dtypes.push(DType::F16);
    }
    let mut out = Vec::new();
    for (name, side, c, k, ks, stride, pad) in LAYERS {
        for (what, pass) in [("fwd", Pass::Forward), ("dgrad", Pass::Dgrad), ("wgrad", Pass::Wgrad)] {
            if !wanted(&format!("resnet50.{name}.{what}")) {
                continue;
            }
            for &dtype in &dtypes {
                let sh = shape(n, (side, c, k, ks, stride, pad), shrink);
                out.push(row(rt, name, sh, dtype, pass)?);
            }
        }
    }
    Ok(out)
}
