//! The layer library: each new op's forward and backward against f64 references,
//! dropout's masks (rate, scaling, the same mask in backward and in a recomputed
//! segment, none in evaluation), the builder's names and refusals, and a model of the
//! caller's trained by the real trainer, resumed bit for bit with dropout on.

mod common;

use std::sync::Arc;

use common::{Rng, assert_close_within, finish, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::ops;
use wgtrain_engine::autograd::{Mode, Params, Tape, Var};
use wgtrain_engine::data::{DataError, Dataset, HostBatch};
use wgtrain_engine::nn::{Act, Activation, Builder, Ctx, Dropout, Fill, Init, LayerNorm, Linear, Module, Residual, Sequential};
use wgtrain_engine::train::{BuildModel, Config, RunOptions, Trainable, Trainer};
use wgtrain_engine::{Category, DType, Error, Runtime, Tensor};

const TOL: (f64, f64) = (1e-5, 1e-4);

/// y = op(x) recorded, then backward from L = sum(y * g): returns y and dx.
fn through(rt: &Runtime, x: &[f32], g: &[f32], mode: Mode, op: &dyn Fn(&mut Tape, &Var) -> Var) -> (Vec<f32>, Vec<f32>) {
    let mut params = Params::default();
    let xi = params.add("x", upload(rt, x, &[x.len()], DType::F32));
    let mut tape = Tape::new().with_mode(mode);
    let xv = tape.param(&params, xi).unwrap();
    let y = op(&mut tape, &xv);
    let gt = upload(rt, g, &[g.len()], DType::F32);
    // Seed backward with g directly: L = sum(y * g).
    let placeholder = Tensor::full(rt, &[1], DType::F32, 0.0, Category::Temporary, "L").unwrap();
    let l = tape.record(placeholder, &[&y], Box::new(move |_rt, _dl, _c| Ok(vec![Some(gt)])));
    let yv = y.value.to_f32_vec(rt).unwrap();
    tape.backward(rt, &l, &mut params).unwrap();
    (yv, params.list[xi].grad.as_ref().unwrap().to_f32_vec(rt).unwrap())
}

fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..120 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= TOL.0 + TOL.1 * w.abs() * 10.0, "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn silu_exact_gelu_mul_and_mse_match_f64() {
    let rt = runtime();
    let mut rng = Rng(7);
    let (x, g) = (rng.vec(37, -4.0, 4.0), rng.vec(37, -1.0, 1.0));
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let (y, dx) = through(&rt, &x, &g, Mode::default(), &|t, v| ops::silu(t, &rt, v, "silu").unwrap());
    close("silu", &y, &x.iter().map(|&v| v as f64 * sig(v as f64)).collect::<Vec<_>>());
    let d = |v: f64| sig(v) * (1.0 + v * (1.0 - sig(v)));
    close(
        "dsilu",
        &dx,
        &x.iter().zip(&g).map(|(&v, &g)| g as f64 * d(v as f64)).collect::<Vec<_>>(),
    );
    let (y, dx) = through(&rt, &x, &g, Mode::default(), &|t, v| ops::gelu_erf(t, &rt, v, "gelu").unwrap());
    let cdf = |v: f64| 0.5 * (1.0 + erf(v / 2f64.sqrt()));
    close("gelu", &y, &x.iter().map(|&v| v as f64 * cdf(v as f64)).collect::<Vec<_>>());
    let dg = |v: f64| cdf(v) + v * (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
    close(
        "dgelu",
        &dx,
        &x.iter().zip(&g).map(|(&v, &g)| g as f64 * dg(v as f64)).collect::<Vec<_>>(),
    );
    // a * b with b a constant: d/da = g * b.
    let b = rng.vec(37, -2.0, 2.0);
    let bt = upload(&rt, &b, &[37], DType::F32);
    let (y, dx) = through(&rt, &x, &g, Mode::default(), &|t, v| {
        let bv = t.constant(bt.clone());
        ops::mul(t, &rt, v, &bv, "mul").unwrap()
    });
    close("mul", &y, &x.iter().zip(&b).map(|(&a, &b)| a as f64 * b as f64).collect::<Vec<_>>());
    close(
        "dmul",
        &dx,
        &g.iter().zip(&b).map(|(&g, &b)| g as f64 * b as f64).collect::<Vec<_>>(),
    );
    // MSE: mean((p - t)^2), gradient 2 (p - t) / n.
    let mut params = Params::default();
    let p = params.add("p", upload(&rt, &x, &[37], DType::F32));
    let mut tape = Tape::new();
    let pv = tape.param(&params, p).unwrap();
    let loss = ops::mse_mean(&mut tape, &rt, &pv, &bt, "mse").unwrap();
    let want: f64 = x.iter().zip(&b).map(|(&p, &t)| (p as f64 - t as f64).powi(2)).sum::<f64>() / 37.0;
    assert_close_within(&rt, "mse", &loss.value, &[want], TOL);
    tape.backward(&rt, &loss, &mut params).unwrap();
    let want: Vec<f64> = x.iter().zip(&b).map(|(&p, &t)| 2.0 * (p as f64 - t as f64) / 37.0).collect();
    assert_close_within(&rt, "dmse", params.list[p].grad.as_ref().unwrap(), &want, TOL);
    finish(&rt);
}

#[test]
fn dropout_drops_at_its_rate_and_backward_draws_the_same_mask() {
    let rt = runtime();
    let n = 1 << 16;
    let x = vec![1.0f32; n];
    let g = vec![3.0f32; n];
    let p = 0.25f32;
    let mode = Mode {
        seed: 11,
        ..Mode::default()
    };
    let (y, dx) = through(&rt, &x, &g, mode, &|t, v| ops::dropout(t, &rt, v, p, "drop").unwrap());
    let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
    assert!((dropped - 0.25).abs() < 0.01, "dropped {dropped}");
    for (i, (&a, &d)) in y.iter().zip(&dx).enumerate() {
        assert!(a == 0.0 || (a - 1.0 / 0.75).abs() < 1e-6, "kept values are scaled: {a}");
        // The gradient passes exactly where the value did, scaled alike.
        assert_eq!(d, a * 3.0, "element {i}");
    }
    // The same seed and label draw the same mask; another label or seed another one.
    let again = through(&rt, &x, &g, mode, &|t, v| ops::dropout(t, &rt, v, p, "drop").unwrap()).0;
    assert_eq!(y, again);
    let other = through(&rt, &x, &g, mode, &|t, v| ops::dropout(t, &rt, v, p, "drop2").unwrap()).0;
    assert_ne!(y, other);
    let later = through(&rt, &x, &g, mode.fork(&[1]), &|t, v| ops::dropout(t, &rt, v, p, "drop").unwrap()).0;
    assert_ne!(y, later);
    // The scalar path (odd length) draws what the vec4 path draws for the same elements.
    let odd = through(&rt, &x[..37], &g[..37], mode, &|t, v| ops::dropout(t, &rt, v, p, "drop").unwrap()).0;
    assert_eq!(odd[..], y[..37]);
    // Evaluation passes the input through.
    let eval = through(&rt, &x, &g, Mode::eval(), &|t, v| ops::dropout(t, &rt, v, p, "drop").unwrap());
    assert!(eval.0.iter().all(|&v| v == 1.0) && eval.1.iter().all(|&v| v == 3.0));
    assert!(
        ops::dropout(
            &mut Tape::new(),
            &rt,
            &Tape::new().constant(upload(&rt, &x[..4], &[4], DType::F32)),
            1.0,
            "d"
        )
        .is_err()
    );
    finish(&rt);
}

#[test]
fn a_recomputed_segment_draws_the_same_dropout_mask() {
    let rt = runtime();
    let mut rng = Rng(3);
    let mut params = Params::default();
    let w = params.add("w", upload(&rt, &rng.vec(16 * 16, -0.5, 0.5), &[16, 16], DType::F32));
    let x = upload(&rt, &rng.vec(8 * 16, -1.0, 1.0), &[8, 16], DType::F32);
    let mut run = |recompute: bool| {
        let mut tape = Tape::new().with_mode(Mode {
            seed: 5,
            ..Mode::default()
        });
        let wv = tape.param(&params, w).unwrap();
        let xv = tape.constant(x.clone());
        let seg = std::rc::Rc::new(|t: &mut Tape, rt: &Runtime, v: &[Var]| {
            let h = ops::linear(t, rt, &v[0], &v[1], None, ops::WeightLayout::OutIn, "fc")?;
            let h = ops::gelu_erf(t, rt, &h, "act")?;
            ops::dropout(t, rt, &h, 0.5, "drop")
        });
        let y = if recompute {
            ops::checkpoint(&mut tape, &rt, &[&xv, &wv], seg).unwrap()
        } else {
            seg(&mut tape, &rt, &[xv, wv]).unwrap()
        };
        let zero = Tensor::full(&rt, y.value.shape(), DType::F32, 0.25, Category::Other, "t").unwrap();
        let loss = ops::mse_mean(&mut tape, &rt, &y, &zero, "l").unwrap();
        let l = loss.value.to_f32_vec(&rt).unwrap()[0];
        tape.backward(&rt, &loss, &mut params).unwrap();
        let g = params.list[w].grad.take().unwrap().to_f32_vec(&rt).unwrap();
        (l, g)
    };
    let plain = run(false);
    let again = run(true);
    assert_eq!(plain, again, "the recompute drew the forward's mask");
    finish(&rt);
}

#[test]
fn the_builder_names_parameters_by_path_and_refuses_what_cannot_be() {
    let rt = runtime();
    let mut params = Params::default();
    let mut init = Init::new(0);
    let mut vb = Builder::new(&rt, &mut params, &mut init);
    let mut h = vb.sub("h");
    let mut block = h.sub(0);
    Linear::new(&mut block.sub("attn").sub("c_attn"), 4, 12).unwrap();
    LayerNorm::new(&mut block.sub("ln_1"), 4, 1e-5).unwrap();
    assert!(
        block
            .param("ln_1.weight", &[4], Fill::Constant(1.0))
            .unwrap_err()
            .to_string()
            .contains("registered twice")
    );
    let huge = vb.param("huge", &[1 << 20, 1 << 20], Fill::Constant(0.0)).unwrap_err().to_string();
    assert!(huge.contains("huge") && huge.contains("larger than one buffer binding"), "{huge}");
    let names: Vec<&str> = params.list.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight", "h.0.ln_1.bias"]
    );
    assert_eq!(params.list[0].value.shape(), &[12, 4]);
    // Given values: taken by name, a missing name or a wrong shape said.
    let mut values = std::collections::BTreeMap::from([("fc.weight".to_string(), upload(&rt, &[0.0; 6], &[3, 2], DType::F32))]);
    let mut given = Params::default();
    let mut vb = Builder::from_values(&rt, &mut given, &mut init, &mut values);
    let err = Linear::new(&mut vb.sub("fc"), 2, 3).err().unwrap().to_string();
    assert!(err.contains("missing parameter fc.bias"), "{err}");
    let mut values = std::collections::BTreeMap::from([("fc.weight".to_string(), upload(&rt, &[0.0; 6], &[2, 3], DType::F32))]);
    let mut given = Params::default();
    let mut vb = Builder::from_values(&rt, &mut given, &mut init, &mut values);
    assert!(Linear::new(&mut vb.sub("fc"), 2, 3).is_err());
    finish(&rt);
}

