//! Differentiable ops: each runs its forward kernels, and records a backward that owns
//! only what it needs. Forward and backward of an op sit side by side, as in llm.c.
//!
//! May call: `autograd::tape`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

mod conv;
mod loss;
mod mlp;
mod pointwise;

pub use conv::{BatchNormOptions, batch_norm, conv2d, flatten_nchw, nchw_to_nhwc, pool2d};
pub use loss::{cross_entropy_mean, cross_entropy_smoothed, lm_head_cross_entropy};
pub use mlp::mlp;
pub use pointwise::{dropout, gelu, gelu_erf, mse_mean, mul, relu, silu, to_f32};

use super::tape::{Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::{MatmulOptions, matmul};
use crate::kernels::reduce::{sum_rows, sum_rows_and_half};
use crate::kernels::{embedding as emb, flash_attention as flash, heads, layernorm as ln};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// How a linear layer stores its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// torch.nn.Linear: weight [out, in], y = x W^T + b.
    OutIn,
    /// transformers' Conv1D (GPT-2): weight [in, out], y = x W + b.
    InOut,
}

fn flatten2(t: &Tensor) -> Result<Tensor, Error> {
    let last = *t
        .shape()
        .last()
        .ok_or_else(|| Error::shape("rows", "a tensor of rank >= 1", "a scalar"))?;
    t.reshape(&[t.numel() / last.max(1), last])
}

/// An f16 copy of `t` for a matmul under fp16-mixed (`t` itself when already f16).
pub(crate) fn half(rt: &Runtime, t: &Tensor, category: Category, label: &str) -> Result<Tensor, Error> {
    if t.dtype() == DType::F16 {
        return Ok(t.clone());
    }
    t.cast(rt, DType::F16, category, label)
}

/// The f16 weight a product reads under fp16-mixed: the copy the optimizer keeps
/// (`autograd::half`), else a cast of `w` for this step.
fn weight_half(tape: &Tape, rt: &Runtime, w: &Tensor, label: &str) -> Result<Tensor, Error> {
    match tape.half_weight(w) {
        Some(h) => Ok(h),
        None => half(rt, w, Category::Temporary, &format!("{label}.w.f16")),
    }
}

/// y = x W^T + b (OutIn) or x W + b (InOut) over the last dimension of x, with an
/// optional activation fused into the matmul's epilogue (its backward is recorded too).
///
/// Under fp16-mixed ([`Tape::half_matmuls`]) x and W are cast to f16 once, those f16
/// copies are what backward keeps (half the bytes of the f32 input), and every matmul
/// (forward, dx, dW) reads f16 and accumulates and writes f32, as torch.autocast's
/// linear with f32 master weights; the bias and its gradient stay f32.
pub fn linear(tape: &mut Tape, rt: &Runtime, x: &Var, w: &Var, b: Option<&Var>, layout: WeightLayout, label: &str) -> Result<Var, Error> {
    linear_as(tape, rt, x, w, b, layout, DType::F32, label)
}

/// [`linear`] writing its output in `out` (f16 under fp16-mixed when the consumer is
/// attention or an activation, which keep f16 inputs anyway: half the bytes, no cast).
/// Gradients stay f32.
#[allow(clippy::too_many_arguments)]
pub fn linear_as(
    tape: &mut Tape,
    rt: &Runtime,
    x: &Var,
    w: &Var,
    b: Option<&Var>,
    layout: WeightLayout,
    out: DType,
    label: &str,
) -> Result<Var, Error> {
    linear_then(tape, rt, (x, w, b), layout, out, None, label)
}

