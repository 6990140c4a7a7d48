//! The cooperative-matrix (tensor core) matmul (shaders/matmul_coop.wgsl): chosen for
//! f16 A and B when the adapter grants 16x16x16 f16 -> f32 and subgroups of 32.

use super::matmul::{Activation, MatmulOptions, Params};
use super::{ACTIVATIONS, KernelError, Runtime};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/matmul_coop.wgsl");
/// Rows and columns of C per workgroup.
const TILE: usize = 128;

/// The template values of one variant.
pub fn variant(tc: DType, act: Activation) -> Vec<(&'static str, String)> {
    let expr = match act {
        Activation::Identity => "v",
        Activation::Relu => "max(v, 0.0)",
        Activation::Gelu => "gelu(v)",
    };
    vec![("TC", tc.wgsl().into()), ("ACT", expr.into()), ("ACTIVATIONS", ACTIVATIONS.into())]
}

/// Whether the host may pick this path for these operands on this adapter.
pub fn usable(rt: &Runtime, a: &Tensor, b: &Tensor, c: &Tensor) -> bool {
    eligible(rt.gpu.caps.coop_f16_16x16x16(), rt.gpu.caps.subgroup_size, a.dtype(), b.dtype(), c.dtype())
}

/// The rule behind [`usable`], apart from the adapter (tested on every machine).
pub fn eligible(coop_f16: bool, subgroup_size: (u32, u32), a: DType, b: DType, c: DType) -> bool {
    coop_f16 && subgroup_size == (32, 32) && a == DType::F16 && b == DType::F16 && c.is_float()
}

pub(super) fn launch(rt: &Runtime, params: &Params, a: &Tensor, b: &Tensor, c: &Tensor, opts: &MatmulOptions, batches: u32) -> Result<(), KernelError> {
    let kernel = rt.kernel("matmul_coop", SOURCE, &variant(c.dtype(), opts.activation), 4)?;
    let bias = opts.bias.unwrap_or(c);
    rt.launch(
        &kernel,
        bytemuck::bytes_of(params),
        &[a, b, c, bias],
        [(params.n as usize).div_ceil(TILE) as u32, (params.m as usize).div_ceil(TILE) as u32, batches],
    )
}
