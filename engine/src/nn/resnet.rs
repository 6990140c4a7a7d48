//! ResNet (He et al.) in transformers' ResNetForImageClassification layout: the stem
//! (7x7 convolution, stride 2, BatchNorm, ReLU, 3x3 max pool), stages of basic (two 3x3)
//! or bottleneck (1x1, 3x3 with the stride, 1x1) blocks with projection shortcuts where
//! the shape changes, global average pooling and a linear classifier. Depths 18 and 34
//! are basic, 50 and 101 bottleneck; torchvision's ResNet is the same network. Each
//! block's last BatchNorm adds the shortcut and applies the ReLU fused; blocks are the
//! checkpointable segments.
//!
//! May call: `autograd`, `error`, `nn::{builder, conv, hf, init, layers}`, `runtime`,
//! `tensor`.

use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::builder::{Builder, Ctx, Fill, ParamId};
use super::conv::{BatchNorm2d, Conv2d, ConvOptions, Flatten, Pool2d, images};
use super::layers::{Linear, Module};
use crate::autograd::ops::{self, Segment};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::runtime::Runtime;

fn default_channels() -> usize {
    3
}
fn default_embedding() -> usize {
    64
}
fn default_hidden() -> Vec<usize> {
    vec![256, 512, 1024, 2048]
}
fn default_depths() -> Vec<usize> {
    vec![3, 4, 6, 3]
}
fn default_layer() -> String {
    "bottleneck".into()
}
fn default_act() -> String {
    "relu".into()
}

/// The fields of transformers' ResNetConfig that the model uses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResNetConfig {
    /// Image channels.
    #[serde(default = "default_channels")]
    pub num_channels: usize,
    /// The stem's channels.
    #[serde(default = "default_embedding")]
    pub embedding_size: usize,
    /// Each stage's output channels.
    #[serde(default = "default_hidden")]
    pub hidden_sizes: Vec<usize>,
    /// Blocks per stage.
    #[serde(default = "default_depths")]
    pub depths: Vec<usize>,
    /// "basic" or "bottleneck".
    #[serde(default = "default_layer")]
    pub layer_type: String,
    /// Must be relu.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Whether the first stage downsamples (stride 2).
    #[serde(default)]
    pub downsample_in_first_stage: bool,
    /// Whether a bottleneck's stride sits on its first 1x1 (else on the 3x3: v1.5).
    #[serde(default)]
    pub downsample_in_bottleneck: bool,
    /// Classes (transformers writes id2label; `num_labels` is read when given).
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// Every other field (id2label among them), written back unchanged by save_hf.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The most blocks in a stage, and stages.
pub const MAX_DEPTH: usize = 64;

impl ResNetConfig {
    /// torchvision's resnet{depth} with `classes` outputs and `channels` image channels,
    /// its widths scaled by `width` / 64.
    pub fn standard(depth: usize, width: usize, channels: usize, classes: usize) -> Result<ResNetConfig, Error> {
        let (depths, basic) = match depth {
            18 => (vec![2, 2, 2, 2], true),
            34 => (vec![3, 4, 6, 3], true),
            50 => (vec![3, 4, 6, 3], false),
            101 => (vec![3, 4, 23, 3], false),
            other => return Err(Error::invalid("ResNet depth", format!("{other} is not one of 18, 34, 50, 101"))),
        };
        let expansion = if basic { 1 } else { 4 };
        let mut id2label = serde_json::Map::new();
        for i in 0..classes {
            id2label.insert(i.to_string(), format!("LABEL_{i}").into());
        }
        Ok(ResNetConfig {
            num_channels: channels,
            embedding_size: width,
            hidden_sizes: (0..4).map(|i| width * expansion << i).collect(),
            depths,
            layer_type: if basic { "basic" } else { "bottleneck" }.into(),
            hidden_act: "relu".into(),
            downsample_in_first_stage: false,
            downsample_in_bottleneck: false,
            num_labels: None,
            extra: serde_json::Map::from_iter([("id2label".to_string(), id2label.into())]),
        })
    }

    /// Classes: `num_labels`, else id2label's size, else 2 (transformers' default).
    pub fn classes(&self) -> usize {
        self.num_labels
            .or_else(|| self.extra.get("id2label").and_then(|m| m.as_object()).map(|m| m.len()))
            .unwrap_or(2)
    }

    fn bottleneck(&self) -> bool {
        self.layer_type == "bottleneck"
    }

