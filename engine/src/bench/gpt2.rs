//! Benchmarks at the shapes a GPT-2 small training step really runs (B 8, T 1024,
//! C 768, 12 heads, vocabulary 50257), so the bench predicts the step: the four linear
//! layers' forward product and both backward products (dX = dY·Wᵀ, dW = Xᵀ·dY) in f32
//! and, where the adapter has f16, f16 inputs (the tensor-core path when granted);
//! attention forward + backward (fused, and the composite it replaced); LayerNorm forward and backward; GELU forward and
//! backward; the residual add; the embedding backward. Cross-entropy and AdamW at these
//! shapes are `bench::kernels`' rows. The char workload's linear products (L6, C384,
//! T256, B64: weight gradients of K 16384) are rows too, named `char.*`. Each row is
//! checked against an f64 reference on samples and timed as `bench::measure` says; the
//! others are named `gpt2.*`.
//!
//! May call: `bench::{measure, record}`, `error`, `kernels`, `memory`, `runtime`,
//! `tensor`.

use super::measure::{Rng, Row, SAMPLES, record, softmax_ref, stored, time, unless_unsplittable, upload};
use super::record::BenchRecord;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::flash_attention::BackwardTiles;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::matmul_into;
use crate::kernels::matmul_params::MatmulVariant;
use crate::kernels::tolerance::{tensor_core_tolerance, tolerance};
use crate::kernels::{attention, embedding, flash_attention, layernorm};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// The step's sizes.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    b: usize,
    t: usize,
    pub(super) c: usize,
    nh: usize,
    vocab: usize,
}

impl Shape {
    pub(super) fn head(&self) -> usize {
        self.c / self.nh
    }

    pub(super) fn rows(&self) -> usize {
        self.b * self.t
    }
}

/// The char workload's GPT (scripts/gpt_workloads.sh: L6, C384, T256, B64), whose
/// linear layers' products are the `char.*` rows.
pub(super) const CHAR: Shape = Shape {
    b: 64,
    t: 256,
    c: 384,
    nh: 6,
    vocab: 65,
};

/// GPT-2 small at the gpt2 workload's batch.
pub(super) const GPT2: Shape = Shape {
    b: 8,
    t: 1024,
    c: 768,
    nh: 12,
    vocab: 50257,
};

/// The four linear layers of a block: name, K and N.
pub(super) fn linear_layers(c: usize) -> [(&'static str, usize, usize); 4] {
    [("qkv", c, 3 * c), ("attn_proj", c, c), ("fc", c, 4 * c), ("fc_proj", 4 * c, c)]
}

/// The three products of each linear layer, with their row names.
pub(super) const PRODUCTS: [(&str, Product); 3] = [("fwd", Product::Forward), ("dx", Product::GradInput), ("dw", Product::GradWeight)];

/// Which product of a linear layer y = x·W (W stored [K, N]).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Product {
    Forward,
    GradInput,
    GradWeight,
}

/// One linear layer's product: forward [R,K]·[K,N], dX [R,N]·[N,K] (Wᵀ a view), dW
/// [K,R]·[R,N] (Xᵀ a view). With a forced variant the row is named `tune.TILE.gpt2...`
/// (the tuning sweep).
pub(super) struct Linear<'a> {
    /// The row name's first part: `gpt2`, or `char` (the char workload's shapes).
    pub model: &'a str,
    pub layer: &'a str,
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub product: Product,
    pub dtype: DType,
    pub forced: MatmulVariant,
}

