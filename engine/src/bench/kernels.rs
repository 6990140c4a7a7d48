//! Kernel benchmarks at fixed sizes (4096^3 matmuls, 2^28-element copies, ...): each
//! case builds random inputs, checks the result against an f64 CPU reference on
//! sampled rows or elements, and is timed as `bench::measure` says (GPU timestamps
//! when granted, else wall clock). The GPT-2 step's own shapes are in `bench::gpt2`.
//!
//! May call: `bench::{measure, record}`, `error`, `kernels`, `memory`, `runtime`,
//! `tensor`.

use super::measure::{Rng, Row, SAMPLES, record, softmax_ref, stored, time, upload};
use super::record::BenchRecord;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::attention;
use crate::kernels::cross_entropy::cross_entropy_rows;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::matmul_into;
use crate::kernels::matmul_params::MatmulVariant;
use crate::kernels::optim::{AdamW, OptimState, adamw_step};
use crate::kernels::softmax::softmax_into;
use crate::kernels::tolerance::{tensor_core_tolerance, tolerance};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

fn copy(rt: &Runtime, n: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(1);
    let data = rng.vec(n, -1.0, 1.0);
    let x = upload(rt, &data, &[n], DType::F32)?;
    let y = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, "copy")?;
    let timing = time(rt, || map_into(rt, MapOp::Copy, Some(&x), None, &y, 1.0, 0.0))?;
    let got = y.to_f32_vec(rt)?;
    let idx: Vec<usize> = (0..SAMPLES.min(n)).map(|_| rng.index(n)).collect();
    let want: Vec<f64> = idx.iter().map(|&i| data[i] as f64).collect();
    let got: Vec<f32> = idx.iter().map(|&i| got[i]).collect();
    Ok(record(
        "copy",
        DType::F32,
        &[n],
        &timing,
        Row {
            flops: 0.0,
            bytes: 8.0 * n as f64,
            got: &got,
            want: &want,
            tol: (0.0, 0.0),
        },
    ))
}

fn add(rt: &Runtime, n: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(2);
    let (a, b) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let (x, y) = (upload(rt, &a, &[n], DType::F32)?, upload(rt, &b, &[n], DType::F32)?);
    let z = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, "add")?;
    let timing = time(rt, || map_into(rt, MapOp::Add, Some(&x), Some(&y), &z, 1.0, 1.0))?;
    let out = z.to_f32_vec(rt)?;
    let idx: Vec<usize> = (0..SAMPLES.min(n)).map(|_| rng.index(n)).collect();
    let want: Vec<f64> = idx.iter().map(|&i| a[i] as f64 + b[i] as f64).collect();
    let got: Vec<f32> = idx.iter().map(|&i| out[i]).collect();
    Ok(record(
        "add",
        DType::F32,
        &[n],
        &timing,
        Row {
            flops: n as f64,
            bytes: 12.0 * n as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, 1),
        },
    ))
}

/// A square-ish matmul row, on the kernel `forced` names.
pub(super) fn matmul(rt: &Runtime, name: &str, [m, k, n]: [usize; 3], dtype: DType, forced: MatmulVariant) -> Result<BenchRecord, Error> {
    let mut rng = Rng(3);
    let (a, b) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
    let (x, y) = (upload(rt, &a, &[m, k], dtype)?, upload(rt, &b, &[k, n], dtype)?);
    let c = Tensor::empty(rt, &[m, n], DType::F32, Category::Temporary, "matmul")?;
    let opts = super::measure::matmul_options(forced);
    let timing = time(rt, || matmul_into(rt, &x, &y, &c, &opts))?;
    let out = c.to_f32_vec(rt)?;
    let mut got = Vec::new();
    let mut want = Vec::new();
    for _ in 0..SAMPLES {
        let (i, j) = (rng.index(m), rng.index(n));
        got.push(out[i * n + j]);
        want.push((0..k).map(|p| stored(a[i * k + p], dtype) * stored(b[p * n + j], dtype)).sum());
    }
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let bytes = ((m * k + k * n) * dtype.size() + m * n * 4) as f64;
    let coop = !opts.tiled_only && crate::kernels::matmul_coop::usable(rt, &x, &y, &c);
    let tol = if coop { tensor_core_tolerance(k) } else { tolerance(DType::F32, k) };
    Ok(super::measure::with_splits(record(
        name,
        dtype,
        &[m, k, n],
        &timing,
        Row {
            flops,
            bytes,
            got: &got,
            want: &want,
            tol,
        },
    )))
}

