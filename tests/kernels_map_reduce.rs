//! Elementwise, reduction and softmax kernels against f64 CPU references: broadcasting,
//! strided views, f16 variants, the vec4 path, size-0 and size-1 dims, large values.

mod common;

use common::{Rng, assert_close, assert_same_or_within, finish, rounded, runtime, upload};
use wgtrain_engine::TensorOps;
use wgtrain_engine::kernels::map::{MapOp, map_into};
use wgtrain_engine::kernels::reduce::{ReduceOp, reduce_all, reduce_last, sum_rows, sum_rows_and_half, sum_rows_through};
use wgtrain_engine::kernels::softmax::{softmax_backward_into, softmax_into};
use wgtrain_engine::{Category, DType, Tensor};

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_grad(x: f64) -> f64 {
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
}

/// erf by its Maclaurin series (|x| <= 4 here: 120 terms leave an error far below f32's).
fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..120 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn reference(op: MapOp, a: f64, b: f64, alpha: f64, beta: f64) -> f64 {
    match op {
        MapOp::Add => a + b,
        MapOp::Sub => a - b,
        MapOp::Mul => a * b,
        MapOp::Div => a / b,
        MapOp::Axpby => alpha * a + beta * b,
        MapOp::Neg => -a,
        MapOp::Scale => alpha * a,
        MapOp::Exp => a.exp(),
        MapOp::Log => a.ln(),
        MapOp::Sqrt => a.sqrt(),
        MapOp::Rsqrt => 1.0 / a.sqrt(),
        MapOp::Tanh => a.tanh(),
        MapOp::Relu => a.max(0.0),
        MapOp::Gelu => gelu(a),
        MapOp::ReluBackward => {
            if a > 0.0 {
                b
            } else {
                0.0
            }
        }
        MapOp::GeluBackward => b * gelu_grad(a),
        MapOp::TanhBackward => b * (1.0 - a * a),
        MapOp::Silu => a * sigmoid(a),
        MapOp::SiluBackward => b * (sigmoid(a) * (1.0 + a * (1.0 - sigmoid(a)))),
        MapOp::GeluErf => gelu_erf(a),
        MapOp::GeluErfBackward => b * (0.5 * (1.0 + erf(a / 2f64.sqrt())) + a * (-0.5 * a * a).exp() / (2.0 * std::f64::consts::PI).sqrt()),
        MapOp::Dropout => panic!("dropout draws from a seed: tested in autograd_gradcheck"),
        MapOp::Copy => a,
        MapOp::Fill => alpha,
    }
}

/// Broadcast index: element i of `out` (shape) in a tensor of shape `s` (right-aligned).
fn source_index(i: usize, out: &[usize], s: &[usize]) -> usize {
    let mut rem = i;
    let mut idx = vec![0; out.len()];
    for d in (0..out.len()).rev() {
        idx[d] = rem % out[d];
        rem /= out[d];
    }
    let lead = out.len() - s.len();
    let mut flat = 0;
    for (k, &dim) in s.iter().enumerate() {
        let v = if dim == 1 { 0 } else { idx[lead + k] };
        flat = flat * dim + v;
    }
    flat
}

#[test]
fn every_map_op_matches_the_reference_with_broadcasting() {
    let rt = runtime();
    let mut rng = Rng(1);
    let cases: [(&[usize], &[usize], &[usize]); 5] = [
        (&[3, 1, 5], &[4, 5], &[3, 4, 5]), // broadcast both ways
        (&[37], &[37], &[37]),             // odd length, scalar path
        (&[64], &[64], &[64]),             // vec4 path
        (&[1], &[1], &[1]),
        (&[0, 3], &[0, 3], &[0, 3]), // empty
    ];
    for op in MapOp::ALL {
        for (sa, sb, so) in cases {
            let positive = matches!(op, MapOp::Log | MapOp::Sqrt | MapOp::Rsqrt | MapOp::Div);
            let (lo, hi) = if positive { (0.1, 4.0) } else { (-4.0, 4.0) };
            let a_data = rng.vec(sa.iter().product(), lo, hi);
            let b_data = rng.vec(sb.iter().product(), lo, hi);
            let a = upload(&rt, &a_data, sa, DType::F32);
            let b = upload(&rt, &b_data, sb, DType::F32);
            let out = Tensor::empty(&rt, so, DType::F32, Category::Other, "out").unwrap();
            let (ia, ib) = match op.arity() {
                0 => (None, None),
                1 => (Some(&a), None),
                _ => (Some(&a), Some(&b)),
            };
            let (alpha, beta) = (0.75f32, -1.5f32);
            map_into(&rt, op, ia, ib, &out, alpha, beta).unwrap();
            let n: usize = so.iter().product();
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let av = a_data.get(source_index(i, so, sa)).copied().unwrap_or(0.0) as f64;
                    let bv = b_data.get(source_index(i, so, sb)).copied().unwrap_or(0.0) as f64;
                    reference(op, av, bv, alpha as f64, beta as f64)
                })
                .collect();
            assert_close(&rt, &format!("{op:?} {sa:?} {sb:?}"), &out, &want, 1);
        }
    }
    finish(&rt);
}

