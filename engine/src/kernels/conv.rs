//! 2-D convolution on NHWC activations (shaders/conv.wgsl for the gathers, the matmul
//! family for the products): forward, input gradient and weight gradient as GEMMs over
//! the columns of the images (CUTLASS's problem sizes: forward M = N P Q, N = K,
//! K = Cg R S; input gradient M = N P Q (then gathered to N H W), N = Cg R S, K = K;
//! weight gradient M = K, N = Cg R S, K = N P Q, split by the matmul's plan). Any kernel
//! size, stride, padding, dilation and groups. A 1x1 convolution with stride 1 and no
//! padding reads the activations as its matrix; others gather their columns into a
//! workspace of at most [`WORKSPACE`] bytes, a few images at a time, so the products
//! run on the matmul's kernels (tensor cores under f16 where the adapter has them).
//! Columns are ordered (r, s, c), so each gather reads a pixel's channels together
//! (vec4s where a group's channels allow), and a group's width is padded to a multiple
//! of 8 with zeros so the products load aligned rows (the stem's 3 x 7 x 7 = 147 becomes
//! 152). Weights keep PyTorch's [K, Cg, R, S] layout; [`pack_weight`] reorders them
//! for the products each step (the copy fp16-mixed makes anyway) and the weight
//! gradient is reordered back. The weight gradient's long K (the images' rows) is split
//! into slices computed side by side and summed, so its few output tiles fill the
//! device.
//!
//! May call: `error`, `kernels::{common, map, matmul}`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_tensor, enables, require_f16};
use super::matmul::{MatmulOptions, matmul_into};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/conv.wgsl");

/// The largest column workspace one chunk of images gathers into (bytes; smaller where
/// the adapter's storage bindings are).
pub const WORKSPACE: usize = 256 << 20;

/// One convolution's shape: input [n, h, w, c] (NHWC), weight [k, c / groups, r, s].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    /// Images.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub k: usize,
    /// Kernel height.
    pub r: usize,
    /// Kernel width.
    pub s: usize,
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Zero padding (height, width).
    pub pad: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Groups (dividing c and k).
    pub groups: usize,
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
    r: u32,
    s: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    groups: u32,
    total: u32,
    src_off: u32,
    dst_off: u32,
    ld: u32,
    k: u32,
}

/// The template values of one variant (mode 0 im2col, 1 col2im, 2 pack the weight, 3
/// unpack its gradient), `w` elements a thread (1 or 4).
pub fn variant(mode: u32, ts: DType, td: DType, w: u32) -> Vec<(&'static str, String)> {
    variant_split(mode, ts, td, w, false)
}