/// Refuses a product whose operands (f32 on the host for the reference, and on the
/// device) no binding of the adapter holds, before anything is allocated.
fn check_matmul_shape(rt: &Runtime, [m, k, n]: [usize; 3]) -> Result<(), Error> {
    let limit = rt
        .gpu
        .caps
        .limits
        .max_storage_buffer_binding_size
        .min(rt.gpu.caps.limits.max_buffer_size);
    for (what, rows, cols) in [("A", m, k), ("B", k, n), ("C", m, n)] {
        let bytes = (rows as u64).checked_mul(cols as u64).and_then(|e| e.checked_mul(4));
        if bytes.is_none_or(|b| b > limit) {
            return Err(Error::invalid(
                "matmul shape",
                format!(
                    "{m}x{k}x{n}: {what} ({rows} x {cols}) takes {}, more than one buffer binding of '{}' holds ({limit} bytes)",
                    bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes")),
                    rt.gpu.report.name
                ),
            ));
        }
    }
    Ok(())
}

/// A matmul of the user's shape (`wgtrain bench --matmul MxKxN`): f16 inputs on the
/// tensor-core path where the adapter grants it, else f32 on the tiled kernel.
pub fn matmul_shape(rt: &Runtime, shape: [usize; 3]) -> Result<BenchRecord, Error> {
    check_matmul_shape(rt, shape)?;
    if rt.gpu.caps.coop_f16_16x16x16() {
        matmul(rt, "matmul_coop_f16", shape, DType::F16, MatmulVariant::Auto)
    } else {
        matmul(rt, "matmul_f32", shape, DType::F32, MatmulVariant::Tiled)
    }
}

fn softmax(rt: &Runtime, rows: usize, cols: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(4);
    let data = rng.vec(rows * cols, -20.0, 20.0);
    let x = upload(rt, &data, &[rows, cols], DType::F32)?;
    let y = Tensor::empty(rt, &[rows, cols], DType::F32, Category::Temporary, "softmax")?;
    let timing = time(rt, || softmax_into(rt, &x, &y, false, false))?;
    let out = y.to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let r = rng.index(rows);
        let row: Vec<f64> = data[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
        want.extend(softmax_ref(&row));
        got.extend_from_slice(&out[r * cols..(r + 1) * cols]);
    }
    Ok(record(
        "softmax",
        DType::F32,
        &[rows, cols],
        &timing,
        Row {
            flops: 0.0,
            bytes: 8.0 * (rows * cols) as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, cols),
        },
    ))
}

fn cross_entropy(rt: &Runtime, rows: usize, vocab: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(6);
    let data = rng.vec(rows * vocab, -10.0, 10.0);
    let targets: Vec<i32> = (0..rows).map(|_| rng.index(vocab) as i32).collect();
    let logits = upload(rt, &data, &[rows, vocab], DType::F32)?;
    let tt = Tensor::from_i32(rt, &targets, &[rows], Category::Input, "targets")?;
    let losses = Tensor::empty(rt, &[rows], DType::F32, Category::Temporary, "losses")?;
    let dlogits = Tensor::empty(rt, &[rows, vocab], DType::F32, Category::Temporary, "dlogits")?;
    let scale = 1.0 / rows as f32;
    let timing = time(rt, || cross_entropy_rows(rt, &logits, &tt, &losses, Some(&dlogits), scale, 0..rows))?;
    let (l, d) = (losses.to_f32_vec(rt)?, dlogits.to_f32_vec(rt)?);
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let r = rng.index(rows);
        let row: Vec<f64> = data[r * vocab..(r + 1) * vocab].iter().map(|&v| v as f64).collect();
        let p = softmax_ref(&row);
        let t = targets[r] as usize;
        want.push(-p[t].ln());
        got.push(l[r]);
        want.extend(
            p.iter()
                .enumerate()
                .map(|(j, &pj)| (pj - if j == t { 1.0 } else { 0.0 }) * scale as f64),
        );
        got.extend_from_slice(&d[r * vocab..(r + 1) * vocab]);
    }
    Ok(record(
        "cross_entropy_fwd_bwd",
        DType::F32,
        &[rows, vocab],
        &timing,
        Row {
            flops: 0.0,
            bytes: 8.0 * (rows * vocab) as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, vocab),
        },
    ))
}

fn attention_fwd(rt: &Runtime, b: usize, nh: usize, t: usize, d: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(7);
    let c = nh * d;
    let data = rng.vec(b * t * 3 * c, -1.0, 1.0);
    let qkv = upload(rt, &data, &[b, t, 3 * c], DType::F32)?;
    let mut last = None;
    let timing = time(rt, || {
        last = Some(attention::forward(rt, &qkv, nh, "attn")?.0);
        Ok(())
    })?;
    let out = last.expect("timed at least once").to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let at = |bi: usize, ti: usize, part: usize, h: usize, k: usize| data[bi * t * 3 * c + ti * 3 * c + part * c + h * d + k] as f64;
    for _ in 0..8 {
        let (bi, h, i) = (rng.index(b), rng.index(nh), rng.index(t));
        let scores: Vec<f64> = (0..=i)
            .map(|j| (0..d).map(|k| at(bi, i, 0, h, k) * at(bi, j, 1, h, k)).sum::<f64>() / (d as f64).sqrt())
            .collect();
        let p = softmax_ref(&scores);
        for k in 0..d {
            want.push(p.iter().enumerate().map(|(j, pj)| pj * at(bi, j, 2, h, k)).sum());
            got.push(out[bi * t * c + i * c + h * d + k]);
        }
    }
    let flops = 4.0 * (b * nh * t * t * d) as f64;
    Ok(record(
        "attention_fwd",
        DType::F32,
        &[b, nh, t, d],
        &timing,
        Row {
            flops,
            bytes: 0.0,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, t),
        },
    ))
}