#[test]
fn f16_variants_and_casts_round_trip() {
    let rt = runtime();
    if !rt.gpu.caps.shader_f16 {
        eprintln!("adapter lacks SHADER_F16; f16 kernels are refused (checked below)");
        let t = upload(&rt, &[1.0; 8], &[8], DType::F32);
        assert!(t.cast(&rt, DType::F16, Category::Other, "x").is_err());
        return;
    }
    let mut rng = Rng(2);
    for n in [1usize, 7, 64, 1000] {
        let data = rng.vec(n, -100.0, 100.0);
        let x = upload(&rt, &data, &[n], DType::F32);
        let h = x.cast(&rt, DType::F16, Category::Other, "half").unwrap();
        assert_close(&rt, "cast to f16", &h, &rounded(&data, DType::F16), 1);
        let back = h.cast(&rt, DType::F32, Category::Other, "back").unwrap();
        assert_close(&rt, "cast back", &back, &rounded(&data, DType::F16), 1);
        // gelu in f16 storage, f32 math.
        let out = Tensor::empty(&rt, &[n], DType::F16, Category::Other, "gelu").unwrap();
        map_into(&rt, MapOp::Gelu, Some(&h), None, &out, 1.0, 0.0).unwrap();
        let want: Vec<f64> = rounded(&data, DType::F16).iter().map(|&v| gelu(v)).collect();
        assert_close(&rt, "gelu f16", &out, &want, 1);
    }
    finish(&rt);
}

#[test]
fn strided_views_copy_to_contiguous() {
    let rt = runtime();
    let data: Vec<f32> = (0..2 * 3 * 5).map(|v| v as f32).collect();
    let t = upload(&rt, &data, &[2, 3, 5], DType::F32);
    let tt = t.transpose(0, 2).unwrap(); // [5, 3, 2]
    let want: Vec<f64> = (0..30)
        .map(|i| {
            let (k, j, l) = (i / 6, (i / 2) % 3, i % 2);
            data[l * 15 + j * 5 + k] as f64
        })
        .collect();
    assert_close(&rt, "transpose", &tt.contiguous(&rt).unwrap(), &want, 1);
    let s = t.slice(2, 1, 3).unwrap(); // [2, 3, 3]
    let want: Vec<f64> = (0..18).map(|i| data[(i / 9) * 15 + ((i / 3) % 3) * 5 + 1 + i % 3] as f64).collect();
    assert_close(&rt, "slice", &s.contiguous(&rt).unwrap(), &want, 1);
    // A view reaching past its block is refused on the host, before any launch.
    assert!(t.as_strided(&[31], &[1], 0).is_err());
    assert!(t.reshape(&[7]).is_err());
    assert!(tt.reshape(&[30]).is_err(), "reshape of a non-contiguous view");
    finish(&rt);
}

#[test]
fn reductions_match_including_empty_and_long_rows() {
    let rt = runtime();
    let mut rng = Rng(3);
    for shape in [[7usize, 300], [1, 1], [3, 1000], [5, 0]] {
        let n = shape[0] * shape[1];
        let data = rng.vec(n, -10.0, 10.0);
        let x = upload(&rt, &data, &shape, DType::F32);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let got = reduce_last(&rt, op, &x, "r").unwrap();
            let want: Vec<f64> = (0..shape[0])
                .map(|r| {
                    let row = &data[r * shape[1]..(r + 1) * shape[1]];
                    match op {
                        ReduceOp::Sum => row.iter().map(|&v| v as f64).sum(),
                        ReduceOp::Mean => row.iter().map(|&v| v as f64).sum::<f64>() / shape[1] as f64,
                        ReduceOp::Max => row.iter().map(|&v| v as f64).fold(f64::NEG_INFINITY, f64::max),
                    }
                })
                .collect();
            if shape[1] == 0 && op == ReduceOp::Max {
                assert!(got.to_f32_vec(&rt).unwrap().iter().all(|v| *v == f32::NEG_INFINITY));
                continue;
            }
            if shape[1] == 0 && op == ReduceOp::Mean {
                continue; // 0/0: PyTorch gives NaN; not asserted
            }
            assert_close(&rt, &format!("{op:?} {shape:?}"), &got, &want, shape[1]);
        }
    }
    for n in [0usize, 1, 40_000] {
        let data = rng.vec(n, -1.0, 1.0);
        let x = upload(&rt, &data, &[n], DType::F32);
        let sum: f64 = data.iter().map(|&v| v as f64).sum();
        assert_close(&rt, "sum all", &reduce_all(&rt, ReduceOp::Sum, &x, "s").unwrap(), &[sum], n);
        if n > 0 {
            assert_close(
                &rt,
                "mean all",
                &reduce_all(&rt, ReduceOp::Mean, &x, "m").unwrap(),
                &[sum / n as f64],
                n,
            );
            let max = data.iter().map(|&v| v as f64).fold(f64::NEG_INFINITY, f64::max);
            assert_close(&rt, "max all", &reduce_all(&rt, ReduceOp::Max, &x, "x").unwrap(), &[max], 1);
        }
    }
    finish(&rt);
}