/// [`linear_as`] followed by an elementwise activation (`act`: [`MapOp::Gelu`],
/// [`MapOp::GeluErf`] or [`MapOp::Silu`]; its output labelled `act_label`), recorded as
/// one node: backward sums the bias gradient of the activation's input gradient, and
/// writes the copy the products read, in the pass that forms it from the activation's
/// output gradient (no launch of the activation's backward, and no f32 input gradient
/// under fp16-mixed). The same values as [`linear_as`] then the activation's op.
#[allow(clippy::too_many_arguments)]
pub fn linear_act_as(
    tape: &mut Tape,
    rt: &Runtime,
    (x, w, b): (&Var, &Var, Option<&Var>),
    layout: WeightLayout,
    out: DType,
    act: MapOp,
    (label, act_label): (&str, &str),
) -> Result<Var, Error> {
    let bwd = match act {
        MapOp::Gelu => MapOp::GeluBackward,
        MapOp::GeluErf => MapOp::GeluErfBackward,
        MapOp::Silu => MapOp::SiluBackward,
        other => return Err(Error::invalid(label, format!("{other:?} is no activation a linear fuses"))),
    };
    linear_then(tape, rt, (x, w, b), layout, out, Some((act, bwd, act_label)), label)
}

/// A linear, and the activation after it where `act` says (forward op, backward op,
/// output label).
fn linear_then(
    tape: &mut Tape,
    rt: &Runtime,
    (x, w, b): (&Var, &Var, Option<&Var>),
    layout: WeightLayout,
    out: DType,
    act: Option<(MapOp, MapOp, &str)>,
    label: &str,
) -> Result<Var, Error> {
    let mixed = tape.half_matmuls();
    let x2 = flatten2(&x.value)?;
    let (x2, w_used) = if mixed {
        (
            half(rt, &x2, Category::Activation, &format!("{label}.x.f16"))?,
            weight_half(tape, rt, &w.value, label)?,
        )
    } else {
        (x2, w.value.clone())
    };
    let wt = match layout {
        WeightLayout::OutIn => w_used.transpose(0, 1)?,
        WeightLayout::InOut => w_used.clone(),
    };
    let opts = MatmulOptions {
        bias: b.map(|b| &b.value),
        ..Default::default()
    };
    let y2 = matmul(rt, &x2, &wt, out, &opts, Category::Activation, label)?;
    let mut shape = x.value.shape().to_vec();
    *shape.last_mut().expect("checked by flatten2") = y2.shape()[1];
    // With an activation: its output is the node's, and y2 (its input) is kept.
    let (y, pre) = match act {
        Some((fwd, _, act_label)) => {
            let g = Tensor::empty(rt, &shape, out, Category::Activation, act_label)?;
            map_into(rt, fwd, Some(&y2.reshape(&shape)?), None, &g, 1.0, 0.0)?;
            (g, Some(y2))
        }
        None => (y2.reshape(&shape)?, None),
    };
    let act_grad = act.map(|a| a.1);
    let inputs: Vec<&Var> = match b {
        Some(b) => vec![x, w, b],
        None => vec![x, w],
    };
    let has_bias = b.is_some();
    Ok(tape.record(
        y,
        &inputs,
        Box::new(move |rt, dy, cats| {
            // Nothing but the tape holds dy: in f32 the activation's backward may write
            // over it.
            let dy_owned = dy.is_unique();
            let dy2 = flatten2(dy)?;
            // The weight's and bias's gradients first: their temporaries (split-K
            // partials, column-sum partials) are freed before dx, the largest, exists.
            // Under fp16-mixed an f32 dy is summed for the bias in the pass that writes
            // its f16 copy for the products (one read of dy, no cast of its own).
            let whole = |t: Tensor| if t.is_contiguous() { Ok(t) } else { t.contiguous(rt) };
            let mut dy2 = dy2;
            if let (Some(op), Some(pre)) = (act_grad, &pre) {
                if has_bias && dy2.dtype() == DType::F32 {
                    // The activation's backward in the bias-sum pass: its product with
                    // dy is the dy the products read (f16 under fp16-mixed; in f32
                    // written over dy where the tape's is the only hold on it, so no
                    // second gradient of that size exists).
                    let dy2 = whole(dy2)?;
                    let dy_act = if mixed {
                        Tensor::empty(rt, dy2.shape(), DType::F16, Category::Temporary, "dy.act")?
                    } else if dy_owned && dy2.offset() == 0 {
                        dy2.clone()
                    } else {
                        Tensor::empty(rt, dy2.shape(), DType::F32, Category::Temporary, "dy.act")?
                    };
                    let db = crate::kernels::reduce::sum_rows_through(rt, &dy2, (op, pre), &dy_act, None, cats[2], "bias.grad")?;
                    // The node is named after the activation's output; its products are
                    // the linear's (named after its output, the pre-activation), as the
                    // profiler and the memory timeline show them.
                    let outer = rt.alloc.set_scope(pre.block().label().map(Into::into));
                    let grads = linear_products(rt, (&x2, &w_used), layout, dy_act, || Ok(Some(db)), dy.shape(), cats);
                    rt.alloc.set_scope(outer);
                    return grads;
                }
                let d = Tensor::empty(rt, dy2.shape(), DType::F32, Category::Temporary, "dx")?;
                map_into(rt, op, Some(pre), Some(&dy2), &d, 1.0, 0.0)?;
                dy2 = d;
            }
            let (dy_mm, fused_db) = if mixed && has_bias && dy2.dtype() == DType::F32 {
                let dy2 = whole(dy2.clone())?;
                let dy16 = Tensor::empty(rt, dy2.shape(), DType::F16, Category::Temporary, "dy.f16")?;
                let db = sum_rows_and_half(rt, &dy2, &dy16, cats[2], "bias.grad")?;
                (dy16, Some(db))
            } else if mixed {
                (half(rt, &dy2, Category::Temporary, "dy.f16")?, None)
            } else {
                (dy2.clone(), None)
            };
            let db = move || match fused_db {
                Some(db) => Ok(Some(db)),
                None if has_bias => Ok(Some(sum_rows(rt, &whole(dy2)?, cats[2], "bias.grad")?)),
                None => Ok(None),
            };
            linear_products(rt, (&x2, &w_used), layout, dy_mm, db, dy.shape(), cats)
        }),
    ))
}

