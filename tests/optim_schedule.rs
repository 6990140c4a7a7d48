//! The learning-rate schedule and global-norm clipping, as PyTorch users know them, and
//! AdamW with 8-bit blockwise state (`train.optimizer = "adamw8bit"`): the kernel against
//! the host reference, its memory, its loss against AdamW's, and resuming it.

mod cli;
mod common;

use common::{finish, runtime, upload};
use wgtrain_engine::DType;
use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::HalfWeights;
use wgtrain_engine::autograd::Params;
use wgtrain_engine::optim::{clip_grad_norm, lr_at};
use wgtrain_engine::{Category, Tensor};

#[test]
fn warmup_then_cosine_decay() {
    // Linear warmup over 10 steps to 1.0, cosine to 0.1 at step 110.
    assert!((lr_at(0, 1.0, 10, 110, 0.1, true) - 0.1).abs() < 1e-6);
    assert!((lr_at(9, 1.0, 10, 110, 0.1, true) - 1.0).abs() < 1e-6);
    assert!((lr_at(10, 1.0, 10, 110, 0.1, true) - 1.0).abs() < 1e-6);
    assert!((lr_at(60, 1.0, 10, 110, 0.1, true) - 0.55).abs() < 1e-6, "halfway is the midpoint");
    assert!((lr_at(110, 1.0, 10, 110, 0.1, true) - 0.1).abs() < 1e-6);
    assert!((lr_at(500, 1.0, 10, 110, 0.1, true) - 0.1).abs() < 1e-6, "stays at the floor");
    assert_eq!(lr_at(50, 0.3, 0, 110, 0.0, false), 0.3, "constant");
}

#[test]
fn clipping_scales_gradients_to_the_max_norm() {
    let rt = runtime();
    let mut params = Params::default();
    let a = params.add("a", upload(&rt, &[0.0; 2], &[2], DType::F32));
    let b = params.add("b", upload(&rt, &[0.0; 1], &[1], DType::F32));
    params.list[a].grad = Some(upload(&rt, &[3.0, 0.0], &[2], DType::F32));
    params.list[b].grad = Some(upload(&rt, &[4.0], &[1], DType::F32));
    let norm = clip_grad_norm(&rt, &params, 1.0).unwrap();
    assert!((norm - 5.0).abs() < 1e-5);
    let ga = params.list[a].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap();
    let gb = params.list[b].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap();
    assert!((ga[0] - 0.6).abs() < 1e-5 && (gb[0] - 0.8).abs() < 1e-5, "{ga:?} {gb:?}");
    // Below the max, nothing changes.
    let norm = clip_grad_norm(&rt, &params, 10.0).unwrap();
    assert!((norm - 1.0).abs() < 1e-5);
    assert!((params.list[b].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap()[0] - 0.8).abs() < 1e-5);
    finish(&rt);
}

/// `steps` fp16-mixed AdamW steps of a small GPT (the f16 weight copies kept by the
/// optimizer when `keep`): each step's loss bits, the weights after, and the copies.
#[allow(clippy::type_complexity)]
fn half_steps(keep: bool, steps: usize) -> (Vec<u32>, Vec<Vec<f32>>, Vec<Option<Vec<f32>>>) {
    use std::sync::Arc;
    use wgtrain_engine::autograd::{HalfWeights, Tape};
    use wgtrain_engine::kernels::optim::AdamW;
    use wgtrain_engine::nn::{Gpt, GptConfig, Init};
    use wgtrain_engine::optim::{Optimizer, Rule};
    use wgtrain_engine::{Category, Tensor};
    let rt = runtime();
    let config: GptConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 200, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 2
    }))
    .unwrap();
    let mut params = Params::default();
    let model = Gpt::new(&rt, config, &mut params, &mut Init::new(5)).unwrap();
    let (b, t) = (4usize, 16usize);
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 37 % 200) as i32).collect();
    let targets: Vec<i32> = (0..b * t).map(|i| (i * 11 % 200) as i32).collect();
    let ids = Tensor::from_i32(&rt, &ids, &[b, t], Category::Input, "ids").unwrap();
    let tg = Tensor::from_i32(&rt, &targets, &[b * t], Category::Input, "targets").unwrap();
    let halves = keep.then(|| Arc::new(HalfWeights::default()));
    let mut opt = Optimizer::new(Rule::AdamW(AdamW {
        lr: 1e-2,
        ..Default::default()
    }));
    opt.halves = halves.clone();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let mut tape = Tape::new().with_half_matmuls(true).with_half_weights(halves.clone());
        let loss = model.forward_loss(&mut tape, &rt, &params, &ids, (&tg, b * t), 8).unwrap();
        losses.push(loss.value.to_f32_vec(&rt).unwrap()[0].to_bits());
        tape.backward(&rt, &loss, &mut params).unwrap();
        opt.step(&rt, &params, 1e-2).unwrap();
        params.zero_grad();
    }
    let weights = params.list.iter().map(|p| p.value.to_f32_vec(&rt).unwrap()).collect();
    let copies = params
        .list
        .iter()
        .map(|p| halves.as_ref().and_then(|h| h.get(&p.value)).map(|c| c.to_f32_vec(&rt).unwrap()))
        .collect();
    finish(&rt);
    (losses, weights, copies)
}