/// Column sums (bias gradients) over row counts below, at and past one chunk of 64 (one
/// invocation a column, or the one-pass lanes), in
/// f32 and f16, from an offset view, four columns an invocation where they line up; the
/// same result on a second run (deterministic). With the f16 copy written in the same
/// pass (fp16-mixed's dy): the same sums, and the copy is each element rounded to f16.
/// Through GELU's derivative (a linear fused with the GELU after it): the copy and the sums
/// equal the separate launches' within rounding.
#[test]
fn column_sums_match_and_repeat() {
    let rt = runtime();
    let mut rng = Rng(31);
    let mut dtypes = vec![DType::F32];
    if rt.gpu.caps.shader_f16 {
        dtypes.push(DType::F16);
    }
    for dtype in dtypes {
        for (rows, cols) in [(1, 5), (64, 3), (65, 300), (1000, 77), (0, 4), (1030, 64), (3, 8), (2500, 12)] {
            let data = rng.vec((rows + 1) * cols, -1.0, 1.0);
            let all = upload(&rt, &data, &[rows + 1, cols], dtype);
            let x = all.slice(0, 1, rows).unwrap();
            let held = rounded(&data, dtype);
            let want: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| held[(r + 1) * cols + c]).sum()).collect();
            let got = sum_rows(&rt, &x, Category::Temporary, "db").unwrap();
            assert_eq!(got.shape(), &[cols]);
            assert_close(&rt, &format!("sum_rows {rows}x{cols} {dtype}"), &got, &want, rows.max(1));
            let again = sum_rows(&rt, &x, Category::Temporary, "db").unwrap();
            assert_eq!(got.to_f32_vec(&rt).unwrap(), again.to_f32_vec(&rt).unwrap(), "bitwise repeatable");
            if dtype == DType::F32 && rt.gpu.caps.shader_f16 && rows > 0 {
                let copy = wgtrain_engine::Tensor::empty(&rt, &[rows, cols], DType::F16, Category::Temporary, "dy.f16").unwrap();
                let with_copy = sum_rows_and_half(&rt, &x, &copy, Category::Temporary, "db").unwrap();
                assert_eq!(with_copy.to_f32_vec(&rt).unwrap(), got.to_f32_vec(&rt).unwrap(), "the same sums");
                let want: Vec<f32> = data[cols..].iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
                assert_eq!(copy.to_f32_vec(&rt).unwrap(), want, "the f16 copy, {rows}x{cols}");
                // Through GELU's derivative at a pre-activation (f16, as fp16-mixed keeps
                // it): the copy is the activation's backward op's result, and the sums
                // are its column sums, within rounding of the separate launches.
                let pre_v = rng.vec(rows * cols, -4.0, 4.0);
                let pre = upload(&rt, &pre_v, &[rows, cols], DType::F16);
                let dx = Tensor::empty(&rt, &[rows, cols], DType::F32, Category::Temporary, "dx").unwrap();
                let xw = x.contiguous(&rt).unwrap();
                map_into(&rt, MapOp::GeluBackward, Some(&pre), Some(&xw), &dx, 1.0, 0.0).unwrap();
                let apart = sum_rows(&rt, &dx, Category::Temporary, "db").unwrap();
                for copy_t in [DType::F16, DType::F32] {
                    let copy = Tensor::empty(&rt, &[rows, cols], copy_t, Category::Temporary, "dy.act").unwrap();
                    // GELU's output written again in the same pass: the forward map's values (bit
                    // for bit on lavapipe; an H200's driver rounded a few f16 elements the other way).
                    let again = Tensor::empty(&rt, &[rows, cols], DType::F16, Category::Temporary, "act.again").unwrap();
                    let through =
                        sum_rows_through(&rt, &x, (MapOp::GeluBackward, &pre), &copy, Some(&again), Category::Temporary, "db").unwrap();
                    let forward = Tensor::empty(&rt, &[rows, cols], DType::F16, Category::Temporary, "act").unwrap();
                    map_into(&rt, MapOp::Gelu, Some(&pre), None, &forward, 1.0, 0.0).unwrap();
                    assert_same_or_within(
                        rt.gpu.caps.facts.cpu,
                        &format!("gelu again, {rows}x{cols}"),
                        &again.to_f32_vec(&rt).unwrap(),
                        &forward.to_f32_vec(&rt).unwrap(),
                        1e-3,
                    );
                    let want = dx.to_f32_vec(&rt).unwrap();
                    let got = copy.to_f32_vec(&rt).unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        let w = if copy_t == DType::F16 {
                            half::f16::from_f32(*w).to_f32()
                        } else {
                            *w
                        };
                        assert!(
                            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                            "copy {g} against {w}, {rows}x{cols} {copy_t}"
                        );
                    }
                    let want: Vec<f64> = apart.to_f32_vec(&rt).unwrap().iter().map(|&v| v as f64).collect();
                    assert_close(&rt, &format!("sum_rows through gelu {rows}x{cols}"), &through, &want, 4);
                }
            }
        }
    }
    finish(&rt);
}

