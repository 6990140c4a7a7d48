//! Llama with exactly the parameter layout of transformers' LlamaForCausalLM:
//! `model.embed_tokens.weight` [V, C], per layer `model.layers.{i}.self_attn.{q,k,v,o}_proj`
//! (torch.nn.Linear, no bias; k and v with the key/value heads of grouped-query
//! attention), `mlp.{gate,up,down}_proj` (SwiGLU), `input_layernorm` and
//! `post_attention_layernorm` (RMSNorm), then `model.norm` and `lm_head.weight` (absent
//! when tied to the embedding). Rotary embeddings as transformers computes them from
//! `rope_theta` (or `rope_parameters` in newer config.json files).
//!
//! Generation decodes a token at a time over `nn::kv_cache`.
//!
//! May call: `autograd`, `error`, `nn::hf`, `kernels`, `memory`, `nn::{builder, gpt,
//! kv_cache}`, `runtime`, `tensor`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::builder::{Builder, Fill, ParamId};
use super::gpt::{MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB};
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::kernels::heads::Heads;
use crate::memory::Category;
use crate::nn::kv_cache::KvCache;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// `rope_parameters` of newer config.json files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RopeParameters {
    /// The base of the rotary frequencies.
    pub rope_theta: f64,
    /// Only "default" is implemented.
    #[serde(default = "default_rope_type")]
    pub rope_type: String,
}

fn default_rope_type() -> String {
    "default".into()
}

fn default_rms_eps() -> f64 {
    1e-6
}

fn default_act() -> String {
    "silu".into()
}

/// The fields of transformers' LlamaConfig that the model uses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary V.
    pub vocab_size: usize,
    /// Width C.
    pub hidden_size: usize,
    /// SwiGLU width.
    pub intermediate_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Query heads H.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention; H when absent).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head width (C / H when absent).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    /// The rotary base, in older config.json files.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// The rotary base and type, in newer ones.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Longest sequence.
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    /// Whether lm_head is the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Must be silu.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Every other field, written back unchanged by save_hf.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_positions() -> usize {
    2048
}

impl LlamaConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .map(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10000.0)
    }

    /// Checks what the engine implements and the sizes it builds.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::invalid("Llama config", m));
        for (key, value, max) in [
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("hidden_size", self.hidden_size, super::gpt::MAX_EMBD),
            ("intermediate_size", self.intermediate_size, 4 * super::gpt::MAX_EMBD),
            ("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
        ] {
            if value == 0 || value > max {
                return bad(format!("{key} {value} is not in 1..={max}"));
            }
        }
        let (h, kv, d) = (self.num_attention_heads, self.kv_heads(), self.head_dim());
        if kv == 0 || !h.is_multiple_of(kv) {
            return bad(format!("num_key_value_heads {kv} does not divide num_attention_heads {h}"));
        }
        if !d.is_multiple_of(4) || d > crate::kernels::flash_attention::MAX_HEAD {
            return bad(format!(
                "head_dim {d} is not supported by the fused attention (a multiple of 4 up to {})",
                crate::kernels::flash_attention::MAX_HEAD
            ));
        }
        if self.hidden_act != "silu" {
            return bad(format!("hidden_act '{}' is not supported (silu)", self.hidden_act));
        }
        if let Some(r) = &self.rope_parameters
            && r.rope_type != "default"
        {
            return bad(format!("rope_type '{}' is not implemented (default)", r.rope_type));
        }
        if self.extra.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            return bad("rope_scaling is not implemented".into());
        }
        for flag in ["attention_bias", "mlp_bias"] {
            if self.extra.get(flag).and_then(|v| v.as_bool()) == Some(true) {
                return bad(format!("{flag} = true is not implemented"));
            }
        }
        if !(self.theta().is_finite() && self.theta() > 0.0) {
            return bad(format!("rope_theta {} must be positive", self.theta()));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return bad(format!("rms_norm_eps {} must be a positive number below 1", self.rms_norm_eps));
        }
        Ok(())
    }

    /// The rotary tables (cos, sin) [t, D/2] as transformers computes them in f32:
    /// inv_freq = 1 / theta^(2i / D), angle = position * inv_freq.
    pub fn rope_tables(&self, t: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.head_dim();
        let half = d / 2;
        let theta = self.theta() as f32;
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32)).collect();
        let (mut cos, mut sin) = (Vec::with_capacity(t * half), Vec::with_capacity(t * half));
        for p in 0..t {
            for &f in &inv {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        (cos, sin)
    }
}

