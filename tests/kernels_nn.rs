//! LayerNorm, cross-entropy, embedding, matmul, attention and the optimizers against
//! f64 CPU references, on shapes that are not multiples of any tile, with size-1 dims
//! and large logits; guard bytes are on throughout.

mod common;

use common::{Rng, assert_close, assert_close_within, finish, rounded, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::kernels::matmul::{Activation, MatmulOptions, matmul, matmul_into};
use wgtrain_engine::kernels::matmul_params::MatmulTile;
use wgtrain_engine::kernels::optim::{AdamW, OptimState, Sgd, adamw_step, sgd_step, unscale_and_check};
use wgtrain_engine::kernels::tolerance::{tensor_core_tolerance, tolerance};
use wgtrain_engine::kernels::{attention, cross_entropy, embedding, layernorm, map};
use wgtrain_engine::{Category, DType, Runtime, Tensor};

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// C[z] = A[z] @ B[z] for row-major [batch, m, k] x [batch, k, n] in f64.
fn matmul_ref(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for z in 0..batch {
        for i in 0..m {
            for p in 0..k {
                let av = a[z * m * k + i * k + p];
                for j in 0..n {
                    c[z * m * n + i * n + j] += av * b[z * k * n + p * n + j];
                }
            }
        }
    }
    c
}

fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

#[test]
fn matmul_matches_for_odd_shapes_transposes_and_epilogues() {
    let rt = runtime();
    let mut rng = Rng(10);
    for (m, k, n) in [
        (67, 35, 129),
        (1, 1, 1),
        (1, 300, 5),
        (130, 17, 131),
        (9, 12, 64),
        (130, 64, 136),
        (0, 4, 3),
        (5, 0, 4),
    ] {
        let a_data = rng.vec(m * k, -1.0, 1.0);
        let b_data = rng.vec(k * n, -1.0, 1.0);
        let want = matmul_ref(&f64s(&a_data), &f64s(&b_data), 1, m, k, n);
        let a = upload(&rt, &a_data, &[m, k], DType::F32);
        let b = upload(&rt, &b_data, &[k, n], DType::F32);
        let c = matmul(&rt, &a, &b, DType::F32, &MatmulOptions::default(), Category::Other, "c").unwrap();
        assert_close(&rt, &format!("matmul {m}x{k}x{n}"), &c, &want, k);
        // The same product from transposed storage: A^T stored [k, m], B^T stored [n, k].
        let at = upload(
            &rt,
            &transpose(&f64s(&a_data), m, k).iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[k, m],
            DType::F32,
        );
        let bt = upload(
            &rt,
            &transpose(&f64s(&b_data), k, n).iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[n, k],
            DType::F32,
        );
        let c2 = matmul(
            &rt,
            &at.transpose(0, 1).unwrap(),
            &bt.transpose(0, 1).unwrap(),
            DType::F32,
            &MatmulOptions::default(),
            Category::Other,
            "c2",
        )
        .unwrap();
        assert_close(&rt, &format!("matmul transposed {m}x{k}x{n}"), &c2, &want, k);
    }
    // Bias + gelu epilogue, and beta accumulation into an existing C.
    let (m, k, n) = (33, 20, 45);
    let a_data = rng.vec(m * k, -1.0, 1.0);
    let b_data = rng.vec(k * n, -1.0, 1.0);
    let bias_data = rng.vec(n, -1.0, 1.0);
    let prod = matmul_ref(&f64s(&a_data), &f64s(&b_data), 1, m, k, n);
    let (a, b) = (upload(&rt, &a_data, &[m, k], DType::F32), upload(&rt, &b_data, &[k, n], DType::F32));
    let bias = upload(&rt, &bias_data, &[n], DType::F32);
    let opts = MatmulOptions {
        bias: Some(&bias),
        activation: Activation::Gelu,
        ..Default::default()
    };
    let c = matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").unwrap();
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
    let want: Vec<f64> = prod.iter().enumerate().map(|(i, &v)| gelu(v + bias_data[i % n] as f64)).collect();
    assert_close(&rt, "bias+gelu", &c, &want, k);
    let acc_data = rng.vec(m * n, -1.0, 1.0);
    let acc = upload(&rt, &acc_data, &[m, n], DType::F32);
    matmul_into(
        &rt,
        &a,
        &b,
        &acc,
        &MatmulOptions {
            alpha: 0.5,
            beta: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    let want: Vec<f64> = prod.iter().zip(&acc_data).map(|(&p, &c)| 0.5 * p + c as f64).collect();
    assert_close(&rt, "alpha/beta accumulate", &acc, &want, k);
    // Batched with a broadcast operand: [2, 3, m, k] @ [k, n].
    let a_data = rng.vec(6 * m * k, -1.0, 1.0);
    let a4 = upload(&rt, &a_data, &[2, 3, m, k], DType::F32);
    let c = matmul(&rt, &a4, &b, DType::F32, &MatmulOptions::default(), Category::Other, "c").unwrap();
    assert_eq!(c.shape(), &[2, 3, m, n]);
    let b_rep: Vec<f64> = (0..6).flat_map(|_| f64s(&b_data)).collect();
    assert_close(&rt, "batched broadcast", &c, &matmul_ref(&f64s(&a_data), &b_rep, 6, m, k, n), k);
    // Shape errors are refused on the host.
    assert!(matmul(&rt, &a, &a, DType::F32, &MatmulOptions::default(), Category::Other, "bad").is_err());
    finish(&rt);
}

/// Every variant of the tiled kernel (lane placement, one or two workgroup buffers, the
/// K loop written out or not), on both tile sizes, with tails in M, N and K, many K
/// tiles (so the buffers alternate), rows or transposed views, vec4 and scalar loads.
#[test]
fn every_tiled_variant_matches() {
    use wgtrain_engine::kernels::matmul::SimtTile;
    let rt = runtime();
    let mut rng = Rng(23);
    // (m, k, n): 64-tiles with an odd K; 128-tiles over 6 K tiles with tails and vec4
    // loads; scalar loads (no dimension a multiple of 4); whole tiles (loads unchecked)
    // of 128 and of 64 (N 192 is not whole for 128). A CPU adapter picks 64-tiles
    // throughout, so the 128-tiles (8 x 8 a thread) are forced too where the shape
    // reaches them.
    for (m, k, n) in [(70, 37, 66), (136, 88, 132), (131, 45, 133), (128, 96, 128), (256, 64, 192)] {
        let a_data = rng.vec(m * k, -1.0, 1.0);
        let b_data = rng.vec(k * n, -1.0, 1.0);
        let (a64, b64) = (f64s(&a_data), f64s(&b_data));
        let want = matmul_ref(&a64, &b64, 1, m, k, n);
        // A rows x cols operand as stored, or as the transposed view of its transpose.
        let operand = |data: &[f64], rows: usize, cols: usize, transposed: bool| {
            let (stored, shape) = if transposed {
                (transpose(data, rows, cols), [cols, rows])
            } else {
                (data.to_vec(), [rows, cols])
            };
            let t = upload(&rt, &stored.iter().map(|&x| x as f32).collect::<Vec<_>>(), &shape, DType::F32);
            if transposed { t.transpose(0, 1).unwrap() } else { t }
        };
        let forced = (m >= 128 && n >= 128).then_some(SimtTile {
            tm: 8,
            ..SimtTile::DEFAULT
        });
        for (i, tile) in SimtTile::candidates().into_iter().chain(forced).enumerate() {
            // Each variant sees rows, and one transposed operand in turn.
            let (a_t, b_t) = (i % 2 == 1, i % 4 >= 2);
            let (a, b) = (operand(&a64, m, k, a_t), operand(&b64, k, n, b_t));
            let opts = MatmulOptions {
                tiled_only: true,
                simt_tile: Some(tile),
                ..Default::default()
            };
            let c = matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").unwrap();
            assert_close(&rt, &format!("{} {m}x{k}x{n} a_t={a_t} b_t={b_t}", tile.name()), &c, &want, k);
        }
    }
    finish(&rt);
}

/// Products whose few output tiles leave the device idle split K into slices whose
/// partials a second pass sums in order through the epilogue (bias, GELU, alpha, and
/// beta accumulating onto C).
#[test]
fn split_k_products_match() {
    // The split rules themselves: tests/kernel_plans.rs. K = 2000 (off the unit of
    // uneven slices) is split in equal slices on lavapipe and on the GPUs.
    let rt = runtime();
    let mut rng = Rng(22);
    let (m, k, n) = (33, 2000, 65);
    let (a_data, b_data) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
    let (bias_data, c_data) = (rng.vec(n, -1.0, 1.0), rng.vec(m * n, -1.0, 1.0));
    let a = upload(&rt, &a_data, &[m, k], DType::F32);
    let b = upload(&rt, &b_data, &[k, n], DType::F32);
    let bias = upload(&rt, &bias_data, &[n], DType::F32);
    let c = upload(&rt, &c_data, &[m, n], DType::F32);
    let opts = MatmulOptions {
        alpha: 0.5,
        beta: 1.0,
        bias: Some(&bias),
        activation: Activation::Gelu,
        ..Default::default()
    };
    matmul_into(&rt, &a, &b, &c, &opts).unwrap();
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
    let want: Vec<f64> = matmul_ref(&f64s(&a_data), &f64s(&b_data), 1, m, k, n)
        .iter()
        .enumerate()
        .map(|(i, &v)| gelu(0.5 * v + bias_data[i % n] as f64 + c_data[i] as f64))
        .collect();
    assert_close(&rt, "split-K f32 with the whole epilogue", &c, &want, k);
    // Forced uneven slices on the tiled f32 kernel (K whole units of 128): ragged M and N
    // with A a transposed view (a weight gradient's read), and whole tiles (the unchecked
    // loads); K off the unit takes equal slices only and says so.
    let tiled = MatmulOptions {
        tiled_only: true,
        ..Default::default()
    };
    for (m, k, n, a_view) in [(192, 896, 160, true), (256, 896, 128, false)] {
        let (a_data, b_data) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
        let want = matmul_ref(&f64s(&a_data), &f64s(&b_data), 1, m, k, n);
        let a = if a_view {
            let at: Vec<f32> = transpose(&f64s(&a_data), m, k).iter().map(|&x| x as f32).collect();
            upload(&rt, &at, &[k, m], DType::F32).transpose(0, 1).unwrap()
        } else {
            upload(&rt, &a_data, &[m, k], DType::F32)
        };
        let b = upload(&rt, &b_data, &[k, n], DType::F32);
        for splits in [2, 3, 5, 7] {
            let opts = MatmulOptions {
                split_k: Some(splits),
                ..tiled
            };
            let c = matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").unwrap();
            assert_close(&rt, &format!("{m}x{k}x{n} in {splits} slices, A a view: {a_view}"), &c, &want, k);
        }
    }
    let (a, b) = (
        upload(&rt, &rng.vec(64 * 960, -1.0, 1.0), &[64, 960], DType::F32),
        upload(&rt, &rng.vec(960 * 64, -1.0, 1.0), &[960, 64], DType::F32),
    );
    let opts = MatmulOptions { split_k: Some(7), ..tiled };
    let e = matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").unwrap_err();
    assert!(e.to_string().contains("slices of K = 960"), "{e}");
    finish(&rt);
}

#[test]
fn f16_matmul_accumulates_in_f32() {
    let rt = runtime();
    if !rt.gpu.caps.shader_f16 {
        return;
    }
    let mut rng = Rng(11);
    for (m, k, n) in [(67, 130, 129), (16, 16, 16), (3, 1000, 2)] {
        let a_data = rng.vec(m * k, -1.0, 1.0);
        let b_data = rng.vec(k * n, -1.0, 1.0);
        let want = matmul_ref(&rounded(&a_data, DType::F16), &rounded(&b_data, DType::F16), 1, m, k, n);
        let a = upload(&rt, &a_data, &[m, k], DType::F16);
        let b = upload(&rt, &b_data, &[k, n], DType::F16);
        for out in [DType::F32, DType::F16] {
            for tiled_only in [false, true] {
                let opts = MatmulOptions {
                    tiled_only,
                    ..Default::default()
                };
                let c = matmul(&rt, &a, &b, out, &opts, Category::Other, "c").unwrap();
                // f32 output: accumulation-order error only; f16: output rounding too.
                // Tensor cores (chosen where granted) round differently inside.
                let coop = !tiled_only && wgtrain_engine::kernels::matmul_coop::usable(&rt, &a, &b, &c);
                let tol = match (out, coop) {
                    (DType::F32, true) => tensor_core_tolerance(k),
                    _ => tolerance(out, k),
                };
                assert_close_within(&rt, &format!("f16 matmul {m}x{k}x{n} -> {out} coop={coop}"), &c, &want, tol);
            }
        }
        // Transposed f16 operands take the strided (scalar) loads.
        let at = upload(
            &rt,
            &transpose(&f64s(&a_data), m, k).iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[k, m],
            DType::F16,
        );
        let c = matmul(
            &rt,
            &at.transpose(0, 1).unwrap(),
            &b,
            DType::F32,
            &MatmulOptions::default(),
            Category::Other,
            "c",
        )
        .unwrap();
        let coop = wgtrain_engine::kernels::matmul_coop::usable(&rt, &a, &b, &c);
        let tol = if coop { tensor_core_tolerance(k) } else { tolerance(DType::F32, k) };
        assert_close_within(&rt, "f16 matmul, transposed A", &c, &want, tol);
    }
    finish(&rt);
}

/// a @ b (f16) into f32 with the cooperative `tile` forced (None: the host's pick),
/// against `want`, at the tensor cores' tolerance where they ran.
fn check_f16_product(rt: &Runtime, (a, b): (&Tensor, &Tensor), tile: Option<MatmulTile>, want: &[f64], what: &str) {
    let k = a.shape()[a.shape().len() - 1];
    let opts = MatmulOptions {
        coop_tile: tile,
        ..Default::default()
    };
    let c = matmul(rt, a, b, DType::F32, &opts, Category::Other, "c").unwrap();
    let coop = wgtrain_engine::kernels::matmul_coop::usable(rt, a, b, &c);
    let tol = if coop { tensor_core_tolerance(k) } else { tolerance(DType::F32, k) };
    assert_close_within(rt, &format!("{what} tile={tile:?} coop={coop}"), &c, want, tol);
}

/// The cooperative kernel's operand loads (rows or transposed views; 8-, 4- and 1-wide),
/// every candidate tile, tails in M, N and K, batches, the wide stores of whole tiles
/// (with and without the epilogue) and the staged ones of ragged tiles.
/// Where the adapter has no cooperative matrices (lavapipe) the same calls take the
/// tiled kernel, and the checks hold for it.
#[test]
fn f16_matmul_loads_tiles_and_epilogues() {
    use wgtrain_engine::kernels::matmul_coop::CANDIDATES;
    let rt = runtime();
    if !rt.gpu.caps.shader_f16 {
        return;
    }
    let mut rng = Rng(21);
    let mut case = 0;
    // Four shapes times four orientations.
    const CASES: usize = 16;
    // The last shape has too few tiles for the device: its K is split.
    for (m, k, n) in [(136, 72, 200), (132, 68, 196), (67, 67, 131), (40, 1024, 72)] {
        let a_data = rng.vec(2 * m * k, -1.0, 1.0);
        let b_data = rng.vec(k * n, -1.0, 1.0);
        let (a64, b64) = (rounded(&a_data, DType::F16), rounded(&b_data, DType::F16));
        let want = matmul_ref(&a64[..m * k], &b64, 1, m, k, n);
        for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
            // A as [m, k], or as the transposed view of a stored [k, m] (B likewise).
            let to_f32 = |v: Vec<f64>| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
            let a = if a_t {
                let at = to_f32(transpose(&a64[..m * k], m, k));
                upload(&rt, &at, &[k, m], DType::F16).transpose(0, 1).unwrap()
            } else {
                upload(&rt, &a_data[..m * k], &[m, k], DType::F16)
            };
            let b = if b_t {
                let bt = to_f32(transpose(&b64, k, n));
                upload(&rt, &bt, &[n, k], DType::F16).transpose(0, 1).unwrap()
            } else {
                upload(&rt, &b_data, &[k, n], DType::F16)
            };
            // Every candidate tile (and the host's pick) in one of the 16 cases or more:
            // case c takes choices c, c + 16, ...
            for choice in (case..=CANDIDATES.len()).step_by(CASES) {
                let tile = CANDIDATES.get(choice).copied();
                check_f16_product(&rt, (&a, &b), tile, &want, &format!("f16 {m}x{k}x{n} a_t={a_t} b_t={b_t}"));
            }
            case += 1;
        }
        // Batched A [2, m, k] with B broadcast, into f16 with bias and GELU.
        let a2 = upload(&rt, &a_data, &[2, m, k], DType::F16);
        let b = upload(&rt, &b_data, &[k, n], DType::F16);
        let bias_data = rng.vec(n, -1.0, 1.0);
        let bias = upload(&rt, &bias_data, &[n], DType::F32);
        let opts = MatmulOptions {
            bias: Some(&bias),
            activation: Activation::Gelu,
            ..Default::default()
        };
        let c = matmul(&rt, &a2, &b, DType::F16, &opts, Category::Other, "c").unwrap();
        let b2: Vec<f64> = b64.iter().chain(&b64).copied().collect();
        let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
        let want: Vec<f64> = matmul_ref(&a64, &b2, 2, m, k, n)
            .iter()
            .enumerate()
            .map(|(i, &v)| gelu(v + bias_data[i % n] as f64))
            .collect();
        let (atol, rtol) = tolerance(DType::F16, k);
        let (catol, crtol) = tensor_core_tolerance(k);
        assert_close_within(
            &rt,
            &format!("f16 batched bias+gelu {m}x{k}x{n}"),
            &c,
            &want,
            (atol.max(catol), rtol.max(crtol)),
        );
    }
    finish(&rt);
}

/// Whole tiles, which the cooperative kernel loads without bounds checks: every
/// candidate tile at shapes that are whole for every tile, with an even count of K tiles
/// of 32 and an odd one of 64 (K 192: the tiles taking two K tiles a turn keep their
/// checks there), with a count of 3 (K 96), and with even counts of both (K 256: the
/// two-ahead tile's last turn fetches nothing), plain and with B a transposed view.
#[test]
fn f16_matmul_whole_tiles() {
    use wgtrain_engine::kernels::matmul_coop::CANDIDATES;
    let rt = runtime();
    if !rt.gpu.caps.shader_f16 {
        return;
    }
    let mut rng = Rng(23);
    for (m, k, n) in [(256, 192, 256), (128, 96, 256), (128, 256, 128)] {
        let a_data = rng.vec(m * k, -1.0, 1.0);
        let b_data = rng.vec(k * n, -1.0, 1.0);
        let (a64, b64) = (rounded(&a_data, DType::F16), rounded(&b_data, DType::F16));
        let want = matmul_ref(&a64, &b64, 1, m, k, n);
        let a = upload(&rt, &a_data, &[m, k], DType::F16);
        let bt: Vec<f32> = transpose(&b64, k, n).iter().map(|&x| x as f32).collect();
        for b in [
            upload(&rt, &b_data, &[k, n], DType::F16),
            upload(&rt, &bt, &[n, k], DType::F16).transpose(0, 1).unwrap(),
        ] {
            for tile in CANDIDATES.iter().copied().map(Some).chain([None]) {
                check_f16_product(&rt, (&a, &b), tile, &want, &format!("f16 whole {m}x{k}x{n}"));
            }
        }
    }
    finish(&rt);
}

/// Forced K slices (`MatmulOptions::split_k`): the tensor-core kernel takes uneven ones
/// over whole tiles (K = 7 units of 128 in 2, 3, 5 and 7 slices; A as stored and as a
/// transposed view, the way a weight gradient reads it; f32 and f16 C, with the whole
/// epilogue once); so does the tiled kernel, over any tiles (K whole units).
#[test]
fn f16_matmul_uneven_k_slices() {
    let rt = runtime();
    if !rt.gpu.caps.shader_f16 {
        return;
    }
    let mut rng = Rng(24);
    let (m, k, n) = (256, 896, 128);
    let a_data = rng.vec(m * k, -1.0, 1.0);
    let b_data = rng.vec(k * n, -1.0, 1.0);
    let (bias_data, c_data) = (rng.vec(n, -1.0, 1.0), rng.vec(m * n, -1.0, 1.0));
    let (a64, b64) = (rounded(&a_data, DType::F16), rounded(&b_data, DType::F16));
    let want = matmul_ref(&a64, &b64, 1, m, k, n);
    let at: Vec<f32> = transpose(&a64, m, k).iter().map(|&x| x as f32).collect();
    let b = upload(&rt, &b_data, &[k, n], DType::F16);
    let bias = upload(&rt, &bias_data, &[n], DType::F32);
    let probe = Tensor::empty(&rt, &[m, n], DType::F32, Category::Other, "probe").unwrap();
    let a_plain = upload(&rt, &a_data, &[m, k], DType::F16);
    let coop = wgtrain_engine::kernels::matmul_coop::usable(&rt, &a_plain, &b, &probe);
    let tol = if coop { tensor_core_tolerance(k) } else { tolerance(DType::F32, k) };
    for a in [a_plain, upload(&rt, &at, &[k, m], DType::F16).transpose(0, 1).unwrap()] {
        for splits in [2, 3, 5, 7] {
            let opts = MatmulOptions {
                split_k: Some(splits),
                ..Default::default()
            };
            let what = format!("{splits} slices, A strides {:?}, coop={coop}", a.strides());
            let c = matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").unwrap();
            assert_close_within(&rt, &what, &c, &want, tol);
        }
    }
    // The whole epilogue and an f16 C, in 3 slices.
    let splits = 3;
    let a = upload(&rt, &a_data, &[m, k], DType::F16);
    let c = upload(&rt, &c_data, &[m, n], DType::F32);
    let opts = MatmulOptions {
        alpha: 0.5,
        beta: 1.0,
        bias: Some(&bias),
        activation: Activation::Gelu,
        split_k: Some(splits),
        ..Default::default()
    };
    matmul_into(&rt, &a, &b, &c, &opts).unwrap();
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh());
    let full: Vec<f64> = (0..m * n)
        .map(|i| gelu(0.5 * want[i] + bias_data[i % n] as f64 + c_data[i] as f64))
        .collect();
    assert_close_within(&rt, &format!("{splits} slices, whole epilogue"), &c, &full, tol);
    let c16 = matmul(
        &rt,
        &a,
        &b,
        DType::F16,
        &MatmulOptions {
            split_k: Some(splits),
            ..Default::default()
        },
        Category::Other,
        "c16",
    )
    .unwrap();
    assert_close_within(&rt, &format!("{splits} slices, f16 C"), &c16, &want, tolerance(DType::F16, 1));
    // A count the shape cannot take, on any adapter.
    let opts = MatmulOptions {
        split_k: Some(0),
        ..Default::default()
    };
    assert!(matmul(&rt, &a, &b, DType::F32, &opts, Category::Other, "c").is_err());
    finish(&rt);
}

/// The rule for loads without bounds checks: M, N and K multiples of the tile's, and an
/// even count of K tiles where the loop takes two a turn.
#[test]
fn whole_tiles_are_told_apart() {
    use wgtrain_engine::kernels::matmul::whole_tiles;
    use wgtrain_engine::kernels::matmul_params::Load;
    // The tiled kernel: TM 8 (128 x 128) and 4 (64 x 64), K by 32, rows contiguous.
    let rows = [Load { col: false, width: 4 }; 2];
    let scalar = [Load { col: false, width: 1 }; 2];
    assert!(whole_tiles(4096, 4096, 4096, 8, 32, rows));
    assert!(!whole_tiles(256, 192, 64, 8, 32, rows) && whole_tiles(256, 192, 64, 4, 32, rows));
    assert!(!whole_tiles(128, 128, 48, 8, 32, rows) && !whole_tiles(128, 128, 0, 8, 32, rows));
    // A transposed view, or scalar loads, keep the checks.
    assert!(!whole_tiles(4096, 4096, 4096, 8, 32, [rows[0], Load { col: true, width: 4 }]));
    assert!(!whole_tiles(4096, 4096, 4096, 8, 32, scalar));
    use wgtrain_engine::kernels::matmul_coop::{TILE_128_AHEAD, TILE_128_SLIM, whole};
    use wgtrain_engine::kernels::matmul_params::Params;
    let p = |m, n, k| Params {
        m,
        n,
        k,
        ..Default::default()
    };
    // 4096^3 and GPT-2's qkv forward, in 128 x 128 tiles by 32 (one a turn).
    assert!(whole(&p(4096, 4096, 4096), TILE_128_SLIM));
    assert!(whole(&p(8192, 2304, 768), TILE_128_SLIM));
    // Three K tiles: whole for a tile taking one a turn; not for one taking two (its
    // fourth tile is of zeros, which the checks make).
    assert!(whole(&p(128, 128, 96), TILE_128_SLIM));
    assert!(whole(&p(128, 128, 256), TILE_128_AHEAD));
    assert!(!whole(&p(128, 128, 192), TILE_128_AHEAD));
    // Tails in M, N or K, and no K at all.
    assert!(!whole(&p(136, 128, 128), TILE_128_SLIM));
    assert!(!whole(&p(128, 200, 128), TILE_128_SLIM));
    assert!(!whole(&p(128, 128, 72), TILE_128_SLIM));
    assert!(!whole(&p(128, 128, 0), TILE_128_SLIM));
}

#[test]
fn the_cooperative_path_is_chosen_only_where_granted() {
    use wgtrain_engine::kernels::matmul_coop::eligible;
    assert!(eligible(true, (32, 32), DType::F16, DType::F16, DType::F32));
    assert!(
        !eligible(false, (32, 32), DType::F16, DType::F16, DType::F32),
        "no coop configs (lavapipe)"
    );
    assert!(!eligible(true, (64, 64), DType::F16, DType::F16, DType::F32), "subgroups of 64");
    assert!(!eligible(true, (32, 32), DType::F32, DType::F16, DType::F32), "f32 operand");
    let rt = runtime();
    let granted = rt.gpu.caps.coop_f16_16x16x16();
    assert_eq!(
        granted,
        rt.gpu
            .caps
            .cooperative_matrix
            .iter()
            .any(|c| (c.m, c.n, c.k) == (16, 16, 16) && c.ab == "f16" && c.cr == "f32")
    );
}

#[test]
fn layernorm_forward_and_backward_match() {
    let rt = runtime();
    let mut rng = Rng(12);
    // Rows a multiple of 4 and at most 1,024 wide take the subgroup-a-row kernels (on
    // lavapipe 8 lanes: up to 32 vec4s a lane, chunks of 8 rows eight to a workgroup),
    // the others the workgroup-a-row ones.
    let cases = [
        (13usize, 67usize),
        (1, 1),
        (4, 768),
        (200, 67),
        (700, 9),
        (40, 1100),
        (200, 384),
        (9, 1024),
        (33, 4),
        (131, 12),
    ];
    for (rows, cols) in cases {
        let x = rng.vec(rows * cols, -3.0, 3.0);
        let w = rng.vec(cols, 0.5, 1.5);
        let b = rng.vec(cols, -0.5, 0.5);
        let dy = rng.vec(rows * cols, -1.0, 1.0);
        let eps = 1e-5;
        let (mut y_ref, mut dx_ref) = (vec![0.0; rows * cols], vec![0.0; rows * cols]);
        let (mut dw_ref, mut db_ref) = (vec![0.0; cols], vec![0.0; cols]);
        // dx's natural size: the largest rstd * |dy * w| of a row. A GPU's division may be
        // off by 2.5 ulp (Vulkan's precision rule; NVIDIA's driver takes 1 / n that way),
        // and rstd carries it into dx: a one-column row (variance 0, rstd = 1 / sqrt(eps)
        // = 316) came out -4.2e-6 where its dx is 0 on an H200. dx's tolerance is scaled
        // by this where it exceeds 1.
        let mut dx_size: f64 = 1.0;
        for r in 0..rows {
            let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
            let mu = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            let xhat: Vec<f64> = row.iter().map(|v| (v - mu) * rstd).collect();
            let g: Vec<f64> = (0..cols).map(|j| dy[r * cols + j] as f64 * w[j] as f64).collect();
            let mg = g.iter().sum::<f64>() / cols as f64;
            let mgx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
            dx_size = dx_size.max(rstd * g.iter().fold(0.0, |m: f64, v| m.max(v.abs())));
            for j in 0..cols {
                y_ref[r * cols + j] = xhat[j] * w[j] as f64 + b[j] as f64;
                dx_ref[r * cols + j] = rstd * (g[j] - mg - xhat[j] * mgx);
                dw_ref[j] += dy[r * cols + j] as f64 * xhat[j];
                db_ref[j] += dy[r * cols + j] as f64;
            }
        }
        let xt = upload(&rt, &x, &[rows, cols], DType::F32);
        let wt = upload(&rt, &w, &[cols], DType::F32);
        let bt = upload(&rt, &b, &[cols], DType::F32);
        let (y, saved) = layernorm::forward(&rt, &xt, &wt, &bt, eps as f32, "ln").unwrap();
        assert_close(&rt, "layernorm y", &y, &y_ref, cols);
        let dyt = upload(&rt, &dy, &[rows, cols], DType::F32);
        let dw = Tensor::full(&rt, &[cols], DType::F32, 0.0, Category::Gradient, "dw").unwrap();
        let db = Tensor::full(&rt, &[cols], DType::F32, 0.0, Category::Gradient, "db").unwrap();
        let dx = layernorm::backward(&rt, &xt, &wt, &saved, &dyt, (&dw, &db), "dx").unwrap();
        let (atol, rtol) = tolerance(DType::F32, cols);
        assert_close_within(&rt, "layernorm dx", &dx, &dx_ref, (atol * dx_size, rtol));
        assert_close(&rt, "layernorm dw", &dw, &dw_ref, rows);
        assert_close(&rt, "layernorm db", &db, &db_ref, rows);

        // Fused with the residual add before it: x = x0 + r, the sum written too; then
        // backward with a gradient so far folded in. Both bit-equal to the separate
        // launches (the add, the LayerNorm, the add of the gradients) on lavapipe. A GPU
        // driver may fuse the folded add with the product before it into one rounding
        // (NVIDIA's did, on an H200): there the gradient is within two f32 roundings of
        // the separate add's.
        let r0 = rng.vec(rows * cols, -1.0, 1.0);
        let x0: Vec<f32> = x.iter().zip(&r0).map(|(a, b)| a - b).collect();
        let (x0t, r0t) = (
            upload(&rt, &x0, &[rows, cols], DType::F32),
            upload(&rt, &r0, &[rows, cols], DType::F32),
        );
        let (sum, y2, saved2) = layernorm::add_forward_as(&rt, (&x0t, &r0t), &wt, &bt, eps as f32, DType::F32, ("sum", "ln")).unwrap();
        let sum_want: Vec<f32> = x0.iter().zip(&r0).map(|(a, b)| a + b).collect();
        assert_eq!(sum.to_f32_vec(&rt).unwrap(), sum_want, "the residual sum");
        let summed = upload(&rt, &sum_want, &[rows, cols], DType::F32);
        let (y_apart, saved_apart) = layernorm::forward(&rt, &summed, &wt, &bt, eps as f32, "ln").unwrap();
        assert_eq!(y2.to_f32_vec(&rt).unwrap(), y_apart.to_f32_vec(&rt).unwrap(), "fused y");
        assert_eq!(saved2.rstd.to_f32_vec(&rt).unwrap(), saved_apart.rstd.to_f32_vec(&rt).unwrap());
        let so_far = rng.vec(rows * cols, -1.0, 1.0);
        let so_far_t = upload(&rt, &so_far, &[rows, cols], DType::F32);
        let dx_apart = layernorm::backward(&rt, &summed, &wt, &saved_apart, &dyt, (&dw, &db), "dx").unwrap();
        let dx_sum = layernorm::backward_adding(&rt, &sum, &wt, &saved2, &dyt, (&dw, &db), &so_far_t, "dx").unwrap();
        let apart = dx_apart.to_f32_vec(&rt).unwrap();
        let want: Vec<f32> = apart.iter().zip(&so_far).map(|(a, b)| b + a).collect();
        let got = dx_sum.to_f32_vec(&rt).unwrap();
        if rt.gpu.caps.facts.cpu {
            assert_eq!(got, want, "dx with the gradient so far");
        } else {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let bound = 2.0 * f32::EPSILON * w.abs().max(apart[i].abs()).max(so_far[i].abs());
                assert!((g - w).abs() <= bound, "dx with the gradient so far, element {i}: {g} against {w}");
            }
        }
    }
    finish(&rt);
}