/// A linear's dW and dx products from the dy they read (`dy_mm`, [rows, out]), the
/// bias gradient `db` (None without a bias) made between them: the gradients of (x, w,
/// b) in that order.
fn linear_products(
    rt: &Runtime,
    (x2, w_used): (&Tensor, &Tensor),
    layout: WeightLayout,
    dy_mm: Tensor,
    db: impl FnOnce() -> Result<Option<Tensor>, Error>,
    dy_shape: &[usize],
    cats: &[Category],
) -> Result<Vec<Option<Tensor>>, Error> {
    // dW = dy^T x (OutIn) or x^T dy (InOut).
    let (a, b) = match layout {
        WeightLayout::OutIn => (dy_mm.transpose(0, 1)?, x2.clone()),
        WeightLayout::InOut => (x2.transpose(0, 1)?, dy_mm.clone()),
    };
    let dw = matmul(rt, &a, &b, DType::F32, &MatmulOptions::default(), cats[1], "weight.grad")?;
    let db = db()?;
    // dx = dy W (OutIn) or dy W^T (InOut).
    let w_for_dx = match layout {
        WeightLayout::OutIn => w_used.clone(),
        WeightLayout::InOut => w_used.transpose(0, 1)?,
    };
    let dx2 = matmul(rt, &dy_mm, &w_for_dx, DType::F32, &MatmulOptions::default(), cats[0], "dx")?;
    let dx = dx2.reshape(x2_shape(x2, dy_shape).as_slice())?;
    let mut out = vec![Some(dx), Some(dw)];
    out.extend(db.map(Some));
    Ok(out)
}

