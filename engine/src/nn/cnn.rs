//! A small convolutional classifier (the Fashion-MNIST example's): stages of 3x3
//! convolution, BatchNorm with the ReLU fused, and 2x2 max pooling, then a hidden
//! linear layer and the classifier, named as a torch.nn.Sequential would name them
//! (`features.{i}`, `classifier.{i}`).
//!
//! May call: `autograd`, `error`, `nn::{builder, conv, layers}`, `runtime`, `tensor`.

use super::builder::{Builder, Ctx};
use super::conv::{BatchNorm2d, Conv2d, ConvOptions, Flatten, Pool2d, images};
use super::layers::{Linear, Module};
use crate::autograd::{Params, Tape, Var, ops};
use crate::error::Error;
use crate::runtime::Runtime;

/// The CNN's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct CnnConfig {
    /// Image channels, height and width.
    pub image: [usize; 3],
    /// Each stage's channels (each stage halves the height and width).
    pub channels: Vec<usize>,
    /// The hidden linear layer's width.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
}

struct Stage {
    conv: Conv2d,
    bn: BatchNorm2d,
    pool: Pool2d,
}

/// Stages, then Flatten -> Linear -> ReLU -> Linear.
pub struct Cnn {
    /// Its shape.
    pub config: CnnConfig,
    stages: Vec<Stage>,
    flatten: Flatten,
    hidden: Linear,
    out: Linear,
}

impl Cnn {
    /// Registers the layers under `vb`.
    pub fn build(vb: &mut Builder, config: CnnConfig) -> Result<Cnn, Error> {
        let [mut c, mut h, mut w] = config.image;
        if config.channels.is_empty() || config.hidden == 0 || config.classes == 0 || c == 0 {
            return Err(Error::shape(
                "CNN",
                "at least one stage, a hidden width, classes and channels",
                format!("{config:?}"),
            ));
        }
        let mut stages = Vec::new();
        {
            let mut fv = vb.sub("features");
            for (i, &k) in config.channels.iter().enumerate() {
                if h < 2 || w < 2 {
                    return Err(Error::shape(
                        "CNN",
                        format!("images large enough for {} 2x2 pools", config.channels.len()),
                        format!("{:?}", config.image),
                    ));
                }
                let padded = ConvOptions {
                    padding: [1, 1],
                    ..Default::default()
                };
                stages.push(Stage {
                    conv: Conv2d::new(&mut fv.sub(3 * i), c, k, [3, 3], padded)?,
                    bn: BatchNorm2d::new(&mut fv.sub(3 * i + 1), k, true)?,
                    pool: Pool2d::max(2, 2, 0, &fv.path(&(3 * i + 2).to_string())),
                });
                (c, h, w) = (k, h / 2, w / 2);
            }
        }
        let mut cv = vb.sub("classifier");
        let hidden = Linear::new(&mut cv.sub(0), c * h * w, config.hidden)?;
        let out = Linear::new(&mut cv.sub(2), config.hidden, config.classes)?;
        Ok(Cnn {
            config,
            stages,
            flatten: Flatten::new("flatten"),
            hidden,
            out,
        })
    }

    /// Multiply-adds of one forward pass of one image.
    pub fn macs(&self) -> f64 {
        let [_, mut h, mut w] = self.config.image;
        let mut total = 0.0;
        for s in &self.stages {
            let (m, p, q) = s.conv.macs(h, w);
            (total, h, w) = (total + m, p / 2, q / 2);
        }
        let c = *self.config.channels.last().unwrap_or(&0);
        total + (c * h * w * self.config.hidden + self.config.hidden * self.config.classes) as f64
    }

    /// Logits [N, classes] of N images (NCHW values, flattened).
    pub fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, pixels: &[f32], n: usize) -> Result<Var, Error> {
        let [c, h, w] = self.config.image;
        let x = images(rt, pixels, [n, c, h, w])?;
        let mut cx = Ctx::new(tape, rt, params);
        let mut h = cx.input(x);
        for s in &self.stages {
            h = s.conv.forward(&mut cx, &h)?;
            h = s.bn.forward(&mut cx, &h)?;
            h = s.pool.forward(&mut cx, &h)?;
        }
        let h = self.flatten.forward(&mut cx, &h)?;
        let h = self.hidden.forward(&mut cx, &h)?;
        let h = ops::relu(cx.tape, rt, &h, "classifier.1")?;
        self.out.forward(&mut cx, &h)
    }
}
