//! Elementwise kernels (shaders/map.wgsl): arithmetic with broadcasting, unary math,
//! activations and their backward forms, casts, fill and strided copies, from one
//! template. Contiguous same-shape launches use the vec4 variant.
//!
//! May call: `error`, `kernels::common`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_tensor, enables, require_f16};
use crate::error::Error;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/map.wgsl");

/// What the map computes, in terms of `a`, `b`, `alpha`, `beta`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// alpha * a + beta * b
    Axpby,
    /// -a
    Neg,
    /// alpha * a
    Scale,
    /// exp(a)
    Exp,
    /// log(a)
    Log,
    /// sqrt(a)
    Sqrt,
    /// 1 / sqrt(a)
    Rsqrt,
    /// tanh(a)
    Tanh,
    /// max(a, 0)
    Relu,
    /// GPT-2's gelu (tanh approximation)
    Gelu,
    /// b * (a > 0): relu's backward (a = input, b = upstream gradient)
    ReluBackward,
    /// b * gelu'(a)
    GeluBackward,
    /// b * (1 - a^2): tanh's backward given the output a
    TanhBackward,
    /// SiLU: a * sigmoid(a)
    Silu,
    /// b * silu'(a)
    SiluBackward,
    /// exact gelu: a * Phi(a) (erf form, BERT's and torch.nn.GELU()'s)
    GeluErf,
    /// b * gelu_erf'(a)
    GeluErfBackward,
    /// a * keep / (1 - alpha) with keep drawn per element from the launch's seed
    /// (inverted dropout with probability alpha; the same seed draws the same mask)
    Dropout,
    /// a (copy or cast)
    Copy,
    /// alpha (fill)
    Fill,
}

impl MapOp {
    /// The WGSL expression.
    pub fn expr(self) -> &'static str {
        match self {
            MapOp::Add => "a + b",
            MapOp::Sub => "a - b",
            MapOp::Mul => "a * b",
            MapOp::Div => "a / b",
            MapOp::Axpby => "S(p.alpha) * a + S(p.beta) * b",
            MapOp::Neg => "-a",
            MapOp::Scale => "S(p.alpha) * a",
            MapOp::Exp => "exp(a)",
            MapOp::Log => "log(a)",
            MapOp::Sqrt => "sqrt(a)",
            MapOp::Rsqrt => "inverseSqrt(a)",
            MapOp::Tanh => "tanh_s(a)",
            MapOp::Relu => "max(a, S(0.0))",
            MapOp::Gelu => "gelu(a)",
            MapOp::ReluBackward => "select(S(0.0), b, a > S(0.0))",
            MapOp::GeluBackward => "b * gelu_grad(a)",
            MapOp::TanhBackward => "b * (S(1.0) - a * a)",
            MapOp::Silu => "a / (S(1.0) + exp(-a))",
            MapOp::SiluBackward => "b * silu_grad(a)",
            MapOp::GeluErf => "gelu_erf(a)",
            MapOp::GeluErfBackward => "b * gelu_erf_grad(a)",
            MapOp::Dropout => "a * dropout_keep(i)",
            MapOp::Copy => "a",
            MapOp::Fill => "S(p.alpha)",
        }
    }

    /// How many tensor inputs it reads.
    pub fn arity(self) -> usize {
        match self {
            MapOp::Fill => 0,
            MapOp::Add
            | MapOp::Sub
            | MapOp::Mul
            | MapOp::Div
            | MapOp::Axpby
            | MapOp::ReluBackward
            | MapOp::GeluBackward
            | MapOp::TanhBackward
            | MapOp::SiluBackward
            | MapOp::GeluErfBackward => 2,
            _ => 1,
        }
    }

    /// Every op with a deterministic reference, for variant tests and benchmarks
    /// (dropout, drawn from a seed, is tested on its own).
    pub const ALL: [MapOp; 23] = [
        MapOp::Add,
        MapOp::Sub,
        MapOp::Mul,
        MapOp::Div,
        MapOp::Axpby,
        MapOp::Neg,
        MapOp::Scale,
        MapOp::Exp,
        MapOp::Log,
        MapOp::Sqrt,
        MapOp::Rsqrt,
        MapOp::Tanh,
        MapOp::Relu,
        MapOp::Gelu,
        MapOp::ReluBackward,
        MapOp::GeluBackward,
        MapOp::TanhBackward,
        MapOp::Silu,
        MapOp::SiluBackward,
        MapOp::GeluErf,
        MapOp::GeluErfBackward,
        MapOp::Copy,
        MapOp::Fill,
    ];
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    shape: [u32; 4],
    a_strides: [u32; 4],
    b_strides: [u32; 4],
    n: u32,
    a_offset: u32,
    b_offset: u32,
    out_offset: u32,
    alpha: f32,
    beta: f32,
    seed: u32,
    pad: u32,
}