/// Parameters of one decoder layer, in transformers' order.
#[derive(Clone, Copy)]
struct Layer {
    ids: [ParamId; 9],
}

/// The model.
pub struct Llama {
    /// Its configuration.
    pub config: LlamaConfig,
    embed: ParamId,
    layers: Vec<Layer>,
    norm: ParamId,
    head: ParamId,
}

const LAYER_PARAMS: [&str; 9] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
];

impl Llama {
    /// Registers the parameters through `vb` in state-dict order, initialised as
    /// LlamaForCausalLM does: normal(0, 0.02) weights, unit RMSNorm weights.
    pub fn build(vb: &mut Builder, config: LlamaConfig) -> Result<Llama, Error> {
        config.validate()?;
        let (c, f, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
        let (h, kv, d) = (config.num_attention_heads, config.kv_heads(), config.head_dim());
        let normal = Fill::Normal(0.02);
        let mut m = vb.sub("model");
        let embed = m.param("embed_tokens.weight", &[v, c], normal)?;
        let mut layers = Vec::new();
        for i in 0..config.num_hidden_layers {
            let mut l = m.sub(format!("layers.{i}"));
            let shapes: [Vec<usize>; 9] = [
                vec![h * d, c],
                vec![kv * d, c],
                vec![kv * d, c],
                vec![c, h * d],
                vec![f, c],
                vec![f, c],
                vec![c, f],
                vec![c],
                vec![c],
            ];
            let mut ids = Vec::new();
            for (name, shape) in LAYER_PARAMS.iter().zip(&shapes) {
                let fill = if shape.len() == 1 { Fill::Constant(1.0) } else { normal };
                ids.push(l.param(&format!("{name}.weight"), shape, fill)?);
            }
            layers.push(Layer {
                ids: ids.try_into().expect("nine"),
            });
        }
        let norm = m.param("norm.weight", &[c], Fill::Constant(1.0))?;
        let head = if config.tie_word_embeddings {
            embed
        } else {
            vb.param("lm_head.weight", &[v, c], normal)?
        };
        Ok(Llama {
            config,
            embed,
            layers,
            norm,
            head,
        })
    }

    /// Loads config.json and model.safetensors written by transformers' save_pretrained.
    pub fn from_hf_dir(rt: &Runtime, dir: &Path, params: &mut Params) -> Result<Llama, Error> {
        let config: LlamaConfig = crate::nn::hf::read_config(dir)?;
        config.validate().map_err(|e| Error::format(&dir.join("config.json"), e))?;
        let (c, f, v) = (config.hidden_size as u64, config.intermediate_size as u64, config.vocab_size as u64);
        let hd = (config.num_attention_heads * config.head_dim()) as u64;
        let kvd = (config.kv_heads() * config.head_dim()) as u64;
        let layer = 2 * c * hd + 2 * c * kvd + 3 * c * f + 2 * c;
        let numel = 2 * v * c + config.num_hidden_layers as u64 * layer + c;
        let tied = config.tie_word_embeddings;
        let mut values = crate::nn::hf::read_weights(rt, dir, 4 * numel + (16 << 20), &|name| {
            (!(tied && name == "lm_head.weight")).then(|| name.to_string())
        })?;
        let mut init = super::init::Init::new(0);
        Llama::build(&mut Builder::from_values(rt, params, &mut init, &mut values), config)
    }

    /// Writes config.json and model.safetensors in transformers' layout.
    pub fn save_hf(&self, rt: &Runtime, params: &Params, dir: &Path) -> Result<(), Error> {
        let mut config = serde_json::to_value(&self.config).map_err(|e| Error::invalid("Llama config", e.to_string()))?;
        config["model_type"] = "llama".into();
        config["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        super::hf::write_params(rt, params, dir, &config)
    }

    /// The mean next-token loss against `targets` ([B*T] i32, -100 ignored, and how many
    /// are not) through the fused head + cross-entropy.
    pub fn forward_loss(
        &self,
        tape: &mut Tape,
        rt: &Runtime,
        params: &Params,
        ids: &Tensor,
        targets: (&Tensor, usize),
        row_chunk: usize,
    ) -> Result<Var, Error> {
        let (h, head) = self.trunk(tape, rt, params, ids)?;
        ops::lm_head_cross_entropy(tape, rt, &h, &head, targets, row_chunk, "loss")
    }

    /// The next-token logits [B, V] after token ids [B, T] (generation: the head on the
    /// last position only).
    pub fn next_token_logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        let (h, head) = self.trunk(tape, rt, params, ids)?;
        ops::last_position_logits(tape, rt, &h, &head)
    }

    /// An empty key/value cache for `batch` sequences over the model's whole context (its
    /// key/value heads: grouped-query attention's smaller cache).
    pub fn kv_cache(&self, rt: &Runtime, batch: usize) -> Result<KvCache, Error> {
        let c = &self.config;
        KvCache::new(
            rt,
            (c.num_hidden_layers, c.max_position_embeddings, batch),
            (c.num_attention_heads, c.kv_heads(), c.head_dim()),
            |i| format!("model.layers.{i}.self_attn"),
        )
    }

    /// The next-token logits [B, V] after token `ids` [B] (i32, one a sequence) at the
    /// cache's next position, whose keys and values the cache keeps: every layer on that
    /// one position, its queries and keys rotated by that position's angles.
    pub fn decode(&self, tape: &mut Tape, rt: &Runtime, params: &Params, cache: &mut KvCache, ids: &Tensor) -> Result<Var, Error> {
        let c = &self.config;
        let b = cache.batch();
        let pos = cache.next_position(ids)?;
        let embed = tape.param(params, self.embed.0)?;
        let mut x = ops::embedding(tape, rt, &ids.reshape(&[b, 1])?, &embed, "model.embed_tokens")?;
        let half = c.head_dim() / 2;
        let (cos, sin) = c.rope_tables(pos + 1);
        let cos = Tensor::from_f32(rt, &cos[pos * half..], &[1, half], Category::Input, "rope.cos")?;
        let sin = Tensor::from_f32(rt, &sin[pos * half..], &[1, half], Category::Input, "rope.sin")?;
        let hs = Heads {
            b,
            t: 1,
            h: c.num_attention_heads,
            kv: c.kv_heads(),
            d: c.head_dim(),
        };
        let eps = c.rms_norm_eps as f32;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut vars = vec![x.clone()];
            for id in layer.ids {
                vars.push(tape.param(params, id.0)?);
            }
            let cache = &*cache;
            x = decoder_layer_with(tape, rt, i, (eps, hs, (&cos, &sin)), &vars, &mut |tape, rt, qkv| {
                Ok(tape.constant(cache.attend(rt, &qkv.value, i, pos)?))
            })?;
        }
        cache.advance();
        let w = tape.param(params, self.norm.0)?;
        let h = ops::rmsnorm(tape, rt, &x, &w, eps, "model.norm")?;
        let head = if self.head == self.embed {
            embed
        } else {
            tape.param(params, self.head.0)?
        };
        ops::last_position_logits(tape, rt, &h, &head)
    }

