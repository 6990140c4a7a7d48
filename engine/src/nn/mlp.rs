//! An MLP classifier: Linear -> ReLU -> ... -> Linear, with torch.nn.Linear's layout,
//! names (`layers.{i}.weight`, `layers.{i}.bias`) and default initialisation, built
//! from the layer library.
//!
//! May call: `autograd`, `error`, `nn::{builder, init, layers}`, `runtime`, `tensor`.

use super::builder::{Builder, Ctx};
use super::init::Init;
use super::layers::{Linear, Module};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// Layer sizes and layers.
pub struct Mlp {
    /// Input, hidden..., output widths.
    pub sizes: Vec<usize>,
    layers: Vec<Linear>,
    labels: Vec<String>,
}

impl Mlp {
    /// Registers the layers under `vb` (`layers.{i}`), initialised like torch.nn.Linear
    /// (uniform in +-1/sqrt(fan_in) for weight and bias).
    pub fn build(vb: &mut Builder, sizes: &[usize]) -> Result<Mlp, Error> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(Error::shape(
                "MLP widths",
                "an input and an output width, all non-zero",
                format!("{sizes:?}"),
            ));
        }
        let mut layers = Vec::new();
        let mut vb = vb.sub("layers");
        for (i, w) in sizes.windows(2).enumerate() {
            layers.push(Linear::new(&mut vb.sub(i), w[0], w[1])?);
        }
        Ok(Mlp {
            sizes: sizes.to_vec(),
            labels: (0..layers.len()).map(|i| format!("layers.{i}.relu")).collect(),
            layers,
        })
    }

    /// [`Mlp::build`] at the root of `params`.
    pub fn new(rt: &Runtime, params: &mut Params, sizes: &[usize], init: &mut Init) -> Result<Mlp, Error> {
        Mlp::build(&mut Builder::new(rt, params, init), sizes)
    }

    /// Logits [N, classes] of inputs [N, features].
    pub fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, x: Tensor) -> Result<Var, Error> {
        let mut cx = Ctx::new(tape, rt, params);
        let mut h = cx.input(x);
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&mut cx, &h)?;
            if i + 1 < self.layers.len() {
                h = crate::autograd::ops::relu(cx.tape, rt, &h, &self.labels[i])?;
            }
        }
        Ok(h)
    }
}
