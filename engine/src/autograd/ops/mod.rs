//! Differentiable ops: each runs its forward kernels, and records a backward that owns
//! only what it needs. Forward and backward of an op sit side by side, as in llm.c.
//!
//! May call: `autograd::tape`, `device` (adapter facts), `error`, `kernels`, `memory`,
//! `runtime`, `tensor`.

mod conv;
mod pointwise;

pub use conv::{BatchNormOptions, batch_norm, conv2d, flatten_nchw, nchw_to_nhwc, pool2d};
pub use pointwise::{dropout, gelu, gelu_erf, mse_mean, mul, relu, silu, to_f32};

use super::tape::{Tape, Var};
use crate::device::AdapterFacts;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::{MatmulOptions, matmul, matmul_into};
use crate::kernels::reduce::{ReduceOp, reduce_all, sum_rows};
use crate::kernels::{cross_entropy as ce, embedding as emb, flash_attention as flash, heads, layernorm as ln};
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
    let mixed = tape.half_matmuls();
    let x2 = flatten2(&x.value)?;
    let (x2, w_used) = if mixed {
        (
            half(rt, &x2, Category::Activation, &format!("{label}.x.f16"))?,
            half(rt, &w.value, Category::Temporary, &format!("{label}.w.f16"))?,
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
    let y = y2.reshape(&shape)?;
    let inputs: Vec<&Var> = match b {
        Some(b) => vec![x, w, b],
        None => vec![x, w],
    };
    let has_bias = b.is_some();
    Ok(tape.record(
        y,
        &inputs,
        Box::new(move |rt, dy, cats| {
            let dy2 = flatten2(dy)?;
            let dy_mm = if mixed {
                half(rt, &dy2, Category::Temporary, "dy.f16")?
            } else {
                dy2.clone()
            };
            // The weight's and bias's gradients first: their temporaries (split-K
            // partials, column-sum partials) are freed before dx, the largest, exists.
            // dW = dy^T x (OutIn) or x^T dy (InOut).
            let (a, b) = match layout {
                WeightLayout::OutIn => (dy_mm.transpose(0, 1)?, x2.clone()),
                WeightLayout::InOut => (x2.transpose(0, 1)?, dy_mm.clone()),
            };
            let dw = matmul(rt, &a, &b, DType::F32, &MatmulOptions::default(), cats[1], "weight.grad")?;
            let db = if has_bias {
                let dy2 = if dy2.is_contiguous() { dy2 } else { dy2.contiguous(rt)? };
                Some(sum_rows(rt, &dy2, cats[2], "bias.grad")?)
            } else {
                None
            };
            // dx = dy W (OutIn) or dy W^T (InOut).
            let w_for_dx = match layout {
                WeightLayout::OutIn => w_used.clone(),
                WeightLayout::InOut => w_used.transpose(0, 1)?,
            };
            let dx2 = matmul(rt, &dy_mm, &w_for_dx, DType::F32, &MatmulOptions::default(), cats[0], "dx")?;
            let dx = dx2.reshape(x2_shape(&x2, dy.shape()).as_slice())?;
            let mut out = vec![Some(dx), Some(dw)];
            out.extend(db.map(Some));
            Ok(out)
        }),
    ))
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
    let (y, saved) = ln::forward(rt, &x.value, &w.value, &b.value, eps, label)?;
    let (xs, ws) = (x.value.clone(), w.value.clone());
    Ok(tape.record(
        y,
        &[x, w, b],
        Box::new(move |rt, dy, cats| {
            let c = ws.numel();
            let dw = Tensor::full(rt, &[c], DType::F32, 0.0, cats[1], "weight.grad")?;
            let db = Tensor::full(rt, &[c], DType::F32, 0.0, cats[2], "bias.grad")?;
            let dy = if dy.is_contiguous() { dy.clone() } else { dy.contiguous(rt)? };
            let dx = ln::backward(rt, &xs, &ws, &saved, &dy, (&dw, &db), "dx")?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }),
    ))
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
            let dw = Tensor::full(rt, &[ws.numel()], DType::F32, 0.0, cats[1], "weight.grad")?;
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

/// Mean cross-entropy of logits [N, V] against targets [N] (i32, -100 ignored), as
/// torch.nn.functional.cross_entropy. Forward and the logits' gradient are computed in
/// one fused pass, `row_chunk` rows at a time; the loss is a one-element f32 tensor.
pub fn cross_entropy_mean(
    tape: &mut Tape,
    rt: &Runtime,
    logits: &Var,
    targets: &Tensor,
    n_valid: usize,
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    cross_entropy_smoothed(tape, rt, logits, (targets, n_valid), 0.0, row_chunk, label)
}

/// [`cross_entropy_mean`] with label smoothing `smoothing` in [0, 1)
/// (torch.nn.functional.cross_entropy's `label_smoothing`).
pub fn cross_entropy_smoothed(
    tape: &mut Tape,
    rt: &Runtime,
    logits: &Var,
    (targets, n_valid): (&Tensor, usize),
    smoothing: f32,
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    let lg = flatten2(&logits.value)?;
    let n = lg.shape()[0];
    let losses = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, &format!("{label}.rows"))?;
    let scale = 1.0 / n_valid.max(1) as f32;
    let dlogits = if tape.grad_enabled() {
        Some(Tensor::empty(
            rt,
            lg.shape(),
            DType::F32,
            Category::Activation,
            &format!("{label}.dlogits"),
        )?)
    } else {
        None
    };
    let chunk = row_chunk.max(1);
    for start in (0..n).step_by(chunk) {
        ce::cross_entropy_rows_smoothed(
            rt,
            &lg,
            targets,
            &losses,
            dlogits.as_ref(),
            (scale, smoothing),
            start..(start + chunk).min(n),
        )?;
    }
    let total = reduce_all(rt, ReduceOp::Sum, &losses, label)?;
    let loss = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    map_into(rt, MapOp::Scale, Some(&total), None, &loss, scale, 0.0)?;
    let shape = logits.value.shape().to_vec();
    Ok(tape.record(
        loss,
        &[logits],
        Box::new(move |rt, g, _cats| {
            let d = dlogits.expect("recorded only with gradients enabled");
            // dlogits * upstream gradient (1 for a plain loss, the scale under a scaler).
            map_into(rt, MapOp::Mul, Some(&d), Some(g), &d, 1.0, 1.0)?;
            Ok(vec![Some(d.reshape(&shape)?)])
        }),
    ))
}

/// The tied language-model head and mean cross-entropy in one op that never holds the
/// whole [N, V] logits: for each chunk of `row_chunk` rows, logits = h W^T (W is
/// [V, C]), the fused cross-entropy writes the logits' gradient in place, and with
/// gradients enabled dh = dlogits W and dW += dlogits^T h are formed right away. Peak
/// extra memory is one [row_chunk, V] block instead of two [N, V] ones (logits and
/// their gradient). `targets` are [N] i32 with `n_valid` of them not ignored. Returns the one-element loss; backward scales the stored dh and dW
/// by the upstream gradient.
pub fn lm_head_cross_entropy(
    tape: &mut Tape,
    rt: &Runtime,
    h: &Var,
    w: &Var,
    (targets, n_valid): (&Tensor, usize),
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    let h2 = flatten2(&h.value)?;
    let [n, c] = [h2.shape()[0], h2.shape()[1]];
    let v = w.value.shape()[0];
    if w.value.shape() != [v, c] || targets.shape() != [n] {
        return Err(Error::shape(
            "lm head",
            "h [N, C], W [V, C], targets [N]",
            format!("h {:?}, W {:?}, targets {:?}", h.value.shape(), w.value.shape(), targets.shape()),
        ));
    }
    let grad = tape.grad_enabled();
    let scale = 1.0 / n_valid.max(1) as f32;
    // Gradients are formed here, before backward: under fp16-mixed they carry the
    // expected seed (the loss scale) already, or small ones would underflow in f16.
    let pre = if tape.half_matmuls() { tape.grad_prescale() } else { 1.0 };
    let losses = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, &format!("{label}.rows"))?;
    let dh = if grad {
        Some(Tensor::empty(rt, &[n, c], DType::F32, Category::Temporary, &format!("{label}.dh"))?)
    } else {
        None
    };
    let dw = if grad {
        Some(Tensor::full(
            rt,
            &[v, c],
            DType::F32,
            0.0,
            Category::Temporary,
            &format!("{label}.dW"),
        )?)
    } else {
        None
    };
    // Logit rows are padded to a multiple of 8 elements, so the matmuls that read them
    // load aligned vectors (GPT-2's 50257 would leave them one element at a time); the
    // padding is never read. A chunk must also fit one binding (128 MiB on some
    // adapters).
    let ld = v.next_multiple_of(8);
    let fits = (rt.alloc.config().max_page / (ld.max(1) as u64 * 4)).max(1) as usize;
    let mut chunk = row_chunk.max(1).min(n.max(1)).min(fits);
    let mixed = tape.half_matmuls();
    if grad {
        chunk = chunk_rows(&rt.gpu.caps.facts, chunk, n, ld, v, if mixed { None } else { Some(c) });
    }
    let logits = Tensor::empty(rt, &[chunk, ld], DType::F32, Category::Temporary, &format!("{label}.logits_chunk"))?;
    // fp16-mixed: h and W are cast once; each chunk's logit gradient is cast before its
    // two matmuls. Logits, the loss and the accumulation stay f32.
    let (h2, w_mm) = if mixed {
        (
            half(rt, &h2, Category::Temporary, &format!("{label}.h.f16"))?,
            half(rt, &w.value, Category::Temporary, &format!("{label}.w.f16"))?,
        )
    } else {
        (h2, w.value.clone())
    };
    let grad_half = if mixed && grad {
        Some(Tensor::empty(
            rt,
            &[chunk, ld],
            DType::F16,
            Category::Temporary,
            &format!("{label}.dlogits.f16"),
        )?)
    } else {
        None
    };
    let wt = w_mm.transpose(0, 1)?;
    let parts = vocab_parts(v);
    for start in (0..n).step_by(chunk) {
        let rows = chunk.min(n - start);
        let hc = h2.slice(0, start, rows)?;
        let lc_rows = logits.slice(0, 0, rows)?;
        let lc = lc_rows.slice(1, 0, v)?;
        for r in &parts {
            let out = lc.slice(1, r.start, r.len())?;
            matmul_into(rt, &hc, &wt.slice(1, r.start, r.len())?, &out, &MatmulOptions::default())?;
        }
        // The fused kernel takes whole tensors: this chunk's targets and losses are copied.
        let tc = targets.slice(0, start, rows)?.contiguous(rt)?;
        let loss_c = Tensor::empty(rt, &[rows], DType::F32, Category::Temporary, "chunk losses")?;
        ce::cross_entropy_rows(rt, &lc, &tc, &loss_c, grad.then_some(&lc), scale * pre, 0..rows)?;
        crate::kernels::map::copy_into(rt, &loss_c, &losses.slice(0, start, rows)?)?;
        if let (Some(dh), Some(dw)) = (&dh, &dw) {
            let lc = match &grad_half {
                Some(g) => {
                    // Whole padded rows (the copy writes contiguous memory).
                    let g = g.slice(0, 0, rows)?;
                    crate::kernels::map::copy_into(rt, &lc_rows, &g)?;
                    g.slice(1, 0, v)?
                }
                None => lc,
            };
            // Under fp16-mixed the f32 logits are dead once cast: split-K's partials
            // go there rather than into a block of their own.
            let scratch = MatmulOptions {
                scratch: mixed.then_some(&logits),
                ..Default::default()
            };
            let dh_c = dh.slice(0, start, rows)?;
            // dh sums over the vocabulary: the remainder's product adds to the first's.
            // In f32 it stays one product: split, its first part took split-K partials
            // the size of the rows it had (GPT-2: a higher peak).
            let dh_parts = if mixed { parts.clone() } else { vec![0..v] };
            for (i, r) in dh_parts.iter().enumerate() {
                let lr = lc.slice(1, r.start, r.len())?;
                let beta = if i == 0 { 0.0 } else { 1.0 };
                matmul_into(
                    rt,
                    &lr,
                    &w_mm.slice(0, r.start, r.len())?,
                    &dh_c,
                    &MatmulOptions { beta, ..scratch },
                )?;
            }
            for r in &parts {
                let lr = lc.slice(1, r.start, r.len())?;
                let dw_r = dw.slice(0, r.start, r.len())?;
                matmul_into(rt, &lr.transpose(0, 1)?, &hc, &dw_r, &MatmulOptions { beta: 1.0, ..scratch })?;
            }
        }
    }
    let total = reduce_all(rt, ReduceOp::Sum, &losses, label)?;
    let loss = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    map_into(rt, MapOp::Scale, Some(&total), None, &loss, scale, 0.0)?;
    let h_shape = h.value.shape().to_vec();
    Ok(tape.record(
        loss,
        &[h, w],
        Box::new(move |rt, g, _cats| {
            let (dh, dw) = (dh.expect("recorded with gradients"), dw.expect("recorded with gradients"));
            // The stored gradients carry `pre` already: scale them by g / pre.
            let g = if pre == 1.0 {
                g.clone()
            } else {
                let gs = Tensor::empty(rt, g.shape(), DType::F32, Category::Temporary, "g/pre")?;
                map_into(rt, MapOp::Scale, Some(g), None, &gs, 1.0 / pre, 0.0)?;
                gs
            };
            map_into(rt, MapOp::Mul, Some(&dh), Some(&g), &dh, 1.0, 1.0)?;
            map_into(rt, MapOp::Mul, Some(&dw), Some(&g), &dw, 1.0, 1.0)?;
            Ok(vec![Some(dh.reshape(&h_shape)?), Some(dw)])
        }),
    ))
}