#[test]
fn kept_f16_weight_copies_change_no_step_and_follow_the_weights() {
    let (cast, cast_weights, none) = half_steps(false, 4);
    assert!(none.iter().all(Option::is_none));
    let (kept, kept_weights, copies) = half_steps(true, 4);
    assert_eq!(cast, kept, "every loss equal to the bit");
    assert_eq!(cast_weights, kept_weights, "every weight equal to the bit");
    // The products' weights have copies (the blocks' four, the tied head's); LayerNorm's,
    // the biases and the position table have none.
    let with: usize = copies.iter().filter(|c| c.is_some()).count();
    assert_eq!(with, 2 * 4 + 1, "{with} copies");
    for (w, c) in kept_weights.iter().zip(&copies) {
        if let Some(c) = c {
            let want: Vec<f32> = w.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
            assert_eq!(c, &want, "a copy is its weight rounded to f16");
        }
    }
}

/// A seeded uniform in [-1, 1).
fn uniform(state: &mut u64) -> f32 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Three steps of 8-bit AdamW on the device against the host reference of
/// `kernels::blockwise` (dequantize, PyTorch AdamW in f32, quantize again against each
/// block's new absmax): a 5,000-element weight (a partial last block) with gradients of
/// mixed magnitudes. Every block's absmax and weight agree; a value's code may differ by
/// one step of the map where f32 rounding falls differently (at most 0.5% of them).
#[test]
fn eight_bit_adamw_matches_the_host_reference() {
    use wgtrain_engine::kernels::blockwise::{dequantize, dynamic_map, quantize};
    use wgtrain_engine::kernels::optim::AdamW;
    use wgtrain_engine::optim::{Optimizer, Rule};
    let rt = runtime();
    let n = 5000;
    let mut rng = 7u64;
    let w0: Vec<f32> = (0..n).map(|_| 0.5 * uniform(&mut rng)).collect();
    let mut params = Params::default();
    let a = params.add("w", upload(&rt, &w0, &[n], DType::F32));
    let small = params.add("b", upload(&rt, &[0.25; 100], &[100], DType::F32));
    let h = AdamW {
        lr: 1e-2,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = Optimizer::new(Rule::AdamW8bit(h));
    let (sm, um) = (dynamic_map(true), dynamic_map(false));
    let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    let mut w = w0.clone();
    for step in 1..=3i32 {
        let g: Vec<f32> = (0..n).map(|k| uniform(&mut rng) * if k % 7 == 0 { 10.0 } else { 0.01 }).collect();
        params.list[a].grad = Some(upload(&rt, &g, &[n], DType::F32));
        params.list[small].grad = Some(upload(&rt, &[0.5; 100], &[100], DType::F32));
        opt.step(&rt, &params, h.lr).unwrap();
        // The host: the moments from their codes, updated, the weight, quantized again.
        let (b1, b2) = h.betas;
        let (bc1, bc2_sqrt) = (1.0 - b1.powi(step), (1.0 - b2.powi(step)).sqrt());
        for k in 0..n {
            m[k] = b1 * m[k] + (1.0 - b1) * g[k];
            v[k] = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
            w[k] = w[k] * (1.0 - h.lr * h.weight_decay) - (h.lr / bc1) * m[k] / (v[k].sqrt() / bc2_sqrt + h.eps);
        }
        let (mc, ma) = quantize(&sm, &m, None);
        let (vc, va) = quantize(&um, &v, None);
        let got = opt.state_host(&rt, a, n).unwrap().expect("state");
        let (gma, gva) = got.absmax.clone().expect("8-bit state");
        for (x, y) in ma.iter().chain(&va).zip(gma.iter().chain(&gva)) {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "step {step}: absmax {x} against {y}");
        }
        let (hm, hv) = (dequantize(&sm, &mc, &ma), dequantize(&um, &vc, &va));
        let (gm, gv) = (&got.m, got.v.as_ref().unwrap());
        // The host's codes against the device's absmax: equal to the device's values
        // exactly where the codes are equal (an absmax one rounding apart, as a GPU
        // driver's fused multiply-adds leave it, would otherwise count its whole block).
        let (hm_dev, hv_dev) = (dequantize(&sm, &mc, &gma), dequantize(&um, &vc, &gva));
        let mut differ = 0;
        for k in 0..n {
            let (bm, bv) = (ma[k / 256], va[k / 256]);
            if hm_dev[k] != gm[k] || hv_dev[k] != gv[k] {
                differ += 1;
                assert!(
                    (hm[k] - gm[k]).abs() <= 0.016 * bm && (hv[k] - gv[k]).abs() <= 0.016 * bv,
                    "step {step} element {k}"
                );
            }
        }
        assert!(differ * 200 <= n, "step {step}: {differ} of {n} codes differ");
        let gw = params.list[a].value.to_f32_vec(&rt).unwrap();
        for k in 0..n {
            assert!((gw[k] - w[k]).abs() <= 1e-5, "step {step} weight {k}: {} against {}", gw[k], w[k]);
        }
        // The host continues from what the codes stand for, as the device does.
        (m, v) = (hm, hv);
        w = gw;
    }
    // A parameter under 4,096 elements keeps f32 state.
    let b = opt.state_host(&rt, small, 100).unwrap().expect("state");
    assert!(b.absmax.is_none() && b.m.len() == 100);
    finish(&rt);
}

