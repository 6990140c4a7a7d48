//! Fused (flash) attention against f64 references and against the composite: the
//! output and all three gradients, causal, odd T (1, 7, 65, 257), head sizes 12 to 128,
//! f32 and f16 inputs, on every path this machine runs (lavapipe: the register-tiled,
//! subgroup and plain paths, forced; an H100: the tensor-core path too, for f16 and head
//! sizes that are multiples of 16); bitwise repeatable backward; B * NH beyond one dispatch
//! row of workgroups; bad shapes are clear errors; the tensor-core path's choice and
//! tiles, and every tile forced against f64. Guard bytes are on throughout.

mod common;

use common::{AttentionCase, Rng, assert_close_within, attention_cases, finish, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::kernels::flash_attention::{BackwardTiles, Path, backward_on, backward_tiled, forward_on, forward_tiled};
use wgtrain_engine::kernels::flash_attention_coop::{AttentionTile, CoopMode, candidates, eligible, pick, whole};
use wgtrain_engine::kernels::{attention, tolerance::tolerance};
use wgtrain_engine::{DType, Runtime};

fn paths(rt: &Runtime) -> Vec<Path> {
    let mut v = vec![Path::Plain];
    if Path::for_adapter(&rt.gpu.caps.facts) != Path::Plain {
        v.push(Path::Subgroup);
    }
    if Path::for_adapter(&rt.gpu.caps.facts) == Path::Tiled {
        v.push(Path::Tiled);
    }
    if Path::for_inputs(&rt.gpu.caps.facts, DType::F16, 64) == Path::Coop {
        v.push(Path::Coop);
    }
    v
}

// The f64 checks in three tests by head size, so that the test threads compile their
// kernels side by side (lavapipe compiles each on its first run, one at a time a device).

#[test]
fn forward_and_gradients_match_f64_at_head_sizes_12_to_20() {
    forward_and_gradients_match_f64(
        41,
        &[
            (2, 7, 2, 16),
            // D / 4 = 3 and 5 threads a row in the row dot: rows do not fill its workgroups.
            (2, 9, 3, 12),
            (1, 11, 2, 20),
        ],
    );
    // The subgroup lane kernels' loops written out, as GPUs run them (a CPU adapter's
    // plans keep them as loops): one small head size, since lavapipe takes minutes to
    // compile larger ones written out.
    let mut rt = runtime();
    rt.set_overrides(wgtrain_engine::runtime::KernelOverrides {
        attention_tiles: "unroll".into(),
    });
    let subgroup: Vec<Path> = paths(&rt).into_iter().filter(|&p| p == Path::Subgroup).collect();
    check_against_f64(&rt, &subgroup, &mut Rng(46), &[(2, 7, 2, 16)]);
    finish(&rt);
}

#[test]
fn forward_and_gradients_match_f64_at_head_sizes_32_and_64() {
    forward_and_gradients_match_f64(
        47,
        &[
            (1, 1, 1, 32),
            (1, 257, 1, 32),
            (1, 65, 2, 64),
            (1, 70, 3, 64),
            // Whole tiles (T a multiple of the tensor-core tiles' rows): loads unchecked.
            (2, 128, 2, 64),
        ],
    );
}

#[test]
fn forward_and_gradients_match_f64_at_head_size_128() {
    forward_and_gradients_match_f64(48, &[(1, 33, 1, 128), (1, 192, 1, 128)]);
}

/// [`check_against_f64`] on every path this adapter runs, on a runtime of its own.
fn forward_and_gradients_match_f64(seed: u64, cases: &[(usize, usize, usize, usize)]) {
    let rt = runtime();
    let on = paths(&rt);
    assert!(
        on.contains(&Path::Tiled) || !rt.gpu.caps.subgroup,
        "lavapipe grants subgroups of 8: the plain, lane and register-tiled paths run here"
    );
    check_against_f64(&rt, &on, &mut Rng(seed), cases);
    finish(&rt);
}

/// Each case's output and gradients on the paths `on` against f64.
fn check_against_f64(rt: &Runtime, on: &[Path], rng: &mut Rng, cases: &[(usize, usize, usize, usize)]) {
    for &(b, t, nh, d) in cases {
        for AttentionCase {
            dtype,
            qkv,
            dy,
            want_y,
            want_d,
        } in attention_cases(rt, rng, (b, t, nh, d))
        {
            for &path in on {
                if path == Path::Coop && Path::for_inputs(&rt.gpu.caps.facts, dtype, d) != Path::Coop {
                    continue;
                }
                let what = format!("[{b},{t},{nh},{d}] {dtype:?} {path:?}");
                let saved = forward_on(rt, &qkv, nh, path, "attn").unwrap();
                let tol = if dtype == DType::F16 {
                    (4e-3, 1e-2)
                } else {
                    tolerance(DType::F32, t.max(d))
                };
                assert_close_within(rt, &format!("{what} y"), &saved.y, &want_y, tol);
                let dqkv = backward_on(rt, &qkv, nh, &saved, &dy, path, "dqkv").unwrap();
                let gtol = if dtype == DType::F16 {
                    (4e-3, 1e-2)
                } else {
                    (2e-5 * (t as f64).sqrt(), 1e-4)
                };
                assert_close_within(rt, &format!("{what} dqkv"), &dqkv, &want_d, gtol);
                if path == Path::Coop {
                    let again = backward_on(rt, &qkv, nh, &saved, &dy, path, "dqkv").unwrap();
                    let (a, b) = (dqkv.to_f32_vec(rt).unwrap(), again.to_f32_vec(rt).unwrap());
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}: backward is bitwise repeatable"
                    );
                }
            }
        }
    }
}