/// Per-row losses and (softmax - onehot) * scale of `logits` (rows of `v`) in f64; rows
/// whose target is negative (ignored) get zeros.
fn ce_reference(logits: &[f32], targets: &[i32], v: usize, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let n = targets.len();
    let (mut loss, mut grad) = (vec![0.0; n], vec![0.0; n * v]);
    for r in 0..n {
        let row: Vec<f64> = logits[r * v..(r + 1) * v].iter().map(|&x| x as f64).collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|x| (x - m).exp()).sum();
        if targets[r] < 0 {
            continue;
        }
        let t = targets[r] as usize;
        loss[r] = s.ln() + m - row[t];
        for j in 0..v {
            grad[r * v + j] = ((row[j] - m).exp() / s - if j == t { 1.0 } else { 0.0 }) * scale;
        }
    }
    (loss, grad)
}

#[test]
fn cross_entropy_is_stable_and_its_gradient_matches_in_place() {
    let rt = runtime();
    let mut rng = Rng(13);
    let (n, v) = (9usize, 301usize);
    let logits = rng.vec(n * v, -50.0, 50.0);
    let mut targets: Vec<i32> = (0..n).map(|i| ((i * 37) % v) as i32).collect();
    targets[4] = cross_entropy::IGNORE_INDEX;
    let valid = targets.iter().filter(|&&t| t >= 0).count();
    let scale = 1.0 / valid as f64;
    let (loss_ref, grad_ref) = ce_reference(&logits, &targets, v, scale);
    let lt = upload(&rt, &logits, &[n, v], DType::F32);
    let tt = Tensor::from_i32(&rt, &targets, &[n], Category::Input, "targets").unwrap();
    let losses = Tensor::empty(&rt, &[n], DType::F32, Category::Other, "losses").unwrap();
    // Forward only first, then forward+backward in two row chunks, writing into the logits.
    cross_entropy::cross_entropy_rows(&rt, &lt, &tt, &losses, None, 0.0, 0..n).unwrap();
    assert_close(&rt, "ce loss", &losses, &loss_ref, v);
    cross_entropy::cross_entropy_rows(&rt, &lt, &tt, &losses, Some(&lt), scale as f32, 0..5).unwrap();
    cross_entropy::cross_entropy_rows(&rt, &lt, &tt, &losses, Some(&lt), scale as f32, 5..n).unwrap();
    assert_close(&rt, "ce loss (fused)", &losses, &loss_ref, v);
    assert_close(&rt, "ce dlogits in place", &lt, &grad_ref, v);
    assert!(cross_entropy::cross_entropy_rows(&rt, &lt, &tt, &losses, None, 0.0, 0..n + 1).is_err());
    // Rows padded to 304 (the four-wide loads; the padding holds NaN, which must not
    // reach a loss or a gradient), in place and into f16, with targets in the last,
    // partial four.
    let ld = 304;
    let mut targets = targets.clone();
    targets[0] = (v - 1) as i32;
    targets[1] = 0;
    let tt = Tensor::from_i32(&rt, &targets, &[n], Category::Input, "targets").unwrap();
    let (loss_ref, grad_ref) = ce_reference(&logits, &targets, v, scale);
    let mut padded = vec![f32::NAN; n * ld];
    for r in 0..n {
        padded[r * ld..r * ld + v].copy_from_slice(&logits[r * v..(r + 1) * v]);
    }
    let dtypes = if rt.gpu.caps.shader_f16 {
        vec![DType::F32, DType::F16]
    } else {
        vec![DType::F32]
    };
    for dt in dtypes {
        let lp = Tensor::from_f32(&rt, &padded, &[n, ld], Category::Other, "padded").unwrap();
        let view = lp.slice(1, 0, v).unwrap();
        let grad = if dt == DType::F16 {
            Tensor::empty(&rt, &[n, ld], DType::F16, Category::Other, "dlogits")
                .unwrap()
                .slice(1, 0, v)
                .unwrap()
        } else {
            view.clone()
        };
        cross_entropy::cross_entropy_rows(&rt, &view, &tt, &losses, Some(&grad), scale as f32, 0..n).unwrap();
        assert_close(&rt, &format!("ce loss, padded rows, {dt} gradient"), &losses, &loss_ref, v);
        let got = grad.contiguous(&rt).unwrap();
        assert_close(&rt, &format!("ce dlogits, padded rows, {dt}"), &got, &grad_ref, v);
    }
    finish(&rt);
}

