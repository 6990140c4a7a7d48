//! The layer library: each layer registers its parameters through a [`Builder`] at its
//! path and runs its forward on a [`Ctx`] (the tape records backward). Layers follow
//! PyTorch's modules in names, layouts and default initialisation, so a state dict
//! written by transformers or torch loads by name.
//!
//! May call: `autograd`, `error`, `nn::builder`, `runtime`, `tensor`. Called by: models.

use super::builder::{Builder, Ctx, Fill, ParamId};
use crate::autograd::Var;
use crate::autograd::ops::{self, WeightLayout};
use crate::error::Error;
use crate::tensor::{DType, Tensor};

/// A layer: one input to one output.
pub trait Module: Send + Sync {
    /// The output of `x`.
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error>;
}

/// y = x W^T + b (torch.nn.Linear) or y = x W + b (transformers' Conv1D, GPT-2's
/// layout), over the last dimension.
pub struct Linear {
    weight: ParamId,
    bias: Option<ParamId>,
    layout: WeightLayout,
    label: String,
}

/// How a [`Linear`] is made.
#[derive(Clone, Copy, Debug)]
pub struct LinearOptions {
    /// With a bias (torch's default).
    pub bias: bool,
    /// The weight's layout.
    pub layout: WeightLayout,
    /// The weight's fill (None: torch's default, uniform in +-1/sqrt(in)).
    pub weight: Option<Fill>,
    /// The bias's fill (None: torch's default, uniform in +-1/sqrt(in)).
    pub bias_fill: Option<Fill>,
}

impl Default for LinearOptions {
    fn default() -> Self {
        LinearOptions {
            bias: true,
            layout: WeightLayout::OutIn,
            weight: None,
            bias_fill: None,
        }
    }
}

impl Linear {
    /// torch.nn.Linear(inputs, outputs): `weight` [out, in] and `bias` [out] under `vb`.
    pub fn new(vb: &mut Builder, inputs: usize, outputs: usize) -> Result<Linear, Error> {
        Linear::with(vb, inputs, outputs, LinearOptions::default())
    }

    /// A linear layer as `options` says.
    pub fn with(vb: &mut Builder, inputs: usize, outputs: usize, options: LinearOptions) -> Result<Linear, Error> {
        if inputs == 0 || outputs == 0 {
            return Err(Error::shape(vb.path("weight"), "non-zero widths", format!("{inputs} -> {outputs}")));
        }
        let default = Fill::Uniform(1.0 / (inputs as f32).sqrt());
        let shape = match options.layout {
            WeightLayout::OutIn => [outputs, inputs],
            WeightLayout::InOut => [inputs, outputs],
        };
        let weight = vb.param("weight", &shape, options.weight.unwrap_or(default))?;
        let bias = if options.bias {
            Some(vb.param("bias", &[outputs], options.bias_fill.unwrap_or(default))?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            layout: options.layout,
            label: vb.path(""),
        })
    }

    /// The output written in `out` (f16 under fp16-mixed when the consumer reads f16).
    pub fn forward_as(&self, cx: &mut Ctx, x: &Var, out: DType) -> Result<Var, Error> {
        let w = cx.param(self.weight)?;
        let b = self.bias.map(|b| cx.param(b)).transpose()?;
        ops::linear_as(cx.tape, cx.rt, x, &w, b.as_ref(), self.layout, out, &self.label)
    }
}

impl Module for Linear {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        self.forward_as(cx, x, DType::F32)
    }
}

/// A lookup table: rows of `weight` [n, dim] picked by i32 ids (torch.nn.Embedding,
/// initialised normal(0, 1) unless told otherwise).
pub struct Embedding {
    weight: ParamId,
    label: String,
}

impl Embedding {
    /// torch.nn.Embedding(n, dim) under `vb`.
    pub fn new(vb: &mut Builder, n: usize, dim: usize) -> Result<Embedding, Error> {
        Embedding::with(vb, n, dim, Fill::Normal(1.0))
    }

    /// An embedding filled as `fill` says.
    pub fn with(vb: &mut Builder, n: usize, dim: usize, fill: Fill) -> Result<Embedding, Error> {
        Ok(Embedding {
            weight: vb.param("weight", &[n, dim], fill)?,
            label: vb.path(""),
        })
    }

    /// The table's parameter (for a tied head).
    pub fn weight(&self) -> ParamId {
        self.weight
    }

    /// Rows for `ids` (i32): shape ids.shape + [dim].
    pub fn lookup(&self, cx: &mut Ctx, ids: &Tensor) -> Result<Var, Error> {
        let w = cx.param(self.weight)?;
        ops::embedding(cx.tape, cx.rt, ids, &w, &self.label)
    }
}