pub(super) fn linear(rt: &Runtime, l: Linear) -> Result<BenchRecord, Error> {
    let Linear {
        model,
        layer,
        rows,
        k,
        n,
        product,
        dtype,
        forced,
    } = l;
    let mut rng = Rng(11);
    // The two operands as stored, and the product's (m, inner, n).
    let (sa, sb, (m, inner, cols)) = match product {
        Product::Forward => ([rows, k], [k, n], (rows, k, n)),
        Product::GradInput => ([rows, n], [k, n], (rows, n, k)),
        Product::GradWeight => ([rows, k], [rows, n], (k, rows, n)),
    };
    let (a, b) = (rng.vec(sa[0] * sa[1], -1.0, 1.0), rng.vec(sb[0] * sb[1], -1.0, 1.0));
    let (x, y) = (upload(rt, &a, &sa, dtype)?, upload(rt, &b, &sb, dtype)?);
    let (x, y) = match product {
        Product::Forward => (x, y),
        Product::GradInput => (x, y.transpose(0, 1)?),
        Product::GradWeight => (x.transpose(0, 1)?, y),
    };
    let c = Tensor::empty(rt, &[m, cols], DType::F32, Category::Temporary, "bench.out")?;
    let opts = super::measure::matmul_options(forced);
    let timing = time(rt, || matmul_into(rt, &x, &y, &c, &opts))?;
    let out = c.to_f32_vec(rt)?;
    // Element (i, p) of the first operand and (p, j) of the second, as multiplied.
    let at = |i: usize, p: usize| match product {
        Product::GradWeight => a[p * sa[1] + i],
        _ => a[i * sa[1] + p],
    };
    let bt = |p: usize, j: usize| match product {
        Product::GradInput => b[j * sb[1] + p],
        _ => b[p * sb[1] + j],
    };
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        let (i, j) = (rng.index(m), rng.index(cols));
        got.push(out[i * cols + j]);
        want.push((0..inner).map(|p| stored(at(i, p), dtype) * stored(bt(p, j), dtype)).sum());
    }
    let coop = !opts.tiled_only && crate::kernels::matmul_coop::usable(rt, &x, &y, &c);
    let tol = if coop {
        tensor_core_tolerance(inner)
    } else {
        tolerance(DType::F32, inner)
    };
    let what = match product {
        Product::Forward => "fwd",
        Product::GradInput => "dx",
        Product::GradWeight => "dw",
    };
    let prefix = forced.row_prefix();
    Ok(super::measure::with_splits(record(
        &format!("{prefix}{model}.{layer}.{what}"),
        dtype,
        &[m, inner, cols],
        &timing,
        Row {
            flops: 2.0 * (m * inner * cols) as f64,
            bytes: ((m * inner + inner * cols) * dtype.size() + m * cols * 4) as f64,
            got: &got,
            want: &want,
            tol,
        },
    )))
}

/// Which attention a row runs.
#[derive(Clone, Copy)]
pub(super) enum Attention {
    /// The composite (matmuls and a softmax storing [B, NH, T, T]).
    Composite,
    /// Flash attention on the adapter's path, or with the tensor-core tiles forced (the
    /// forward's, and the backward kernels').
    Fused(
        Option<crate::kernels::flash_attention_coop::AttentionTile>,
        flash_attention::BackwardTiles,
    ),
}

