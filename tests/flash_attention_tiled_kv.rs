//! The register-tiled dK dV kernel, which runs only when a tile is asked for (the
//! runtime's `KernelOverrides::attention_tiles`, `kv=...`; the lane kernel is the
//! default): this test asks for one on its runtime, then checks the output and all three gradients against f64, causal, odd T, head sizes 32
//! to 128, f32 and f16 inputs, and that the backward repeats bitwise.

mod common;

use common::{AttentionCase, Rng, assert_close_within, attention_cases, finish, runtime};
use wgtrain_engine::DType;
use wgtrain_engine::TensorOps;
use wgtrain_engine::kernels::flash_attention::{Path, backward_on, forward_on};
use wgtrain_engine::runtime::KernelOverrides;

#[test]
fn the_tiled_dk_dv_kernel_matches_f64_and_repeats_bitwise() {
    // 16 keys a workgroup against 32 queries a tile, prefetched: it fits lavapipe's
    // 32 KiB at head size 64 (the H100's 48 KiB too).
    let mut rt = runtime();
    rt.set_overrides(KernelOverrides {
        attention_tiles: "kv=16x32x2p".into(),
    });
    if Path::for_adapter(&rt.gpu.caps.facts) != Path::Tiled {
        eprintln!("the adapter does not grant subgroups of 8: no register-tiled path to test");
        return;
    }
    let mut rng = Rng(44);
    for (b, t, nh, d) in [(1, 65, 2, 64), (2, 70, 1, 32), (1, 40, 1, 128)] {
        // (Head size 128: the tile does not fit lavapipe's 32 KiB; the lane kernel runs there.)
        for AttentionCase {
            dtype,
            qkv,
            dy,
            want_y,
            want_d,
        } in attention_cases(&rt, &mut rng, (b, t, nh, d))
        {
            let what = format!("[{b},{t},{nh},{d}] {dtype:?}");
            let saved = forward_on(&rt, &qkv, nh, Path::Tiled, "attn").unwrap();
            let tol = if dtype == DType::F16 { (4e-3, 1e-2) } else { (1e-5, 1e-4) };
            assert_close_within(&rt, &format!("{what} y"), &saved.y, &want_y, tol);
            let dqkv = backward_on(&rt, &qkv, nh, &saved, &dy, Path::Tiled, "dqkv").unwrap();
            let gtol = if dtype == DType::F16 {
                (4e-3, 1e-2)
            } else {
                (2e-5 * (t as f64).sqrt(), 1e-4)
            };
            assert_close_within(&rt, &format!("{what} dqkv"), &dqkv, &want_d, gtol);
            let again = backward_on(&rt, &qkv, nh, &saved, &dy, Path::Tiled, "dqkv").unwrap();
            let (x, y) = (dqkv.to_f32_vec(&rt).unwrap(), again.to_f32_vec(&rt).unwrap());
            assert!(
                x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: backward repeats bitwise"
            );
        }
    }
    finish(&rt);
}