/// The template values of one variant.
pub fn variant(op: MapOp, ta: DType, tb: DType, to: DType, lanes: u32) -> Vec<(&'static str, String)> {
    let v = if lanes == 4 { "vec4<f32>".to_string() } else { "f32".to_string() };
    let ty = |t: DType| {
        if lanes == 4 {
            format!("vec4<{}>", t.wgsl())
        } else {
            t.wgsl().to_string()
        }
    };
    let load = |name: &str, arr: &str, idx: &str, used: bool| {
        if used {
            format!("let {name} = V({arr}[{idx}]);")
        } else {
            String::new()
        }
    };
    let (ia, ib) = if lanes == 4 {
        ("p.a_offset / 4u + i", "p.b_offset / 4u + i")
    } else {
        ("ia", "ib")
    };
    let out = if lanes == 4 {
        format!("vec4<{}>", to.wgsl())
    } else {
        to.wgsl().to_string()
    };
    vec![
        ("ENABLE", enables(&[ta, tb, to])),
        ("TA", ty(ta)),
        ("TB", ty(tb)),
        ("TO", out),
        ("V", v),
        ("LOAD_A", load("a", "xa", ia, op.arity() >= 1)),
        ("LOAD_B", load("b", "xb", ib, op.arity() >= 2)),
        ("EXPR", op.expr().to_string()),
        ("LANES", lanes.to_string()),
        (
            "KEEP_LANES",
            (0..lanes).map(|k| format!("keep_one(e + {k}u)")).collect::<Vec<_>>().join(", "),
        ),
        ("ACTIVATIONS", super::common::ACTIVATIONS.to_string()),
    ]
    .into_iter()
    .collect()
}

/// Broadcast strides of `t` against the 4-d output shape `out4` (right-aligned).
fn broadcast_strides(what: &str, t: &Tensor, out: &[usize]) -> Result<[u32; 4], Error> {
    let rank = t.shape().len();
    if rank > out.len() {
        return Err(Error::shape(
            what,
            format!("a shape that broadcasts to {out:?}"),
            format!("{:?}", t.shape()),
        ));
    }
    let mut strides = [0u32; 4];
    let lead = 4 - out.len();
    for (k, (&d, &s)) in t.shape().iter().zip(t.strides()).enumerate() {
        let od = out[out.len() - rank + k];
        if d != od && d != 1 {
            return Err(Error::shape(
                what,
                format!("a shape that broadcasts to {out:?}"),
                format!("{:?}", t.shape()),
            ));
        }
        strides[lead + out.len() - rank + k] = if d == 1 { 0 } else { s as u32 };
    }
    Ok(strides)
}

/// out = op(a, b, alpha, beta), broadcasting a and b to out's shape (out contiguous).
pub fn map_into(rt: &Runtime, op: MapOp, a: Option<&Tensor>, b: Option<&Tensor>, out: &Tensor, alpha: f32, beta: f32) -> Result<(), Error> {
    map_seeded_into(rt, op, a, b, out, (alpha, beta), 0)
}

/// out = a with each element kept with probability 1 - `p` and scaled by 1 / (1 - p),
/// the mask drawn from `seed` and the element's index in `out` (the same seed and shape
/// draw the same mask: dropout's backward applies it to the gradient without storing it).
pub fn dropout_into(rt: &Runtime, a: &Tensor, out: &Tensor, p: f32, seed: u32) -> Result<(), Error> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::invalid("dropout", format!("the probability must be in [0, 1), not {p}")));
    }
    map_seeded_into(rt, MapOp::Dropout, Some(a), None, out, (p, 1.0 / (1.0 - p)), seed)
}