    /// Refuses what the model cannot build, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.layer_type.as_str(), "basic" | "bottleneck") {
            return Err(format!("layer_type \"{}\" is not basic or bottleneck", self.layer_type));
        }
        if self.hidden_act != "relu" {
            return Err(format!("hidden_act \"{}\" is not relu", self.hidden_act));
        }
        if self.depths.is_empty() || self.depths.len() != self.hidden_sizes.len() || self.depths.len() > MAX_DEPTH {
            return Err(format!(
                "depths {:?} and hidden_sizes {:?} must be as long, 1 to {MAX_DEPTH} stages",
                self.depths, self.hidden_sizes
            ));
        }
        if self.depths.iter().any(|&d| d == 0 || d > MAX_DEPTH) {
            return Err(format!("depths {:?} must be 1 to {MAX_DEPTH}", self.depths));
        }
        let sizes = self.hidden_sizes.iter().chain([&self.embedding_size, &self.num_channels]);
        if sizes.clone().any(|&s| s == 0 || s > 1 << 16) {
            return Err("channel counts must be 1 to 65536".into());
        }
        if self.bottleneck() && self.hidden_sizes.iter().any(|s| s % 4 != 0) {
            return Err(format!(
                "a bottleneck's hidden_sizes {:?} must be multiples of 4",
                self.hidden_sizes
            ));
        }
        if self.classes() == 0 {
            return Err("no classes".into());
        }
        Ok(())
    }
}

/// Convolution + BatchNorm (+ ReLU): transformers' ResNetConvLayer (`convolution`,
/// `normalization`), padding kernel / 2, no bias.
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBn {
    fn new(vb: &mut Builder, inputs: usize, outputs: usize, kernel: usize, stride: usize, relu: bool) -> Result<ConvBn, Error> {
        // Kaiming normal, fan_out, for ReLU (transformers' and torchvision's init).
        let std = (2.0 / (outputs * kernel * kernel) as f32).sqrt();
        let options = ConvOptions {
            stride: [stride; 2],
            padding: [kernel / 2; 2],
            bias: false,
            weight: Some(Fill::Normal(std)),
            ..Default::default()
        };
        Ok(ConvBn {
            conv: Conv2d::new(&mut vb.sub("convolution"), inputs, outputs, [kernel; 2], options)?,
            bn: BatchNorm2d::new(&mut vb.sub("normalization"), outputs, relu)?,
        })
    }

    fn params(&self) -> Vec<ParamId> {
        let mut ids = self.conv.params();
        ids.extend(self.bn.params());
        ids
    }

    fn forward(&self, cx: &mut Ctx, x: &Var, residual: Option<&Var>) -> Result<Var, Error> {
        let y = self.conv.forward(cx, x)?;
        self.bn.forward_add(cx, &y, residual)
    }
}

/// One residual block: `layer.{i}` and an optional `shortcut`; the last layer's
/// BatchNorm adds the shortcut and applies the ReLU.
struct Block {
    layers: Vec<ConvBn>,
    shortcut: Option<ConvBn>,
}

impl Block {
    fn new(vb: &mut Builder, c: &ResNetConfig, inputs: usize, outputs: usize, stride: usize) -> Result<Block, Error> {
        let shortcut = (inputs != outputs || stride != 1)
            .then(|| ConvBn::new(&mut vb.sub("shortcut"), inputs, outputs, 1, stride, false))
            .transpose()?;
        let mut lv = vb.sub("layer");
        let layers = if c.bottleneck() {
            let mid = outputs / 4;
            let (s1, s3) = if c.downsample_in_bottleneck { (stride, 1) } else { (1, stride) };
            vec![
                ConvBn::new(&mut lv.sub(0), inputs, mid, 1, s1, true)?,
                ConvBn::new(&mut lv.sub(1), mid, mid, 3, s3, true)?,
                ConvBn::new(&mut lv.sub(2), mid, outputs, 1, 1, true)?,
            ]
        } else {
            vec![
                ConvBn::new(&mut lv.sub(0), inputs, outputs, 3, stride, true)?,
                ConvBn::new(&mut lv.sub(1), outputs, outputs, 3, 1, true)?,
            ]
        };
        Ok(Block { layers, shortcut })
    }

    fn params(&self) -> Vec<ParamId> {
        self.shortcut.iter().chain(&self.layers).flat_map(ConvBn::params).collect()
    }

    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let residual = match &self.shortcut {
            Some(s) => s.forward(cx, x, None)?,
            None => x.clone(),
        };
        let mut h = x.clone();
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(cx, &h, (i == last).then_some(&residual))?;
        }
        Ok(h)
    }
}

/// ResNetForImageClassification.
pub struct ResNet {
    /// The configuration it was built from.
    pub config: ResNetConfig,
    stem: ConvBn,
    pool: Pool2d,
    blocks: Arc<Vec<Block>>,
    avg: Pool2d,
    flatten: Flatten,
    classifier: Linear,
}

