//! Gradient checks: every differentiable op's backward against central finite
//! differences of an f64 CPU forward, through the tape (L = sum(y * g) for random g).

mod common;

use common::{Rng, assert_same_or_within, finish, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::ops::{self, WeightLayout};
use wgtrain_engine::autograd::{Params, Tape, Var};
use wgtrain_engine::kernels::tolerance::compare;
use wgtrain_engine::{Category, DType, Runtime, Tensor};

/// Records L = sum(y * g) so that backward hands g to y.
fn dot_loss(tape: &mut Tape, rt: &Runtime, y: &Var, g: &[f32]) -> Var {
    let gt = upload(rt, g, y.value.shape(), DType::F32);
    let placeholder = Tensor::full(rt, &[1], DType::F32, 0.0, Category::Temporary, "L").unwrap();
    tape.record(placeholder, &[y], Box::new(move |_rt, _dl, _c| Ok(vec![Some(gt)])))
}

/// Central differences of `f` at `x` in f64.
fn numeric_grad(x: &[f64], f: &dyn Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..x.len())
        .map(|i| {
            let h = 1e-6 * (1.0 + x[i].abs());
            let (mut up, mut down) = (x.to_vec(), x.to_vec());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect()
}

fn check(what: &str, got: &Tensor, want: &[f64], rt: &Runtime) {
    let g = got.to_f32_vec(rt).unwrap();
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let (abs, rel, ok) = compare(&g, want, 2e-4 * scale, 2e-3);
    assert!(
        ok,
        "{what}: max abs {abs:e} rel {rel:e}; got {:?} want {:?}",
        &g[..g.len().min(5)],
        &want[..want.len().min(5)]
    );
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn linear_both_layouts_with_bias() {
    let rt = runtime();
    let mut rng = Rng(21);
    let (n, i, o) = (5usize, 7usize, 3usize);
    let x = rng.vec(n * i, -1.0, 1.0);
    let b = rng.vec(o, -1.0, 1.0);
    let g = rng.vec(n * o, -1.0, 1.0);
    for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
        let w = rng.vec(i * o, -1.0, 1.0);
        let wshape = if layout == WeightLayout::OutIn { [o, i] } else { [i, o] };
        let wat = |w: &[f64], r: usize, c: usize| {
            if layout == WeightLayout::OutIn {
                w[c * i + r]
            } else {
                w[r * o + c]
            }
        };
        let fwd = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
            let mut l = 0.0;
            for r in 0..n {
                for c in 0..o {
                    let y = b[c] + (0..i).map(|k| x[r * i + k] * wat(w, k, c)).sum::<f64>();
                    l += y * g[r * o + c] as f64;
                }
            }
            l
        };
        let mut params = Params::default();
        let wi = params.add("w", upload(&rt, &w, &wshape, DType::F32));
        let bi = params.add("b", upload(&rt, &b, &[o], DType::F32));
        let mut tape = Tape::new();
        let xv = tape.constant(upload(&rt, &x, &[n, i], DType::F32));
        let (wv, bv) = (tape.param(&params, wi).unwrap(), tape.param(&params, bi).unwrap());
        let y = ops::linear(&mut tape, &rt, &xv, &wv, Some(&bv), layout, "y").unwrap();
        let l = dot_loss(&mut tape, &rt, &y, &g);
        tape.backward(&rt, &l, &mut params).unwrap();
        let (xd, wd, bd) = (f64s(&x), f64s(&w), f64s(&b));
        check(
            "dW",
            params.list[wi].grad.as_ref().unwrap(),
            &numeric_grad(&wd, &|w| fwd(&xd, w, &bd)),
            &rt,
        );
        check(
            "db",
            params.list[bi].grad.as_ref().unwrap(),
            &numeric_grad(&bd, &|b| fwd(&xd, &wd, b)),
            &rt,
        );
        assert_eq!(params.list[wi].grad.as_ref().unwrap().block().category(), Category::Gradient);
    }
    finish(&rt);
}

#[test]
fn activations_add_and_input_gradients() {
    // L = sum(g * act(x W^T) + g * x2) exercises relu/gelu backward, add, and dx of linear.
    let rt = runtime();
    let mut rng = Rng(22);
    let (n, i, o) = (4usize, 6usize, 6usize);
    let x = rng.vec(n * i, -1.0, 1.0);
    let w = rng.vec(o * i, -1.0, 1.0);
    let g = rng.vec(n * o, -1.0, 1.0);
    for act in ["relu", "gelu"] {
        let mut params = Params::default();
        let xi = params.add("x", upload(&rt, &x, &[n, i], DType::F32));
        let wi = params.add("w", upload(&rt, &w, &[o, i], DType::F32));
        let mut tape = Tape::new();
        let (xv, wv) = (tape.param(&params, xi).unwrap(), tape.param(&params, wi).unwrap());
        let h = ops::linear(&mut tape, &rt, &xv, &wv, None, WeightLayout::OutIn, "h").unwrap();
        let a = if act == "relu" {
            ops::relu(&mut tape, &rt, &h, "a")
        } else {
            ops::gelu(&mut tape, &rt, &h, "a")
        }
        .unwrap();
        let y = ops::add(&mut tape, &rt, &a, &xv, "y").unwrap();
        let l = dot_loss(&mut tape, &rt, &y, &g);
        tape.backward(&rt, &l, &mut params).unwrap();
        let f = |x: &[f64], w: &[f64]| -> f64 {
            let mut l = 0.0;
            for r in 0..n {
                for c in 0..o {
                    let hv: f64 = (0..i).map(|k| x[r * i + k] * w[c * i + k]).sum();
                    let av = if act == "relu" {
                        hv.max(0.0)
                    } else {
                        0.5 * hv * (1.0 + (0.7978845608028654 * (hv + 0.044715 * hv.powi(3))).tanh())
                    };
                    l += (av + x[r * i + c]) * g[r * o + c] as f64;
                }
            }
            l
        };
        let (xd, wd) = (f64s(&x), f64s(&w));
        check(
            &format!("{act} dx"),
            params.list[xi].grad.as_ref().unwrap(),
            &numeric_grad(&xd, &|x| f(x, &wd)),
            &rt,
        );
        check(
            &format!("{act} dW"),
            params.list[wi].grad.as_ref().unwrap(),
            &numeric_grad(&wd, &|w| f(&xd, w)),
            &rt,
        );
    }
    finish(&rt);
}

#[test]
fn layernorm_embedding_and_cross_entropy() {
    let rt = runtime();
    let mut rng = Rng(23);
    let (v, c) = (9usize, 8usize);
    let ids: Vec<i32> = vec![1, 4, 4, 8, 0];
    let targets: Vec<i32> = vec![3, -100, 8, 1, 5];
    let n = ids.len();
    let table = rng.vec(v * c, -1.0, 1.0);
    let w = rng.vec(c, 0.5, 1.5);
    let b = rng.vec(c, -0.5, 0.5);
    let head = rng.vec(v * c, -1.0, 1.0);
    let mut params = Params::default();
    let ti = params.add("table", upload(&rt, &table, &[v, c], DType::F32));
    let wi = params.add("ln.w", upload(&rt, &w, &[c], DType::F32));
    let bi = params.add("ln.b", upload(&rt, &b, &[c], DType::F32));
    let hi = params.add("head", upload(&rt, &head, &[v, c], DType::F32));
    let ids_t = Tensor::from_i32(&rt, &ids, &[n], Category::Input, "ids").unwrap();
    let tg_t = Tensor::from_i32(&rt, &targets, &[n], Category::Input, "targets").unwrap();
    let mut tape = Tape::new();
    let (tv, wv, bv, hv) = (
        tape.param(&params, ti).unwrap(),
        tape.param(&params, wi).unwrap(),
        tape.param(&params, bi).unwrap(),
        tape.param(&params, hi).unwrap(),
    );
    let e = ops::embedding(&mut tape, &rt, &ids_t, &tv, "emb").unwrap();
    let h = ops::layernorm(&mut tape, &rt, &e, &wv, &bv, 1e-5, "ln").unwrap();
    let logits = ops::linear(&mut tape, &rt, &h, &hv, None, WeightLayout::OutIn, "logits").unwrap();
    let loss = ops::cross_entropy_mean(&mut tape, &rt, &logits, &tg_t, 4, 2, "loss").unwrap();
    let loss_value = loss.value.to_f32_vec(&rt).unwrap()[0] as f64;
    tape.backward(&rt, &loss, &mut params).unwrap();
    let f = |table: &[f64], w: &[f64], b: &[f64], head: &[f64]| -> f64 {
        let mut total = 0.0;
        for (r, &id) in ids.iter().enumerate() {
            let x: Vec<f64> = table[id as usize * c..(id as usize + 1) * c].to_vec();
            let mu = x.iter().sum::<f64>() / c as f64;
            let var = x.iter().map(|q| (q - mu).powi(2)).sum::<f64>() / c as f64;
            let hn: Vec<f64> = (0..c).map(|j| (x[j] - mu) / (var + 1e-5).sqrt() * w[j] + b[j]).collect();
            let lg: Vec<f64> = (0..v).map(|k| (0..c).map(|j| hn[j] * head[k * c + j]).sum()).collect();
            if targets[r] < 0 {
                continue;
            }
            let m = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = lg.iter().map(|q| (q - m).exp()).sum();
            total += z.ln() + m - lg[targets[r] as usize];
        }
        total / 4.0
    };
    let (td, wd, bd, hd) = (f64s(&table), f64s(&w), f64s(&b), f64s(&head));
    assert!((loss_value - f(&td, &wd, &bd, &hd)).abs() < 1e-5, "loss {loss_value}");
    check(
        "dtable",
        params.list[ti].grad.as_ref().unwrap(),
        &numeric_grad(&td, &|t| f(t, &wd, &bd, &hd)),
        &rt,
    );
    check(
        "dln.w",
        params.list[wi].grad.as_ref().unwrap(),
        &numeric_grad(&wd, &|w| f(&td, w, &bd, &hd)),
        &rt,
    );
    check(
        "dln.b",
        params.list[bi].grad.as_ref().unwrap(),
        &numeric_grad(&bd, &|b| f(&td, &wd, b, &hd)),
        &rt,
    );
    check(
        "dhead",
        params.list[hi].grad.as_ref().unwrap(),
        &numeric_grad(&hd, &|h| f(&td, &wd, &bd, h)),
        &rt,
    );
    finish(&rt);
}

#[test]
fn gradients_accumulate_across_backward_calls_and_zero_grad_frees_them() {
    let rt = runtime();
    let mut params = Params::default();
    let wi = params.add("w", upload(&rt, &[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32));
    for _ in 0..2 {
        let mut tape = Tape::new();
        let x = tape.constant(upload(&rt, &[1.0, 1.0], &[1, 2], DType::F32));
        let w = tape.param(&params, wi).unwrap();
        let y = ops::linear(&mut tape, &rt, &x, &w, None, WeightLayout::OutIn, "y").unwrap();
        let l = dot_loss(&mut tape, &rt, &y, &[1.0, 1.0]);
        tape.backward(&rt, &l, &mut params).unwrap();
    }
    assert_eq!(params.list[wi].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap(), vec![2.0; 4]);
    let before = rt.alloc.stats().category(Category::Gradient).allocated.current;
    assert!(before > 0);
    params.zero_grad();
    assert_eq!(rt.alloc.stats().category(Category::Gradient).allocated.current, 0);
    // no_grad records nothing and keeps no activations for backward.
    let mut tape = Tape::no_grad();
    let x = tape.constant(upload(&rt, &[1.0, 1.0], &[1, 2], DType::F32));
    let w = tape.param(&params, wi).unwrap();
    let y = ops::linear(&mut tape, &rt, &x, &w, None, WeightLayout::OutIn, "y").unwrap();
    assert_eq!(y.value.to_f32_vec(&rt).unwrap(), vec![3.0, 7.0]);
    finish(&rt);
}

/// The MLP node (`ops::mlp`: a linear, GELU, a linear, keeping GELU's input only and
/// writing its output again in backward) against the same linears recorded apart
/// (`ops::linear_act_as`, then `ops::linear`): the same output and the same five
/// gradients, bit for bit, in both layouts, in f32 and under fp16-mixed; and what its
/// forward leaves allocated is at least the hidden activation's bytes less.
#[test]
fn mlp_node_equals_its_linears_apart_and_keeps_no_activation_output() {
    use wgtrain_engine::kernels::map::MapOp;
    let rt = runtime();
    let mut rng = Rng(5);
    // More than 64 rows: the bias sums take two chunks (held second passes).
    let (n, c, h) = (70usize, 16usize, 64usize);
    let gy = rng.vec(n * c, -1.0, 1.0);
    for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
        let (w1_shape, w2_shape) = match layout {
            WeightLayout::OutIn => ([h, c], [c, h]),
            WeightLayout::InOut => ([c, h], [h, c]),
        };
        let shapes: [&[usize]; 5] = [&[n, c], &w1_shape, &[h], &w2_shape, &[c]];
        let values: Vec<Vec<f32>> = shapes.iter().map(|s| rng.vec(s.iter().product(), -1.0, 1.0)).collect();
        for mixed in [false, true] {
            if mixed && !rt.gpu.caps.shader_f16 {
                continue;
            }
            let hidden = if mixed { DType::F16 } else { DType::F32 };
            let run = |fused: bool| {
                let mut params = Params::default();
                let ids: Vec<usize> = (0..5)
                    .map(|i| params.add(&format!("p{i}"), upload(&rt, &values[i], shapes[i], DType::F32)))
                    .collect();
                let mut tape = Tape::new().with_half_matmuls(mixed);
                let v: Vec<Var> = ids.iter().map(|&i| tape.param(&params, i).unwrap()).collect();
                let before = rt.alloc.stats().allocated.current;
                let y = if fused {
                    ops::mlp(
                        &mut tape,
                        &rt,
                        &v[0],
                        (&v[1], Some(&v[2])),
                        MapOp::Gelu,
                        (&v[3], Some(&v[4])),
                        layout,
                        hidden,
                        ["fc", "act", "proj"],
                    )
                    .unwrap()
                } else {
                    let g = ops::linear_act_as(
                        &mut tape,
                        &rt,
                        (&v[0], &v[1], Some(&v[2])),
                        layout,
                        hidden,
                        MapOp::Gelu,
                        ("fc", "act"),
                    )
                    .unwrap();
                    ops::linear(&mut tape, &rt, &g, &v[3], Some(&v[4]), layout, "proj").unwrap()
                };
                let kept = rt.alloc.stats().allocated.current - before;
                let out = y.value.to_f32_vec(&rt).unwrap();
                let l = dot_loss(&mut tape, &rt, &y, &gy);
                drop(v);
                tape.backward(&rt, &l, &mut params).unwrap();
                let grads: Vec<Vec<f32>> = ids
                    .iter()
                    .map(|&i| params.list[i].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap())
                    .collect();
                (out, grads, kept)
            };
            let (y_apart, g_apart, kept_apart) = run(false);
            let (y_fused, g_fused, kept_fused) = run(true);
            let what = format!("{layout:?}, mixed {mixed}");
            // Bit for bit on lavapipe; on a GPU the node's GELU, recomputed by the bias
            // sums' pass, may round differently from the forward's (an H200's did).
            let (cpu, rel) = (rt.gpu.caps.facts.cpu, if mixed { 2e-3 } else { 1e-5 });
            assert_same_or_within(cpu, &format!("output, {what}"), &y_fused, &y_apart, rel);
            for (i, (f, a)) in g_fused.iter().zip(&g_apart).enumerate() {
                assert_same_or_within(cpu, &format!("gradient {i}, {what}"), f, a, rel);
            }
            let activation = (n * h * hidden.size()) as u64;
            assert!(
                kept_fused + activation <= kept_apart,
                "{what}: the node kept {kept_fused} bytes, apart {kept_apart}"
            );
        }
    }
    finish(&rt);
}