#[test]
fn embedding_gathers_and_scatter_adds_deterministically() {
    let rt = runtime();
    let mut rng = Rng(14);
    let (v, c) = (11usize, 37usize);
    let table = rng.vec(v * c, -1.0, 1.0);
    let ids: Vec<i32> = vec![3, 0, 3, 10, 3, 7, 0];
    let tt = upload(&rt, &table, &[v, c], DType::F32);
    let it = Tensor::from_i32(&rt, &ids, &[1, ids.len()], Category::Input, "ids").unwrap();
    let out = embedding::gather(&rt, &it, &tt, "emb").unwrap();
    assert_eq!(out.shape(), &[1, ids.len(), c]);
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&i| table[i as usize * c..(i as usize + 1) * c].iter().map(|&x| x as f64))
        .collect();
    assert_close(&rt, "gather", &out, &want, 1);
    // The short lists take the sorted walk (one of them over more than a tile of
    // tokens, and with an id past the table); the long one the chunked passes.
    let long: Vec<i32> = (0..1000).map(|_| (rng.next_u64() % v as u64) as i32).collect();
    let mut sorted: Vec<i32> = (0..300).map(|_| (rng.next_u64() % v as u64) as i32).collect();
    sorted[17] = v as i32;
    assert_eq!(embedding::scatter_chunks(ids.len(), v, c), 1);
    assert_eq!(embedding::scatter_chunks(sorted.len(), v, c), 1);
    assert_eq!(embedding::scatter_chunks(long.len(), v, c), 3);
    assert_eq!(embedding::scatter_chunks(8192, 50257, 768), 1, "GPT-2's partials exceed the budget");
    for ids in [ids, sorted, long] {
        let it = Tensor::from_i32(&rt, &ids, &[1, ids.len()], Category::Input, "ids").unwrap();
        let dout = rng.vec(ids.len() * c, -1.0, 1.0);
        let dt = upload(&rt, &dout, &[1, ids.len(), c], DType::F32);
        let base = rng.vec(v * c, -1.0, 1.0);
        let mut want: Vec<f64> = f64s(&base);
        for (i, &id) in ids.iter().enumerate().filter(|(_, id)| (**id as usize) < v) {
            for j in 0..c {
                want[id as usize * c + j] += dout[i * c + j] as f64;
            }
        }
        let mut runs = Vec::new();
        for _ in 0..2 {
            let dtable = upload(&rt, &base, &[v, c], DType::F32);
            embedding::scatter_add(&rt, &it, &dt, &dtable).unwrap();
            assert_close(&rt, &format!("scatter-add of {} ids", ids.len()), &dtable, &want, ids.len());
            runs.push(dtable.to_f32_vec(&rt).unwrap());
        }
        assert_eq!(runs[0], runs[1], "bitwise equal across runs");
        if embedding::scatter_chunks(ids.len(), v, c) == 1 {
            // The sorted walk adds each id's rows in token order, as one thread would.
            let mut seq = base.clone();
            for (i, &id) in ids.iter().enumerate().filter(|(_, id)| (**id as usize) < v) {
                for j in 0..c {
                    seq[id as usize * c + j] += dout[i * c + j];
                }
            }
            assert_eq!(runs[0], seq, "the sorted walk adds in token order");
        }
    }
    finish(&rt);
}