#[test]
fn sequential_and_residual_compute_what_they_say() {
    let rt = runtime();
    let mut params = Params::default();
    let mut init = Init::new(1);
    let mut vb = Builder::new(&rt, &mut params, &mut init);
    let inner = Sequential::new()
        .push(Linear::new(&mut vb.sub(0), 3, 3).unwrap())
        .push(Act::new(&vb.sub(1), Activation::Relu))
        .push(Dropout::new(&vb.sub(2), 0.5).unwrap());
    let net = Residual::new(&vb, inner);
    let x = [0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75];
    let w = params.list[0].value.to_f32_vec(&rt).unwrap();
    let b = params.list[1].value.to_f32_vec(&rt).unwrap();
    // In evaluation dropout passes through: y = x + relu(x W^T + b).
    let mut tape = Tape::no_grad().with_mode(Mode::eval());
    let mut cx = Ctx::new(&mut tape, &rt, &params);
    let xv = cx.input(upload(&rt, &x, &[2, 3], DType::F32));
    let y = net.forward(&mut cx, &xv).unwrap();
    let mut want = Vec::new();
    for r in 0..2 {
        for o in 0..3 {
            let z = b[o] as f64 + (0..3).map(|k| x[r * 3 + k] as f64 * w[o * 3 + k] as f64).sum::<f64>();
            want.push(x[r * 3 + o] as f64 + z.max(0.0));
        }
    }
    assert_close_within(&rt, "residual", &y.value, &want, TOL);
    finish(&rt);
}

