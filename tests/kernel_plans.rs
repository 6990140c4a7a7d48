//! Kernel plans without a GPU: the matmul's and the attention's choices (kernel, tile,
//! split-K, loops) for an H100-like and a lavapipe-like adapter, described by their
//! facts alone, and the names the profiler shows for them.

use wgtrain_engine::DType;
use wgtrain_engine::device::{AdapterFacts, AdapterReport};
use wgtrain_engine::kernels::attention_plan::{AttentionKernel, Mode, Path, plan_backward, plan_kernel};
use wgtrain_engine::kernels::matmul::MatmulOptions;
use wgtrain_engine::kernels::matmul_plan::{Operand, ProductKernel, plan};

/// The facts of the first adapter of a saved `wgtrain devices --json` report.
fn described(file: &str) -> AdapterFacts {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(file);
    let reports: Vec<AdapterReport> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    AdapterFacts::described(&reports[0])
}

/// An H100 as its report describes it: 132 SMs, 48 KiB of workgroup memory, subgroups
/// of 32, f16 cooperative matrices.
fn h100() -> AdapterFacts {
    described("devices-h100.json")
}

/// Lavapipe on this project's 2-core machine, as its report says: two threads, 32 KiB,
/// subgroups of 8, no cooperative matrices.
fn lavapipe() -> AdapterFacts {
    described("devices-lavapipe.json")
}

fn op<'a>(shape: &'a [usize], strides: &'a [usize], dtype: DType) -> Operand<'a> {
    Operand {
        shape,
        strides,
        offset: 0,
        dtype,
    }
}

/// A dW product of GPT-2 (B*T = 8192 rows): x^T [C, 8192] (a transposed view) @ dy
/// [8192, n] into [C, n] f32.
fn dw(facts: &AdapterFacts, c: usize, n: usize, dtype: DType) -> wgtrain_engine::kernels::matmul::MatmulPlan {
    let (rows, x_strides) = ([c, 8192], [1, c]);
    let (dy_shape, dy_strides) = ([8192, n], [n, 1]);
    let (out, out_strides) = ([c, n], [n, 1]);
    plan(
        facts,
        op(&rows, &x_strides, dtype),
        op(&dy_shape, &dy_strides, dtype),
        op(&out, &out_strides, DType::F32),
        &MatmulOptions::default(),
    )
    .expect("a valid product")
    .expect("a product to compute")
}

#[test]
fn adapters_wave_is_their_multiprocessors() {
    assert_eq!(h100().wave(), 132);
    assert_eq!(lavapipe().wave(), 2);
    let unknown = AdapterFacts {
        multiprocessors: None,
        ..h100()
    };
    assert_eq!(unknown.wave(), u64::from(wgtrain_engine::device::ASSUMED_MULTIPROCESSORS));
}

