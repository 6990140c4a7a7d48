//! Products whose operands are aligned for vector loads except for an odd extent (padded
//! rows, as the logits of GPT-2's 50257-token vocabulary) split into an aligned bulk and
//! a scalar remainder: K (accumulated onto the bulk, with alpha and beta), M and N; f32
//! and f16 operands, against an f64 reference.

mod common;

use common::{Rng, assert_close_within, finish, rounded, runtime, upload};
use wgtrain_engine::kernels::matmul::{MatmulOptions, matmul_into};
use wgtrain_engine::kernels::tolerance::{tensor_core_tolerance, tolerance};
use wgtrain_engine::{DType, Tensor};

/// A [rows, cols] view of a [rows, ld] upload (rows padded to `ld`), and its values.
fn padded(rt: &wgtrain_engine::Runtime, rng: &mut Rng, rows: usize, cols: usize, ld: usize, dtype: DType) -> (Tensor, Vec<f64>) {
    let data = rng.vec(rows * ld, -1.0, 1.0);
    let held = rounded(&data, dtype);
    let t = upload(rt, &data, &[rows, ld], dtype).slice(1, 0, cols).unwrap();
    let vals = (0..rows).flat_map(|r| held[r * ld..r * ld + cols].to_vec()).collect();
    (t, vals)
}

fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols).flat_map(|c| (0..rows).map(move |r| x[r * cols + c])).collect()
}

#[test]
fn odd_extents_of_aligned_operands_match() {
    let rt = runtime();
    let mut rng = Rng(41);
    let mut dtypes = vec![DType::F32];
    if rt.gpu.caps.shader_f16 {
        dtypes.push(DType::F16);
    }
    let (m, k, n) = (67, 67, 67);
    for dtype in dtypes {
        for case in ["k", "m", "n"] {
            // The odd extent is the one whose operand rows are padded to 72.
            let (a, av) = match case {
                "k" => padded(&rt, &mut rng, m, k, 72, dtype),
                "m" => {
                    let (t, v) = padded(&rt, &mut rng, k, m, 72, dtype);
                    (t.transpose(0, 1).unwrap(), transpose(&v, k, m))
                }
                _ => padded(&rt, &mut rng, m, k, 72, dtype),
            };
            let (b, bv) = padded(&rt, &mut rng, k, n, 72, dtype);
            let c_data = rng.vec(m * n, -1.0, 1.0);
            let c = upload(&rt, &c_data, &[m, n], DType::F32);
            let opts = MatmulOptions {
                alpha: 0.5,
                beta: 1.0,
                ..Default::default()
            };
            matmul_into(&rt, &a, &b, &c, &opts).unwrap();
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (r, col) = (i / n, i % n);
                    0.5 * (0..k).map(|p| av[r * k + p] * bv[p * n + col]).sum::<f64>() + c_data[i] as f64
                })
                .collect();
            let tol = if dtype == DType::F16 {
                let (a1, r1) = tensor_core_tolerance(k);
                let (a2, r2) = tolerance(DType::F32, k);
                (a1.max(a2), r1.max(r2))
            } else {
                tolerance(DType::F32, k)
            };
            assert_close_within(&rt, &format!("{dtype} odd {case}"), &c, &want, tol);
        }
    }
    finish(&rt);
}
