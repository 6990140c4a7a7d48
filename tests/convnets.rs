//! Conv nets: the convolution, BatchNorm and pooling kernels against f64 references on
//! odd shapes (kernels 1/3/5/7, strides 1 and 2, padding, dilation, groups, non-square,
//! batch 1), BatchNorm's running statistics, and the models built on them trained end
//! to end: a ResNet's estimate equals its measured peak under every policy and on two
//! devices, SyncBatchNorm on two devices equals one device over the whole batch, a
//! resumed run equals an uninterrupted one (running statistics included), and the
//! Fashion-MNIST CNN learns.

mod cli;
mod common;

use std::path::Path;

use cli::{losses, run_ok, scratch};
use common::{Rng, assert_close, assert_close_within, finish, rounded, runtime, upload};
use wgtrain_engine::kernels::batchnorm::{self, Stats};
use wgtrain_engine::kernels::conv::{self, ConvShape};
use wgtrain_engine::kernels::pool::{Pool, PoolKind};
use wgtrain_engine::{Category, DType};

/// Every tap of the convolution `s` on NHWC input: (output index, input index, weight
/// index) for each output element, input channel and kernel position inside the image.
fn taps(s: &ConvShape, mut f: impl FnMut(usize, usize, usize)) {
    let (p, q) = s.out_hw();
    let (cg, kg) = (s.c / s.groups, s.k / s.groups);
    for n in 0..s.n {
        for i in 0..p {
            for j in 0..q {
                for k in 0..s.k {
                    let g = k / kg;
                    for c in 0..cg {
                        for r in 0..s.r {
                            for t in 0..s.s {
                                let hh = (i * s.stride[0] + r * s.dilation[0]) as isize - s.pad[0] as isize;
                                let ww = (j * s.stride[1] + t * s.dilation[1]) as isize - s.pad[1] as isize;
                                if hh < 0 || ww < 0 || hh >= s.h as isize || ww >= s.w as isize {
                                    continue;
                                }
                                let xi = ((n * s.h + hh as usize) * s.w + ww as usize) * s.c + g * cg + c;
                                f(((n * p + i) * q + j) * s.k + k, xi, ((k * cg + c) * s.r + r) * s.s + t);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// x [n, h, w, c] NHWC, w [k, cg, r, s]: y [n, p, q, k].
fn conv_ref(x: &[f64], w: &[f64], s: &ConvShape) -> Vec<f64> {
    let (p, q) = s.out_hw();
    let mut y = vec![0.0; s.n * p * q * s.k];
    taps(s, |o, xi, wi| y[o] += x[xi] * w[wi]);
    y
}

/// dx and dw of sum(y * dy), by the chain rule on the same taps.
fn conv_grads_ref(x: &[f64], w: &[f64], dy: &[f64], s: &ConvShape) -> (Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; w.len()]);
    taps(s, |o, xi, wi| {
        dx[xi] += dy[o] * w[wi];
        dw[wi] += dy[o] * x[xi];
    });
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
    // Channels in fours (the vec4 gathers), and enough rows to split the weight gradient.
    cases.push(shape(4, (20, 18), (8, 12), (3, 3), 1, 1, 1));
    cases.push(shape(2, (34, 34), (4, 8), (1, 1), 1, 0, 1));
    cases.push(shape(2, (10, 10), (8, 8), (3, 3), 2, 1, 2));
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
            let wp = conv::pack_weight(&rt, &wt, &s, dt).unwrap();
            let y = conv::forward(&rt, &xt, &wp, Some(&bt), &s, DType::F32, "y").unwrap();
            let what = format!("{s:?} {dt:?}");
            assert_close(&rt, &format!("conv forward {what}"), &y, &want, s.per_group());
            let (dx_want, dw_want) = conv_grads_ref(&xr, &wr, &dyr, &s);
            let dx = conv::backward_input(&rt, &dyt, &wp, &s, (dt, Category::Other)).unwrap();
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
    let w = conv::pack_weight(&rt, &w, &s, DType::F32).unwrap();
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
        // Channels in fours: the elementwise passes take vec4s.
        (640, 12, true, true, DType::F16),
        (515, 8, true, false, DType::F32),
        (300, 16, false, false, DType::F32),
        // Past one workgroup's 64 channels, in fours (statistics read vec4s too).
        (1100, 68, false, false, DType::F16),
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
        // Backward reads the ReLU's mask from the forward's output.
        let relu_out = relu.then_some(&y);
        let gp = batchnorm::grad_stats(&rt, &xt, relu_out, &dyt, &coef).unwrap();
        let [gcoef, dgamma, dbeta] = batchnorm::grad_finalize(&rt, &gp, &coef, m, false, [Category::Other; 2]).unwrap();
        // Backward's dx written in `out` (f32, or f16 as fp16-mixed writes it).
        let gapply =
            |out: DType| batchnorm::grad_apply(&rt, &xt, relu_out, &dyt, &coef, &gcoef, residual, (out, [Category::Other; 2])).unwrap();
        let (dx, dres) = gapply(DType::F32);
        assert_close_within(&rt, &format!("bn dx {what}"), &dx, &dx_want, (1e-4, 1e-3));
        // The same dx in f16 (fp16-mixed's, for an f16 input): rounded once.
        if dt == DType::F16 {
            let (dx16, _) = gapply(DType::F16);
            assert_eq!(dx16.dtype(), DType::F16);
            assert_close_within(&rt, &format!("bn dx f16 {what}"), &dx16, &dx_want, (2e-3, 2e-3));
        }
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
        // Channels in fours: a vector of 4 a thread.
        ([2, 9, 7, 8], pool(PoolKind::Max, 3, 2, 1)),
        ([1, 8, 8, 4], pool(PoolKind::Max, 2, 2, 0)),
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
        // Without the forward's output, and (a max pool) with it: the same gradient.
        for kept in [None, Some(&y)] {
            let dx = p.backward(&rt, &xt, kept, &dyt, Category::Other).unwrap();
            assert_close_within(
                &rt,
                &format!("pool backward {p:?}, kept {}", kept.is_some()),
                &dx,
                &dx_want,
                (1e-6, 1e-5),
            );
        }
    }
    let bad = pool(PoolKind::Max, 2, 2, 2).out_hw(8, 8).unwrap_err().to_string();
    assert!(bad.contains("half the kernel"), "{bad}");
    finish(&rt);
}

/// `wgtrain COMMAND` on a ResNet-18 of width 8 over synthetic 48x48 images (batch 16,
/// augmented), with `sets` on top.
fn resnet_args(command: &str, sets: &[&str]) -> Vec<String> {
    let mut args = vec![command.to_string()];
    if command == "train" {
        args.push("--quiet".into());
    }
    let base = [
        "model.kind=\"resnet\"",
        "model.depth=18",
        "model.width=8",
        "data.kind=\"synthetic_images\"",
        "data.image=[3, 48, 40]",
        "data.classes=10",
        "data.train_limit=64",
        "data.eval_limit=16",
        "data.crop_padding=2",
        "data.flip=true",
        "train.batch_size=16",
        "train.eval_every=0",
        "train.optimizer=\"sgd\"",
        "train.lr=0.05",
        "train.momentum=0.9",
    ];
    for s in base.iter().chain(sets) {
        args.extend(["--set".into(), s.to_string()]);
    }
    args
}

/// Trains [`resnet_args`] with `sets` into `dir/name.jsonl` (checkpoints in name.ckpt).
fn resnet_run(dir: &Path, name: &str, sets: &[&str]) -> std::path::PathBuf {
    let log = dir.join(format!("{name}.jsonl"));
    let ckpt = format!("checkpoint.dir=\"{}\"", dir.join(format!("{name}.ckpt")).display());
    let mut all = vec![ckpt.as_str()];
    all.extend(sets);
    let mut args = resnet_args("train", &all);
    args.extend(["--log".into(), log.display().to_string()]);
    run_ok(&args, &[]);
    log
}

fn lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The evaluation losses of a log (they read BatchNorm's running statistics).
fn eval_losses(log: &Path) -> Vec<f64> {
    lines(log)
        .iter()
        .filter_map(|v| v.get("eval").map(|e| e["loss"].as_f64().unwrap()))
        .collect()
}

fn estimate_json(sets: &[&str]) -> serde_json::Value {
    let mut args = resnet_args("estimate", sets);
    args.push("--json".into());
    serde_json::from_str(&run_ok(&args, &[])).unwrap()
}

#[test]
fn a_resnet_estimate_equals_its_measured_peak_under_every_policy() {
    let dir = scratch("resnet-estimate");
    for precision in ["fp32", "fp16-mixed"] {
        for checkpoint in ["none", "every-layer"] {
            let sets = [
                "train.steps=3".to_string(),
                format!("memory.precision=\"{precision}\""),
                format!("memory.checkpoint=\"{checkpoint}\""),
            ];
            let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
            let est = estimate_json(&sets);
            let want = est["peak_bytes"].as_u64().unwrap();
            // Saved activations per image: the activations' own peak over the 16 images.
            let act = est["category_peaks"]["activation"].as_u64().unwrap();
            assert!(act > 0);
            assert_eq!(est["activation_per_example"].as_u64(), Some(act / 16), "{precision} {checkpoint}");
            let log = resnet_run(&dir, &format!("{precision}-{checkpoint}"), &sets);
            // From the second step on (the optimizer state exists), as the estimate's.
            for v in lines(&log)
                .iter()
                .filter(|v| v.get("loss").is_some() && v["step"].as_u64() > Some(1))
            {
                assert_eq!(
                    v["mem"]["peak"].as_u64().unwrap(),
                    want,
                    "{precision} {checkpoint}: step {}",
                    v["step"]
                );
            }
        }
    }
    for extra in [
        vec!["parallel.zero=0"],
        vec![
            "parallel.zero=3",
            "parallel.offload=\"optimizer+parameters\"",
            "memory.checkpoint=\"every-layer\"",
        ],
    ] {
        let mut sets = vec!["train.steps=3", "parallel.devices=[\"0\", \"0\"]", "parallel.sync_batch_norm=true"];
        sets.extend(&extra);
        let want: Vec<u64> = estimate_json(&sets)["device_peaks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let log = resnet_run(&dir, &format!("d2-{}", extra.len()), &sets);
        for v in lines(&log)
            .iter()
            .filter(|v| v.get("loss").is_some() && v["step"].as_u64() > Some(1))
        {
            let peaks: Vec<u64> = v["mem"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["peak"].as_u64().unwrap())
                .collect();
            assert_eq!(peaks, want, "{extra:?}: step {}", v["step"]);
        }
    }
}

#[test]
fn sync_batch_norm_on_two_devices_equals_one_device_over_the_whole_batch() {
    let dir = scratch("resnet-syncbn");
    // One epoch at a small learning rate: long enough to move the running statistics
    // four times, short enough that rounding is not amplified by training itself.
    let steps = ["train.steps=4", "train.lr=0.005"];
    let one = resnet_run(&dir, "one", &steps);
    let two = [
        "train.steps=4",
        "train.lr=0.005",
        "parallel.devices=[\"0\", \"0\"]",
        "parallel.sync_batch_norm=true",
    ];
    let synced = resnet_run(&dir, "synced", &two);
    let own = resnet_run(&dir, "own", &two[..3]);
    let (a, b) = (losses(&one), losses(&synced));
    assert_eq!(a.len(), 4);
    for ((s, x), (_, y)) in a.iter().zip(&b) {
        assert!(((x - y) / x).abs() <= 1e-5, "step {s}: one device {x}, SyncBatchNorm on two {y}");
    }
    // Evaluation reads the running statistics: they moved alike.
    let (ea, eb) = (eval_losses(&one), eval_losses(&synced));
    assert_eq!(ea.len(), 1);
    assert!(
        ((ea[0] - eb[0]) / ea[0]).abs() <= 1e-5,
        "evaluation: one device {ea:?}, SyncBatchNorm on two {eb:?}"
    );
    // Each device's own statistics (no sync) are another computation.
    let c = losses(&own);
    assert!(
        a.iter().zip(&c).any(|((_, x), (_, y))| ((x - y) / x).abs() > 1e-3),
        "{a:?} vs {c:?}"
    );
}

#[test]
fn a_resumed_resnet_run_equals_the_uninterrupted_one_running_statistics_included() {
    let dir = scratch("resnet-resume");
    let full = resnet_run(&dir, "full", &["train.steps=6", "checkpoint.every=3"]);
    let ckpt = dir.join("full.ckpt").join("step-000000003");
    assert!(ckpt.is_dir(), "{}", ckpt.display());
    let log = dir.join("resumed.jsonl");
    let mut args = vec!["train".to_string(), "--quiet".into(), "--resume".into(), ckpt.display().to_string()];
    args.extend(["--log".into(), log.display().to_string()]);
    args.extend(["--set".into(), format!("checkpoint.dir=\"{}\"", dir.join("resumed.ckpt").display())]);
    run_ok(&args, &[]);
    let tail: Vec<(u64, f64)> = losses(&full).into_iter().filter(|(s, _)| *s > 3).collect();
    assert_eq!(tail, losses(&log), "the resumed steps' losses");
    assert_eq!(eval_losses(&full).last(), eval_losses(&log).last(), "the final evaluation");
}

#[test]
fn the_fashion_cnn_learns_and_its_config_is_the_documented_one() {
    let dir = scratch("fashion-cnn");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs/fashion_cnn.toml");
    let log = dir.join("cnn.jsonl");
    let args: Vec<String> = [
        "train",
        "--quiet",
        config.to_str().unwrap(),
        "--set",
        "train.steps=20",
        "--set",
        "train.warmup_steps=5",
        "--set",
        "data.train_limit=1280",
        "--set",
        "data.eval_limit=300",
        "--set",
        "train.eval_every=20",
        "--set",
        &format!("checkpoint.dir=\"{}\"", dir.join("ck").display()),
        "--log",
        log.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run_ok(&args, &[]);
    let evals: Vec<f64> = lines(&log)
        .iter()
        .filter_map(|v| v.get("eval").map(|e| e["accuracy"].as_f64().unwrap()))
        .collect();
    // Ten classes: chance is 10%; 20 steps of 64 images (a short warm-up) already reach
    // well past it (lavapipe: 71%).
    assert!(evals.last().is_some_and(|&a| a > 0.6), "{evals:?}");
}
