//! The loss scaler against torch.amp.GradScaler's semantics: scaled backward and
//! unscale give the unscaled gradients, a forced overflow skips the step and backs off,
//! and the scale grows after the interval of clean steps.

mod common;

use common::{finish, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::ops::{self, WeightLayout};
use wgtrain_engine::autograd::{Params, Tape};
use wgtrain_engine::kernels::optim::AdamW;
use wgtrain_engine::optim::{Optimizer, Rule};
use wgtrain_engine::scaler::GradScaler;
use wgtrain_engine::{Category, DType, Tensor};

fn grads_of(rt: &wgtrain_engine::Runtime, params: &mut Params, seed: f32, x: &[f32]) -> Vec<f32> {
    let mut tape = Tape::new();
    let xv = tape.constant(upload(rt, x, &[2, 3], DType::F32));
    let w = tape.param(params, 0).unwrap();
    let logits = ops::linear(&mut tape, rt, &xv, &w, None, WeightLayout::OutIn, "logits").unwrap();
    let tg = Tensor::from_i32(rt, &[0, 1], &[2], Category::Input, "t").unwrap();
    let loss = ops::cross_entropy_mean(&mut tape, rt, &logits, &tg, 2, 16, "loss").unwrap();
    tape.backward_with(rt, &loss, seed, params).unwrap();
    params.list[0].grad.as_ref().unwrap().to_f32_vec(rt).unwrap()
}

#[test]
fn defaults_are_pytorchs() {
    let s = GradScaler::default();
    assert_eq!(
        (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval),
        (65536.0, 2.0, 0.5, 2000)
    );
}

#[test]
fn scaled_backward_then_unscale_gives_the_true_gradients() {
    let rt = runtime();
    let mut params = Params::default();
    params.add("w", upload(&rt, &[0.1, -0.2, 0.3, 0.4, 0.5, -0.6], &[2, 3], DType::F32));
    let x = [1.0, 2.0, 3.0, -1.0, 0.5, 0.25];
    let plain = grads_of(&rt, &mut params, 1.0, &x);
    params.zero_grad();
    let scaler = GradScaler::default();
    let scaled = grads_of(&rt, &mut params, scaler.scale, &x);
    assert!(
        scaled
            .iter()
            .zip(&plain)
            .all(|(s, p)| (s - p * 65536.0).abs() <= 1e-3 * (p * 65536.0).abs() + 1e-3)
    );
    assert!(!scaler.unscale(&rt, &params).unwrap());
    let unscaled = params.list[0].grad.as_ref().unwrap().to_f32_vec(&rt).unwrap();
    assert!(
        unscaled.iter().zip(&plain).all(|(u, p)| (u - p).abs() <= 1e-6 + 1e-5 * p.abs()),
        "{unscaled:?} vs {plain:?}"
    );
    finish(&rt);
}

#[test]
fn a_forced_overflow_skips_the_step_and_backs_off() {
    let rt = runtime();
    let mut params = Params::default();
    params.add("w", upload(&rt, &[0.1, -0.2, 0.3, 0.4, 0.5, -0.6], &[2, 3], DType::F32));
    let before = params.list[0].value.to_f32_vec(&rt).unwrap();
    let mut scaler = GradScaler::default();
    let mut opt = Optimizer::new(Rule::AdamW(AdamW::default()));
    // A huge input makes the scaled loss gradient overflow f32.
    let x = [3e34, 2.0, 3.0, -1.0, 0.5, 0.25];
    grads_of(&rt, &mut params, scaler.scale, &x);
    let found = scaler.unscale(&rt, &params).unwrap();
    assert!(found, "the overflow is detected");
    if !found {
        opt.step(&rt, &params, 1e-3).unwrap();
    }
    scaler.update(found);
    params.zero_grad();
    assert_eq!(scaler.scale, 32768.0);
    assert_eq!(scaler.growth_tracker, 0);
    assert_eq!(params.list[0].value.to_f32_vec(&rt).unwrap(), before, "the step was skipped");
    assert_eq!(opt.step, 0);
    finish(&rt);
}

#[test]
fn the_scale_grows_after_the_interval_of_clean_steps() {
    let mut s = GradScaler {
        growth_interval: 3,
        ..GradScaler::default()
    };
    s.update(false);
    s.update(false);
    assert_eq!(s.scale, 65536.0);
    s.update(false);
    assert_eq!((s.scale, s.growth_tracker), (131072.0, 0));
    s.update(false);
    s.update(true);
    assert_eq!((s.scale, s.growth_tracker), (65536.0, 0), "a skip halves and restarts the count");
}