impl ResNet {
    /// Registers every parameter under `vb` (`resnet.…`, `classifier.1.…`).
    pub fn build(vb: &mut Builder, config: ResNetConfig) -> Result<ResNet, Error> {
        config.validate().map_err(|e| Error::invalid("ResNet config", e))?;
        let mut rv = vb.sub("resnet");
        let stem = {
            let mut ev = rv.sub("embedder");
            ConvBn::new(&mut ev.sub("embedder"), config.num_channels, config.embedding_size, 7, 2, true)?
        };
        let mut blocks = Vec::new();
        let mut inputs = config.embedding_size;
        {
            let mut ev = rv.sub("encoder");
            let mut sv = ev.sub("stages");
            for (s, (&outputs, &depth)) in config.hidden_sizes.iter().zip(&config.depths).enumerate() {
                let stride = if s == 0 && !config.downsample_in_first_stage { 1 } else { 2 };
                let mut lv = sv.sub(s);
                let mut lv = lv.sub("layers");
                for i in 0..depth {
                    blocks.push(Block::new(
                        &mut lv.sub(i),
                        &config,
                        inputs,
                        outputs,
                        if i == 0 { stride } else { 1 },
                    )?);
                    inputs = outputs;
                }
            }
        }
        let classes = config.classes();
        let classifier = {
            let mut cv = vb.sub("classifier");
            Linear::new(&mut cv.sub(1), inputs, classes)?
        };
        Ok(ResNet {
            config,
            stem,
            pool: Pool2d::max(3, 2, 1, "resnet.embedder.pooler"),
            blocks: Arc::new(blocks),
            avg: Pool2d::adaptive_avg([1, 1], "resnet.pooler"),
            flatten: Flatten::new("classifier.0"),
            classifier,
        })
    }

    /// Blocks (the checkpointable segments).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Multiply-adds of one forward pass of an `h` x `w` image.
    pub fn macs(&self, h: usize, w: usize) -> f64 {
        let (mut total, h, w) = self.stem.conv.macs(h, w);
        // The 3x3 max pool, stride 2, padding 1.
        let (mut h, mut w) = ((h + 2).saturating_sub(3) / 2 + 1, (w + 2).saturating_sub(3) / 2 + 1);
        for b in self.blocks.iter() {
            if let Some(s) = &b.shortcut {
                total += s.conv.macs(h, w).0;
            }
            for l in &b.layers {
                let (m, p, q) = l.conv.macs(h, w);
                (total, h, w) = (total + m, p, q);
            }
        }
        let width = *self.config.hidden_sizes.last().unwrap_or(&0);
        total + (width * self.config.classes()) as f64
    }

    /// Logits [N, classes] of NCHW images (flattened f32 [N, C, H, W]).
    pub fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, pixels: &[f32], nchw: [usize; 4]) -> Result<Var, Error> {
        if nchw[1] != self.config.num_channels {
            return Err(Error::shape(
                "ResNet pixel_values",
                format!("{} channels", self.config.num_channels),
                nchw[1],
            ));
        }
        let x = images(rt, pixels, nchw)?;
        let mut cx = Ctx::new(tape, rt, params);
        let x = cx.input(x);
        let h = self.stem.forward(&mut cx, &x, None)?;
        let mut h = self.pool.forward(&mut cx, &h)?;
        // Each block a segment whose parameters enter as inputs (checkpointing
        // recomputes it from them); buffers are read from a copy of their handles.
        let buffers = Rc::new(params.buffers_only());
        for i in 0..self.blocks.len() {
            let ids = self.blocks[i].params();
            let mut inputs = vec![h];
            for &id in &ids {
                inputs.push(cx.param(id)?);
            }
            let (blocks, buffers) = (self.blocks.clone(), buffers.clone());
            let f: Segment = Rc::new(move |tape: &mut Tape, rt: &Runtime, xs: &[Var]| {
                let mut cx = Ctx::new(tape, rt, &buffers).with_bound(ids.iter().copied().zip(xs[1..].iter().cloned()));
                blocks[i].forward(&mut cx, &xs[0])
            });
            h = ops::segment(cx.tape, rt, i, &inputs, f)?;
        }
        let h = self.avg.forward(&mut cx, &h)?;
        let h = self.flatten.forward(&mut cx, &h)?;
        self.classifier.forward(&mut cx, &h)
    }

    /// Loads config.json and model.safetensors from a transformers folder.
    pub fn from_hf_dir(rt: &Runtime, dir: &Path, params: &mut Params) -> Result<ResNet, Error> {
        let config: ResNetConfig = super::hf::read_config(dir)?;
        config.validate().map_err(|e| Error::format(&dir.join("config.json"), e))?;
        let widest = config.hidden_sizes.iter().max().copied().unwrap_or(64) as u64;
        let blocks: u64 = config.depths.iter().sum::<usize>() as u64;
        let bound = 4 * (blocks * 3 * 9 * widest * widest + 9 * widest * widest) + (16 << 20);
        let mut values = super::hf::read_weights(rt, dir, bound, &|name| Some(name.to_string()))?;
        let mut init = super::init::Init::new(0);
        ResNet::build(&mut Builder::from_values(rt, params, &mut init, &mut values), config)
    }

    /// Writes config.json and model.safetensors in transformers' layout.
    pub fn save_hf(&self, rt: &Runtime, params: &Params, dir: &Path) -> Result<(), Error> {
        let mut config = serde_json::to_value(&self.config).map_err(|e| Error::invalid("ResNet config", e.to_string()))?;
        config["model_type"] = "resnet".into();
        config["architectures"] = serde_json::json!(["ResNetForImageClassification"]);
        super::hf::write_params(rt, params, dir, &config)
    }
}