/// LayerNorm over the last dimension, with weight (1) and bias (0).
pub struct LayerNorm {
    weight: ParamId,
    bias: ParamId,
    eps: f32,
    label: String,
}

impl LayerNorm {
    /// torch.nn.LayerNorm(dim, eps) under `vb`.
    pub fn new(vb: &mut Builder, dim: usize, eps: f32) -> Result<LayerNorm, Error> {
        Ok(LayerNorm {
            weight: vb.param("weight", &[dim], Fill::Constant(1.0))?,
            bias: vb.param("bias", &[dim], Fill::Constant(0.0))?,
            eps,
            label: vb.path(""),
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let (w, b) = (cx.param(self.weight)?, cx.param(self.bias)?);
        ops::layernorm(cx.tape, cx.rt, x, &w, &b, self.eps, &self.label)
    }
}

/// Inverted dropout (torch.nn.Dropout): active in training mode only; its mask is drawn
/// from the step's seed and the layer's name, and drawn again in backward (not stored).
pub struct Dropout {
    p: f32,
    label: String,
}

impl Dropout {
    /// Dropout with probability `p` in [0, 1), named by `vb`'s path.
    pub fn new(vb: &Builder, p: f32) -> Result<Dropout, Error> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                vb.path(""),
                format!("dropout probability must be in [0, 1), not {p}"),
            ));
        }
        Ok(Dropout { p, label: vb.path("") })
    }
}

impl Module for Dropout {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        ops::dropout(cx.tape, cx.rt, x, self.p, &self.label)
    }
}

/// An elementwise activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// max(x, 0).
    Relu,
    /// The exact gelu (erf form: torch.nn.GELU(), BERT).
    Gelu,
    /// The tanh approximation (GPT-2's gelu_new, torch.nn.GELU(approximate="tanh")).
    GeluTanh,
    /// x * sigmoid(x) (torch.nn.SiLU, Llama).
    Silu,
}

impl Activation {
    /// transformers' name of the activation (`hidden_act`), if it is one of these.
    pub fn from_hf(name: &str) -> Option<Activation> {
        Some(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            "silu" | "swish" => Activation::Silu,
            _ => return None,
        })
    }

    /// The activation of `x`, its outputs labelled `label`.
    pub fn apply(self, cx: &mut Ctx, x: &Var, label: &str) -> Result<Var, Error> {
        match self {
            Activation::Relu => ops::relu(cx.tape, cx.rt, x, label),
            Activation::Gelu => ops::gelu_erf(cx.tape, cx.rt, x, label),
            Activation::GeluTanh => ops::gelu(cx.tape, cx.rt, x, label),
            Activation::Silu => ops::silu(cx.tape, cx.rt, x, label),
        }
    }
}

/// An activation as a layer of a [`Sequential`].
pub struct Act {
    kind: Activation,
    label: String,
}

impl Act {
    /// `kind` labelled by `vb`'s path.
    pub fn new(vb: &Builder, kind: Activation) -> Act {
        Act { kind, label: vb.path("") }
    }
}

impl Module for Act {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        self.kind.apply(cx, x, &self.label)
    }
}

/// Layers applied in order (torch.nn.Sequential: build each under `vb.sub(i)`).
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// No layers yet.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer`.
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// How many layers it holds.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(cx, &h)?;
        }
        Ok(h)
    }
}

/// x + f(x): a residual connection around `inner`.
pub struct Residual<M: Module> {
    inner: M,
    label: String,
}

impl<M: Module> Residual<M> {
    /// The residual connection around `inner`, its sum labelled by `vb`'s path.
    pub fn new(vb: &Builder, inner: M) -> Residual<M> {
        Residual {
            inner,
            label: vb.path("residual"),
        }
    }
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let y = self.inner.forward(cx, x)?;
        ops::add(cx.tape, cx.rt, x, &y, &self.label)
    }
}

/// RMSNorm over the last dimension with a weight (1) and no bias (Llama's).
pub struct RmsNorm {
    weight: ParamId,
    eps: f32,
    label: String,
}

