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