    /// The final hidden states [B, T, C] (after the last RMSNorm) and the head's weight.
    fn trunk(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<(Var, Var), Error> {
        let [b, t] = *ids.shape() else {
            return Err(Error::shape("Llama input ids", "[B, T]", format!("{:?}", ids.shape())));
        };
        let c = &self.config;
        if t > c.max_position_embeddings {
            return Err(Error::shape(
                "Llama input ids",
                format!("a sequence length of at most max_position_embeddings {}", c.max_position_embeddings),
                t,
            ));
        }
        let embed = tape.param(params, self.embed.0)?;
        let mut x = ops::embedding(tape, rt, ids, &embed, "model.embed_tokens")?;
        let (cos, sin) = c.rope_tables(t);
        let half = c.head_dim() / 2;
        let cos = Tensor::from_f32(rt, &cos, &[t, half], Category::Input, "rope.cos")?;
        let sin = Tensor::from_f32(rt, &sin, &[t, half], Category::Input, "rope.sin")?;
        let hs = Heads {
            b,
            t,
            h: c.num_attention_heads,
            kv: c.kv_heads(),
            d: c.head_dim(),
        };
        let eps = c.rms_norm_eps as f32;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut vars = vec![x.clone()];
            for id in layer.ids {
                vars.push(tape.param(params, id.0)?);
            }
            let (cos, sin) = (cos.clone(), sin.clone());
            let layer =
                std::rc::Rc::new(move |tape: &mut Tape, rt: &Runtime, v: &[Var]| decoder_layer(tape, rt, i, (eps, hs, (&cos, &sin)), v));
            x = ops::segment(tape, rt, i, &vars, layer)?;
        }
        let w = tape.param(params, self.norm.0)?;
        let h = ops::rmsnorm(tape, rt, &x, &w, eps, "model.norm")?;
        let head = if self.head == self.embed {
            embed
        } else {
            tape.param(params, self.head.0)?
        };
        Ok((h, head))
    }
}