impl RmsNorm {
    /// torch.nn.RMSNorm(dim, eps) under `vb`.
    pub fn new(vb: &mut Builder, dim: usize, eps: f32) -> Result<RmsNorm, Error> {
        Ok(RmsNorm {
            weight: vb.param("weight", &[dim], Fill::Constant(1.0))?,
            eps,
            label: vb.path(""),
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        let w = cx.param(self.weight)?;
        ops::rmsnorm(cx.tape, cx.rt, x, &w, self.eps, &self.label)
    }
}

/// How an [`Attention`] is made.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOptions {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, dividing `heads` (fewer: grouped-query attention).
    pub kv_heads: usize,
    /// Each position attends to those before it (the fused kernels), or to every
    /// position (with an optional padding mask).
    pub causal: bool,
    /// Rotary embeddings' base (None: no rotation).
    pub rope_theta: Option<f32>,
    /// Biases on the projections.
    pub bias: bool,
}

/// Multi-head self-attention with its projections `q_proj`, `k_proj`, `v_proj`, `o_proj`
/// (torch.nn.Linear layouts): grouped-query heads, rotary embeddings, causal on the
/// fused kernels or bidirectional with padding masks.
pub struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    options: AttentionOptions,
    head_dim: usize,
    label: String,
}

impl Attention {
    /// Attention over `width`-wide inputs under `vb`.
    pub fn new(vb: &mut Builder, width: usize, options: AttentionOptions) -> Result<Attention, Error> {
        let AttentionOptions { heads, kv_heads, .. } = options;
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || !width.is_multiple_of(heads) {
            return Err(Error::shape(
                vb.path(""),
                "heads dividing the width and key/value heads dividing the heads",
                format!("width {width}, {heads} heads, {kv_heads} key/value heads"),
            ));
        }
        let d = width / heads;
        let lin = LinearOptions {
            bias: options.bias,
            ..LinearOptions::default()
        };
        Ok(Attention {
            q: Linear::with(&mut vb.sub("q_proj"), width, heads * d, lin)?,
            k: Linear::with(&mut vb.sub("k_proj"), width, kv_heads * d, lin)?,
            v: Linear::with(&mut vb.sub("v_proj"), width, kv_heads * d, lin)?,
            o: Linear::with(&mut vb.sub("o_proj"), heads * d, width, lin)?,
            options,
            head_dim: d,
            label: vb.path(""),
        })
    }

    /// The attention of x [B, T, C]; `padding` (1 for a token, 0 for padding, per [B, T]
    /// position) leaves padded keys out of a bidirectional attention.
    pub fn forward_masked(&self, cx: &mut Ctx, x: &Var, padding: Option<&[i32]>) -> Result<Var, Error> {
        let [b, t, _] = *x.value.shape() else {
            return Err(Error::shape(&self.label, "[B, T, C]", format!("{:?}", x.value.shape())));
        };
        let o = &self.options;
        if o.causal && padding.is_some() {
            return Err(Error::invalid(
                &self.label,
                "padding masks need a bidirectional attention (causal: false)",
            ));
        }
        let act = if cx.tape.half_matmuls() { DType::F16 } else { DType::F32 };
        let (q, k, v) = (
            self.q.forward_as(cx, x, act)?,
            self.k.forward_as(cx, x, act)?,
            self.v.forward_as(cx, x, act)?,
        );
        let hs = crate::kernels::heads::Heads {
            b,
            t,
            h: o.heads,
            kv: o.kv_heads,
            d: self.head_dim,
        };
        let tables = match o.rope_theta {
            Some(theta) => {
                let half = self.head_dim / 2;
                let inv: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / self.head_dim as f32)).collect();
                let angles = |f: fn(f64) -> f64| -> Vec<f32> {
                    (0..t)
                        .flat_map(|p| inv.iter().map(move |&w| f((p as f32 * w) as f64) as f32))
                        .collect()
                };
                let cos = Tensor::from_f32(cx.rt, &angles(f64::cos), &[t, half], crate::memory::Category::Input, "rope.cos")?;
                let sin = Tensor::from_f32(cx.rt, &angles(f64::sin), &[t, half], crate::memory::Category::Input, "rope.sin")?;
                Some((cos, sin))
            }
            None => None,
        };
        let rope = tables.as_ref().map(|(c, s)| (c, s));
        let qkv = ops::pack_heads(cx.tape, cx.rt, (&q, &k, &v), rope, hs, &format!("{}.qkv", self.label))?;
        let y = if o.causal {
            ops::attention(cx.tape, cx.rt, &qkv, o.heads, &self.label)?
        } else {
            let bias = padding
                .map(|m| {
                    let values: Vec<f32> = m.iter().map(|&v| if v == 0 { f32::MIN } else { 0.0 }).collect();
                    Tensor::from_f32(cx.rt, &values, &[b, 1, 1, t], crate::memory::Category::Input, "padding")
                })
                .transpose()?;
            ops::attention_bidirectional(cx.tape, cx.rt, &qkv, o.heads, bias.as_ref(), &self.label)?
        };
        self.o.forward(cx, &y)
    }
}

impl Module for Attention {
    fn forward(&self, cx: &mut Ctx, x: &Var) -> Result<Var, Error> {
        self.forward_masked(cx, x, None)
    }
}
