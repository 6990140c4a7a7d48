//! Conv nets: the convolution, BatchNorm and pooling kernels against f64 references on
//! odd shapes (kernels 1/3/5/7, strides 1 and 2, padding, dilation, groups, non-square,
//! batch 1), BatchNorm's running statistics, and the layers and models built on them.

mod common;

use common::{Rng, assert_close, assert_close_within, finish, rounded, runtime, upload};
use wgtrain_engine::kernels::batchnorm::{self, Stats};
use wgtrain_engine::kernels::conv::{self, ConvShape};
use wgtrain_engine::kernels::pool::{Pool, PoolKind};
use wgtrain_engine::{Category, DType};

/// x [n, h, w, c] NHWC, w [k, cg, r, s]: y [n, p, q, k].
fn conv_ref(x: &[f64], w: &[f64], s: &ConvShape) -> Vec<f64> {
    let (p, q) = s.out_hw();
    let (cg, kg) = (s.c / s.groups, s.k / s.groups);
    let mut y = vec![0.0; s.n * p * q * s.k];
    for n in 0..s.n {
        for i in 0..p {
            for j in 0..q {
                for k in 0..s.k {
                    let g = k / kg;
                    let mut acc = 0.0;
                    for c in 0..cg {
                        for r in 0..s.r {
                            for t in 0..s.s {
                                let hh = (i * s.stride[0] + r * s.dilation[0]) as isize - s.pad[0] as isize;
                                let ww = (j * s.stride[1] + t * s.dilation[1]) as isize - s.pad[1] as isize;
                                if hh < 0 || ww < 0 || hh >= s.h as isize || ww >= s.w as isize {
                                    continue;
                                }
                                let xv = x[((n * s.h + hh as usize) * s.w + ww as usize) * s.c + g * cg + c];
                                acc += xv * w[((k * cg + c) * s.r + r) * s.s + t];
                            }
                        }
                    }
                    y[((n * p + i) * q + j) * s.k + k] = acc;
                }
            }
        }
    }
    y
}