/// [`variant`]; `split`: an im2col writing 4 columns a vector whose source channels are
/// not in fours (each column read on its own).
pub fn variant_split(mode: u32, ts: DType, td: DType, w: u32, split: bool) -> Vec<(&'static str, String)> {
    let v = |t: DType| {
        if w == 4 {
            format!("vec4<{}>", t.wgsl())
        } else {
            t.wgsl().to_string()
        }
    };
    vec![
        ("ENABLE", enables(&[ts, td])),
        ("TS", ts.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("SPLIT", split.to_string()),
        ("VS", if split { ts.wgsl().to_string() } else { v(ts) }),
        ("VD", v(td)),
        ("VA", v(DType::F32)),
        ("MODE", mode.to_string()),
        ("W", w.to_string()),
    ]
}

impl ConvShape {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        let out = |len: usize, k: usize, i: usize| (len + 2 * self.pad[i] - self.dilation[i] * (k - 1) - 1) / self.stride[i] + 1;
        (out(self.h, self.r, 0), out(self.w, self.s, 1))
    }

    /// Columns of one group: c / groups x r x s.
    pub fn per_group(&self) -> usize {
        self.c / self.groups * self.r * self.s
    }

    /// A group's width in the columns and the packed weight: [`ConvShape::per_group`]
    /// rounded up to a multiple of 8 (one group, gathered columns), else itself.
    pub fn ld(&self) -> usize {
        if self.groups == 1 && !self.direct() {
            self.per_group().next_multiple_of(8)
        } else {
            self.per_group()
        }
    }

    /// Elements a gather thread handles: 4 where a group's channels (and so the
    /// columns' runs) are a multiple of 4.
    fn width(&self) -> u32 {
        let cg = self.c / self.groups;
        if cg.is_multiple_of(4) && self.ld().is_multiple_of(4) {
            4
        } else {
            1
        }
    }

    /// The weight's shape.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.k, self.c / self.groups, self.r, self.s]
    }

    /// Refuses shapes no convolution has, naming what is wrong.
    pub fn check(&self, what: &str) -> Result<(), Error> {
        let dims = [self.n, self.h, self.w, self.c, self.k, self.r, self.s, self.groups];
        if dims.contains(&0) || self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err(Error::shape(what, "non-zero sizes, strides and dilations", format!("{self:?}")));
        }
        if !self.c.is_multiple_of(self.groups) || !self.k.is_multiple_of(self.groups) {
            return Err(Error::shape(
                what,
                format!("channels divisible by the {} groups", self.groups),
                format!("{} in, {} out", self.c, self.k),
            ));
        }
        for (i, (len, k)) in [(self.h, self.r), (self.w, self.s)].into_iter().enumerate() {
            if len + 2 * self.pad[i] < self.dilation[i] * (k - 1) + 1 {
                return Err(Error::shape(
                    what,
                    "an input at least as large as the (dilated) kernel after padding",
                    format!("{}x{} input, {}x{} kernel, padding {:?}", self.h, self.w, self.r, self.s, self.pad),
                ));
            }
        }
        let (p, q) = self.out_hw();
        let most = [
            self.n * self.h * self.w * self.c,
            self.n * p * q * self.k,
            self.n * p * q * self.groups * self.ld(),
            self.k * self.ld() * 64,
        ];
        if most.iter().any(|&e| e > u32::MAX as usize) {
            return Err(Error::shape(what, "fewer than 2^32 elements per tensor", format!("{self:?}")));
        }
        Ok(())
    }

    /// Whether the activations are the product's matrix (1x1, stride 1, no padding).
    pub fn direct(&self) -> bool {
        self.r == 1 && self.s == 1 && self.stride == [1, 1] && self.pad == [0, 0]
    }

    /// Images per chunk of the column workspace for elements of `bytes`.
    pub fn chunk(&self, rt: &Runtime, bytes: usize) -> usize {
        if self.direct() {
            return self.n;
        }
        let cap = WORKSPACE.min(rt.gpu.caps.limits.max_storage_buffer_binding_size as usize);
        let (p, q) = self.out_hw();
        let per_image = p * q * self.groups * self.ld() * bytes.max(4);
        (cap / per_image.max(1)).clamp(1, self.n)
    }

    fn params(&self, threads: usize, src_off: usize, dst_off: usize) -> Params {
        let (p, q) = self.out_hw();
        Params {
            n: self.n as u32,
            h: self.h as u32,
            w: self.w as u32,
            c: self.c as u32,
            p: p as u32,
            q: q as u32,
            r: self.r as u32,
            s: self.s as u32,
            sh: self.stride[0] as u32,
            sw: self.stride[1] as u32,
            ph: self.pad[0] as u32,
            pw: self.pad[1] as u32,
            dh: self.dilation[0] as u32,
            dw: self.dilation[1] as u32,
            groups: self.groups as u32,
            total: threads as u32,
            src_off: src_off as u32,
            dst_off: dst_off as u32,
            ld: self.ld() as u32,
            k: self.k as u32,
        }
    }
}

/// Rows one im2col thread writes (RB in shaders/conv.wgsl).
const ROWS_A_THREAD: usize = 8;