/// Causal attention over qkv [B, T, 3C]: forward, and backward when `backward`;
/// checks sampled elements of the output (and of dV) against f64.
pub(super) fn attention_row(
    rt: &Runtime,
    name: &str,
    s: Shape,
    dtype: DType,
    which: Attention,
    backward: bool,
) -> Result<BenchRecord, Error> {
    let mut rng = Rng(12);
    let (b, t, c, nh) = (s.b, s.t, s.c, s.nh);
    let d = c / nh;
    let data = rng.vec(b * t * 3 * c, -1.0, 1.0);
    let dy_data = rng.vec(b * t * c, -1.0, 1.0);
    let qkv = upload(rt, &data, &[b, t, 3 * c], dtype)?;
    // The fused kernels get dy in f32, as training gives it (fp16-mixed's attention output
    // gradient is f32); the composite gets qkv's type.
    let dy_type = if matches!(which, Attention::Fused(..)) { DType::F32 } else { dtype };
    let dy = upload(rt, &dy_data, &[b, t, c], dy_type)?;
    let mut last = None;
    let timing = time(rt, || {
        last = Some(match which {
            Attention::Fused(tile, tiles) => {
                let path = flash_attention::Path::for_inputs(&rt.gpu.caps.facts, dtype, d);
                let saved = flash_attention::forward_tiled(rt, &qkv, nh, path, tile, "bench.attn")?;
                let dqkv = if backward {
                    Some(flash_attention::backward_tiled(
                        rt,
                        &qkv,
                        nh,
                        &saved,
                        &dy,
                        path,
                        tiles,
                        "bench.dattn",
                    )?)
                } else {
                    None
                };
                (saved.y, dqkv)
            }
            Attention::Composite => {
                let (y, saved) = attention::forward(rt, &qkv, nh, "bench.attn")?;
                let dqkv = if backward {
                    Some(attention::backward(rt, &qkv, nh, &saved, &dy, "bench.dattn")?)
                } else {
                    None
                };
                (y, dqkv)
            }
        });
        Ok(())
    })?;
    let (y, dqkv) = last.expect("timed at least once");
    let y = y.to_f32_vec(rt)?;
    let dqkv = dqkv.map(|t| t.to_f32_vec(rt)).transpose()?;
    let at =
        |bi: usize, ti: usize, part: usize, h: usize, k: usize| stored(data[bi * t * 3 * c + ti * 3 * c + part * c + h * d + k], dtype);
    let probs = |bi: usize, h: usize, i: usize| -> Vec<f64> {
        let scores: Vec<f64> = (0..=i)
            .map(|j| (0..d).map(|k| at(bi, i, 0, h, k) * at(bi, j, 1, h, k)).sum::<f64>() / (d as f64).sqrt())
            .collect();
        softmax_ref(&scores)
    };
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let (bi, h, i) = (rng.index(b), rng.index(nh), rng.index(t));
        let p = probs(bi, h, i);
        for k in 0..d {
            want.push(p.iter().enumerate().map(|(j, pj)| pj * at(bi, j, 2, h, k)).sum());
            got.push(y[bi * t * c + i * c + h * d + k]);
        }
    }
    // dV[j] = sum over i >= j of P[i, j] dY[i].
    for _ in 0..2 {
        let Some(dqkv) = &dqkv else { break };
        let (bi, h, j) = (rng.index(b), rng.index(nh), rng.index(t));
        let mut dv = vec![0.0f64; d];
        for i in j..t {
            let pij = probs(bi, h, i)[j];
            for (k, acc) in dv.iter_mut().enumerate() {
                *acc += pij * stored(dy_data[bi * t * c + i * c + h * d + k], dy_type);
            }
        }
        want.extend(dv);
        got.extend((0..d).map(|k| dqkv[bi * t * 3 * c + j * 3 * c + 2 * c + h * d + k]));
    }
    // Causal: half the T x T products; backward 2.5x forward (FlashAttention's count).
    let flops = 0.5 * if backward { 3.5 } else { 1.0 } * 4.0 * (b * nh * t * t * d) as f64;
    let tol = if dtype == DType::F16 {
        tolerance(DType::F16, t)
    } else {
        tolerance(DType::F32, t)
    };
    Ok(record(
        name,
        dtype,
        &[b, nh, t, d],
        &timing,
        Row {
            flops,
            bytes: 0.0,
            got: &got,
            want: &want,
            tol,
        },
    ))
}