/// The split rules at the H100's 132 SMs, as measured there (CHANGELOG.md).
#[test]
fn split_rules_on_an_h100() {
    let w = h100().wave();
    use wgtrain_engine::kernels::matmul_plan::split_k;
    assert_eq!(split_k(w, 264, 8192), 1, "two full waves need no split");
    assert_eq!(split_k(w, 144, 8192), 2);
    assert_eq!(split_k(w, 36, 8192), 8);
    assert_eq!(split_k(w, 108, 8192), 4);
    assert_eq!(split_k(w, 1, 2048), 8, "the most slices that stay 256 long");
    assert_eq!(split_k(w, 10, 100), 1, "too short to split");
    // The tensor-core kernel takes the count its cost model finds fastest: GPT-2's
    // attn_proj.dw (36 tiles) in 3 uneven slices (one wave of 108 workgroups), fc.dw (144)
    // in 3, qkv.dw (108, one wave already) unsplit, as measured on the H100; a product
    // of two waves or more unsplit.
    use wgtrain_engine::kernels::matmul_plan::{split_cost, split_k_coop};
    assert_eq!(split_k_coop(w, 36, 8192, true, true), 3);
    assert_eq!(split_k_coop(w, 144, 8192, true, true), 3);
    assert_eq!(split_k_coop(w, 108, 8192, true, true), 1);
    assert_eq!(split_k_coop(w, 264, 8192, true, true), 1);
    assert_eq!(split_k_coop(w, 1152, 768, false, true), 1, "GPT-2's qkv.fwd");
    assert!(split_cost(w, 36, 3, 22.0, true) < split_cost(w, 36, 8, 8.0, true));
    assert!(split_cost(w, 108, 1, 64.0, true) < split_cost(w, 108, 4, 16.0, true));
    // Without uneven slices (K off the unit, or tiles not whole): 2, 4 or 8 equal slices
    // at least 256 long, each a multiple of 8, where one fits.
    assert_eq!(split_k_coop(w, 36, 8192, true, false), 8);
    assert_eq!(split_k_coop(w, 36, 8200, true, false), 1, "8200 = 8 x 1025: no equal slices of 8");
    assert_eq!(split_k_coop(w, 4, 300, true, false), 1, "no equal slice of 300 is 256 long");
    // By wave fill (264 slots): 144 tiles fill 2 waves of 264 at 55%, 5 waves at 87% in
    // 8 slices; 108 tiles fill their last wave at 82% in 2, 4 or 8 slices (the most win).
    use wgtrain_engine::kernels::matmul_plan::split_k_by_waves;
    assert_eq!(split_k_by_waves(w, 144, 8192), 8);
    assert_eq!(split_k_by_waves(w, 108, 8192), 8);
    assert_eq!(split_k_by_waves(w, 100, 2048), 8);
    assert_eq!(split_k_by_waves(w, 264, 8192), 1, "a full wave is not split");
    assert_eq!(split_k_by_waves(w, 144, 768), 2, "4 slices would be shorter than 256");
    assert_eq!(split_k(w, 10, 1000), 1, "slices would not be multiples of 8");
    // The tiled kernel with K whole units of 128 (uneven slices): by its cost model, the
    // busiest SM's workgroups times the longest slice. The char workload's dW products
    // (K 16384): fc.dw's 36 tiles in 11 slices (396 workgroups, three an SM; measured on
    // the H200 478 us, against 512 in 10 and 554 in 12), attn_proj.dw's 9 tiles in 13;
    // GPT-2's fc.dw (144 tiles, K 8192) in 8 as before; products that fill the SMs with
    // short K (the forward's) unsplit.
    use wgtrain_engine::kernels::matmul_plan::{split_k_tiled, tiled_split_cost};
    assert_eq!(split_k_tiled(w, (36, 128), 16384), 11);
    assert_eq!(split_k_tiled(w, (9, 128), 16384), 13);
    assert_eq!(split_k_tiled(w, (144, 128), 8192), 8);
    assert_eq!(split_k_tiled(w, (1536, 128), 768), 1, "GPT-2's fc.fwd");
    assert_eq!(split_k_tiled(w, (384, 128), 1536), 1, "the char workload's fc.dx");
    assert_eq!(split_k_tiled(w, (1, 128), 128), 1, "one unit of K is not split");
    let cost = |tiles, units, s| tiled_split_cost(w, (tiles, 128), units, s);
    assert!(cost(36, 128, 11) < cost(36, 128, 12) && cost(36, 128, 11) < cost(36, 128, 10));
    assert!(cost(36, 128, 11) < cost(36, 128, 1) / 3.0);
}