fn attention_ref(qkv: &[f64], b: usize, t: usize, c: usize, nh: usize) -> (Vec<f64>, Vec<f64>) {
    let d = c / nh;
    let mut y = vec![0.0; b * t * c];
    let mut probs = vec![0.0; b * nh * t * t];
    for bi in 0..b {
        for h in 0..nh {
            for i in 0..t {
                let q = |k: usize| qkv[bi * t * 3 * c + i * 3 * c + h * d + k];
                let mut s: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|k| q(k) * qkv[bi * t * 3 * c + j * 3 * c + c + h * d + k]).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for x in s.iter_mut() {
                    *x = (*x - m).exp() / z;
                }
                for (j, &p) in s.iter().enumerate() {
                    probs[((bi * nh + h) * t + i) * t + j] = p;
                    for k in 0..d {
                        y[bi * t * c + i * c + h * d + k] += p * qkv[bi * t * 3 * c + j * 3 * c + 2 * c + h * d + k];
                    }
                }
            }
        }
    }
    (y, probs)
}

#[test]
fn attention_forward_and_backward_match() {
    let rt: Runtime = runtime();
    let mut rng = Rng(15);
    let (b, t, c, nh) = (2usize, 7usize, 12usize, 3usize);
    let qkv = rng.vec(b * t * 3 * c, -1.0, 1.0);
    let qkv_t = upload(&rt, &qkv, &[b, t, 3 * c], DType::F32);
    let (y, saved) = attention::forward(&rt, &qkv_t, nh, "attn").unwrap();
    let (y_ref, probs_ref) = attention_ref(&f64s(&qkv), b, t, c, nh);
    assert_close(&rt, "attention y", &y, &y_ref, t);
    assert_close(&rt, "attention probs", &saved.probs, &probs_ref, c / nh);
    // Backward against central differences of L = sum(y * g) in f64.
    let g = rng.vec(b * t * c, -1.0, 1.0);
    let gt = upload(&rt, &g, &[b, t, c], DType::F32);
    let dqkv = attention::backward(&rt, &qkv_t, nh, &saved, &gt, "dqkv").unwrap();
    let loss = |x: &[f64]| {
        attention_ref(x, b, t, c, nh)
            .0
            .iter()
            .zip(&g)
            .map(|(a, &b)| a * b as f64)
            .sum::<f64>()
    };
    let base = f64s(&qkv);
    let want: Vec<f64> = (0..base.len())
        .map(|i| {
            let (mut up, mut down) = (base.clone(), base.clone());
            up[i] += 1e-5;
            down[i] -= 1e-5;
            (loss(&up) - loss(&down)) / 2e-5
        })
        .collect();
    assert_close(&rt, "attention dqkv", &dqkv, &want, t * c);
    finish(&rt);
}