fn adamw(rt: &Runtime, n: usize) -> Result<BenchRecord, Error> {
    let mut rng = Rng(8);
    let (p0, g) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let param = upload(rt, &p0, &[n], DType::F32)?;
    let grad = upload(rt, &g, &[n], DType::F32)?;
    let m = Tensor::full(rt, &[n], DType::F32, 0.0, Category::OptimizerState, "m")?;
    let v = Tensor::full(rt, &[n], DType::F32, 0.0, Category::OptimizerState, "v")?;
    let found = Tensor::full(rt, &[1], DType::U32, 0.0, Category::Temporary, "found")?;
    let h = AdamW::default();
    // Check one step from the initial state, then time further steps.
    adamw_step(
        rt,
        &h,
        &OptimState {
            param: &param,
            grad: &grad,
            m: &m,
            v: &v,
            half: None,
        },
        1,
        1.0,
        &found,
        false,
    )?;
    let out = param.to_f32_vec(rt)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES.min(n) {
        let i = rng.index(n);
        let (gi, pi) = (g[i] as f64, p0[i] as f64 * (1.0 - h.lr as f64 * h.weight_decay as f64));
        let (mi, vi) = ((1.0 - h.betas.0 as f64) * gi, (1.0 - h.betas.1 as f64) * gi * gi);
        let denom = (vi / (1.0 - h.betas.1 as f64)).sqrt() + h.eps as f64;
        want.push(pi - h.lr as f64 / (1.0 - h.betas.0 as f64) * mi / denom);
        got.push(out[i]);
    }
    let mut step = 1;
    let timing = time(rt, || {
        step += 1;
        adamw_step(
            rt,
            &h,
            &OptimState {
                param: &param,
                grad: &grad,
                m: &m,
                v: &v,
                half: None,
            },
            step,
            1.0,
            &found,
            false,
        )
    })?;
    Ok(record(
        "adamw",
        DType::F32,
        &[n],
        &timing,
        Row {
            flops: 0.0,
            bytes: 28.0 * n as f64,
            got: &got,
            want: &want,
            tol: tolerance(DType::F32, 1),
        },
    ))
}

/// Every kernel benchmark whose name passes `wanted`; `quick` uses small shapes.
pub fn run_all(rt: &Runtime, quick: bool, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<BenchRecord>, Error> {
    let mut out = Vec::new();
    let q = |small: usize, big: usize| if quick { small } else { big };
    if wanted("copy") {
        out.push(copy(rt, q(1 << 20, 1 << 28))?);
    }
    if wanted("add") {
        out.push(add(rt, q(1 << 20, 1 << 26))?);
    }
    let mm = q(256, 4096);
    if wanted("matmul_f32") {
        out.push(matmul(rt, "matmul_f32", [mm; 3], DType::F32, MatmulVariant::Tiled)?);
    }
    if rt.gpu.caps.shader_f16 && wanted("matmul_f16") {
        out.push(matmul(rt, "matmul_f16", [mm; 3], DType::F16, MatmulVariant::Tiled)?);
    }
    if rt.gpu.caps.coop_f16_16x16x16() && wanted("matmul_coop_f16") {
        out.push(matmul(rt, "matmul_coop_f16", [mm; 3], DType::F16, MatmulVariant::Auto)?);
        if !quick {
            out.push(matmul(rt, "matmul_coop_f16", [8192; 3], DType::F16, MatmulVariant::Auto)?);
        }
    }
    if wanted("softmax") {
        out.push(softmax(rt, q(256, 8 * 12 * 1024), q(512, 1024))?);
    }
    if wanted("cross_entropy") {
        out.push(cross_entropy(rt, q(64, 8 * 1024), q(1000, 50257))?);
    }
    if wanted("attention") {
        let (b, nh, t, d) = if quick { (1, 2, 64, 16) } else { (8, 12, 1024, 64) };
        out.push(attention_fwd(rt, b, nh, t, d)?);
    }
    if wanted("adamw") {
        out.push(adamw(rt, q(1 << 20, 124_439_808))?);
    }
    Ok(out)
}