/// Two-feature points labelled by which side of a line they fall on.
struct Points(Vec<[f32; 2]>);

impl Dataset for Points {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn push(&self, i: usize, b: &mut HostBatch) -> Result<(), DataError> {
        b.features.extend_from_slice(&self.0[i]);
        b.targets.push(i32::from(self.0[i][0] + 0.5 * self.0[i][1] > 0.1));
        Ok(())
    }
}

struct Net(Sequential);

impl Trainable for Net {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        let mut cx = Ctx::new(tape, rt, params);
        let x = cx.input(Tensor::from_f32(rt, &b.features, &[b.examples, 2], Category::Input, "x")?);
        let logits = self.0.forward(&mut cx, &x)?;
        let y = Tensor::from_i32(rt, &b.targets, &[b.examples], Category::Input, "y")?;
        ops::cross_entropy_mean(cx.tape, rt, &logits, &y, b.examples, b.examples, "loss")
    }
}

fn custom(dir: &std::path::Path, steps: u64) -> Trainer {
    custom_with(dir, steps, 0.3, &[])
}

/// A caller's model and data with `drop` dropout and further `--set`s.
fn custom_with(dir: &std::path::Path, steps: u64, drop: f32, more: &[&str]) -> Trainer {
    let mut rng = Rng(9);
    let points: Vec<[f32; 2]> = (0..256).map(|_| [rng.uniform(-1.0, 1.0), rng.uniform(-1.0, 1.0)]).collect();
    let data: Arc<dyn Dataset> = Arc::new(Points(points));
    let build: Arc<BuildModel> = Arc::new(move |vb: &mut Builder| {
        let net = Sequential::new()
            .push(Linear::new(&mut vb.sub(0), 2, 32)?)
            .push(Act::new(&vb.sub(1), Activation::Silu))
            .push(Dropout::new(&vb.sub(2), drop)?)
            .push(Linear::new(&mut vb.sub(3), 32, 2)?);
        Ok(Box::new(Net(net)) as Box<dyn Trainable>)
    });
    let mut sets = vec![
        format!("train.steps={steps}"),
        "train.batch_size=32".into(),
        "train.lr=0.01".into(),
        format!("checkpoint.dir=\"{}\"", dir.display()),
    ];
    sets.extend(more.iter().map(|s| s.to_string()));
    Trainer::custom(Config::parse("", &sets).unwrap(), build, (data.clone(), data), None).unwrap()
}

