//! An MLP classifier: Linear -> ReLU -> ... -> Linear, with torch.nn.Linear's layout,
//! names (`layers.{i}.weight`, `layers.{i}.bias`) and default initialisation.
//!
//! May call: `autograd`, `error`, `nn::init`, `runtime`, `tensor`.

use super::init::Init;
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// Layer sizes and parameter indices.
pub struct Mlp {
    /// Input, hidden..., output widths.
    pub sizes: Vec<usize>,
    layers: Vec<(usize, usize)>,
}

impl Mlp {
    /// Registers the parameters in `params`, initialised like torch.nn.Linear
    /// (uniform in +-1/sqrt(fan_in) for weight and bias).
    pub fn new(rt: &Runtime, params: &mut Params, sizes: &[usize], init: &mut Init) -> Result<Mlp, Error> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(Error::shape(
                "MLP widths",
                "an input and an output width, all non-zero",
                format!("{sizes:?}"),
            ));
        }
        let mut layers = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            let bound = 1.0 / (w[0] as f32).sqrt();
            let weight = init.uniform(rt, &[w[1], w[0]], bound, &format!("layers.{i}.weight"))?;
            let bias = init.uniform(rt, &[w[1]], bound, &format!("layers.{i}.bias"))?;
            layers.push((
                params.add(&format!("layers.{i}.weight"), weight),
                params.add(&format!("layers.{i}.bias"), bias),
            ));
        }
        Ok(Mlp {
            sizes: sizes.to_vec(),
            layers,
        })
    }

    /// Logits [N, classes] of inputs [N, features].
    pub fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, x: Tensor) -> Result<Var, Error> {
        let mut h = tape.constant(x);
        for (i, &(w, b)) in self.layers.iter().enumerate() {
            let (wv, bv) = (tape.param(params, w)?, tape.param(params, b)?);
            h = ops::linear(tape, rt, &h, &wv, Some(&bv), WeightLayout::OutIn, &format!("layers.{i}"))?;
            if i + 1 < self.layers.len() {
                h = ops::relu(tape, rt, &h, &format!("layers.{i}.relu"))?;
            }
        }
        Ok(h)
    }
}