/// A product's split, kernel and scratch come from one plan: the char workload's fc.dw
/// in f32 on the H100 (K 16384, whole units) takes 11 uneven slices on the tiled kernel
/// and their partials; K off the unit falls back to equal slices by wave fill.
#[test]
fn tiled_products_take_uneven_slices_where_k_is_whole_units() {
    let plan_dw = |rows: usize| {
        plan(
            &h100(),
            op(&[384, rows], &[1, 384], DType::F32),
            op(&[rows, 1536], &[1536, 1], DType::F32),
            op(&[384, 1536], &[1536, 1], DType::F32),
            &MatmulOptions::default(),
        )
        .unwrap()
        .unwrap()
    };
    let p = plan_dw(16384);
    assert!(matches!(p.kernel, ProductKernel::Tiled(_)), "{p}");
    assert_eq!((p.splits, p.scratch_elems), (11, 11 * 384 * 1536), "{p}");
    assert_eq!(p.first.flags & wgtrain_engine::kernels::matmul_params::SLICED, 2, "{p}");
    assert_eq!(
        wgtrain_engine::kernels::matmul_plan::tiled_split_bytes(&h100(), 384, 1536, 16384),
        (11 * 384 * 1536 * 4) as u64
    );
    // 16384 + 8 rows: not whole units, so equal slices (8: 36 tiles fill 288 of 264 slots...
    // the wave-fill rule), and no uneven flag.
    let q = plan_dw(16392);
    assert_eq!(q.first.flags & wgtrain_engine::kernels::matmul_params::SLICED, 0, "{q}");
    assert_eq!(
        q.splits,
        wgtrain_engine::kernels::matmul_plan::split_k_by_waves(132, 36, 16392),
        "{q}"
    );
}

/// GPT-2's dW products in f16 on the H100 take tensor cores: fc.dw (144 tiles) in 3
/// uneven K slices, qkv.dw (108 tiles, a wave already) unsplit; in f32 the tiled
/// kernel splits fc.dw by wave fill. On lavapipe (no cooperative matrices, two threads)
/// the same products run on the tiled kernel's 64 x 64 tiles (a CPU adapter's) and are
/// not split: 576 tiles fill two threads many times over.
#[test]
fn gpt2_products_plan_by_adapter() {
    let fc = dw(&h100(), 768, 3072, DType::F16);
    let ProductKernel::Coop(k) = fc.kernel else { panic!("{fc}") };
    assert_eq!(fc.splits, 3, "{fc}");
    assert_eq!(fc.scratch_elems, 3 * 768 * 3072);
    assert!(k.loads[0].col && k.plain, "{fc}");
    assert!(fc.to_string().starts_with("matmul_coop f16,f16->f32 a:col8 b:row8 128x128"), "{fc}");
    assert!(fc.to_string().ends_with("split 3 (sum ->f32)"), "{fc}");
    let qkv = dw(&h100(), 768, 2304, DType::F16);
    assert!(matches!(qkv.kernel, ProductKernel::Coop(_)) && qkv.splits == 1, "{qkv}");
    let f32_fc = dw(&h100(), 768, 3072, DType::F32);
    assert!(matches!(f32_fc.kernel, ProductKernel::Tiled(_)) && f32_fc.splits > 1, "{f32_fc}");
    for dtype in [DType::F16, DType::F32] {
        let p = dw(&lavapipe(), 768, 3072, dtype);
        let ProductKernel::Tiled(t) = p.kernel else { panic!("{p}") };
        assert_eq!((t.tm, p.splits), (4, 1), "{p}");
        assert!(p.to_string().starts_with(&format!("matmul {0},{0}->f32 tm4", dtype.wgsl())), "{p}");
    }
}

/// A product of two output tiles: on the H100's 132 SMs it splits K into the most
/// slices of a unit (K 2048: 16); a CPU adapter (lavapipe's two threads) keeps the
/// wave-fill rule, whose equal slices fill its last wave best (2048: 8; 2000, off the
/// unit: 2).
#[test]
fn small_products_split_where_it_pays() {
    let p = |facts: &AdapterFacts, k: usize| {
        plan(
            facts,
            op(&[33, k], &[k, 1], DType::F32),
            op(&[k, 65], &[65, 1], DType::F32),
            op(&[33, 65], &[65, 1], DType::F32),
            &MatmulOptions::default(),
        )
        .unwrap()
        .unwrap()
    };
    assert_eq!(p(&lavapipe(), 2048).splits, 8);
    assert_eq!(p(&h100(), 2048).splits, 16);
    assert_eq!(p(&lavapipe(), 2000).splits, 2);
}

