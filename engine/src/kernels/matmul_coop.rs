//! The cooperative-matrix (tensor core) matmul (shaders/matmul_coop.wgsl): chosen for
//! f16 A and B when the adapter grants 16x16x16 f16 -> f32 and subgroups of 32.
//!
//! May call: `error`, `kernels::common`, `kernels::matmul_params`, `runtime`, `tensor`.

use super::common::ACTIVATIONS;
use super::matmul_params::{Activation, COMMON, MatmulOptions, Params, vec4_loads};
use crate::error::Error;
use crate::runtime::{KernelKey, Runtime, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/matmul_coop.wgsl");
/// Rows and columns of C per workgroup.
const TILE: usize = 128;

/// The template values of one variant; `vec_a` / `vec_b` pick vec4 loads.
pub fn variant(tc: DType, act: Activation, vec_a: bool, vec_b: bool) -> Vec<(&'static str, String)> {
    let ty = |vec: bool| if vec { "vec4<f16>" } else { "f16" };
    vec![
        ("MATMUL_COMMON", COMMON.into()),
        ("TC", tc.wgsl().into()),
        ("ACT", act.expr().into()),
        ("ACTIVATIONS", ACTIVATIONS.into()),
        ("TYPE_A", ty(vec_a).into()),
        ("TYPE_B", ty(vec_b).into()),
        ("VEC_A", vec_a.to_string()),
        ("VEC_B", vec_b.to_string()),
    ]
}

/// Whether the host may pick this path for these operands on this adapter.
pub fn usable(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor) -> bool {
    eligible(
        rt.gpu.caps.coop_f16_16x16x16(),
        rt.gpu.caps.subgroup_size,
        a.dtype(),
        b.dtype(),
        c.dtype(),
    )
}

/// The rule behind [`usable`], apart from the adapter (tested on every machine).
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), a: DType, b: DType, c: DType) -> bool {
    coop_f16 && subgroup_size == (32, 32) && a == DType::F16 && b == DType::F16 && c.is_float()
}

pub(super) fn launch(
    rt: &Runtime,
    params: &Params,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    opts: &MatmulOptions,
    batches: u32,
) -> Result<(), Error> {
    let vec_a = vec4_loads(params.a_off, params.a_rs, params.a_cs, [params.a_bs0, params.a_bs1], params.k);
    let vec_b = vec4_loads(params.b_off, params.b_rs, params.b_cs, [params.b_bs0, params.b_bs1], params.n);
    let kernel = rt.kernel(
        KernelKey::new(
            "matmul_coop",
            &[c.dtype() as u32, opts.activation as u32, u32::from(vec_a), u32::from(vec_b)],
        ),
        4,
        || render("matmul_coop", SOURCE, &variant(c.dtype(), opts.activation, vec_a, vec_b)),
    )?;
    let bias = opts.bias.unwrap_or(c);
    let flops = 2.0 * f64::from(params.m) * f64::from(params.n) * f64::from(params.k) * f64::from(batches);
    rt.launch_with_work(
        &kernel,
        bytemuck::bytes_of(params),
        &[a, b, c, bias],
        [
            (params.n as usize).div_ceil(TILE) as u32,
            (params.m as usize).div_ceil(TILE) as u32,
            batches,
        ],
        Some(flops),
        2,
    )
}