/// Sums held back to share a launch (`kernels::col_sums`): several of them, of other
/// shapes, lanes, strided outputs and alpha/beta, are recorded as one and equal the sums
/// in the documented order; a launch that reads a held output, or one that writes a
/// held part, waits for them; an allocation that would raise the peak records them
/// first, so what they hold is freed and the peak does not grow.
#[test]
fn held_sums_share_launches_and_are_settled_before_use() {
    use wgtrain_engine::kernels::col_sums::{self, Sum};
    let rt = runtime();
    let mut rng = Rng(77);
    // (parts, len, n, d_rs, lanes, alpha, beta)
    let cases = [
        (3, 40, 40, 40, 1, 1.0, 0.0),
        (130, 12, 12, 12, 16, 1.0, 0.0),
        (70, 9, 3, 5, 64, 0.5, 1.0),
        (2, 1030, 10, 16, 1, 2.0, -1.0),
        (1, 7, 7, 7, 4, 1.0, 0.0),
        (513, 300, 300, 300, 256, 1.0, 0.5),
    ];
    let mut made = Vec::new();
    for &(parts, len, n, d_rs, lanes, alpha, beta) in &cases {
        let s_rs = len + 3;
        let src_v = rng.vec(2 + parts * s_rs, -1.0, 1.0);
        let src = upload(&rt, &src_v, &[src_v.len()], DType::F32);
        let rows = len / n;
        let dst_v = rng.vec(1 + rows * d_rs, -1.0, 1.0);
        let dst = upload(&rt, &dst_v, &[dst_v.len()], DType::F32);
        // The documented order, in f32: lane l sums parts l, l + lanes, ... in order, then
        // the lanes in order.
        let mut want = dst_v.clone();
        for i in 0..len {
            let mut t = 0.0f32;
            for l in 0..lanes {
                let mut s = 0.0f32;
                let mut z = l;
                while z < parts {
                    s += src_v[2 + z * s_rs + i];
                    z += lanes;
                }
                t += s;
            }
            let at = 1 + (i / n) * d_rs + i % n;
            want[at] = alpha * t + if beta != 0.0 { beta * dst_v[at] } else { 0.0 };
        }
        let sum = Sum {
            src,
            s_off: 2,
            s_rs,
            parts,
            lanes,
            len,
            n,
            dst: dst.clone(),
            d_off: 1,
            d_rs,
            alpha,
            beta,
        };
        col_sums::defer(&rt, sum).unwrap();
        made.push((dst, want));
    }
    for (k, (dst, want)) in made.iter().enumerate() {
        let got = dst.to_f32_vec(&rt).unwrap();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "sum {k}, element {i}: {g} against {w}");
        }
    }
    // A held sum's output read by a launch: the launch waits for it (2 x the sums).
    let data = rng.vec(700 * 20, -1.0, 1.0);
    let x = upload(&rt, &data, &[700, 20], DType::F32);
    let db = sum_rows(&rt, &x, Category::Temporary, "db").unwrap();
    let twice = Tensor::empty(&rt, &[20], DType::F32, Category::Temporary, "2db").unwrap();
    map_into(&rt, MapOp::Add, Some(&db), Some(&db), &twice, 1.0, 0.0).unwrap();
    let want: Vec<f64> = (0..20)
        .map(|c| 2.0 * (0..700).map(|r| data[r * 20 + c] as f64).sum::<f64>())
        .collect();
    assert_close(&rt, "twice the held sums", &twice, &want, 700);
    // An allocation that would raise the peak records held sums first: their partials
    // (11 chunks of 20 columns) are freed before it.
    let db = sum_rows(&rt, &x, Category::Temporary, "db").unwrap();
    rt.alloc.reset_peaks();
    let before = rt.alloc.stats().allocated.current;
    let big = Tensor::empty(&rt, &[1 << 16], DType::F32, Category::Temporary, "big").unwrap();
    let after = rt.alloc.stats().allocated.current;
    assert!(
        after < before + big.block().size(),
        "the held partials were freed before the allocation ({before} -> {after})"
    );
    let want: Vec<f64> = (0..20).map(|c| (0..700).map(|r| data[r * 20 + c] as f64).sum::<f64>()).collect();
    assert_close(&rt, "the settled sums", &db, &want, 700);
    finish(&rt);
}

