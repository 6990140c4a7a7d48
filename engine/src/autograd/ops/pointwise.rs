//! Elementwise ops: activations (ReLU, both GELUs, SiLU), dropout, the elementwise
//! product, the cast to f32, and the MSE loss, each with its backward.
//!
//! May call: `autograd::{ops, tape}`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use super::half;
use crate::autograd::tape::{Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::reduce::{ReduceOp, reduce_all};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// An elementwise activation. Under fp16-mixed its input is kept in f16 and its output
/// is f16 (the next linear reads f16 anyway, as autocast's activations are); the
/// gradient is f32.
fn unary(tape: &mut Tape, rt: &Runtime, x: &Var, fwd: MapOp, bwd: MapOp, label: &str) -> Result<Var, Error> {
    let mixed = tape.half_matmuls();
    let out = if mixed { DType::F16 } else { DType::F32 };
    let y = Tensor::empty(rt, x.value.shape(), out, Category::Activation, label)?;
    map_into(rt, fwd, Some(&x.value), None, &y, 1.0, 0.0)?;
    let saved = if mixed {
        half(rt, &x.value, Category::Activation, &format!("{label}.x.f16"))?
    } else {
        x.value.clone()
    };
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |rt, dy, cats| {
            let dx = Tensor::empty(rt, dy.shape(), DType::F32, cats[0], "dx")?;
            map_into(rt, bwd, Some(&saved), Some(dy), &dx, 1.0, 0.0)?;
            Ok(vec![Some(dx)])
        }),
    ))
}

/// max(x, 0).
pub fn relu(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    unary(tape, rt, x, MapOp::Relu, MapOp::ReluBackward, label)
}

/// GPT-2's gelu (tanh approximation, transformers' gelu_new).
pub fn gelu(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    unary(tape, rt, x, MapOp::Gelu, MapOp::GeluBackward, label)
}

/// SiLU (swish): x * sigmoid(x), Llama's MLP activation.
pub fn silu(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    unary(tape, rt, x, MapOp::Silu, MapOp::SiluBackward, label)
}

/// The exact gelu (erf form: torch.nn.GELU(), BERT's "gelu").
pub fn gelu_erf(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    unary(tape, rt, x, MapOp::GeluErf, MapOp::GeluErfBackward, label)
}

/// Inverted dropout with probability `p`: in training mode each element is zeroed with
/// probability p and the rest scaled by 1 / (1 - p); in evaluation mode (or p = 0) the
/// input passes through. The mask is drawn from the tape's seed and `label`, and
/// backward draws it again rather than storing it (nothing is saved).
pub fn dropout(tape: &mut Tape, rt: &Runtime, x: &Var, p: f32, label: &str) -> Result<Var, Error> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::invalid(label, format!("dropout probability must be in [0, 1), not {p}")));
    }
    if !tape.training() || p == 0.0 {
        return Ok(x.clone());
    }
    let seed = tape.mode().seed_for(label);
    let x_in = if x.value.is_contiguous() {
        x.value.clone()
    } else {
        x.value.contiguous(rt)?
    };
    let y = Tensor::empty(rt, x_in.shape(), x_in.dtype(), Category::Activation, label)?;
    crate::kernels::map::dropout_into(rt, &x_in, &y, p, seed)?;
    Ok(tape.record(
        y,
        &[x],
        Box::new(move |rt, dy, cats| {
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            let dx = Tensor::empty(rt, dy.shape(), DType::F32, cats[0], "dx")?;
            crate::kernels::map::dropout_into(rt, &dy, &dx, p, seed)?;
            Ok(vec![Some(dx)])
        }),
    ))
}

/// `x` in f32 (a copy when it is f16: an activation's output under fp16-mixed feeding
/// an op that reads f32, such as LayerNorm); the gradient passes unchanged.
pub fn to_f32(tape: &mut Tape, rt: &Runtime, x: &Var, label: &str) -> Result<Var, Error> {
    if x.value.dtype() == DType::F32 {
        return Ok(x.clone());
    }
    let y = x.value.cast(rt, DType::F32, Category::Activation, label)?;
    Ok(tape.record(y, &[x], Box::new(|_rt, dy, _cats| Ok(vec![Some(dy.clone())]))))
}

/// a * b elementwise (same shapes): SwiGLU's gate.
pub fn mul(tape: &mut Tape, rt: &Runtime, a: &Var, b: &Var, label: &str) -> Result<Var, Error> {
    if a.value.shape() != b.value.shape() {
        return Err(Error::shape(
            label,
            format!("{:?}", a.value.shape()),
            format!("{:?}", b.value.shape()),
        ));
    }
    let y = Tensor::empty(rt, a.value.shape(), DType::F32, Category::Activation, label)?;
    map_into(rt, MapOp::Mul, Some(&a.value), Some(&b.value), &y, 1.0, 1.0)?;
    let (sa, sb) = (a.value.clone(), b.value.clone());
    Ok(tape.record(
        y,
        &[a, b],
        Box::new(move |rt, dy, cats| {
            let da = Tensor::empty(rt, dy.shape(), DType::F32, cats[0], "da")?;
            map_into(rt, MapOp::Mul, Some(dy), Some(&sb), &da, 1.0, 1.0)?;
            let db = Tensor::empty(rt, dy.shape(), DType::F32, cats[1], "db")?;
            map_into(rt, MapOp::Mul, Some(dy), Some(&sa), &db, 1.0, 1.0)?;
            Ok(vec![Some(da), Some(db)])
        }),
    ))
}

/// Mean squared error of `pred` against `target` (same shape, f32), as
/// torch.nn.functional.mse_loss: a one-element loss.
pub fn mse_mean(tape: &mut Tape, rt: &Runtime, pred: &Var, target: &Tensor, label: &str) -> Result<Var, Error> {
    if pred.value.shape() != target.shape() {
        return Err(Error::shape(
            label,
            format!("{:?}", pred.value.shape()),
            format!("{:?}", target.shape()),
        ));
    }
    let n = pred.value.numel().max(1);
    let diff = Tensor::empty(rt, pred.value.shape(), DType::F32, Category::Temporary, &format!("{label}.diff"))?;
    map_into(rt, MapOp::Sub, Some(&pred.value), Some(target), &diff, 1.0, 1.0)?;
    let sq = Tensor::empty(rt, pred.value.shape(), DType::F32, Category::Temporary, &format!("{label}.sq"))?;
    map_into(rt, MapOp::Mul, Some(&diff), Some(&diff), &sq, 1.0, 1.0)?;
    let total = reduce_all(rt, ReduceOp::Sum, &sq.reshape(&[n])?, label)?;
    drop(sq);
    let loss = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    map_into(rt, MapOp::Scale, Some(&total), None, &loss, 1.0 / n as f32, 0.0)?;
    Ok(tape.record(
        loss,
        &[pred],
        Box::new(move |rt, g, cats| {
            // d/dpred = 2 (pred - target) / n, times the upstream gradient.
            let d = Tensor::empty(rt, diff.shape(), DType::F32, cats[0], "dpred")?;
            map_into(rt, MapOp::Mul, Some(&diff), Some(g), &d, 1.0, 1.0)?;
            map_into(rt, MapOp::Scale, Some(&d), None, &d, 2.0 / n as f32, 0.0)?;
            Ok(vec![Some(d)])
        }),
    ))
}