/// A language model's next-token logits [B, V] from its final hidden states h
/// [B, T, C] and head weight W [V, C]: the head on the last position only (generation:
/// the other positions' logits are never made).
pub fn last_position_logits(tape: &mut Tape, rt: &Runtime, h: &Var, w: &Var) -> Result<Var, Error> {
    let [b, t, c] = *h.value.shape() else {
        return Err(Error::shape("next-token logits", "h [B, T, C]", format!("{:?}", h.value.shape())));
    };
    if t == 0 {
        return Err(Error::shape("next-token logits", "at least one position", "none"));
    }
    let last = h.value.slice(1, t - 1, 1)?.contiguous(rt)?.reshape(&[b, c])?;
    let last = tape.constant(last);
    linear(tape, rt, &last, w, None, WeightLayout::OutIn, "lm_head")
}

fn x2_shape(x2: &Tensor, dy_shape: &[usize]) -> Vec<usize> {
    let mut shape = dy_shape.to_vec();
    *shape.last_mut().expect("dy has a last dim") = x2.shape()[1];
    shape
}

/// a + b, with b broadcast to a's shape.
pub fn add(tape: &mut Tape, rt: &Runtime, a: &Var, b: &Var, label: &str) -> Result<Var, Error> {
    let y = Tensor::empty(rt, a.value.shape(), DType::F32, Category::Activation, label)?;
    map_into(rt, MapOp::Add, Some(&a.value), Some(&b.value), &y, 1.0, 1.0)?;
    let (a_shape, b_shape) = (a.value.shape().to_vec(), b.value.shape().to_vec());
    Ok(tape.record(
        y,
        &[a, b],
        Box::new(move |rt, dy, cats| {
            let db = if b_shape == a_shape {
                dy.clone()
            } else {
                // Sum dy over the broadcast leading dims: column sums of dy as [N, C].
                let rows = dy.numel() / b_shape.iter().product::<usize>().max(1);
                let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
                let dy2 = dy.reshape(&[rows, dy.numel() / rows.max(1)])?;
                sum_rows(rt, &dy2, cats[1], "bias.grad")?.reshape(&b_shape)?
            };
            Ok(vec![Some(dy.clone()), Some(db)])
        }),
    ))
}

/// LayerNorm over the last dimension with f32 weight and bias.
pub fn layernorm(tape: &mut Tape, rt: &Runtime, x: &Var, w: &Var, b: &Var, eps: f32, label: &str) -> Result<Var, Error> {
    layernorm_as(tape, rt, x, w, b, eps, DType::F32, label)
}

/// [`layernorm`] writing its output as `out`: f16 under fp16-mixed when the consumer is
/// a product, which would cast it anyway (the same values, no cast of its own). The
/// gradient stays f32.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_as(tape: &mut Tape, rt: &Runtime, x: &Var, w: &Var, b: &Var, eps: f32, out: DType, label: &str) -> Result<Var, Error> {
    let (y, saved) = ln::forward_as(rt, &x.value, &w.value, &b.value, eps, out, label)?;
    Ok(record_layernorm(tape, y, saved, (x, w, b)))
}

/// x + r, then [`layernorm_as`] of the sum, from one launch: returns the sum (the
/// residual stream, `labels.0`) and the normalised output (`labels.1`). Backward is the
/// add's (the sum's gradient to both) and the LayerNorm's, which folds the sum's
/// gradient from its other uses into its own launch.
#[allow(clippy::too_many_arguments)]
pub fn add_layernorm_as(
    tape: &mut Tape,
    rt: &Runtime,
    (x, r): (&Var, &Var),
    w: &Var,
    b: &Var,
    eps: f32,
    out: DType,
    labels: (&str, &str),
) -> Result<(Var, Var), Error> {
    let foldable = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
    if x.value.shape() != r.value.shape() || !foldable(&x.value) || !foldable(&r.value) {
        // The kernel adds same-shaped contiguous f32 tensors; anything else goes apart.
        let sum = add(tape, rt, x, r, labels.0)?;
        let y = layernorm_as(tape, rt, &sum, w, b, eps, out, labels.1)?;
        return Ok((sum, y));
    }
    let (sum, y, saved) = ln::add_forward_as(rt, (&x.value, &r.value), &w.value, &b.value, eps, out, labels)?;
    let sum = tape.record(sum, &[x, r], Box::new(|_, dy, _| Ok(vec![Some(dy.clone()), Some(dy.clone())])));
    let y = record_layernorm(tape, y, saved, (&sum, w, b));
    Ok((sum, y))
}