#[test]
fn bad_products_are_refused_before_launch() {
    let (a, a_s, b, b_s) = ([4, 8], [8, 1], [7, 3], [3, 1]);
    let (c, c_s) = ([4, 3], [3, 1]);
    let err = plan(
        &h100(),
        op(&a, &a_s, DType::F32),
        op(&b, &b_s, DType::F32),
        op(&c, &c_s, DType::F32),
        &MatmulOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("equal inner dimensions"), "{err}");
    let (b, b_s, wrong, wrong_s) = ([8, 3], [3, 1], [4, 4], [4, 1]);
    let err = plan(
        &h100(),
        op(&a, &a_s, DType::F32),
        op(&b, &b_s, DType::F32),
        op(&wrong, &wrong_s, DType::F32),
        &MatmulOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("matmul output"), "{err}");
    let zero = MatmulOptions {
        split_k: Some(0),
        ..Default::default()
    };
    let err = plan(
        &h100(),
        op(&a, &a_s, DType::F32),
        op(&b, &b_s, DType::F32),
        op(&c, &c_s, DType::F32),
        &zero,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("K slices"), "{err}");
    // An empty output: nothing to plan.
    let (e, e_s, ce, ce_s) = ([0, 8], [8, 1], [0, 3], [3, 1]);
    assert!(
        plan(
            &h100(),
            op(&e, &e_s, DType::F32),
            op(&b, &b_s, DType::F32),
            op(&ce, &ce_s, DType::F32),
            &MatmulOptions::default()
        )
        .unwrap()
        .is_none()
    );
}

/// GPT-2's attention (head size 64, T 1024): tensor cores in f16 on the H100, never on
/// lavapipe; the register-tiled SIMT kernels where subgroups of 8 are granted, sized to
/// the workgroup memory; the overrides force the lane kernels.
#[test]
fn attention_plans_by_adapter() {
    assert_eq!(Path::for_inputs(&h100(), DType::F16, 64), Path::Coop);
    assert_eq!(Path::for_inputs(&h100(), DType::F32, 64), Path::Tiled);
    assert_eq!(Path::for_inputs(&lavapipe(), DType::F16, 64), Path::Tiled);
    let no_subgroups = AdapterFacts {
        subgroup: false,
        ..lavapipe()
    };
    assert_eq!(Path::for_adapter(&no_subgroups), Path::Plain);
    let fwd = plan_kernel(&h100(), "", Mode::Forward, DType::F16, DType::F16, 64, 1024, Path::Coop, None).unwrap();
    let AttentionKernel::Coop { whole, .. } = fwd.kernel else {
        panic!("{fwd}")
    };
    assert!(whole, "T 1024 is whole tiles: {fwd}");
    assert!(
        fwd.to_string().starts_with("flash_attention forward f16 d64 tile") && fwd.to_string().ends_with("coop"),
        "{fwd}"
    );
    for facts in [h100(), lavapipe()] {
        let f = plan_kernel(&facts, "", Mode::Forward, DType::F32, DType::F32, 64, 1024, Path::Tiled, None).unwrap();
        let AttentionKernel::Tiled { mode, tile, chunks } = f.kernel else {
            panic!("{f}")
        };
        assert!(tile.workgroup_bytes(mode, 16) <= facts.workgroup_bytes, "{f}");
        assert_eq!(chunks, if facts.cpu { 1 } else { 2 }, "{f}");
        let b = plan_backward(&facts, "", DType::F32, DType::F32, 64, 1024, Path::Tiled, None, None).unwrap();
        assert!(b.pre.is_none() && b.query.row_dot(), "the tiled dQ computes the row dot");
        let AttentionKernel::Lane(kv) = b.key_value.kernel else {
            panic!("{}", b.key_value)
        };
        assert_eq!((kv.rows, kv.lanes), (2, 8), "two key rows a thread: {}", b.key_value);
        let off = plan_backward(&facts, "off", DType::F32, DType::F32, 64, 1024, Path::Tiled, None, None).unwrap();
        let AttentionKernel::Lane(q) = off.query.kernel else {
            panic!("{}", off.query)
        };
        assert_eq!(q.path, Path::Subgroup, "{}", off.query);
        assert!(off.pre.is_some(), "the lane dQ needs the row dot first");
        let one_row = plan_backward(&facts, "kv=lane", DType::F32, DType::F32, 64, 1024, Path::Tiled, None, None).unwrap();
        let AttentionKernel::Lane(kv) = one_row.key_value.kernel else {
            panic!("{}", one_row.key_value)
        };
        assert_eq!((kv.rows, kv.lanes), (1, 4), "{}", one_row.key_value);
        assert!(matches!(one_row.query.kernel, AttentionKernel::Tiled { .. }));
    }
    // An f32 dy on tensor cores is cast to f16 by the row dot.
    let b = plan_backward(&h100(), "", DType::F16, DType::F32, 64, 1024, Path::Coop, None, None).unwrap();
    assert!(b.dy16 && b.pre.is_some_and(|p| p.mode == Mode::RowDotCast));
    assert_eq!(b.query.td, DType::F16);
}