fn gather(rt: &Runtime, mode: u32, shape: &ConvShape, src: &Tensor, dst: &Tensor) -> Result<(), Error> {
    let (ts, td) = (src.dtype(), dst.dtype());
    check_tensor("convolution gather source", src, ts)?;
    check_tensor("convolution gather destination", dst, td)?;
    if !src.is_contiguous() || !dst.is_contiguous() {
        return Err(Error::invalid("convolution gather", "contiguous tensors"));
    }
    require_f16(rt, &[ts, td])?;
    // The weight passes go one element a thread; the gathers 4 where the offsets allow,
    // and im2col writes 4 columns a vector wherever the rows are in fours (reading
    // them one by one where the channels are not: the stem's 3).
    let aligned = src.offset() % 4 == 0 && dst.offset() % 4 == 0;
    let w = if mode < 2 && shape.width() == 4 && aligned { 4 } else { 1 };
    let split = mode == 0 && w == 1 && shape.groups == 1 && shape.ld() % 4 == 0 && dst.offset() % 4 == 0;
    let w = if split { 4 } else { w };
    let kernel = rt.kernel(
        KernelKey::new("conv", &[mode, ts as u32, td as u32, w, u32::from(split)]),
        2,
        || {
            format!(
                "conv {} {}->{}{}",
                ["im2col", "col2im", "pack", "unpack"][mode as usize],
                ts.wgsl(),
                td.wgsl(),
                if split {
                    " split4"
                } else if w == 4 {
                    " vec4"
                } else {
                    ""
                }
            )
        },
        || render("conv", SOURCE, &variant_split(mode, ts, td, w, split)),
    )?;
    // im2col's threads each write one vector of ROWS_A_THREAD rows.
    let threads = if mode == 0 {
        let cols = shape.groups * shape.ld();
        (dst.numel() / cols).div_ceil(ROWS_A_THREAD) * (cols / w as usize)
    } else {
        dst.numel() / w as usize
    };
    let params = shape.params(threads, src.offset(), dst.offset());
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[src, dst],
        grid(threads.div_ceil(256) as u32),
    )
}

/// The weight [K, Cg, R, S] as the products read it: [K, LD] in (r, s, c) order with
/// zero pad columns, in `dtype` (a Temporary block).
pub fn pack_weight(rt: &Runtime, w: &Tensor, shape: &ConvShape, dtype: DType) -> Result<Tensor, Error> {
    if w.shape() != shape.weight_shape() || !w.is_contiguous() {
        return Err(Error::shape(
            "convolution weight",
            format!("{:?}", shape.weight_shape()),
            format!("{:?}", w.shape()),
        ));
    }
    let packed = Tensor::empty(rt, &[shape.k, shape.ld()], dtype, Category::Temporary, "conv.w.packed")?;
    gather(rt, 2, shape, w, &packed)?;
    Ok(packed)
}

/// Images `n0 .. n0 + nb` of `x` [N, H, W, C] as their columns [nb P Q, G LD] in
/// `dtype` (a Temporary block).
pub fn im2col(rt: &Runtime, x: &Tensor, shape: &ConvShape, n0: usize, nb: usize, dtype: DType) -> Result<Tensor, Error> {
    let (p, q) = shape.out_hw();
    let cols = Tensor::empty(
        rt,
        &[nb * p * q, shape.groups * shape.ld()],
        dtype,
        Category::Temporary,
        "conv.cols",
    )?;
    let sub = ConvShape { n: nb, ..*shape };
    gather(rt, 0, &sub, &x.slice(0, n0, nb)?, &cols)?;
    Ok(cols)
}

/// Per-group products C[:, g] = A[:, g] @ B_g for `groups` column blocks of A (width
/// `ka`) and of C (width `nc`), B_g = `b(g)`; with a bias (or one group) one product a
/// group, else one batched launch.
fn grouped(
    rt: &Runtime,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    groups: usize,
    b_of: impl Fn(&Tensor, usize) -> Result<Tensor, Error>,
    opts: &MatmulOptions,
) -> Result<(), Error> {
    if groups == 1 {
        return matmul_into(rt, a, &b_of(b, 0)?, c, opts);
    }
    let (ka, nc) = (a.shape()[1] / groups, c.shape()[1] / groups);
    for g in 0..groups {
        let bias = opts.bias.map(|t| t.slice(0, g * nc, nc)).transpose()?;
        let o = MatmulOptions {
            bias: bias.as_ref(),
            ..*opts
        };
        matmul_into(rt, &a.slice(1, g * ka, ka)?, &b_of(b, g)?, &c.slice(1, g * nc, nc)?, &o)?;
    }
    Ok(())
}