/// Every tensor-core tile, forced into all three kernels, against f64 (the tests above
/// run the picked ones): tiles whose streamed rows are fewer than the block's load the own
/// rows in passes, and the forward's reference max moves (scores of several units, odd T).
/// Where the adapter grants no tensor cores (lavapipe) there is nothing to run.
#[test]
fn every_tensor_core_tile_matches_f64() {
    let rt = runtime();
    if Path::for_inputs(&rt.gpu.caps.facts, DType::F16, 64) != Path::Coop {
        return;
    }
    let limit = u64::from(rt.gpu.caps.limits.max_compute_workgroup_storage_size);
    let mut rng = Rng(45);
    for (b, t, nh, d) in [(1, 65, 2, 64), (2, 128, 1, 64), (1, 33, 1, 128), (1, 100, 1, 32)] {
        for case in attention_cases(&rt, &mut rng, (b, t, nh, d)) {
            if case.dtype != DType::F16 {
                continue;
            }
            for tile in candidates(rt.gpu.caps.subgroup_barrier) {
                let modes = [CoopMode::Forward, CoopMode::KeyValue, CoopMode::Query];
                if modes.iter().any(|&m| tile.workgroup_bytes(m, d as u32) > limit) {
                    continue;
                }
                let what = format!("[{b},{t},{nh},{d}] {}", tile.name());
                let saved = forward_tiled(&rt, &case.qkv, nh, Path::Coop, Some(tile), "attn").unwrap();
                assert_close_within(&rt, &format!("{what} y"), &saved.y, &case.want_y, (4e-3, 1e-2));
                let both = BackwardTiles::both(Some(tile));
                let dqkv = backward_tiled(&rt, &case.qkv, nh, &saved, &case.dy, Path::Coop, both, "dqkv").unwrap();
                assert_close_within(&rt, &format!("{what} dqkv"), &dqkv, &case.want_d, (4e-3, 1e-2));
            }
        }
    }
    finish(&rt);
}

