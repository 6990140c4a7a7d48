//! Helpers shared by the kernel tests: the runtime with guard bytes on, a deterministic
//! generator, and the comparison against f64 references with the documented tolerances.

#![allow(dead_code)]

use std::cell::OnceCell;
use std::sync::Arc;

use wgtrain_engine::TensorOps;
use wgtrain_engine::kernels::tolerance::{compare, tolerance};
use wgtrain_engine::memory::AllocatorOptions;
use wgtrain_engine::{Category, DType, Gpu, Runtime, Tensor};

/// The test adapter (WGTRAIN_TEST_ADAPTER, else the default choice), one device a test
/// thread: lavapipe compiles a kernel on its first run on the device's queue thread, so
/// tests sharing one device would compile one at a time (kernels_nn cold: 99 s on two
/// threads, 103 on one).
pub fn gpu() -> Arc<Gpu> {
    thread_local! {
        static GPU: OnceCell<Arc<Gpu>> = const { OnceCell::new() };
    }
    GPU.with(|gpu| {
        gpu.get_or_init(|| {
            let selector = std::env::var("WGTRAIN_TEST_ADAPTER").ok();
            Arc::new(Gpu::open(selector.as_deref()).expect("a GPU adapter (lavapipe on CI)"))
        })
        .clone()
    })
}

/// A runtime whose allocator surrounds every block with guard bytes.
pub fn runtime() -> Runtime {
    Runtime::new(
        gpu(),
        AllocatorOptions {
            debug: Some(true),
            cap: None,
            ..Default::default()
        },
    )
    .expect("runtime")
}

/// Deterministic uniform numbers.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Uploads `data` as `dtype` (f32 or f16).
pub fn upload(rt: &Runtime, data: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    match dtype {
        DType::F16 => Tensor::from_f32_as_f16(rt, data, shape, Category::Other, "test").unwrap(),
        _ => Tensor::from_f32(rt, data, shape, Category::Other, "test").unwrap(),
    }
}

/// What the values become when stored as `dtype` (the reference sees the same inputs).
pub fn rounded(data: &[f32], dtype: DType) -> Vec<f64> {
    data.iter()
        .map(|&x| {
            if dtype == DType::F16 {
                half::f16::from_f32(x).to_f64()
            } else {
                x as f64
            }
        })
        .collect()
}

/// Asserts `t` matches `want` within the tolerance of `t`'s dtype for `len`-term sums.
pub fn assert_close(rt: &Runtime, what: &str, t: &Tensor, want: &[f64], len: usize) {
    assert_close_within(rt, what, t, want, tolerance(t.dtype(), len));
}

/// Asserts `t` matches `want` within (atol, rtol).
pub fn assert_close_within(rt: &Runtime, what: &str, t: &Tensor, want: &[f64], (atol, rtol): (f64, f64)) {
    let got = t.to_f32_vec(rt).unwrap();
    let (abs, rel, ok) = compare(&got, want, atol, rtol);
    assert!(
        ok,
        "{what}: max abs err {abs:e}, max rel err {rel:e} (atol {atol:e}, rtol {rtol:e}); got {:?}.. want {:?}..",
        &got[..got.len().min(6)],
        &want[..want.len().min(6)]
    );
}