fn softmax_ref(row: &[f64], visible: usize, log: bool) -> Vec<f64> {
    let m = row[..visible].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = row[..visible].iter().map(|v| (v - m).exp()).sum();
    (0..row.len())
        .map(|j| match (j < visible, log) {
            (true, true) => row[j] - m - s.ln(),
            (true, false) => (row[j] - m).exp() / s,
            (false, true) => -3.4028235e38,
            (false, false) => 0.0,
        })
        .collect()
}

#[test]
fn softmax_and_log_softmax_are_stable_for_large_values_and_causal() {
    let rt = runtime();
    let mut rng = Rng(4);
    for (shape, causal, scale) in [
        ([4usize, 3, 300], false, 1000.0f32),
        ([2, 5, 5], true, 30.0),
        ([1, 1, 1], false, 1.0),
        ([2, 7, 7], true, 1.0),
    ] {
        let n: usize = shape.iter().product();
        let data = rng.vec(n, -scale, scale);
        let x = upload(&rt, &data, &shape, DType::F32);
        let cols = shape[2];
        for log in [false, true] {
            let y = Tensor::empty(&rt, &shape, DType::F32, Category::Other, "y").unwrap();
            softmax_into(&rt, &x, &y, log, causal).unwrap();
            let mut want = Vec::with_capacity(n);
            for r in 0..n / cols {
                let row: Vec<f64> = data[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
                let visible = if causal { (r % shape[1]) + 1 } else { cols };
                want.extend(softmax_ref(&row, visible, log));
            }
            let got = y.to_f32_vec(&rt).unwrap();
            assert!(got.iter().all(|v| v.is_finite() || *v == -3.4028235e38));
            assert_close(&rt, &format!("softmax log={log} causal={causal} {shape:?}"), &y, &want, cols);
        }
    }
    // Backward: dx = y * (dy - sum(dy * y)).
    let y_data: Vec<f32> = {
        let raw = rng.vec(6 * 33, -3.0, 3.0);
        let mut out = Vec::new();
        for r in 0..6 {
            let row: Vec<f64> = raw[r * 33..(r + 1) * 33].iter().map(|&v| v as f64).collect();
            out.extend(softmax_ref(&row, 33, false).iter().map(|&v| v as f32));
        }
        out
    };
    let dy_data = rng.vec(6 * 33, -1.0, 1.0);
    let y = upload(&rt, &y_data, &[6, 33], DType::F32);
    let dy = upload(&rt, &dy_data, &[6, 33], DType::F32);
    let dx = Tensor::empty(&rt, &[6, 33], DType::F32, Category::Other, "dx").unwrap();
    softmax_backward_into(&rt, &y, &dy, &dx).unwrap();
    let mut want = Vec::new();
    for r in 0..6 {
        let (yr, dr) = (&y_data[r * 33..(r + 1) * 33], &dy_data[r * 33..(r + 1) * 33]);
        let dot: f64 = yr.iter().zip(dr).map(|(&a, &b)| a as f64 * b as f64).sum();
        want.extend(yr.iter().zip(dr).map(|(&a, &b)| a as f64 * (b as f64 - dot)));
    }
    assert_close(&rt, "softmax backward", &dx, &want, 33);
    finish(&rt);
}