#[test]
fn flash_matches_the_composite_and_repeats_bitwise() {
    let rt = runtime();
    let mut rng = Rng(42);
    // Head size 32: the register-tiled kernels take it.
    let (b, t, nh, d) = (2, 96, 2, 32);
    let c = nh * d;
    let qkv = upload(&rt, &rng.vec(b * t * 3 * c, -2.0, 2.0), &[b, t, 3 * c], DType::F32);
    let dy = upload(&rt, &rng.vec(b * t * c, -1.0, 1.0), &[b, t, c], DType::F32);
    let (cy, csaved) = attention::forward(&rt, &qkv, nh, "composite").unwrap();
    let cd = attention::backward(&rt, &qkv, nh, &csaved, &dy, "composite.d").unwrap();
    let (cy, cd) = (cy.to_f32_vec(&rt).unwrap(), cd.to_f32_vec(&rt).unwrap());
    let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    // (f32: the tensor-core path takes f16 only.)
    for path in paths(&rt).into_iter().filter(|&p| p != Path::Coop) {
        let saved = forward_on(&rt, &qkv, nh, path, "attn").unwrap();
        assert_close_within(&rt, "y vs composite", &saved.y, &widen(&cy), (1e-5, 1e-4));
        let first = backward_on(&rt, &qkv, nh, &saved, &dy, path, "d").unwrap();
        assert_close_within(&rt, "dqkv vs composite", &first, &widen(&cd), (1e-5, 1e-4));
        let first = first.to_f32_vec(&rt).unwrap();
        for _ in 0..3 {
            let again = backward_on(&rt, &qkv, nh, &saved, &dy, path, "d").unwrap().to_f32_vec(&rt).unwrap();
            assert!(
                first.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path:?}: backward is bitwise repeatable"
            );
        }
    }
    finish(&rt);
}

#[test]
fn many_heads_span_a_second_dispatch_row_and_bad_shapes_are_errors() {
    let mut rt = runtime();
    // The register-tiled path's smallest tiles (dK dV's forced onto one): a workgroup's
    // work is mostly rows and keys past the one of each here, and how the workgroups
    // span dispatch rows does not depend on the tile (on lavapipe 279 -> 77 s).
    rt.set_overrides(wgtrain_engine::runtime::KernelOverrides {
        attention_tiles: "fwd=16x32x2p,q=8x32x1p,kv=16x32x2p".into(),
    });
    let mut rng = Rng(43);
    // 65537 (batch, head) pairs of one row: more workgroups than one dispatch dimension,
    // on the plain path and the register-tiled one (at a head size it takes).
    let mut cases = vec![(Path::Plain, 4)];
    if Path::for_adapter(&rt.gpu.caps.facts) == Path::Tiled {
        cases.push((Path::Tiled, 32));
    }
    for (path, d) in cases {
        let (b, t, nh) = (65537, 1, 1);
        let c = nh * d;
        let data = rng.vec(b * t * 3 * c, -1.0, 1.0);
        let dy_data = rng.vec(b * t * c, -1.0, 1.0);
        let qkv = upload(&rt, &data, &[b, t, 3 * c], DType::F32);
        let dy = upload(&rt, &dy_data, &[b, t, c], DType::F32);
        // With one key, the output is v itself, dv is dy, and dq and dk are 0.
        let want: Vec<f64> = (0..b)
            .flat_map(|bi| (0..c).map(move |k| (bi, k)))
            .map(|(bi, k)| data[bi * 3 * c + 2 * c + k] as f64)
            .collect();
        let want_d: Vec<f64> = (0..b)
            .flat_map(|bi| (0..3 * c).map(move |k| (bi, k)))
            .map(|(bi, k)| if k < 2 * c { 0.0 } else { dy_data[bi * c + k - 2 * c] as f64 })
            .collect();
        let saved = forward_on(&rt, &qkv, nh, path, "attn").unwrap();
        assert_close_within(&rt, &format!("{path:?} y of one key"), &saved.y, &want, (1e-6, 1e-6));
        let dqkv = backward_on(&rt, &qkv, nh, &saved, &dy, path, "dqkv").unwrap();
        assert_close_within(&rt, &format!("{path:?} dqkv of one key"), &dqkv, &want_d, (1e-6, 1e-6));
    }
    for (shape, nh) in [(vec![1, 4, 18], 1), (vec![1, 4, 12], 5), (vec![1, 4, 3 * 132], 1), (vec![4, 12], 1)] {
        let n = shape.iter().product();
        let x = upload(&rt, &vec![0.0; n], &shape, DType::F32);
        let err = forward_on(&rt, &x, nh, Path::Plain, "bad").err().expect("a shape error");
        assert!(err.to_string().contains("flash attention qkv"), "{err}");
    }
    finish(&rt);
}