/// The example character GPT's optimizer state under 8-bit AdamW, from `estimate` (equal
/// to the measured peak, as every estimate): at most 0.27x of AdamW's.
#[test]
fn eight_bit_state_is_at_most_0_27_of_adamws_on_the_char_gpt() {
    let state = |optimizer: &str| -> u64 {
        let out = cli::run_ok(
            &[
                "estimate".into(),
                format!("{}/examples/configs/char_gpt.toml", env!("CARGO_MANIFEST_DIR")),
                "--set".into(),
                format!("train.optimizer=\"{optimizer}\""),
                "--json".into(),
            ],
            &[],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["category_peaks"]["optimizer_state"].as_u64().unwrap()
    };
    let (full, eight) = (state("adamw"), state("adamw8bit"));
    let ratio = eight as f64 / full as f64;
    assert!(ratio <= 0.27 && ratio > 0.2, "{eight} / {full} = {ratio:.4}");
}

/// The example character GPT (shorter windows and batches) trained 60 steps with 8-bit
/// AdamW ends within 2% of AdamW's evaluation loss (on lavapipe 2.9509 against 2.9474;
/// at 120 steps 2.7208 against 2.7180, but 300 steps took 4.4 minutes of CI's 30); and
/// a run resumed from its step-30 checkpoint ends exactly where the uninterrupted one
/// does (the codes come back from the saved values and absmax).
#[test]
fn eight_bit_adamw_trains_as_adamw_and_resumes_exactly() {
    let dir = cli::scratch("adamw8bit");
    let run = |optimizer: &str, steps: u32, every: u32, resume: Option<&str>| -> f64 {
        let ckpt = dir.join(format!("{optimizer}-ckpt"));
        let mut args: Vec<String> = vec![
            "train".into(),
            format!("{}/examples/configs/char_gpt.toml", env!("CARGO_MANIFEST_DIR")),
        ];
        for s in [
            format!("train.optimizer=\"{optimizer}\""),
            format!("train.steps={steps}"),
            "model.block_size=32".into(),
            "train.batch_size=16".into(),
            format!("train.eval_every={steps}"),
            format!("checkpoint.every={every}"),
            format!("checkpoint.dir=\"{}\"", ckpt.display()),
        ] {
            args.extend(["--set".into(), s]);
        }
        if let Some(r) = resume {
            args.extend(["--resume".into(), ckpt.join(r).display().to_string()]);
        }
        let out = cli::run_ok(&args, &[]);
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with("eval loss"))
            .unwrap_or_else(|| panic!("{out}"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    // The two first runs side by side (the third resumes the second): 131 -> 124 s alone
    // on 2 cores, where one run already keeps most of both busy.
    let (full, eight) = std::thread::scope(|s| {
        let full = s.spawn(|| run("adamw", 60, 0, None));
        let eight = run("adamw8bit", 60, 30, None);
        (full.join().unwrap(), eight)
    });
    assert!((eight - full).abs() <= 0.02 * full, "8-bit {eight} against AdamW {full}");
    let resumed = run("adamw8bit", 60, 30, Some("step-000000030"));
    assert_eq!(resumed, eight, "resumed from step 30");
}

/// Sizes for [`many_params`]: tiny ones sharing small pages, mid-sized ones in the large
/// pages, three with pages of their own (more pages than one multi-tensor launch binds).
/// `ODD` has lengths that are no multiple of 8 (the multi-tensor kernels take pairs);
/// every length of `WIDE` is one (they take eight elements a thread; smaller, since the
/// grouping into launches is the same and lavapipe is slow).
const ODD: [usize; 13] = [1, 3, 64, 257, 1025, 70_001, 300_000, 4_200_000, 5, 4_200_001, 768, 4_199_999, 2];
const WIDE: [usize; 8] = [8, 64, 1024, 70_008, 300_000, 16, 768, 8];

/// Weights (parameters) and gradients of the given sizes with seeded values; `bad`: one
/// late gradient holds an inf.
fn many_params(rt: &wgtrain_engine::Runtime, bad: bool, sizes: &[usize]) -> Params {
    let mut params = Params::default();
    let mut seed = 11u64;
    for (i, &n) in sizes.iter().enumerate() {
        let w: Vec<f32> = (0..n).map(|_| uniform(&mut seed)).collect();
        let mut g: Vec<f32> = (0..n).map(|_| uniform(&mut seed) * 1e3).collect();
        if bad && i == sizes.len() - 3 {
            g[n / 2] = f32::INFINITY;
        }
        let value = Tensor::from_f32(rt, &w, &[n], Category::Parameter, "w").unwrap();
        let k = params.add(&format!("p{i}"), value);
        params.list[k].grad = Some(upload(rt, &g, &[n], DType::F32));
    }
    params
}

/// f16 copies of every weight of `params`, written by the optimizer's updates (as
/// fp16-mixed keeps them).
fn halves_of(rt: &wgtrain_engine::Runtime, params: &Params) -> std::sync::Arc<HalfWeights> {
    let halves = HalfWeights::default();
    for p in &params.list {
        assert!(halves.get_or_want(&p.value).is_none());
        assert!(halves.make_if_wanted(rt, &p.value, "w").unwrap());
    }
    std::sync::Arc::new(halves)
}

/// The f16 copies' values (exactly, as f32), weight by weight.
fn halves_f32(rt: &wgtrain_engine::Runtime, params: &Params, halves: &HalfWeights) -> Vec<f32> {
    let copy = |p: &wgtrain_engine::autograd::Param| halves.get(&p.value).unwrap().to_f32_vec(rt).unwrap();
    params.list.iter().flat_map(copy).collect()
}

/// Two parameter sets updated by different launches agree: bit for bit on lavapipe,
/// within a few f32 roundings on a GPU (`common::assert_same_or_within`; on an H200 the
/// multi-tensor AdamW and the per-parameter one were one unit in the last place apart).
/// `weights_only`: the values, not the gradients.
fn same(rt: &wgtrain_engine::Runtime, what: &str, a: &Params, b: &Params, weights_only: bool) {
    let floats = |p: &Params| -> Vec<f32> {
        let all = values(rt, p);
        let kept = all.into_iter().enumerate().filter(|(i, _)| !weights_only || i % 2 == 0);
        kept.flat_map(|(_, v)| v).map(f32::from_bits).collect()
    };
    common::assert_same_or_within(rt.gpu.caps.facts.cpu, what, &floats(a), &floats(b), 1e-6);
}

fn values(rt: &wgtrain_engine::Runtime, params: &Params) -> Vec<Vec<u32>> {
    params
        .list
        .iter()
        .flat_map(|p| [Some(&p.value), p.grad.as_ref()])
        .flatten()
        .map(|t| t.to_f32_vec(rt).unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The multi-tensor step (a few launches over pages; `Optimizer::step`) against one
/// launch per parameter (`update_param`): AdamW and SGD with momentum over three steps
/// (SGD's first step fills its buffers), every weight bit for bit (on lavapipe; within
/// a few roundings on a GPU, see `same`); under a loss scale,
/// checking without unscaling and updating with the inverse scale equals unscaling
/// first; an inf in one gradient skips every update.
#[test]
fn multi_tensor_steps_equal_one_launch_per_parameter() {
    use wgtrain_engine::kernels::optim::{AdamW, Sgd};
    use wgtrain_engine::optim::{Optimizer, Rule};
    use wgtrain_engine::scaler::GradScaler;
    let rt = runtime();
    let rules = [
        Rule::AdamW(AdamW {
            lr: 1e-2,
            ..Default::default()
        }),
        Rule::Sgd(Sgd {
            lr: 1e-2,
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 1e-2,
            nesterov: true,
        }),
    ];
    for (sizes, wide) in [(&ODD[..], false), (&WIDE[..], true)] {
        for rule in rules {
            let (multi, single) = (many_params(&rt, false, sizes), many_params(&rt, false, sizes));
            let (mut a, mut b) = (Optimizer::new(rule), Optimizer::new(rule));
            // With f16 copies of the weights (fp16-mixed's), written by both.
            a.halves = Some(halves_of(&rt, &multi));
            b.halves = Some(halves_of(&rt, &single));
            for step in 0..3 {
                rt.start_profiling().unwrap();
                a.step(&rt, &multi, 1e-2).unwrap();
                let trace = rt.collect_profile().unwrap();
                rt.stop_profiling();
                // The updates' kernels (the first step also fills the new states).
                let names: Vec<&str> = trace
                    .launches
                    .iter()
                    .map(|l| &*l.name)
                    .filter(|n| n.starts_with("optim multi"))
                    .collect();
                assert!(
                    !names.is_empty() && names.iter().all(|n| n.contains("+f16 copy") && n.ends_with(" vec4") == wide),
                    "{rule:?}, wide {wide}: {names:?}"
                );
                b.begin_step(&rt, single.list.len()).unwrap();
                for (i, p) in single.list.iter().enumerate() {
                    b.update_param(&rt, i, p, 1e-2).unwrap();
                }
                let what = format!("{rule:?}, wide {wide}, step {}", step + 1);
                same(&rt, &what, &multi, &single, false);
                // The copies round the weights: bit for bit on lavapipe, within an f16
                // rounding on a GPU (where the weights may be an f32 rounding apart).
                let (ha, hb) = (a.halves.as_ref().unwrap(), b.halves.as_ref().unwrap());
                let cpu = rt.gpu.caps.facts.cpu;
                common::assert_same_or_within(
                    cpu,
                    &format!("{what}: the f16 copies"),
                    &halves_f32(&rt, &multi, ha),
                    &halves_f32(&rt, &single, hb),
                    1e-3,
                );
            }
        }
        // fp16-mixed: check, then update with 1/scale, against unscale, then update.
        let scaler = GradScaler {
            scale: 1024.0,
            ..Default::default()
        };
        let (fused, unscaled) = (many_params(&rt, false, sizes), many_params(&rt, false, sizes));
        let (mut a, mut b) = (Optimizer::new(rules[0]), Optimizer::new(rules[0]));
        let found = scaler.check_on_device(&rt, &fused).unwrap();
        a.step_scaled(&rt, &fused, 1e-2, Some(&found), 1.0 / scaler.scale).unwrap();
        assert_eq!(found.to_f32_vec(&rt).unwrap(), [0.0]);
        let found = scaler.unscale_on_device(&rt, &unscaled).unwrap();
        b.step_unless(&rt, &unscaled, 1e-2, Some(&found)).unwrap();
        let weights = |p: &Params| values(&rt, p).into_iter().step_by(2).collect::<Vec<_>>();
        same(&rt, "the weights", &fused, &unscaled, true);
        // An inf in one gradient: the flag is set and no weight moves.
        let bad = many_params(&rt, true, sizes);
        let before = weights(&bad);
        let found = scaler.check_on_device(&rt, &bad).unwrap();
        Optimizer::new(rules[0])
            .step_scaled(&rt, &bad, 1e-2, Some(&found), 1.0 / scaler.scale)
            .unwrap();
        assert_eq!(found.to_f32_vec(&rt).unwrap(), [1.0], "wide {wide}");
        assert_eq!(weights(&bad), before, "wide {wide}");
    }
    finish(&rt);
}