#[test]
fn attention_tile_specs_are_checked() {
    use wgtrain_engine::kernels::flash_attention_tiled::check_spec;
    for good in ["", "off", "fwd=64x64x4p,q=64x32x4p,kv=32x32x2p", "kv=lane,u2", "unroll"] {
        check_spec(good).unwrap();
    }
    for bad in ["fwd=64x64", "kv=fast", "sideways", "q=lane"] {
        assert!(check_spec(bad).is_err(), "{bad}");
    }
}
/// Between the 128 x 128 tensor-core tiles: the one with two K tiles in flight, unless A
/// is a transposed view (dW products) and the K loop (per split-K slice) is long; then
/// the one whose workgroups fill their waves better (one per SM against two), weighed by
/// their speeds.
#[test]
fn the_128_tile_follows_the_waves() {
    let w = h100().wave();
    use wgtrain_engine::kernels::matmul_coop::{TILE_128_AHEAD, TILE_128_SLIM, by_waves};
    // GPT-2's N = 768 products: 384 tiles fill 3 waves of 132 at 97%, 2 of 264 at 73%.
    assert_eq!(by_waves(384, 3072, false, w), TILE_128_AHEAD);
    // 4096^3 (1024 tiles) fills both alike; A's rows are contiguous.
    assert_eq!(by_waves(1024, 4096, false, w), TILE_128_AHEAD);
    assert_eq!(by_waves(1024, 4096, true, w), TILE_128_SLIM);
    // Short K loops take the two tiles in flight whatever the waves.
    assert_eq!(by_waves(1024, 768, true, w), TILE_128_AHEAD);
    assert_eq!(by_waves(288, 1024, true, w), TILE_128_AHEAD);
    // Split-K dW launches: qkv.dw's 108 tiles x 4 slices of 2048 fill both alike; fc.dw's
    // 144 x 4 fill 87% of 5 waves of 132 but 73% of 3 of 264.
    assert_eq!(by_waves(432, 2048, true, w), TILE_128_SLIM);
    assert_eq!(by_waves(576, 2048, true, w), TILE_128_AHEAD);
    assert_eq!(by_waves(432, 2048, false, w), TILE_128_AHEAD);
    assert_eq!(TILE_128_AHEAD.ahead, 2);
    assert!(TILE_128_SLIM.bm() == 128 && TILE_128_SLIM.bn() == 128 && TILE_128_SLIM.threads() == 128);
}