/// LayerNorm forward, or forward + backward (weight and bias gradients included).
fn layer_norm(rt: &Runtime, s: Shape, backward: bool) -> Result<BenchRecord, Error> {
    let mut rng = Rng(13);
    let (rows, cols) = (s.rows(), s.c);
    let data = rng.vec(rows * cols, -3.0, 3.0);
    let dy_data = rng.vec(rows * cols, -1.0, 1.0);
    let w = rng.vec(cols, 0.5, 1.5);
    let bias = rng.vec(cols, -0.5, 0.5);
    let x = upload(rt, &data, &[rows, cols], DType::F32)?;
    let dy = upload(rt, &dy_data, &[rows, cols], DType::F32)?;
    let (wt, bt) = (upload(rt, &w, &[cols], DType::F32)?, upload(rt, &bias, &[cols], DType::F32)?);
    let (dw, db) = (
        Tensor::full(rt, &[cols], DType::F32, 0.0, Category::Gradient, "bench.dw")?,
        Tensor::full(rt, &[cols], DType::F32, 0.0, Category::Gradient, "bench.db")?,
    );
    let (_, saved) = layernorm::forward(rt, &x, &wt, &bt, 1e-5, "bench.ln")?;
    let mut last = None;
    let timing = time(rt, || {
        last = Some(if backward {
            layernorm::backward(rt, &x, &wt, &saved, &dy, (&dw, &db), "bench.dln")?
        } else {
            layernorm::forward(rt, &x, &wt, &bt, 1e-5, "bench.ln")?.0
        });
        Ok(())
    })?;
    let out = last.expect("timed at least once").to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let r = rng.index(rows);
        let row: Vec<f64> = data[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
        let mu = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mu) * rstd).collect();
        if backward {
            // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
            let g: Vec<f64> = (0..cols).map(|j| dy_data[r * cols + j] as f64 * w[j] as f64).collect();
            let mg = g.iter().sum::<f64>() / cols as f64;
            let mgx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
            want.extend((0..cols).map(|j| rstd * (g[j] - mg - xhat[j] * mgx)));
        } else {
            want.extend((0..cols).map(|j| xhat[j] * w[j] as f64 + bias[j] as f64));
        }
        got.extend_from_slice(&out[r * cols..(r + 1) * cols]);
    }
    let passes = if backward { 3.0 } else { 2.0 };
    Ok(record(
        if backward { "gpt2.layernorm.bwd" } else { "gpt2.layernorm.fwd" },
        DType::F32,
        &[rows, cols],
        &timing,
        Row {
            flops: 0.0,
            bytes: passes * 4.0 * (rows * cols) as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, cols),
        },
    ))
}

fn gelu(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())
}

fn gelu_grad(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let u = k * (x + 0.044715 * x.powi(3));
    let th = u.tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x)
}

/// An elementwise op over `shape`: GELU forward or backward, or the residual add.
fn elementwise(rt: &Runtime, name: &str, op: MapOp, shape: [usize; 2]) -> Result<BenchRecord, Error> {
    let mut rng = Rng(14);
    let n = shape[0] * shape[1];
    let (a, b) = (rng.vec(n, -3.0, 3.0), rng.vec(n, -1.0, 1.0));
    let (x, y) = (upload(rt, &a, &shape, DType::F32)?, upload(rt, &b, &shape, DType::F32)?);
    let out = Tensor::empty(rt, &shape, DType::F32, Category::Temporary, "bench.out")?;
    let second = (op.arity() == 2).then_some(&y);
    let timing = time(rt, || map_into(rt, op, Some(&x), second, &out, 1.0, 1.0))?;
    let res = out.to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        let i = rng.index(n);
        let (xa, yb) = (a[i] as f64, b[i] as f64);
        want.push(match op {
            MapOp::Gelu => gelu(xa),
            MapOp::GeluBackward => yb * gelu_grad(xa),
            _ => xa + yb,
        });
        got.push(res[i]);
    }
    let tensors = 1 + op.arity();
    Ok(record(
        name,
        DType::F32,
        &shape,
        &timing,
        Row {
            flops: 0.0,
            bytes: (4 * tensors * n) as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, 4),
        },
    ))
}

