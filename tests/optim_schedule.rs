//! The learning-rate schedule and global-norm clipping, as PyTorch users know them.

mod common;

use common::{finish, runtime, upload};
use wgtrain_engine::DType;
use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::Params;
use wgtrain_engine::optim::{clip_grad_norm, lr_at};

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