/// Checks `x` [N, H, W, C] and the packed weight `w` [K, LD] against `shape`.
fn check_operands(shape: &ConvShape, x: &Tensor, w: &Tensor) -> Result<(), Error> {
    shape.check("convolution")?;
    if x.shape() != [shape.n, shape.h, shape.w, shape.c] || !x.is_contiguous() {
        return Err(Error::shape(
            "convolution input",
            format!("a contiguous NHWC [{}, {}, {}, {}]", shape.n, shape.h, shape.w, shape.c),
            format!("{:?}", x.shape()),
        ));
    }
    if w.shape() != [shape.k, shape.ld()] || !w.is_contiguous() {
        return Err(Error::shape(
            "convolution packed weight",
            format!("[{}, {}]", shape.k, shape.ld()),
            format!("{:?}", w.shape()),
        ));
    }
    Ok(())
}

/// y [N, P, Q, K] in `out` = conv(x, w) + bias; x and the packed weight `w`
/// ([`pack_weight`]) in the products' dtype (both f16 or both f32), f32 accumulation.
pub fn forward(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    shape: &ConvShape,
    out: DType,
    label: &str,
) -> Result<Tensor, Error> {
    check_operands(shape, x, w)?;
    let (p, q) = shape.out_hw();
    let (k, g) = (shape.k, shape.groups);
    let y = Tensor::empty(rt, &[shape.n, p, q, k], out, Category::Activation, label)?;
    let wm = w.clone();
    let kg = k / g;
    let opts = MatmulOptions {
        bias,
        ..Default::default()
    };
    let chunk = shape.chunk(rt, x.dtype().size());
    for n0 in (0..shape.n).step_by(chunk) {
        let nb = chunk.min(shape.n - n0);
        let rows = nb * p * q;
        let a = if shape.direct() {
            x.slice(0, n0, nb)?.reshape(&[rows, shape.c])?
        } else {
            im2col(rt, x, shape, n0, nb, x.dtype())?
        };
        let c = y.slice(0, n0, nb)?.reshape(&[rows, k])?;
        grouped(rt, &a, &wm, &c, g, |w, gi| w.slice(0, gi * kg, kg)?.transpose(0, 1), &opts)?;
    }
    Ok(y)
}

/// dx [N, H, W, C] (in `out`, f32 or f16, `category`) from dy [N, P, Q, K] and the
/// packed weight, both in the products' dtype. The products accumulate in f32; an f16
/// dx has f16 columns too (half the bytes written and read again), which col2im sums
/// in f32, as autocast's f16 input gradient.
pub fn backward_input(
    rt: &Runtime,
    dy: &Tensor,
    w: &Tensor,
    shape: &ConvShape,
    (out, category): (DType, Category),
) -> Result<Tensor, Error> {
    shape.check("convolution")?;
    let (p, q) = shape.out_hw();
    let (k, ld, g, c) = (shape.k, shape.ld(), shape.groups, shape.c);
    let dx = Tensor::empty(rt, &[shape.n, shape.h, shape.w, c], out, category, "dx")?;
    let wm = w.clone();
    let kg = k / g;
    let opts = MatmulOptions::default();
    let b_of = |w: &Tensor, gi: usize| w.slice(0, gi * kg, kg);
    let chunk = shape.chunk(rt, 4);
    for n0 in (0..shape.n).step_by(chunk) {
        let nb = chunk.min(shape.n - n0);
        let rows = nb * p * q;
        let a = dy.slice(0, n0, nb)?.reshape(&[rows, k])?;
        if shape.direct() {
            let out = dx.slice(0, n0, nb)?.reshape(&[rows, c])?;
            grouped(rt, &a, &wm, &out, g, b_of, &opts)?;
        } else {
            let dcols = Tensor::empty(rt, &[rows, g * ld], out, Category::Temporary, "conv.dcols")?;
            grouped(rt, &a, &wm, &dcols, g, b_of, &opts)?;
            let sub = ConvShape { n: nb, ..*shape };
            gather(rt, 1, &sub, &dcols, &dx.slice(0, n0, nb)?)?;
        }
    }
    Ok(dx)
}