/// The token embedding's backward: dtable[ids[i]] += dout[i] over the B·T tokens.
fn embedding_backward(rt: &Runtime, s: Shape) -> Result<BenchRecord, Error> {
    let mut rng = Rng(15);
    let (rows, c, v) = (s.rows(), s.c, s.vocab);
    let ids: Vec<i32> = (0..rows).map(|_| rng.index(v) as i32).collect();
    let dout = rng.vec(rows * c, -1.0, 1.0);
    let idt = Tensor::from_i32(rt, &ids, &[rows], Category::Input, "bench.ids")?;
    let dt = upload(rt, &dout, &[rows, c], DType::F32)?;
    let table = Tensor::full(rt, &[v, c], DType::F32, 0.0, Category::Gradient, "bench.dwte")?;
    let mut runs = 0usize;
    let timing = time(rt, || {
        runs += 1;
        embedding::scatter_add(rt, &idt, &dt, &table)
    })?;
    // Every run added the same gradients once more: compared per run, the sum's
    // rounding over the runs allowed for.
    let res = table.to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        let (r, j) = (rng.index(rows), rng.index(c));
        let id = ids[r] as usize;
        let once: f64 = (0..rows).filter(|&i| ids[i] as usize == id).map(|i| dout[i * c + j] as f64).sum();
        want.push(once);
        got.push(res[id * c + j] / runs as f32);
    }
    Ok(record(
        "gpt2.embedding.bwd",
        DType::F32,
        &[rows, v, c],
        &timing,
        Row {
            flops: 0.0,
            bytes: (4 * 3 * rows * c) as f64,
            got: &got,
            want: &want,
            tol: (1e-4, 1e-4 * (runs as f64).sqrt().max(1.0)),
        },
    ))
}

/// Every GPT-2 step row whose name passes `wanted`; `quick` uses a tiny GPT's shapes.
pub fn run_all(rt: &Runtime, quick: bool, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<BenchRecord>, Error> {
    let s = if quick {
        Shape {
            b: 2,
            t: 32,
            c: 64,
            nh: 4,
            vocab: 96,
        }
    } else {
        GPT2
    };
    let mut dtypes = vec![DType::F32];
    if rt.gpu.caps.shader_f16 {
        dtypes.push(DType::F16);
    }
    let c = s.c;
    let mut out = Vec::new();
    // The char workload's products too, at full size only (the quick shapes are one GPT).
    let models: &[(&str, Shape)] = if quick { &[("gpt2", s)] } else { &[("gpt2", s), ("char", CHAR)] };
    for &(model, ms) in models {
        for (layer, k, n) in linear_layers(ms.c) {
            for (what, product) in PRODUCTS {
                if wanted(&format!("{model}.{layer}.{what}")) {
                    for &dtype in &dtypes {
                        let rows = ms.rows();
                        out.extend(unless_unsplittable(linear(
                            rt,
                            Linear {
                                model,
                                layer,
                                rows,
                                k,
                                n,
                                product,
                                dtype,
                                forced: MatmulVariant::Auto,
                            },
                        ))?);
                    }
                }
            }
        }
    }
    let fused = Attention::Fused(None, BackwardTiles::default());
    for (name, shape, which, backward) in [
        ("gpt2.flash_attention.fwd_bwd", s, fused, true),
        ("gpt2.attention.fwd_bwd", s, Attention::Composite, true),
        // The char workload's attention (T = 256), at full size only.
        ("char.flash_attention.fwd", CHAR, fused, false),
        ("char.flash_attention.fwd_bwd", CHAR, fused, true),
    ] {
        if wanted(name) && (!quick || name.starts_with("gpt2.")) {
            for &dtype in &dtypes {
                out.push(attention_row(rt, name, shape, dtype, which, backward)?);
            }
        }
    }
    if wanted("gpt2.layernorm.fwd") {
        out.push(layer_norm(rt, s, false)?);
    }
    if wanted("gpt2.layernorm.bwd") {
        out.push(layer_norm(rt, s, true)?);
    }
    for (name, op, shape) in [
        ("gpt2.gelu.fwd", MapOp::Gelu, [s.rows(), 4 * c]),
        ("gpt2.gelu.bwd", MapOp::GeluBackward, [s.rows(), 4 * c]),
        ("gpt2.residual_add", MapOp::Add, [s.rows(), c]),
    ] {
        if wanted(name) {
            out.push(elementwise(rt, name, op, shape)?);
        }
    }
    if wanted("gpt2.embedding.bwd") {
        out.push(embedding_backward(rt, s)?);
    }
    Ok(out)
}