#[test]
fn a_model_of_the_callers_trains_checkpoints_and_resumes_bit_for_bit() {
    let root = std::env::temp_dir().join(format!("wgtrain-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let whole = custom(&root.join("whole"), 8).run(&RunOptions::default()).unwrap();
    assert_eq!(whole.losses.len(), 8);
    assert!(whole.losses[7] < whole.losses[0], "{:?}", whole.losses);
    // Four steps of an eight-step schedule's length would change the schedule: the
    // schedule is constant here, so a four-step run is the first half.
    let half = custom(&root.join("half"), 4).run(&RunOptions::default()).unwrap();
    assert_eq!(half.losses[..], whole.losses[..4]);
    let mut resumed = custom(&root.join("half"), 8);
    let rest = resumed
        .run(&RunOptions {
            resume: Some(root.join("half")),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        rest.losses[..],
        whole.losses[4..],
        "dropout's masks follow the step, not the process"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn masked_lm_follows_the_80_10_10_rule_and_its_seed() {
    let rt = runtime();
    let config: wgtrain_engine::nn::BertConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 101, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16
    }))
    .unwrap();
    let mut params = Params::default();
    let bert = wgtrain_engine::nn::Bert::build(&mut Builder::new(&rt, &mut params, &mut Init::new(0)), config).unwrap();
    let mlm = wgtrain_engine::train::model::MaskedLm::new(bert, 0.15);
    let tokens: Vec<i32> = (0..200_000).map(|i| (i * 7 % 100) as i32).collect();
    let (inputs, labels) = mlm.mask(&tokens, 3);
    let chosen: Vec<usize> = (0..tokens.len()).filter(|&i| labels[i] != -100).collect();
    let share = |n: usize| n as f64 / chosen.len() as f64;
    assert!((chosen.len() as f64 / tokens.len() as f64 - 0.15).abs() < 0.005);
    assert!(chosen.iter().all(|&i| labels[i] == tokens[i]), "labels are the original tokens");
    let masked = chosen.iter().filter(|&&i| inputs[i] == 100).count();
    let kept = chosen.iter().filter(|&&i| inputs[i] == tokens[i]).count();
    assert!((share(masked) - 0.8).abs() < 0.01, "{}", share(masked));
    // Kept: the 10% left alone, and the random 10% that drew the token itself (1%).
    assert!((share(kept) - 0.101).abs() < 0.01, "{}", share(kept));
    assert!(
        (0..tokens.len()).all(|i| labels[i] != -100 || inputs[i] == tokens[i]),
        "the rest is unchanged"
    );
    assert!(inputs.iter().all(|&t| (0..=100).contains(&t)));
    assert_eq!(mlm.mask(&tokens, 3), (inputs.clone(), labels.clone()));
    assert_ne!(mlm.mask(&tokens, 4).1, labels);
    finish(&rt);
}

#[test]
fn cross_entropy_with_label_smoothing_matches_pytorchs_formula() {
    let rt = runtime();
    let mut rng = Rng(17);
    let (n, v, e) = (6usize, 11usize, 0.1f64);
    let x = rng.vec(n * v, -3.0, 3.0);
    let targets = [3, -100, 0, 10, 5, 7];
    let mut params = Params::default();
    let xi = params.add("logits", upload(&rt, &x, &[n, v], DType::F32));
    let mut tape = Tape::new();
    let xv = tape.param(&params, xi).unwrap();
    let tt = Tensor::from_i32(&rt, &targets, &[n], Category::Input, "t").unwrap();
    let valid = targets.iter().filter(|&&t| t >= 0).count();
    let loss = ops::cross_entropy_smoothed(&mut tape, &rt, &xv, (&tt, valid), e as f32, 4, "loss").unwrap();
    // f64: loss = mean over valid rows of lse - (1 - e) x_t - e mean(x).
    let (mut want, mut grad) = (0.0, vec![0.0f64; n * v]);
    for r in 0..n {
        let row: Vec<f64> = x[r * v..(r + 1) * v].iter().map(|&a| a as f64).collect();
        if targets[r] < 0 {
            continue;
        }
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + row.iter().map(|a| (a - m).exp()).sum::<f64>().ln();
        let t = targets[r] as usize;
        want += lse - (1.0 - e) * row[t] - e * row.iter().sum::<f64>() / v as f64;
        for j in 0..v {
            let hot = if j == t { 1.0 } else { 0.0 };
            grad[r * v + j] = ((row[j] - lse).exp() - (1.0 - e) * hot - e / v as f64) / valid as f64;
        }
    }
    assert_close_within(&rt, "smoothed loss", &loss.value, &[want / valid as f64], TOL);
    tape.backward(&rt, &loss, &mut params).unwrap();
    assert_close_within(&rt, "smoothed dlogits", params.list[xi].grad.as_ref().unwrap(), &grad, TOL);
    finish(&rt);
}

/// f64 attention of x [T, C] (one example) through the layer's own projection weights:
/// grouped-query heads, rotary embeddings (rotate-half), causal or over the keys
/// `padding` leaves in.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    x: &[f64],
    w: &[Vec<f64>; 4],
    (t, c, h, kv): (usize, usize, usize, usize),
    theta: Option<f64>,
    causal: bool,
    keep: &[i32],
) -> Vec<f64> {
    let d = c / h;
    let proj = |w: &[f64], out: usize| -> Vec<f64> {
        (0..t)
            .flat_map(|r| (0..out).map(move |o| (0..c).map(|k| x[r * c + k] * w[o * c + k]).sum::<f64>()))
            .collect()
    };
    let (q, k, v) = (proj(&w[0], h * d), proj(&w[1], kv * d), proj(&w[2], kv * d));
    let rot = |m: &[f64], heads: usize| -> Vec<f64> {
        let Some(theta) = theta else { return m.to_vec() };
        let mut out = m.to_vec();
        for p in 0..t {
            for hh in 0..heads {
                for j in 0..d / 2 {
                    let a = p as f64 / theta.powf((2 * j) as f64 / d as f64);
                    let base = (p * heads + hh) * d;
                    let (x1, x2) = (m[base + j], m[base + j + d / 2]);
                    out[base + j] = x1 * a.cos() - x2 * a.sin();
                    out[base + j + d / 2] = x2 * a.cos() + x1 * a.sin();
                }
            }
        }
        out
    };
    let (q, k) = (rot(&q, h), rot(&k, kv));
    let mut y = vec![0.0; t * h * d];
    for hh in 0..h {
        let g = hh / (h / kv);
        for i in 0..t {
            let seen: Vec<usize> = (0..t).filter(|&j| (!causal || j <= i) && keep[j] != 0).collect();
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| (0..d).map(|e| q[(i * h + hh) * d + e] * k[(j * kv + g) * d + e]).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|a| (a - m).exp()).sum();
            for (n, &j) in seen.iter().enumerate() {
                for e in 0..d {
                    y[(i * h + hh) * d + e] += (s[n] - m).exp() / z * v[(j * kv + g) * d + e];
                }
            }
        }
    }
    let mut out = vec![0.0; t * c];
    for r in 0..t {
        for o in 0..c {
            out[r * c + o] = (0..h * d).map(|k| y[r * h * d + k] * w[3][o * h * d + k]).sum::<f64>();
        }
    }
    out
}