/// Records a LayerNorm's output `y` of `(x, w, b)`: its backward writes x's whole
/// gradient, the gradient from x's other uses added in the same launch.
fn record_layernorm(tape: &mut Tape, y: Tensor, saved: ln::LayerNormSaved, (x, w, b): (&Var, &Var, &Var)) -> Var {
    let (xs, ws) = (x.value.clone(), w.value.clone());
    tape.record_folding(
        y,
        &[x, w, b],
        0,
        Box::new(move |rt, dy, cats, so_far| {
            let c = ws.numel();
            let dw = Tensor::empty(rt, &[c], DType::F32, cats[1], "weight.grad")?;
            let db = Tensor::empty(rt, &[c], DType::F32, cats[2], "bias.grad")?;
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            let foldable = |t: &Tensor| t.dtype() == DType::F32 && xs.dtype() == DType::F32 && t.shape() == xs.shape() && t.is_contiguous();
            let dx = match so_far {
                Some(g) if foldable(&g) => ln::backward_adding(rt, &xs, &ws, &saved, &dy, (&dw, &db), &g, "dx")?,
                so_far => {
                    let dx = ln::backward(rt, &xs, &ws, &saved, &dy, (&dw, &db), "dx")?;
                    crate::autograd::tape::fold_gradient(rt, so_far, dx)?
                }
            };
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }),
    )
}

/// RMSNorm over the last dimension with an f32 weight (Llama's): x / sqrt(mean(x^2) +
/// eps) * w.
pub fn rmsnorm(tape: &mut Tape, rt: &Runtime, x: &Var, w: &Var, eps: f32, label: &str) -> Result<Var, Error> {
    let (y, saved) = ln::forward_rms(rt, &x.value, &w.value, eps, label)?;
    let (xs, ws) = (x.value.clone(), w.value.clone());
    Ok(tape.record(
        y,
        &[x, w],
        Box::new(move |rt, dy, cats| {
            let dw = Tensor::empty(rt, &[ws.numel()], DType::F32, cats[1], "weight.grad")?;
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            let dx = ln::backward_rms(rt, &xs, &ws, &saved, &dy, &dw, "dx")?;
            Ok(vec![Some(dx), Some(dw)])
        }),
    ))
}

/// Attention's packed input qkv [B, T, 3 H D] from projections q [B, T, H D] and k, v
/// [B, T, KV D] (grouped-query heads: KV divides H), q and k rotated by the rotary
/// tables (cos, sin) [T, D/2] when given. Nothing is saved for backward but the tables.
pub fn pack_heads(
    tape: &mut Tape,
    rt: &Runtime,
    (q, k, v): (&Var, &Var, &Var),
    rope: Option<(&Tensor, &Tensor)>,
    hs: heads::Heads,
    label: &str,
) -> Result<Var, Error> {
    let contiguous = |t: &Tensor| if t.is_contiguous() { Ok(t.clone()) } else { t.contiguous(rt) };
    let dt = q.value.dtype();
    let same = |t: &Tensor| {
        if t.dtype() == dt {
            contiguous(t)
        } else {
            t.cast(rt, dt, Category::Activation, label)
        }
    };
    let y = heads::pack(rt, &contiguous(&q.value)?, &same(&k.value)?, &same(&v.value)?, rope, hs, label)?;
    let tables = rope.map(|(c, s)| (c.clone(), s.clone()));
    Ok(tape.record(
        y,
        &[q, k, v],
        Box::new(move |rt, dy, cats| {
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            let [dq, dk, dv] = heads::unpack(rt, &dy, tables.as_ref().map(|(c, s)| (c, s)), hs, [cats[0], cats[1], cats[2]])?;
            Ok(vec![Some(dq), Some(dk), Some(dv)])
        }),
    ))
}