/// Asserts two results of different kernels that do the same arithmetic agree: bit for
/// bit on a CPU adapter (`cpu`: lavapipe, whose LLVM contracts nothing), else within
/// `rel` of each element's size plus `rel` of the largest element's. A GPU driver fuses
/// multiply-adds and rounds conversions to f16 as it sees fit in each kernel, so there
/// two kernels' results of one formula may differ in their last bits (measured on an
/// H200: one to a few units in the last place of f32, one of f16).
pub fn assert_same_or_within<T: Copy + Into<f64> + PartialEq + std::fmt::Debug>(cpu: bool, what: &str, got: &[T], want: &[T], rel: f64) {
    if cpu {
        assert_eq!(got, want, "{what}");
        return;
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, &w| m.max(w.into().abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        assert!(
            (g - w).abs() <= rel * (g.abs().max(w.abs()) + scale),
            "{what}, element {i}: {g} against {w} (within {rel:e})"
        );
    }
}

/// Ends a test: waits for the device and checks every guard.
pub fn finish(rt: &Runtime) {
    rt.sync().unwrap();
    rt.alloc.check_guards().unwrap();
}

/// y, and dqkv for upstream gradient dy, of causal attention in f64.
pub fn attention_reference(qkv: &[f64], dy: &[f64], b: usize, t: usize, nh: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let c = nh * d;
    let at = |bi: usize, ti: usize, part: usize, h: usize, k: usize| bi * t * 3 * c + ti * 3 * c + part * c + h * d + k;
    let yat = |bi: usize, ti: usize, h: usize, k: usize| bi * t * c + ti * c + h * d + k;
    let scale = 1.0 / (d as f64).sqrt();
    let mut y = vec![0.0; b * t * c];
    let mut dqkv = vec![0.0; b * t * 3 * c];
    for bi in 0..b {
        for h in 0..nh {
            for i in 0..t {
                let s: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|k| qkv[at(bi, i, 0, h, k)] * qkv[at(bi, j, 1, h, k)]).sum::<f64>() * scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                for (j, &pj) in p.iter().enumerate() {
                    for k in 0..d {
                        y[yat(bi, i, h, k)] += pj * qkv[at(bi, j, 2, h, k)];
                    }
                }
                // dP = dY V^T; dS = P * (dP - rowsum(dP * P)); dQ = dS K scale; dK += dS^T Q scale; dV += P^T dY.
                let dp: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|k| dy[yat(bi, i, h, k)] * qkv[at(bi, j, 2, h, k)]).sum())
                    .collect();
                let dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - dot);
                    for k in 0..d {
                        dqkv[at(bi, i, 0, h, k)] += ds * qkv[at(bi, j, 1, h, k)] * scale;
                        dqkv[at(bi, j, 1, h, k)] += ds * qkv[at(bi, i, 0, h, k)] * scale;
                        dqkv[at(bi, j, 2, h, k)] += p[j] * dy[yat(bi, i, h, k)];
                    }
                }
            }
        }
    }
    (y, dqkv)
}

/// An attention test case: qkv [B, T, 3C] of `dtype`, dy [B, T, C] in f32, and the f64
/// reference's y and dqkv.
pub struct AttentionCase {
    pub dtype: DType,
    pub qkv: Tensor,
    pub dy: Tensor,
    pub want_y: Vec<f64>,
    pub want_d: Vec<f64>,
}

/// Random qkv (in [-1.5, 1.5)) and dy (in [-1, 1)) for causal attention of `nh` heads of
/// size `d`, drawn once and uploaded in f32 and (where the adapter takes it) f16.
pub fn attention_cases(rt: &Runtime, rng: &mut Rng, (b, t, nh, d): (usize, usize, usize, usize)) -> Vec<AttentionCase> {
    let c = nh * d;
    let data = rng.vec(b * t * 3 * c, -1.5, 1.5);
    let dy_data = rng.vec(b * t * c, -1.0, 1.0);
    [DType::F32, DType::F16]
        .into_iter()
        .filter(|&dtype| dtype != DType::F16 || rt.gpu.caps.shader_f16)
        .map(|dtype| {
            let (want_y, want_d) = attention_reference(&rounded(&data, dtype), &rounded(&dy_data, DType::F32), b, t, nh, d);
            AttentionCase {
                dtype,
                qkv: upload(rt, &data, &[b, t, 3 * c], dtype),
                dy: upload(rt, &dy_data, &[b, t, c], DType::F32),
                want_y,
                want_d,
            }
        })
        .collect()
}