#[test]
fn the_tensor_core_path_is_chosen_only_where_granted_and_its_tiles_fit() {
    // The rule, apart from the adapter.
    assert!(eligible(true, (32, 32), DType::F16, 64));
    assert!(eligible(true, (32, 32), DType::F16, 128));
    assert!(!eligible(false, (32, 32), DType::F16, 64), "no cooperative matrices");
    assert!(!eligible(true, (4, 64), DType::F16, 64), "subgroups not exactly 32");
    assert!(!eligible(true, (32, 32), DType::F32, 64), "f32 is computed in f32");
    assert!(!eligible(true, (32, 32), DType::F16, 40), "head size not a multiple of 16");
    assert!(!eligible(true, (32, 32), DType::F16, 144), "head size over 128");
    // Every mode and head size has a tile within 48 KiB, and none is picked that does
    // not fit; 8 KiB is too little for head size 128.
    for mode in [CoopMode::Forward, CoopMode::KeyValue, CoopMode::Query] {
        for d in [16, 32, 64, 128] {
            let tile = pick(mode, d, 48 * 1024, true).expect("a tile fits 48 KiB");
            assert!(tile.workgroup_bytes(mode, d) <= 48 * 1024, "{mode:?} d{d}: {tile:?}");
        }
        assert!(pick(mode, 128, 8 * 1024, false).is_none(), "{mode:?}");
    }
    assert_eq!(
        pick(CoopMode::Forward, 64, 48 * 1024, false).map(|t| (t.br(), t.bc)),
        Some((128, 16))
    );
    assert_eq!(pick(CoopMode::Query, 64, 48 * 1024, false).map(|t| (t.br(), t.bc)), Some((64, 16)));
    // A smaller limit gets the first tile that fits it: one subgroup's (6928 bytes).
    assert_eq!(pick(CoopMode::Forward, 64, 8 * 1024, false).map(|t| (t.br(), t.bc)), Some((16, 16)));
    // Whole sequences load without bounds checks: T a multiple of the tile's rows per
    // workgroup and per streamed tile.
    let tile = pick(CoopMode::Forward, 64, 48 * 1024, true).unwrap();
    assert!(whole(1024, tile) && whole(128, tile));
    assert!(!whole(1000, tile) && !whole(65, tile) && !whole(0, tile));
    let narrow = AttentionTile { sg: 2, bc: 64, ..tile };
    assert!(!whole(96, narrow) && whole(192, narrow));
    // The forward and dQ fetch their next tile ahead; dK dV does not.
    for (mode, ahead) in [(CoopMode::Forward, true), (CoopMode::KeyValue, false), (CoopMode::Query, true)] {
        assert_eq!(pick(mode, 64, 48 * 1024, true).map(|t| t.prefetch), Some(ahead), "{mode:?}");
    }
    // Not where a thread would hold more than four loads of each operand ahead.
    for d in [16, 32, 64, 128] {
        for limit in [48 * 1024, 12 * 1024] {
            for mode in [CoopMode::Forward, CoopMode::Query] {
                if let Some(t) = pick(mode, d, limit, true) {
                    assert_eq!(t.prefetch, t.loads(d) <= 4, "{mode:?} d{d} {t:?}");
                }
            }
        }
    }
    let wide = AttentionTile {
        sg: 2,
        bc: 64,
        subgroup_sync: true,
        prefetch: false,
    };
    assert!(wide.loads(128) > 4);
    let rt = runtime();
    let granted = rt.gpu.caps.coop_f16_16x16x16() && rt.gpu.caps.subgroup_size == (32, 32);
    assert_eq!(Path::for_inputs(&rt.gpu.caps.facts, DType::F16, 64) == Path::Coop, granted);
    assert_ne!(Path::for_inputs(&rt.gpu.caps.facts, DType::F32, 64), Path::Coop);
    // Asked where it cannot run (lavapipe, or f32 anywhere): a clear error.
    let mut rng = Rng(44);
    let qkv = upload(&rt, &rng.vec(2 * 4 * 3 * 64, -1.0, 1.0), &[2, 4, 3 * 64], DType::F32);
    let err = forward_on(&rt, &qkv, 1, Path::Coop, "attn").err().expect("an error");
    assert!(err.to_string().contains("tensor-core path needs f16 qkv"), "{err}");
    finish(&rt);
}