/// Rows of `table` picked by `ids` (i32): shape ids.shape + [C].
pub fn embedding(tape: &mut Tape, rt: &Runtime, ids: &Tensor, table: &Var, label: &str) -> Result<Var, Error> {
    embedding_padded(tape, rt, ids, table, None, label)
}

/// [`embedding`] whose row `padding_idx` gets no gradient from this lookup
/// (torch.nn.Embedding's `padding_idx`: BERT's pad token).
pub fn embedding_padded(
    tape: &mut Tape,
    rt: &Runtime,
    ids: &Tensor,
    table: &Var,
    padding_idx: Option<usize>,
    label: &str,
) -> Result<Var, Error> {
    let y = emb::gather(rt, ids, &table.value, label)?;
    let (ids, shape) = (ids.clone(), table.value.shape().to_vec());
    if let Some(p) = padding_idx
        && p >= shape[0]
    {
        return Err(Error::shape(label, format!("a padding index below {}", shape[0]), p));
    }
    Ok(tape.record(
        y,
        &[table],
        Box::new(move |rt, dy, cats| {
            let dtable = Tensor::full(rt, &shape, DType::F32, 0.0, cats[0], "dtable")?;
            emb::scatter_add(rt, &ids, dy, &dtable)?;
            if let Some(p) = padding_idx {
                let row = dtable.as_strided(&[shape[1]], &[1], p * shape[1])?;
                crate::kernels::map::fill(rt, &row, 0.0)?;
            }
            Ok(vec![Some(dtable)])
        }),
    ))
}

/// Causal self-attention of qkv [B, T, 3C] with `nh` heads -> [B, T, C], fused (flash
/// attention: only the output and the per-row log-sum-exp are kept for backward, the
/// probabilities are recomputed there). Under fp16-mixed q, k, v and the output are f16
/// (computed in f32); the gradient is f32.
pub fn attention(tape: &mut Tape, rt: &Runtime, qkv: &Var, nh: usize, label: &str) -> Result<Var, Error> {
    let input = if tape.half_matmuls() {
        half(rt, &qkv.value, Category::Activation, &format!("{label}.qkv.f16"))?
    } else {
        qkv.value.clone()
    };
    let saved = flash::forward(rt, &input, nh, label)?;
    let y = saved.y.clone();
    let qkv_saved = input;
    let dlabel = format!("{label}.dqkv");
    Ok(tape.record(
        y,
        &[qkv],
        Box::new(move |rt, dy, _cats| {
            let dy = if dy.is_contiguous() && dy.offset() == 0 {
                dy.clone()
            } else {
                dy.contiguous(rt)?
            };
            Ok(vec![Some(flash::backward(rt, &qkv_saved, nh, &saved, &dy, &dlabel)?)])
        }),
    ))
}

/// Self-attention of qkv [B, T, 3C] with `nh` heads over every key (not causal), keys
/// where `key_bias` [B, 1, 1, T] is a large negative number left out (padding), as
/// BERT's encoder attends. Composed of batched matmuls and a softmax that keeps the
/// [B, NH, T, T] probabilities for backward (the fused kernels are causal only).
pub fn attention_bidirectional(
    tape: &mut Tape,
    rt: &Runtime,
    qkv: &Var,
    nh: usize,
    key_bias: Option<&Tensor>,
    label: &str,
) -> Result<Var, Error> {
    let input = if tape.half_matmuls() {
        half(rt, &qkv.value, Category::Activation, &format!("{label}.qkv.f16"))?
    } else if qkv.value.is_contiguous() {
        qkv.value.clone()
    } else {
        qkv.value.contiguous(rt)?
    };
    let (y, saved) = crate::kernels::attention::forward_masked(rt, &input, nh, (false, key_bias), label)?;
    Ok(tape.record(
        y,
        &[qkv],
        Box::new(move |rt, dy, _cats| {
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            Ok(vec![Some(crate::kernels::attention::backward(
                rt, &input, nh, &saved, &dy, "dqkv",
            )?)])
        }),
    ))
}