#[test]
fn adamw_and_sgd_match_pytorch_semantics_and_skip_on_overflow() {
    let rt = runtime();
    let mut rng = Rng(16);
    let n = 1001;
    let p0 = rng.vec(n, -1.0, 1.0);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n, -1.0, 1.0)).collect();
    let h = AdamW {
        lr: 1e-2,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let (mut p, mut m, mut v) = (f64s(&p0), vec![0.0; n], vec![0.0; n]);
    let param = upload(&rt, &p0, &[n], DType::F32);
    let mt = Tensor::full(&rt, &[n], DType::F32, 0.0, Category::OptimizerState, "m").unwrap();
    let vt = Tensor::full(&rt, &[n], DType::F32, 0.0, Category::OptimizerState, "v").unwrap();
    let found = Tensor::empty(&rt, &[1], DType::U32, Category::Other, "found").unwrap();
    map::fill(&rt, &found, 0.0).unwrap();
    for (step, g) in grads.iter().enumerate() {
        let step = step as i32 + 1;
        let gt = upload(&rt, &g.iter().map(|x| x * 4.0).collect::<Vec<_>>(), &[n], DType::F32);
        adamw_step(
            &rt,
            &h,
            &OptimState {
                param: &param,
                grad: &gt,
                m: &mt,
                v: &vt,
                half: None,
            },
            step as u32,
            0.25,
            &found,
            true,
        )
        .unwrap();
        let (b1, b2) = (h.betas.0 as f64, h.betas.1 as f64);
        for i in 0..n {
            let gi = g[i] as f64;
            p[i] *= 1.0 - h.lr as f64 * h.weight_decay as f64;
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let denom = (v[i] / (1.0 - b2.powi(step))).sqrt() + h.eps as f64;
            p[i] -= h.lr as f64 / (1.0 - b1.powi(step)) * m[i] / denom;
        }
    }
    assert_close(&rt, "adamw param", &param, &p, 1);
    assert_close(&rt, "adamw exp_avg_sq", &vt, &v, 1);
    // An inf gradient: the check flags it and the step changes nothing.
    let mut bad = grads[0].clone();
    bad[17] = f32::INFINITY;
    let bt = upload(&rt, &bad, &[n], DType::F32);
    // Unscaling: a finite gradient is halved in place and leaves the flag clear.
    let good = upload(&rt, &grads[0], &[n], DType::F32);
    unscale_and_check(&rt, &good, 0.5, &found).unwrap();
    assert_eq!(found.to_f32_vec(&rt).unwrap(), vec![0.0]);
    let halved: Vec<f64> = grads[0].iter().map(|&g| 0.5 * g as f64).collect();
    assert_close(&rt, "unscaled in place", &good, &halved, 1);
    unscale_and_check(&rt, &bt, 1.0, &found).unwrap();
    adamw_step(
        &rt,
        &h,
        &OptimState {
            param: &param,
            grad: &bt,
            m: &mt,
            v: &vt,
            half: None,
        },
        4,
        1.0,
        &found,
        true,
    )
    .unwrap();
    assert_eq!(found.to_f32_vec(&rt).unwrap(), vec![1.0]);
    assert_close(&rt, "skipped step leaves params", &param, &p, 1);
    // SGD with momentum, dampening and nesterov, PyTorch's formulas.
    for nesterov in [false, true] {
        let s = Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: if nesterov { 0.0 } else { 0.1 },
            weight_decay: 0.01,
            nesterov,
        };
        let (mut p, mut buf) = (f64s(&p0), vec![0.0; n]);
        let param = upload(&rt, &p0, &[n], DType::F32);
        let mom = Tensor::full(&rt, &[n], DType::F32, 0.0, Category::OptimizerState, "buf").unwrap();
        map::fill(&rt, &found, 0.0).unwrap();
        for (step, g) in grads.iter().enumerate() {
            let gt = upload(&rt, g, &[n], DType::F32);
            sgd_step(
                &rt,
                &s,
                &OptimState {
                    param: &param,
                    grad: &gt,
                    m: &mom,
                    v: &mom,
                    half: None,
                },
                step == 0,
                1.0,
                &found,
                true,
            )
            .unwrap();
            for i in 0..n {
                let mut gi = g[i] as f64 + s.weight_decay as f64 * p[i];
                buf[i] = if step == 0 {
                    gi
                } else {
                    s.momentum as f64 * buf[i] + (1.0 - s.dampening as f64) * gi
                };
                gi = if nesterov { gi + s.momentum as f64 * buf[i] } else { buf[i] };
                p[i] -= s.lr as f64 * gi;
            }
        }
        assert_close(&rt, &format!("sgd nesterov={nesterov}"), &param, &p, 1);
    }
    finish(&rt);
}