#[test]
fn the_attention_layer_matches_f64_with_grouped_heads_rotary_and_padding() {
    let rt = runtime();
    let (t, c, h, kv) = (6usize, 16usize, 4usize, 2usize);
    let mut rng = Rng(23);
    let x = rng.vec(t * c, -1.0, 1.0);
    for (causal, theta, keep) in [(true, Some(10000.0f32), vec![1; 6]), (false, None, vec![1, 1, 1, 1, 0, 0])] {
        let mut params = Params::default();
        let mut init = Init::new(4);
        let mut vb = Builder::new(&rt, &mut params, &mut init);
        let opts = wgtrain_engine::nn::AttentionOptions {
            heads: h,
            kv_heads: kv,
            causal,
            rope_theta: theta,
            bias: false,
        };
        let layer = wgtrain_engine::nn::Attention::new(&mut vb.sub("attn"), c, opts).unwrap();
        let w: Vec<Vec<f64>> = params
            .list
            .iter()
            .map(|p| p.value.to_f32_vec(&rt).unwrap().iter().map(|&a| a as f64).collect())
            .collect();
        let mut tape = Tape::no_grad();
        let mut cx = Ctx::new(&mut tape, &rt, &params);
        let xv = cx.input(upload(&rt, &x, &[1, t, c], DType::F32));
        let y = layer.forward_masked(&mut cx, &xv, (!causal).then_some(&keep[..])).unwrap();
        let xd: Vec<f64> = x.iter().map(|&a| a as f64).collect();
        let want = attention_reference(
            &xd,
            &[w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone()],
            (t, c, h, kv),
            theta.map(f64::from),
            causal,
            &keep,
        );
        assert_close_within(&rt, &format!("attention causal {causal}"), &y.value, &want, (1e-5, 1e-4));
    }
    finish(&rt);
}

#[test]
fn a_model_of_the_callers_runs_over_several_devices_with_zero_and_offload() {
    let root = std::env::temp_dir().join(format!("wgtrain-layers-par-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let one = custom_with(&root.join("one"), 4, 0.0, &[]).run(&RunOptions::default()).unwrap();
    for (name, sets) in [
        ("z2", vec!["parallel.devices=[\"0\", \"0\"]", "parallel.zero=2"]),
        (
            "z3",
            vec![
                "parallel.devices=[\"0\", \"0\"]",
                "parallel.zero=3",
                "parallel.offload=\"optimizer+parameters\"",
            ],
        ),
    ] {
        let mut t = custom_with(&root.join(name), 4, 0.0, &sets);
        assert_eq!(t.world_size(), 2);
        let got = t.run(&RunOptions::default()).unwrap();
        for (a, b) in one.losses.iter().zip(&got.losses) {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "{name}: {a} vs {b}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