/// One decoder layer: x + o(attention(rope(q), rope(k), v)) of rmsnorm(x), then
/// + down(silu(gate(.)) * up(.)) of rmsnorm of that. `v` holds x and the layer's nine
/// weights in `LAYER_PARAMS` order.
fn decoder_layer(
    tape: &mut Tape,
    rt: &Runtime,
    i: usize,
    (eps, hs, rope): (f32, Heads, (&Tensor, &Tensor)),
    v: &[Var],
) -> Result<Var, Error> {
    let label = format!("model.layers.{i}.self_attn");
    decoder_layer_with(tape, rt, i, (eps, hs, rope), v, &mut |tape, rt, qkv| {
        ops::attention(tape, rt, qkv, hs.h, &label)
    })
}

/// [`decoder_layer`] with `attend` from the packed qkv to the heads' outputs (the
/// training's attention, or the decoder's over its cache).
fn decoder_layer_with(
    tape: &mut Tape,
    rt: &Runtime,
    i: usize,
    (eps, hs, rope): (f32, Heads, (&Tensor, &Tensor)),
    v: &[Var],
    attend: &mut dyn FnMut(&mut Tape, &Runtime, &Var) -> Result<Var, Error>,
) -> Result<Var, Error> {
    let l = |n: &str| format!("model.layers.{i}.{n}");
    let x = &v[0];
    // Under fp16-mixed the projections feeding attention and SiLU write f16.
    let act = if tape.half_matmuls() { DType::F16 } else { DType::F32 };
    let lin = |tape: &mut Tape, x: &Var, w: &Var, out: DType, name: &str| {
        ops::linear_as(tape, rt, x, w, None, WeightLayout::OutIn, out, &l(name))
    };
    let h = ops::rmsnorm(tape, rt, x, &v[8], eps, &l("input_layernorm"))?;
    let q = lin(tape, &h, &v[1], act, "self_attn.q_proj")?;
    let k = lin(tape, &h, &v[2], act, "self_attn.k_proj")?;
    let vv = lin(tape, &h, &v[3], act, "self_attn.v_proj")?;
    let qkv = ops::pack_heads(tape, rt, (&q, &k, &vv), Some(rope), hs, &l("self_attn.qkv"))?;
    let y = attend(tape, rt, &qkv)?;
    let a = lin(tape, &y, &v[4], DType::F32, "self_attn.o_proj")?;
    let x2 = ops::add(tape, rt, x, &a, &l("self_attn.residual"))?;
    let h2 = ops::rmsnorm(tape, rt, &x2, &v[9], eps, &l("post_attention_layernorm"))?;
    let g = lin(tape, &h2, &v[5], act, "mlp.gate_proj")?;
    let u = lin(tape, &h2, &v[6], act, "mlp.up_proj")?;
    let s = ops::silu(tape, rt, &g, &l("mlp.act_fn"))?;
    let m = ops::mul(tape, rt, &s, &u, &l("mlp.act_fn*up_proj"))?;
    let dn = lin(tape, &m, &v[7], DType::F32, "mlp.down_proj")?;
    ops::add(tape, rt, &x2, &dn, &l("mlp.residual"))
}