fn map_seeded_into(
    rt: &Runtime,
    op: MapOp,
    a: Option<&Tensor>,
    b: Option<&Tensor>,
    out: &Tensor,
    (alpha, beta): (f32, f32),
    seed: u32,
) -> Result<(), Error> {
    let shape = out.shape();
    if shape.len() > 4 {
        return Err(Error::shape("map", "rank at most 4", format!("{shape:?}")));
    }
    if !out.is_contiguous() {
        return Err(Error::shape(
            "map output",
            "a contiguous tensor",
            format!("{:?} strides {:?}", out.shape(), out.strides()),
        ));
    }
    let inputs = [a, b];
    for (k, t) in inputs.iter().enumerate() {
        if (k < op.arity()) != t.is_some() {
            return Err(Error::invalid(format!("map {op:?}"), format!("takes {} inputs", op.arity())));
        }
    }
    check_tensor("map out", out, out.dtype())?;
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let a = a.unwrap_or(out);
    let b = b.unwrap_or(out);
    check_tensor("map a", a, a.dtype())?;
    check_tensor("map b", b, b.dtype())?;
    let dtypes = [a.dtype(), b.dtype(), out.dtype()];
    require_f16(rt, &dtypes)?;
    let mut shape4 = [1u32; 4];
    for (k, &d) in shape.iter().enumerate() {
        shape4[4 - shape.len() + k] = d as u32;
    }
    let a_strides = broadcast_strides("map a", a, shape)?;
    let b_strides = broadcast_strides("map b", b, shape)?;
    let same = |t: &Tensor| t.shape() == shape && t.is_contiguous() && t.offset().is_multiple_of(4);
    let lanes = if n.is_multiple_of(4) && out.offset().is_multiple_of(4) && same(a) && same(b) {
        4
    } else {
        1
    };
    let params = Params {
        shape: shape4,
        a_strides,
        b_strides,
        n: (n / lanes) as u32,
        a_offset: a.offset() as u32,
        b_offset: b.offset() as u32,
        out_offset: (out.offset() / lanes) as u32,
        alpha,
        beta,
        seed,
        pad: 0,
    };
    let kernel = rt.kernel(
        KernelKey::new(
            "map",
            &[op as u32, a.dtype() as u32, b.dtype() as u32, out.dtype() as u32, lanes as u32],
        ),
        3,
        || {
            format!(
                "map {} {}{}",
                format!("{op:?}").to_lowercase(),
                out.dtype().wgsl(),
                if lanes == 4 { " vec4" } else { "" }
            )
        },
        || render("map", SOURCE, &variant(op, a.dtype(), b.dtype(), out.dtype(), lanes as u32)),
    )?;
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&params),
        &[a, b, out],
        grid((n / lanes).div_ceil(256) as u32),
    )
}

/// A new contiguous tensor: op(a, b) with the shape `out_shape`.
pub fn map(rt: &Runtime, op: MapOp, a: &Tensor, b: Option<&Tensor>, out_shape: &[usize], label: &str) -> Result<Tensor, Error> {
    let out = Tensor::empty(rt, out_shape, a.dtype(), a.block().category(), label)?;
    map_into(rt, op, Some(a), b, &out, 1.0, 1.0)?;
    Ok(out)
}

/// Fills `t` (contiguous) with `value`.
pub fn fill(rt: &Runtime, t: &Tensor, value: f32) -> Result<(), Error> {
    map_into(rt, MapOp::Fill, None, None, t, value, 0.0)
}

/// Copies (and casts) `src`, any strides, into `dst`, contiguous of the same shape.
pub fn copy_into(rt: &Runtime, src: &Tensor, dst: &Tensor) -> Result<(), Error> {
    if src.shape() != dst.shape() {
        return Err(Error::shape(
            "copy",
            format!("{:?} (the destination)", dst.shape()),
            format!("{:?}", src.shape()),
        ));
    }
    map_into(rt, MapOp::Copy, Some(src), None, dst, 1.0, 0.0)
}