#[test]
fn uploads_into_a_reused_block_do_not_overtake_pending_launches() {
    // Found by the guard bytes: a block freed while a recorded launch still reads it is
    // reused by the next upload; the upload must not land before that launch runs.
    // Without guard bytes, so that nothing else flushes in between.
    let rt = Runtime::new(
        common::gpu(),
        wgtrain_engine::memory::AllocatorOptions {
            debug: Some(false),
            cap: None,
            ..Default::default()
        },
    )
    .unwrap();
    let out = Tensor::empty(&rt, &[256], DType::F32, Category::Other, "out").unwrap();
    for step in 0..4 {
        let x = upload(&rt, &vec![step as f32; 256], &[256], DType::F32);
        map::map_into(&rt, map::MapOp::Axpby, Some(&out), Some(&x), &out, 1.0, 1.0).unwrap();
        drop(x); // the next upload reuses this block while the launch is still recorded
    }
    assert_close(&rt, "sum of uploads", &out, &[6.0; 256], 1);
    rt.sync().unwrap();
}

/// A dry run (the estimate, the what-ifs) validates a kernel without compiling it; the
/// runtime that runs kernels compiles it at its first use, and later dry lookups get
/// that compiled kernel; a bad shader is an error on either path.
#[test]
fn dry_runs_validate_kernels_and_the_running_runtime_compiles_them() {
    use wgtrain_engine::runtime::KernelKey;
    let rt = runtime();
    let dry = rt.dry_beside().unwrap();
    let wgsl = || {
        Ok("struct Params { n: u32 }\n\
            @group(0) @binding(0) var<uniform> p: Params;\n\
            @group(0) @binding(1) var<storage, read_write> x: array<f32>;\n\
            @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n\
                if g.x < p.n { x[g.x] = x[g.x] * 2.0; }\n\
            }\n"
        .to_string())
    };
    let key = KernelKey::new("test_dry_lookup", &[1]);
    let seen = dry.kernel(key, 1, || "dry lookup".into(), wgsl).unwrap();
    assert!(!seen.compiled(), "a dry run compiles no pipeline");
    let used = rt.kernel(key, 1, || "dry lookup".into(), wgsl).unwrap();
    assert!(used.compiled(), "the running runtime compiles the kernel it uses");
    let again = dry.kernel(key, 1, || "dry lookup".into(), || panic!("rendered again")).unwrap();
    assert!(again.compiled(), "a later dry lookup gets the compiled kernel");
    let bad = || Ok("@compute @workgroup_size(1) fn main() { let x: f32 = no_such_value; }".to_string());
    for (who, r) in [("dry", &dry), ("running", &rt)] {
        let key = KernelKey::new("test_dry_lookup", &[2]);
        let err = r
            .kernel(key, 1, || "bad".into(), bad)
            .err()
            .unwrap_or_else(|| panic!("{who}: a bad shader passed"));
        assert!(err.to_string().contains("no_such_value"), "{who}: {err}");
    }
}