/// The head's products split along the vocabulary: its whole 128-wide tiles, then the
/// rest. GPT-2's 50,257 is no multiple of 128, so as one product every tile of it would
/// load with bounds checks; split, all but one column of tiles load without them.
fn vocab_parts(v: usize) -> Vec<std::ops::Range<usize>> {
    let whole = v / 128 * 128;
    if whole == 0 || whole == v {
        vec![0..v]
    } else {
        vec![0..whole, whole..v]
    }
}

/// Rows per chunk of the head with gradients: the chunk's blocks (f32 logits `ld`
/// wide, under fp16-mixed (`f32_dh` None) also their f16 copy) must fit in the bytes of
/// `chunk` unpadded rows (`v` wide), the padding included; in f32 the dh product
/// (rows x V @ V x C, `f32_dh` = Some(C)) reads the logits block, so its split-K
/// partials need room there too (under fp16-mixed they go into the dead f32 logits).
/// The chunk shrinks until that holds, and the `n` rows are then spread evenly over the
/// chunks it takes (rounded down to whole tiles of 128 rows under fp16-mixed).
fn chunk_rows(facts: &AdapterFacts, chunk: usize, n: usize, ld: usize, v: usize, f32_dh: Option<usize>) -> usize {
    let per = if f32_dh.is_some() { 4 } else { 6 };
    let budget = (chunk * v * per) as u64;
    let fits = |rows: usize| {
        let partials = f32_dh.map_or(0, |c| crate::kernels::matmul_plan::tiled_split_bytes(facts, rows, c, v));
        (rows * ld * per) as u64 + partials <= budget
    };
    // Under fp16-mixed, rows in multiples of 128 where chunks are that long, so the
    // tensor-core products' M is whole tiles too (their loads then go unchecked, with
    // `vocab_parts`). In f32 that gave the dh product more split-K partials than the
    // rows it saved (GPT-2: a 6 MiB higher peak).
    let unit = if chunk >= 256 && f32_dh.is_none() { 128 } else { 8 };
    let mut rows = chunk;
    while rows > unit && !fits(rows) {
        rows = (rows - 1) / unit * unit;
    }
    let even = n.div_ceil(n.div_ceil(rows).max(1));
    let even = if unit == 8 { even.next_multiple_of(8) } else { even / unit * unit };
    let even = even.min(rows);
    if even > 0 && fits(even) { even } else { rows }
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

#[cfg(test)]
mod tests {
    use super::chunk_rows;
    use crate::device::AdapterFacts;
    use crate::kernels::matmul_plan::tiled_split_bytes;

    /// The H100 as its saved report describes it (132 multiprocessors).
    fn h100() -> AdapterFacts {
        let reports: Vec<crate::device::AdapterReport> =
            serde_json::from_str(include_str!("../../../../tests/fixtures/devices-h100.json")).expect("the H100's report");
        AdapterFacts::described(&reports[0])
    }

    #[test]
    fn the_head_chunk_and_its_partials_stay_within_the_unpadded_chunk() {
        // GPT-2's head: 8192 rows, V 50257 padded to 50264, C 768.
        let (n, ld, v, c) = (8192, 50264, 50257, 768);
        for f32_dh in [Some(c), None] {
            let per = if f32_dh.is_some() { 4 } else { 6 };
            let rows = chunk_rows(&h100(), 2048, n, ld, v, f32_dh);
            let partials = f32_dh.map_or(0, |c| tiled_split_bytes(&h100(), rows, c, v));
            assert!((rows * ld * per) as u64 + partials <= (2048 * v * per) as u64, "{rows}");
            // The f32 dh product does split at these rows: its partials were counted.
            if f32_dh.is_some() {
                assert!(partials > 0);
            }
            // Five even chunks rather than four and a sliver.
            assert_eq!(n.div_ceil(rows), 5);
            assert_eq!(rows % 8, 0);
            assert!(rows * 5 - n < 5 * 8, "{rows}");
        }
        // A vocabulary already aligned and a product too wide to split: nothing to give up.
        assert_eq!(chunk_rows(&h100(), 2048, 8192, 1024, 1024, None), 2048);
        // Fewer rows than a chunk, and none.
        assert!(chunk_rows(&h100(), 100, 100, 72, 65, Some(64)) <= 100);
        assert_eq!(chunk_rows(&h100(), 1, 0, 72, 65, Some(64)), 1);
    }
}
