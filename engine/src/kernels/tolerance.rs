//! Tolerances of kernels against an f64 CPU reference, per dtype: a result r passes
//! against reference x when |r - x| <= atol + rtol * |x|. f32 kernels accumulate in f32,
//! so long reductions (matmul's K, a row's sum) get `atol` scaled by sqrt(length).
//! f16 tolerances cover rounding inputs and outputs to f16 (11-bit significand).
//!
//! May call: `tensor`.

use crate::tensor::DType;

/// (atol, rtol) for results stored in `dtype` after a reduction over `len` terms.
pub fn tolerance(dtype: DType, len: usize) -> (f64, f64) {
    let scale = (len.max(1) as f64).sqrt();
    match dtype {
        DType::F16 => (2e-3 * scale, 1e-2),
        _ => (2e-6 * scale, 2e-5),
    }
}

/// The largest absolute and relative errors of `got` against `want`, and whether every
/// element is within (atol, rtol).
pub fn compare(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> (f64, f64, bool) {
    let mut max_abs: f64 = 0.0;
    let mut max_rel: f64 = 0.0;
    let mut ok = got.len() == want.len();
    for (&g, &w) in got.iter().zip(want) {
        let g = g as f64;
        let err = if g == w { 0.0 } else { (g - w).abs() };
        if err.is_nan() {
            ok = false;
            max_abs = f64::INFINITY;
            continue;
        }
        max_abs = max_abs.max(err);
        max_rel = max_rel.max(err / w.abs().max(1e-30));
        ok &= err <= atol + rtol * w.abs();
    }
    (max_abs, max_rel, ok)
}

/// (atol, rtol) for f32 results of f16 products accumulated on tensor cores
/// (cooperative matrices), whose internal accumulation order and rounding differ from
/// a sequential f32 sum.
pub fn tensor_core_tolerance(len: usize) -> (f64, f64) {
    (1e-5 * (len.max(1) as f64).sqrt(), 1e-4)
}