/// dx and dw of sum(y * dy), by the chain rule on the reference's loops.
fn conv_grads_ref(x: &[f64], w: &[f64], dy: &[f64], s: &ConvShape) -> (Vec<f64>, Vec<f64>) {
    let (p, q) = s.out_hw();
    let (cg, kg) = (s.c / s.groups, s.k / s.groups);
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; w.len()]);
    for n in 0..s.n {
        for i in 0..p {
            for j in 0..q {
                for k in 0..s.k {
                    let g = k / kg;
                    let d = dy[((n * p + i) * q + j) * s.k + k];
                    for c in 0..cg {
                        for r in 0..s.r {
                            for t in 0..s.s {
                                let hh = (i * s.stride[0] + r * s.dilation[0]) as isize - s.pad[0] as isize;
                                let ww = (j * s.stride[1] + t * s.dilation[1]) as isize - s.pad[1] as isize;
                                if hh < 0 || ww < 0 || hh >= s.h as isize || ww >= s.w as isize {
                                    continue;
                                }
                                let xi = ((n * s.h + hh as usize) * s.w + ww as usize) * s.c + g * cg + c;
                                let wi = ((k * cg + c) * s.r + r) * s.s + t;
                                dx[xi] += d * w[wi];
                                dw[wi] += d * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    (dx, dw)
}

fn shape(
    n: usize,
    (h, w): (usize, usize),
    (c, k): (usize, usize),
    (r, s): (usize, usize),
    stride: usize,
    pad: usize,
    groups: usize,
) -> ConvShape {
    ConvShape {
        n,
        h,
        w,
        c,
        k,
        r,
        s,
        stride: [stride, stride],
        pad: [pad, pad],
        dilation: [1, 1],
        groups,
    }
}

#[test]
fn convolution_forward_and_both_gradients_match_f64() {
    let rt = runtime();
    let mut rng = Rng(41);
    let mut cases = vec![
        shape(2, (9, 7), (5, 6), (3, 3), 1, 1, 1),
        shape(1, (8, 8), (4, 8), (1, 1), 1, 0, 1),
        shape(3, (11, 6), (6, 4), (1, 1), 2, 0, 1),
        shape(2, (12, 10), (3, 5), (5, 5), 2, 2, 1),
        shape(1, (15, 13), (3, 4), (7, 7), 2, 3, 1),
        shape(2, (7, 9), (6, 9), (3, 3), 2, 1, 3),
        shape(2, (6, 6), (4, 4), (3, 3), 1, 1, 4),
        shape(1, (5, 8), (2, 3), (3, 1), 1, 0, 1),
    ];
    cases.push(ConvShape {
        dilation: [2, 2],
        ..shape(1, (9, 9), (3, 2), (3, 3), 1, 2, 1)
    });
    for s in cases {
        let (p, q) = s.out_hw();
        let x = rng.vec(s.n * s.h * s.w * s.c, -1.0, 1.0);
        let w = rng.vec(s.k * s.per_group(), -1.0, 1.0);
        let b = rng.vec(s.k, -1.0, 1.0);
        let dy = rng.vec(s.n * p * q * s.k, -1.0, 1.0);
        for dt in [DType::F32, DType::F16] {
            let xt = upload(&rt, &x, &[s.n, s.h, s.w, s.c], dt);
            let wt = upload(&rt, &w, &s.weight_shape(), dt);
            let bt = upload(&rt, &b, &[s.k], DType::F32);
            let dyt = upload(&rt, &dy, &[s.n, p, q, s.k], dt);
            let (xr, wr, dyr) = (rounded(&x, dt), rounded(&w, dt), rounded(&dy, dt));
            let mut want = conv_ref(&xr, &wr, &s);
            for (i, v) in want.iter_mut().enumerate() {
                *v += b[i % s.k] as f64;
            }
            let y = conv::forward(&rt, &xt, &wt, Some(&bt), &s, DType::F32, "y").unwrap();
            let what = format!("{s:?} {dt:?}");
            assert_close(&rt, &format!("conv forward {what}"), &y, &want, s.per_group());
            let (dx_want, dw_want) = conv_grads_ref(&xr, &wr, &dyr, &s);
            let dx = conv::backward_input(&rt, &dyt, &wt, &s, Category::Other).unwrap();
            assert_close(&rt, &format!("conv dgrad {what}"), &dx, &dx_want, s.k * s.r * s.s);
            let dw = conv::backward_weight(&rt, &xt, &dyt, &s, Category::Other).unwrap();
            assert_close(&rt, &format!("conv wgrad {what}"), &dw, &dw_want, s.n * p * q);
        }
    }
    finish(&rt);
}

#[test]
fn convolution_refuses_impossible_shapes() {
    let rt = runtime();
    let bad = [
        shape(1, (4, 4), (3, 4), (3, 3), 1, 0, 2),
        shape(1, (2, 2), (1, 1), (5, 5), 1, 0, 1),
        shape(0, (4, 4), (1, 1), (1, 1), 1, 0, 1),
    ];
    for s in bad {
        assert!(s.check("conv").is_err(), "{s:?}");
    }
    let s = shape(1, (4, 4), (2, 2), (3, 3), 1, 1, 1);
    let x = upload(&rt, &[0.0; 30], &[1, 5, 3, 2], DType::F32);
    let w = upload(&rt, &[0.0; 36], &s.weight_shape(), DType::F32);
    let e = conv::forward(&rt, &x, &w, None, &s, DType::F32, "y").unwrap_err().to_string();
    assert!(e.contains("NHWC"), "{e}");
}

/// Per-channel mean and biased variance of x [m, c].
fn moments(x: &[f64], c: usize) -> (Vec<f64>, Vec<f64>) {
    let m = x.len() / c;
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for (i, v) in x.iter().enumerate() {
        mean[i % c] += v / m as f64;
    }
    for (i, v) in x.iter().enumerate() {
        var[i % c] += (v - mean[i % c]).powi(2) / m as f64;
    }
    (mean, var)
}

#[test]
fn batch_norm_train_and_eval_with_running_statistics_and_fused_relu_add() {
    let rt = runtime();
    let mut rng = Rng(7);
    for (m, c, relu, residual, dt) in [
        (1500, 5, false, false, DType::F32),
        (700, 70, true, false, DType::F32),
        (1031, 3, true, true, DType::F32),
        (600, 9, true, true, DType::F16),
    ] {
        // An offset mean: the merge must not lose the variance to cancellation.
        let x: Vec<f32> = rng
            .vec(m * c, -1.0, 1.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1.0 + (i % c) as f32) + 30.0)
            .collect();
        let res = rng.vec(m * c, -1.0, 1.0);
        let dy = rng.vec(m * c, -1.0, 1.0);
        let gamma = rng.vec(c, 0.5, 1.5);
        let beta = rng.vec(c, -0.5, 0.5);
        let rm0 = rng.vec(c, -1.0, 1.0);
        let rv0 = rng.vec(c, 0.5, 2.0);
        let (eps, momentum) = (1e-5f32, 0.1f32);
        let xt = upload(&rt, &x, &[m, c], dt);
        let rt_res = upload(&rt, &res, &[m, c], dt);
        let dyt = upload(&rt, &dy, &[m, c], DType::F32);
        let g = upload(&rt, &gamma, &[c], DType::F32);
        let bt = upload(&rt, &beta, &[c], DType::F32);
        let rm = upload(&rt, &rm0, &[c], DType::F32);
        let rv = upload(&rt, &rv0, &[c], DType::F32);
        let nbt = upload(&rt, &[4.0], &[1], DType::F32);
        let xr = rounded(&x, dt);
        let resr = rounded(&res, dt);
        let r = residual.then_some(&rt_res);
        let part = batchnorm::stats(&rt, &xt).unwrap();
        let stats = Stats::Batch { momentum, update: true };
        let coef = batchnorm::finalize(&rt, Some(&part), [&g, &bt, &rm, &rv, &nbt], eps, stats, "coef").unwrap();
        let y = batchnorm::apply(&rt, &xt, r, &coef, relu, DType::F32, "y").unwrap();
        let (mean, var) = moments(&xr, c);
        let invstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps as f64).sqrt()).collect();
        let pre: Vec<f64> = (0..m * c)
            .map(|i| {
                let ch = i % c;
                let v = (xr[i] - mean[ch]) * invstd[ch] * gamma[ch] as f64 + beta[ch] as f64;
                if residual { v + resr[i] } else { v }
            })
            .collect();
        let want: Vec<f64> = pre.iter().map(|&v| if relu { v.max(0.0) } else { v }).collect();
        let what = format!("m {m} c {c} relu {relu} residual {residual} {dt:?}");
        assert_close_within(&rt, &format!("bn forward {what}"), &y, &want, (1e-4, 1e-4));
        let unbiased: Vec<f64> = var.iter().map(|v| v * m as f64 / (m - 1) as f64).collect();
        let rm_want: Vec<f64> = (0..c).map(|i| 0.9 * rm0[i] as f64 + 0.1 * mean[i]).collect();
        let rv_want: Vec<f64> = (0..c).map(|i| 0.9 * rv0[i] as f64 + 0.1 * unbiased[i]).collect();
        assert_close_within(&rt, &format!("running mean {what}"), &rm, &rm_want, (1e-5, 1e-5));
        assert_close_within(&rt, &format!("running var {what}"), &rv, &rv_want, (1e-5, 1e-5));
        // Backward: g = dy through the mask; PyTorch's formulas.
        let gm: Vec<f64> = (0..m * c).map(|i| if relu && pre[i] <= 0.0 { 0.0 } else { dy[i] as f64 }).collect();
        let (mut sg, mut sgx) = (vec![0.0; c], vec![0.0; c]);
        for i in 0..m * c {
            sg[i % c] += gm[i];
            sgx[i % c] += gm[i] * (xr[i] - mean[i % c]);
        }
        let dx_want: Vec<f64> = (0..m * c)
            .map(|i| {
                let ch = i % c;
                let k = gamma[ch] as f64 * invstd[ch];
                k * (gm[i] - sg[ch] / m as f64 - (xr[i] - mean[ch]) * invstd[ch] * invstd[ch] * sgx[ch] / m as f64)
            })
            .collect();
        let gp = batchnorm::grad_stats(&rt, &xt, r, &dyt, &coef, relu).unwrap();
        let [gcoef, dgamma, dbeta] = batchnorm::grad_finalize(&rt, &gp, &coef, m, false, [Category::Other; 2]).unwrap();
        let (dx, dres) = batchnorm::grad_apply(&rt, &xt, r, &dyt, &coef, &gcoef, relu, [Category::Other; 2]).unwrap();
        assert_close_within(&rt, &format!("bn dx {what}"), &dx, &dx_want, (1e-4, 1e-3));
        let dg_want: Vec<f64> = (0..c).map(|ch| sgx[ch] * invstd[ch]).collect();
        assert_close_within(&rt, &format!("bn dgamma {what}"), &dgamma, &dg_want, (1e-3, 1e-4));
        assert_close_within(&rt, &format!("bn dbeta {what}"), &dbeta, &sg, (1e-3, 1e-4));
        assert_eq!(dres.is_some(), residual);
        if let Some(d) = dres {
            assert_close_within(&rt, &format!("bn dres {what}"), &d, &gm, (0.0, 0.0));
        }
        // Evaluation: the running statistics, which stay as they are.
        let coef = batchnorm::finalize(&rt, None, [&g, &bt, &rm, &rv, &nbt], eps, Stats::Running, "coef").unwrap();
        let y = batchnorm::apply(&rt, &xt, None, &coef, false, DType::F32, "y").unwrap();
        let want: Vec<f64> = (0..m * c)
            .map(|i| {
                let ch = i % c;
                (xr[i] - rm_want[ch]) / (rv_want[ch] + eps as f64).sqrt() * gamma[ch] as f64 + beta[ch] as f64
            })
            .collect();
        assert_close_within(&rt, &format!("bn eval {what}"), &y, &want, (1e-3, 1e-4));
        assert_close_within(&rt, &format!("running mean kept {what}"), &rm, &rm_want, (1e-5, 1e-5));
        assert_close_within(&rt, &format!("batches counted once {what}"), &nbt, &[5.0], (0.0, 0.0));
    }
    finish(&rt);
}

/// Pools in f64: y and dx for upstream dy (max: first largest of each window).
fn pool_ref(x: &[f64], dy: &[f64], [n, h, w, c]: [usize; 4], pool: &Pool) -> (Vec<f64>, Vec<f64>) {
    let (p, q) = pool.out_hw(h, w).unwrap();
    let (mut y, mut dx) = (vec![0.0; n * p * q * c], vec![0.0; x.len()]);
    for b in 0..n {
        for i in 0..p {
            for j in 0..q {
                let (ys, ye, xs, xe, div) = match pool.kind {
                    PoolKind::AdaptiveAvg => {
                        let (y0, y1) = (i * h / p, ((i + 1) * h).div_ceil(p));
                        let (x0, x1) = (j * w / q, ((j + 1) * w).div_ceil(q));
                        (y0 as isize, y1 as isize, x0 as isize, x1 as isize, ((y1 - y0) * (x1 - x0)) as f64)
                    }
                    _ => {
                        let ys = (i * pool.stride[0]) as isize - pool.pad[0] as isize;
                        let xs = (j * pool.stride[1]) as isize - pool.pad[1] as isize;
                        let ye = (ys + pool.kernel[0] as isize).min((h + pool.pad[0]) as isize);
                        let xe = (xs + pool.kernel[1] as isize).min((w + pool.pad[1]) as isize);
                        let padded = ((ye - ys) * (xe - xs)) as f64;
                        let (ys, xs, ye, xe) = (ys.max(0), xs.max(0), ye.min(h as isize), xe.min(w as isize));
                        let inner = ((ye - ys) * (xe - xs)) as f64;
                        let div = if pool.kind == (PoolKind::Avg { include_pad: true }) {
                            padded
                        } else {
                            inner
                        };
                        (ys, ye, xs, xe, div)
                    }
                };
                for ch in 0..c {
                    let at = |yy: isize, xx: isize| ((b * h + yy as usize) * w + xx as usize) * c + ch;
                    let o = ((b * p + i) * q + j) * c + ch;
                    if pool.kind == PoolKind::Max {
                        let mut best = at(ys, xs);
                        for yy in ys..ye {
                            for xx in xs..xe {
                                if x[at(yy, xx)] > x[best] {
                                    best = at(yy, xx);
                                }
                            }
                        }
                        y[o] = x[best];
                        dx[best] += dy[o];
                    } else {
                        for yy in ys..ye {
                            for xx in xs..xe {
                                y[o] += x[at(yy, xx)] / div;
                                dx[at(yy, xx)] += dy[o] / div;
                            }
                        }
                    }
                }
            }
        }
    }
    (y, dx)
}

#[test]
fn pools_match_pytorch_windows_forward_and_backward() {
    let rt = runtime();
    let mut rng = Rng(3);
    let pool = |kind, k: usize, s: usize, pd: usize| Pool {
        kind,
        kernel: [k, k],
        stride: [s, s],
        pad: [pd, pd],
        out: [0, 0],
    };
    let cases = [
        ([2, 9, 7, 3], pool(PoolKind::Max, 3, 2, 1)),
        ([1, 8, 8, 5], pool(PoolKind::Max, 2, 2, 0)),
        ([2, 7, 9, 4], pool(PoolKind::Avg { include_pad: true }, 3, 2, 1)),
        ([1, 6, 5, 2], pool(PoolKind::Avg { include_pad: false }, 3, 1, 1)),
        (
            [3, 7, 5, 6],
            Pool {
                out: [1, 1],
                ..pool(PoolKind::AdaptiveAvg, 0, 1, 0)
            },
        ),
        (
            [2, 10, 7, 3],
            Pool {
                out: [3, 4],
                ..pool(PoolKind::AdaptiveAvg, 0, 1, 0)
            },
        ),
    ];
    for (dims, p) in cases {
        let [n, h, w, c] = dims;
        let (oh, ow) = p.out_hw(h, w).unwrap();
        // Ties: a quarter of the values repeat, so the first largest is what counts.
        let x: Vec<f32> = rng
            .vec(n * h * w * c, -1.0, 1.0)
            .iter()
            .map(|v| if *v > 0.5 { 0.75 } else { *v })
            .collect();
        let dy = rng.vec(n * oh * ow * c, -1.0, 1.0);
        let (y_want, dx_want) = pool_ref(&rounded(&x, DType::F32), &rounded(&dy, DType::F32), dims, &p);
        let xt = upload(&rt, &x, &dims, DType::F32);
        let y = p.forward(&rt, &xt, DType::F32, "y").unwrap();
        assert_close_within(&rt, &format!("pool {p:?}"), &y, &y_want, (1e-6, 1e-5));
        let dyt = upload(&rt, &dy, &[n, oh, ow, c], DType::F32);
        let dx = p.backward(&rt, &xt, &dyt, Category::Other).unwrap();
        assert_close_within(&rt, &format!("pool backward {p:?}"), &dx, &dx_want, (1e-6, 1e-5));
    }
    let bad = pool(PoolKind::Max, 2, 2, 2).out_hw(8, 8).unwrap_err().to_string();
    assert!(bad.contains("half the kernel"), "{bad}");
    finish(&rt);
}