/// dw [K, Cg, R, S] (f32, `category`) from x [N, H, W, C] and dy [N, P, Q, K], both in
/// the products' dtype: per chunk of images and group, dW_g [Kg, LD] = dy[:, g]^T
/// cols[:, g], its K (the chunk's rows) split into slices summed afterwards where the
/// product alone would leave the device idle; then reordered to PyTorch's layout.
pub fn backward_weight(rt: &Runtime, x: &Tensor, dy: &Tensor, shape: &ConvShape, category: Category) -> Result<Tensor, Error> {
    let (p, q) = shape.out_hw();
    let (k, ld, g) = (shape.k, shape.ld(), shape.groups);
    let kg = k / g;
    let dwp = Tensor::empty(rt, &[k, ld], DType::F32, Category::Temporary, "conv.dw.packed")?;
    let chunk = shape.chunk(rt, x.dtype().size());
    for (i, n0) in (0..shape.n).step_by(chunk).enumerate() {
        let nb = chunk.min(shape.n - n0);
        let rows = nb * p * q;
        let cols = if shape.direct() {
            x.slice(0, n0, nb)?.reshape(&[rows, shape.c])?
        } else {
            im2col(rt, x, shape, n0, nb, x.dtype())?
        };
        let dyc = dy.slice(0, n0, nb)?.reshape(&[rows, k])?;
        for gi in 0..g {
            let a = dyc.slice(1, gi * kg, kg)?.transpose(0, 1)?;
            let b = cols.slice(1, gi * ld, ld)?;
            let out = dwp.slice(0, gi * kg, kg)?;
            split_product(rt, &a, &b, &out, i > 0)?;
        }
    }
    let dw = Tensor::empty(rt, &shape.weight_shape(), DType::F32, category, "weight.grad")?;
    gather(rt, 3, shape, &dwp, &dw)?;
    Ok(dw)
}

/// Rows of K a slice of [`split_product`] takes at least.
const SLICE_ROWS: usize = 1024;
/// The most bytes the slices' partial products take.
const SLICE_BYTES: usize = 64 << 20;

/// c (+)= a @ b for a [M, R] (R long: rows of images), b [R, N], c [M, N] f32: in Z
/// slices of R computed as one batched product into partials, then summed over Z,
/// where one product would run fewer tiles than twice the device's multiprocessors.
fn split_product(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor, accumulate: bool) -> Result<(), Error> {
    let ([m, r], [_, n]) = (a.shape(), b.shape()) else {
        return Err(Error::invalid("convolution weight gradient", "2-D operands"));
    };
    let (m, r, n) = (*m, *r, *n);
    let tiles = m.div_ceil(128) * n.div_ceil(128);
    let wave = 2 * rt.gpu.caps.facts.wave() as usize;
    let z = (wave / tiles.max(1)).min(r / SLICE_ROWS).min(SLICE_BYTES / (4 * m * n).max(1));
    if z < 2 {
        let opts = MatmulOptions {
            beta: if accumulate { 1.0 } else { 0.0 },
            ..Default::default()
        };
        return matmul_into(rt, a, b, c, &opts);
    }
    let len = r / z;
    let (sa, sb) = (a.strides().to_vec(), b.strides().to_vec());
    let az = a.as_strided(&[z, m, len], &[len * sa[1], sa[0], sa[1]], a.offset())?;
    let bz = b.as_strided(&[z, len, n], &[len * sb[0], sb[0], sb[1]], b.offset())?;
    let parts = Tensor::empty(rt, &[z, m, n], DType::F32, Category::Temporary, "conv.dw.slices")?;
    matmul_into(rt, &az, &bz, &parts, &MatmulOptions::default())?;
    // The rows past z whole slices, onto the first slice's partial.
    let done = z * len;
    if done < r {
        let opts = MatmulOptions {
            beta: 1.0,
            ..Default::default()
        };
        let first = parts.slice(0, 0, 1)?.reshape(&[m, n])?;
        matmul_into(rt, &a.slice(1, done, r - done)?, &b.slice(0, done, r - done)?, &first, &opts)?;
    }
    let sum = super::reduce::sum_rows(rt, &parts.reshape(&[z, m * n])?, Category::Temporary, "conv.dw.sum")?;
    let sum = sum.reshape(&[m, n])?;
    if accumulate {
        super::map::map_into(rt, super::map::MapOp::Add, Some(&sum), Some(c), c, 1.0, 1.0)
    } else {
        super::map::copy_into(rt, &sum, c)
    }
}
