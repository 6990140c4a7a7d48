//! 2-D max, average and adaptive average pooling on NHWC activations, forward and
//! backward (shaders/pool.wgsl), with PyTorch's windows, tie-breaking and divisors.
//!
//! May call: `error`, `kernels::common`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/pool.wgsl");

/// What a pool takes of each window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The largest element.
    Max,
    /// The mean (the divisor counting padding or not).
    Avg {
        /// PyTorch's count_include_pad.
        include_pad: bool,
    },
    /// The mean over [floor(i H / P), ceil((i + 1) H / P)) (AdaptiveAvgPool2d).
    AdaptiveAvg,
}

/// One pool: input [n, h, w, c], kernel, stride, padding (the output size for the
/// adaptive pool: `out`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Max, average or adaptive average.
    pub kind: PoolKind,
    /// Kernel (height, width); unused by the adaptive pool.
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Zero padding (height, width), at most half the kernel.
    pub pad: [usize; 2],
    /// The adaptive pool's output (height, width).
    pub out: [usize; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    p: u32,
    q: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    adaptive: u32,
    include_pad: u32,
    total: u32,
    /// 1 where a max pool's backward binds the forward's output.
    kept: u32,
}

/// The template values of one variant (mode 0 max, 1 max backward, 2 average, 3
/// average backward).
pub fn variant(mode: u32, tx: DType, ts: DType, td: DType, vec: bool) -> Vec<(&'static str, String)> {
    vec![
        ("ENABLE", enables(&[tx, ts, td])),
        ("TX", tx.wgsl().into()),
        ("TS", ts.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("MODE", mode.to_string()),
        ("VEC", vec.to_string()),
    ]
}

impl Pool {
    /// The output's height and width for an `h` x `w` input, or why there is none.
    pub fn out_hw(&self, h: usize, w: usize) -> Result<(usize, usize), Error> {
        if self.kind == PoolKind::AdaptiveAvg {
            if self.out.contains(&0) {
                return Err(Error::shape("adaptive pool", "a non-zero output size", format!("{:?}", self.out)));
            }
            return Ok((self.out[0], self.out[1]));
        }
        if self.kernel.contains(&0) || self.stride.contains(&0) {
            return Err(Error::shape("pool", "a non-zero kernel and stride", format!("{self:?}")));
        }
        if self.pad[0] * 2 > self.kernel[0] || self.pad[1] * 2 > self.kernel[1] {
            return Err(Error::shape("pool", "padding at most half the kernel", format!("{self:?}")));
        }
        let out = |len: usize, i: usize| (len + 2 * self.pad[i]).checked_sub(self.kernel[i]).map(|d| d / self.stride[i] + 1);
        match (out(h, 0), out(w, 1)) {
            (Some(p), Some(q)) => Ok((p, q)),
            _ => Err(Error::shape(
                "pool",
                "an input at least as large as the kernel after padding",
                format!("{h}x{w} input, {:?}", self),
            )),
        }
    }

    fn params(&self, [n, h, w, c]: [usize; 4], (p, q): (usize, usize), total: usize) -> Params {
        Params {
            n: n as u32,
            h: h as u32,
            w: w as u32,
            c: c as u32,
            p: p as u32,
            q: q as u32,
            kh: self.kernel[0] as u32,
            kw: self.kernel[1] as u32,
            sh: self.stride[0] as u32,
            sw: self.stride[1] as u32,
            ph: self.pad[0] as u32,
            pw: self.pad[1] as u32,
            adaptive: u32::from(self.kind == PoolKind::AdaptiveAvg),
            include_pad: u32::from(matches!(self.kind, PoolKind::Avg { include_pad: true })),
            total: total as u32,
            kept: 0,
        }
    }

    fn mode(&self, backward: bool) -> u32 {
        let base = if self.kind == PoolKind::Max { 0 } else { 2 };
        base + u32::from(backward)
    }

    /// One launch; `y` is a max pool's output for its backward, if kept.
    fn run(&self, rt: &Runtime, backward: bool, x: &Tensor, y: Option<&Tensor>, [src, dst]: [&Tensor; 2]) -> Result<(), Error> {
        let kept = u32::from(y.is_some());
        let y = y.unwrap_or(x);
        let mode = self.mode(backward);
        let (tx, ts, td) = (x.dtype(), src.dtype(), dst.dtype());
        require_f16(rt, &[tx, ts, td])?;
        let [n, h, w, c]: [usize; 4] = x
            .shape()
            .try_into()
            .map_err(|_| Error::shape("pool input", "NHWC", format!("{:?}", x.shape())))?;
        // A max pool over channels in fours takes a vector of 4 a thread (its backward
        // where the forward's output is kept).
        let vec = c % 4 == 0 && (mode == 0 || (mode == 1 && kept == 1));
        let kernel = rt.kernel(
            KernelKey::new("pool", &[mode, tx as u32, ts as u32, td as u32, u32::from(vec)]),
            4,
            || {
                format!(
                    "pool {} {}->{}{}",
                    ["max", "max backward", "avg", "avg backward"][mode as usize],
                    ts.wgsl(),
                    td.wgsl(),
                    if vec { " vec4" } else { "" }
                )
            },
            || render("pool", SOURCE, &variant(mode, tx, ts, td, vec)),
        )?;
        let out = self.out_hw(h, w)?;
        if [x, y, src, dst].iter().any(|t| t.offset() != 0 || !t.is_contiguous()) {
            return Err(Error::invalid("pool", "whole contiguous tensors (offset 0)"));
        }
        let total = dst.numel();
        if total > u32::MAX as usize || x.numel() > u32::MAX as usize {
            return Err(Error::shape("pool", "fewer than 2^32 elements", total.max(x.numel())));
        }
        let threads = if vec { total / 4 } else { total };
        let params = Params {
            kept,
            ..self.params([n, h, w, c], out, threads)
        };
        rt.launch(
            &kernel,
            bytemuck::bytes_of(&params),
            &[x, src, dst, y],
            grid(threads.div_ceil(256) as u32),
        )
    }

    /// y [N, P, Q, C] in `out` from x [N, H, W, C] (contiguous).
    pub fn forward(&self, rt: &Runtime, x: &Tensor, out: DType, label: &str) -> Result<Tensor, Error> {
        let dt = x.dtype();
        check_tensor("pool input", x, dt)?;
        require_f16(rt, &[dt, out])?;
        let [n, h, w, c]: [usize; 4] = x
            .shape()
            .try_into()
            .map_err(|_| Error::shape("pool input", "NHWC", format!("{:?}", x.shape())))?;
        check_contiguous("pool input", x, &[n, h, w, c])?;
        let (p, q) = self.out_hw(h, w)?;
        let y = Tensor::empty(rt, &[n, p, q, c], out, Category::Activation, label)?;
        self.run(rt, false, x, None, [x, &y])?;
        Ok(y)
    }

    /// dx [N, H, W, C] (in dy's dtype, `category`) from dy [N, P, Q, C] and the forward's input x;
    /// a max pool also takes the forward's output `y` (in x's dtype) where it has it: a
    /// window is then searched for its first largest element only where an element
    /// equals the window's largest.
    pub fn backward(&self, rt: &Runtime, x: &Tensor, y: Option<&Tensor>, dy: &Tensor, category: Category) -> Result<Tensor, Error> {
        let [n, h, w, c]: [usize; 4] = x
            .shape()
            .try_into()
            .map_err(|_| Error::shape("pool input", "NHWC", format!("{:?}", x.shape())))?;
        let (p, q) = self.out_hw(h, w)?;
        check_contiguous("pool gradient", dy, &[n, p, q, c])?;
        check_tensor("pool gradient", dy, dy.dtype())?;
        let y = match y {
            Some(y) if self.kind == PoolKind::Max => {
                check_contiguous("pool output", y, &[n, p, q, c])?;
                if y.dtype() != x.dtype() {
                    return Err(Error::invalid("max pool backward", "the forward's output in its input's dtype"));
                }
                Some(y)
            }
            _ => None,
        };
        // The gradient keeps dy's dtype (f16 under fp16-mixed, as autocast's).
        let dx = Tensor::empty(rt, x.shape(), dy.dtype(), category, "dx")?;
        self.run(rt, true, x, y, [dy, &dx])?;
        Ok(dx)
    }
}
