//! What the tiled and the cooperative-matrix matmuls share: the epilogue's activation,
//! the options of a matmul, the launch parameters (one layout for both WGSL kernels,
//! `shaders/matmul_common.wgsl`), and the rule for vec4 tile loads.
//!
//! May call: `tensor`. Called by: `kernels::{matmul, matmul_coop}`.

use bytemuck::{Pod, Zeroable};

use crate::tensor::Tensor;

/// Parameters, output bindings and epilogue shared with the cooperative kernel.
pub const COMMON: &str = include_str!("../../../shaders/matmul_common.wgsl");

/// The epilogue's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// max(v, 0)
    Relu,
    /// GPT-2's gelu.
    Gelu,
}

impl Activation {
    /// The epilogue's WGSL expression in terms of `v`.
    pub fn expr(self) -> &'static str {
        match self {
            Activation::Identity => "v",
            Activation::Relu => "max(v, 0.0)",
            Activation::Gelu => "gelu(v)",
        }
    }
}

/// Scale, accumulation and epilogue of a matmul.
#[derive(Clone, Copy, Debug)]
pub struct MatmulOptions<'a> {
    /// C = alpha * A @ B + ...
    pub alpha: f32,
    /// ... + beta * C (0 overwrites C).
    pub beta: f32,
    /// A row vector [N] (f32) added to every row.
    pub bias: Option<&'a Tensor>,
    /// Applied last.
    pub activation: Activation,
    /// Use the tiled kernel even where the cooperative one would be chosen.
    pub tiled_only: bool,
}

impl Default for MatmulOptions<'_> {
    fn default() -> Self {
        MatmulOptions {
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            activation: Activation::Identity,
            tiled_only: false,
        }
    }
}

/// Launch parameters of both matmul kernels (`Params` in shaders/matmul_common.wgsl):
/// sizes, element offsets and strides of A, B and C, the bias, alpha and beta.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
pub struct Params {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch1: u32,
    pub a_off: u32,
    pub a_rs: u32,
    pub a_cs: u32,
    pub a_bs0: u32,
    pub a_bs1: u32,
    pub b_off: u32,
    pub b_rs: u32,
    pub b_cs: u32,
    pub b_bs0: u32,
    pub b_bs1: u32,
    pub c_off: u32,
    pub c_rs: u32,
    pub c_bs0: u32,
    pub c_bs1: u32,
    pub bias_off: u32,
    pub has_bias: u32,
    pub alpha: f32,
    pub beta: f32,
    pub pad: [u32; 2],
}

/// Whether a row-contiguous operand can be loaded as vec4: unit column stride, and
/// the offset, row stride, batch strides and row length multiples of 4.
pub fn vec4_loads(off: u32, rs: u32, cs: u32, bs: [u32; 2], cols: u32) -> bool {
    cs == 1 && [off, rs, bs[0], bs[1], cols].iter().all(|v| v % 4 == 0)
}