/// A recomputable piece of a model: runs on its input values and returns its output.
pub type Segment = std::rc::Rc<dyn Fn(&mut Tape, &Runtime, &[Var]) -> Result<Var, Error>>;

/// Segment `index` of a model (a transformer's block) on `inputs`: recomputed in
/// backward ([`checkpoint`]) when the tape's mode checkpoints every k-th segment and
/// this is one of them, run and kept otherwise.
pub fn segment(tape: &mut Tape, rt: &Runtime, index: usize, inputs: &[Var], f: Segment) -> Result<Var, Error> {
    let every = tape.mode().checkpoint_every;
    if every > 0 && index.is_multiple_of(every) {
        let refs: Vec<&Var> = inputs.iter().collect();
        checkpoint(tape, rt, &refs, f)
    } else {
        f(tape, rt, inputs)
    }
}

/// A segment recomputed in backward (activation checkpointing, as
/// torch.utils.checkpoint): `f` runs on `inputs` without recording, so none of its
/// internals stay alive; the output is recorded as one node whose backward runs `f`
/// again on a fresh tape and backpropagates through it. `f` must be deterministic:
/// the fresh tape has this one's [`Mode`](super::tape::Mode), and dropout's masks are a
/// function of the mode's seed and the layer's label, so the recompute draws the same.
///
/// On a tape that gathers sharded parameters (ZeRO 3), the segment's parameters are not
/// kept: backward gathers them again, so they live only while their layer runs.
pub fn checkpoint(tape: &mut Tape, rt: &Runtime, inputs: &[&Var], f: Segment) -> Result<Var, Error> {
    let values: Vec<Tensor> = inputs.iter().map(|v| v.value.clone()).collect();
    let out = {
        let mut inner = tape.child(false);
        let vars: Vec<Var> = values.iter().map(|t| inner.constant(t.clone())).collect();
        f(&mut inner, rt, &vars)?
    };
    let gather = tape.gatherer();
    let template = tape.child(true).for_recompute();
    let kept: Vec<(Option<Tensor>, Option<usize>)> = values
        .into_iter()
        .zip(inputs)
        .map(|(t, v)| match gather.as_ref().and(tape.leaf_index(v.id)) {
            Some(index) => (None, Some(index)),
            None => (Some(t), None),
        })
        .collect();
    Ok(tape.record(
        out.value,
        inputs,
        Box::new(move |rt, g, cats| {
            let mut inner = template.child(true);
            let values = kept
                .iter()
                .map(|(t, index)| match (t, index, &gather) {
                    (Some(t), _, _) => Ok(t.clone()),
                    (None, Some(i), Some(gather)) => gather.gather(*i),
                    _ => Err(Error::invalid("checkpoint", "an input was neither kept nor gatherable")),
                })
                .collect::<Result<Vec<Tensor>, Error>>()?;
            let vars: Vec<Var> = values.iter().map(|t| inner.constant(t.clone())).collect();
            // The segment's forward again, under its own labels, then its backward.
            let scope = rt.alloc.set_scope(None);
            rt.phase("recompute");
            let out = f(&mut inner, rt, &vars);
            rt.phase("backward");
            let out = out?;
            let wanted: Vec<&Var> = vars.iter().collect();
            let grads = inner.gradients_of(rt, &out, g.clone(), &wanted);
            rt.alloc.set_scope(scope);
            let grads = grads?;
            // Parameter gradients are counted as gradients, not temporaries.
            grads
                .into_iter()
                .zip(cats)
                .map(|(g, &cat)| match g {
                    Some(g) if g.block().category() != cat => {
                        let owned = Tensor::empty(rt, g.shape(), g.dtype(), cat, "grad")?;
                        crate::kernels::map::copy_into(rt, &g, &owned)?;
                        Ok(Some(owned))
                    }
                    other => Ok(other),
                })
                .collect()
        }),
    ))
}
