//! Seeded parameter initialisation, in the order the models register their
//! parameters, so a seed gives the same weights on every adapter.
//!
//! May call: `error`, `kernels`, `memory`, `runtime`, `tensor`. Called by: the models.

use rand::Rng as _;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::Error;
use crate::kernels::TensorOps;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// Seeded parameter initialisation.
pub struct Init {
    rng: ChaCha8Rng,
}

impl Init {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Init {
        Init {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A parameter tensor of `shape` with values uniform in [-bound, bound).
    pub fn uniform(&mut self, rt: &Runtime, shape: &[usize], bound: f32, name: &str) -> Result<Tensor, Error> {
        if !rt.runs_kernels() {
            return Self::unfilled(rt, shape, name);
        }
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| self.rng.random_range(-bound..bound.max(f32::MIN_POSITIVE)))
            .collect();
        Tensor::from_f32(rt, &data, shape, Category::Parameter, name)
    }

    /// A parameter tensor of `shape` with values normal(0, std).
    pub fn normal(&mut self, rt: &Runtime, shape: &[usize], std: f32, name: &str) -> Result<Tensor, Error> {
        if !rt.runs_kernels() {
            return Self::unfilled(rt, shape, name);
        }
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| {
                // Box-Muller from two uniforms.
                let u1: f32 = self.rng.random_range(f32::MIN_POSITIVE..1.0);
                let u2: f32 = self.rng.random_range(0.0..1.0);
                std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect();
        Tensor::from_f32(rt, &data, shape, Category::Parameter, name)
    }

    /// On a dry runtime (the estimate) nothing is computed: the block is what counts.
    fn unfilled(rt: &Runtime, shape: &[usize], name: &str) -> Result<Tensor, Error> {
        Tensor::empty(rt, shape, crate::tensor::DType::F32, Category::Parameter, name)
    }

    /// A parameter tensor filled with `value`.
    pub fn constant(&mut self, rt: &Runtime, shape: &[usize], value: f32, name: &str) -> Result<Tensor, Error> {
        Tensor::full(rt, shape, crate::tensor::DType::F32, value, Category::Parameter, name)
    }
}
