//! BERT with exactly the parameter layout of transformers' BertForMaskedLM:
//! `bert.embeddings.{word,position,token_type}_embeddings` and `.LayerNorm`, per layer
//! `bert.encoder.layer.{i}.attention.self.{query,key,value}`, `attention.output.dense`
//! and `.LayerNorm` (post-LayerNorm blocks), `intermediate.dense`, `output.dense` and
//! `.LayerNorm`; the MLM head `cls.predictions.transform.{dense,LayerNorm}`, a decoder
//! tied to the word embeddings, and its own bias `cls.predictions.bias`. Exact-erf GELU;
//! attention over every key, padding keys left out by the attention mask.
//!
//! May call: `autograd`, `error`, `nn::hf`, `kernels`, `memory`, `nn::{builder, gpt,
//! init}`, `runtime`, `tensor`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::builder::{Builder, Fill, ParamId};
use super::gpt::{MAX_EMBD, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB};
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::kernels::heads::Heads;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

fn default_ln_eps() -> f64 {
    1e-12
}

fn default_types() -> usize {
    2
}

fn default_act() -> String {
    "gelu".into()
}

/// The fields of transformers' BertConfig that the model uses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BertConfig {
    /// Vocabulary V.
    pub vocab_size: usize,
    /// Width C.
    pub hidden_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Heads.
    pub num_attention_heads: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Positions P.
    pub max_position_embeddings: usize,
    /// Token types (segments).
    #[serde(default = "default_types")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_ln_eps")]
    pub layer_norm_eps: f64,
    /// Must be gelu (exact).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Dropout probabilities (0 to compare a step with transformers').
    #[serde(default)]
    pub hidden_dropout_prob: f32,
    /// See hidden_dropout_prob; attention dropout is not implemented.
    #[serde(default)]
    pub attention_probs_dropout_prob: f32,
    /// Every other field, kept as written.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl BertConfig {
    /// Checks what the engine implements and the sizes it builds.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::invalid("BERT config", m));
        for (key, value, max) in [
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("hidden_size", self.hidden_size, MAX_EMBD),
            ("intermediate_size", self.intermediate_size, 4 * MAX_EMBD),
            ("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("type_vocab_size", self.type_vocab_size, 1 << 16),
        ] {
            if value == 0 || value > max {
                return bad(format!("{key} {value} is not in 1..={max}"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.hidden_act != "gelu" {
            return bad(format!("hidden_act '{}' is not supported (gelu)", self.hidden_act));
        }
        if self.attention_probs_dropout_prob != 0.0 {
            return bad("attention_probs_dropout_prob must be 0 (dropout on attention probabilities is not implemented)".into());
        }
        if !(0.0..1.0).contains(&self.hidden_dropout_prob) {
            return bad(format!("hidden_dropout_prob {} must be in [0, 1)", self.hidden_dropout_prob));
        }
        if let Some(kind) = self.extra.get("position_embedding_type").and_then(|v| v.as_str())
            && kind != "absolute"
        {
            return bad(format!("position_embedding_type '{kind}' is not implemented (absolute)"));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0 && self.layer_norm_eps < 1.0) {
            return bad(format!("layer_norm_eps {} must be a positive number below 1", self.layer_norm_eps));
        }
        Ok(())
    }
}

/// Parameter ids of one encoder layer, in `LAYER_PARAMS` order.
#[derive(Clone, Copy)]
struct Layer {
    ids: [ParamId; 16],
}

const LAYER_PARAMS: [(&str, bool); 8] = [
    ("attention.self.query", true),
    ("attention.self.key", true),
    ("attention.self.value", true),
    ("attention.output.dense", true),
    ("attention.output.LayerNorm", false),
    ("intermediate.dense", true),
    ("output.dense", true),
    ("output.LayerNorm", false),
];

/// The model's inputs beyond the token ids.
pub struct BertInputs<'a> {
    /// Token ids [B, T] (i32).
    pub ids: &'a Tensor,
    /// Segment ids [B, T] (i32); None: all 0.
    pub token_types: Option<&'a Tensor>,
    /// 1 for a token, 0 for padding, per [B, T] position; None: no padding.
    pub attention_mask: Option<&'a [i32]>,
}

/// The model.
pub struct Bert {
    /// Its configuration.
    pub config: BertConfig,
    words: ParamId,
    positions: ParamId,
    types: ParamId,
    embed_ln: [ParamId; 2],
    layers: Vec<Layer>,
    transform: [ParamId; 4],
    decoder_bias: ParamId,
}

impl Bert {
    /// Registers the parameters through `vb` in state-dict order, initialised as
    /// BertForMaskedLM does: normal(0, 0.02) weights, zero biases, unit LayerNorm weights.
    pub fn build(vb: &mut Builder, config: BertConfig) -> Result<Bert, Error> {
        config.validate()?;
        let (c, f) = (config.hidden_size, config.intermediate_size);
        let normal = Fill::Normal(0.02);
        let mut bert = vb.sub("bert");
        let mut e = bert.sub("embeddings");
        let words = e.param("word_embeddings.weight", &[config.vocab_size, c], normal)?;
        let positions = e.param("position_embeddings.weight", &[config.max_position_embeddings, c], normal)?;
        let types = e.param("token_type_embeddings.weight", &[config.type_vocab_size, c], normal)?;
        let embed_ln = [
            e.param("LayerNorm.weight", &[c], Fill::Constant(1.0))?,
            e.param("LayerNorm.bias", &[c], Fill::Constant(0.0))?,
        ];
        let mut layers = Vec::new();
        for i in 0..config.num_hidden_layers {
            let mut l = bert.sub(format!("encoder.layer.{i}"));
            let mut ids = Vec::new();
            for (name, linear) in LAYER_PARAMS {
                let (weight, fill) = match (linear, name) {
                    (true, "intermediate.dense") => (vec![f, c], normal),
                    (true, "output.dense") => (vec![c, f], normal),
                    (true, _) => (vec![c, c], normal),
                    (false, _) => (vec![c], Fill::Constant(1.0)),
                };
                let out = if weight.len() == 2 { weight[0] } else { c };
                ids.push(l.param(&format!("{name}.weight"), &weight, fill)?);
                ids.push(l.param(&format!("{name}.bias"), &[out], Fill::Constant(0.0))?);
            }
            layers.push(Layer {
                ids: ids.try_into().map_err(|_| Error::invalid("BERT", "sixteen tensors a layer"))?,
            });
        }
        let mut p = vb.sub("cls.predictions");
        let decoder_bias = p.param("bias", &[config.vocab_size], Fill::Constant(0.0))?;
        let transform = [
            p.param("transform.dense.weight", &[c, c], normal)?,
            p.param("transform.dense.bias", &[c], Fill::Constant(0.0))?,
            p.param("transform.LayerNorm.weight", &[c], Fill::Constant(1.0))?,
            p.param("transform.LayerNorm.bias", &[c], Fill::Constant(0.0))?,
        ];
        Ok(Bert {
            config,
            words,
            positions,
            types,
            embed_ln,
            layers,
            transform,
            decoder_bias,
        })
    }

    /// Loads config.json and model.safetensors written by transformers' save_pretrained
    /// (a BertForMaskedLM; the tied decoder weight, if the file holds it, is skipped).
    pub fn from_hf_dir(rt: &Runtime, dir: &Path, params: &mut Params) -> Result<Bert, Error> {
        let config: BertConfig = crate::nn::hf::read_config(dir)?;
        config.validate().map_err(|e| Error::format(&dir.join("config.json"), e))?;
        let (c, f, v) = (config.hidden_size as u64, config.intermediate_size as u64, config.vocab_size as u64);
        let layer = 4 * c * c + 2 * c * f + 10 * c + f;
        let numel = (v + config.max_position_embeddings as u64 + config.type_vocab_size as u64 + 4) * c
            + config.num_hidden_layers as u64 * layer
            + c * c
            + 2 * v;
        let mut values = crate::nn::hf::read_weights(rt, dir, 4 * numel + (16 << 20), &|name| {
            (name.starts_with("bert.") || (name.starts_with("cls.predictions.") && !name.starts_with("cls.predictions.decoder.")))
                .then(|| name.to_string())
        })?;
        // A file without the pooler of BertModel has nothing else; one with it keeps it out.
        values.retain(|k, _| !k.starts_with("bert.pooler."));
        let mut init = super::init::Init::new(0);
        Bert::build(&mut Builder::from_values(rt, params, &mut init, &mut values), config)
    }

    /// Writes config.json and model.safetensors in transformers' layout (the decoder tied
    /// to the word embeddings, as save_pretrained leaves it out).
    pub fn save_hf(&self, rt: &Runtime, params: &Params, dir: &Path) -> Result<(), Error> {
        let mut config = serde_json::to_value(&self.config).map_err(|e| Error::invalid("BERT config", e.to_string()))?;
        config["model_type"] = "bert".into();
        config["architectures"] = serde_json::json!(["BertForMaskedLM"]);
        config["tie_word_embeddings"] = true.into();
        super::hf::write_params(rt, params, dir, &config)
    }

    /// The mean masked-LM loss against `labels` ([B*T] i32, -100 where not predicted, and
    /// how many are not): logits = transform(h) E^T + bias over the whole vocabulary.
    pub fn forward_loss(
        &self,
        tape: &mut Tape,
        rt: &Runtime,
        params: &Params,
        inputs: &BertInputs,
        labels: (&Tensor, usize),
    ) -> Result<Var, Error> {
        let [b, t] = *inputs.ids.shape() else {
            return Err(Error::shape("BERT input ids", "[B, T]", format!("{:?}", inputs.ids.shape())));
        };
        let c = &self.config;
        if t > c.max_position_embeddings {
            return Err(Error::shape(
                "BERT input ids",
                format!("a sequence length of at most max_position_embeddings {}", c.max_position_embeddings),
                t,
            ));
        }
        let p = |tape: &mut Tape, id: ParamId| tape.param(params, id.0);
        let eps = c.layer_norm_eps as f32;
        let words = p(tape, self.words)?;
        let pad = c.extra.get("pad_token_id").and_then(|v| v.as_u64()).map(|p| p as usize);
        let tok = ops::embedding_padded(tape, rt, inputs.ids, &words, pad, "word_embeddings")?;
        let pos_ids: Vec<i32> = (0..t as i32).collect();
        let pos_ids = Tensor::from_i32(rt, &pos_ids, &[t], Category::Input, "positions")?;
        let pos_table = p(tape, self.positions)?;
        let pos = ops::embedding(tape, rt, &pos_ids, &pos_table, "position_embeddings")?;
        let zeros;
        let type_ids = match inputs.token_types {
            Some(t) => t,
            None => {
                zeros = Tensor::from_i32(rt, &vec![0; b * t], &[b, t], Category::Input, "token_types")?;
                &zeros
            }
        };
        let type_table = p(tape, self.types)?;
        let typ = ops::embedding(tape, rt, type_ids, &type_table, "token_type_embeddings")?;
        let x = ops::add(tape, rt, &tok, &pos, "embeddings.sum")?;
        let x = ops::add(tape, rt, &x, &typ, "embeddings.sum2")?;
        let (w, bb) = (p(tape, self.embed_ln[0])?, p(tape, self.embed_ln[1])?);
        let x = ops::layernorm(tape, rt, &x, &w, &bb, eps, "embeddings.LayerNorm")?;
        let mut x = ops::dropout(tape, rt, &x, c.hidden_dropout_prob, "embeddings.dropout")?;
        let bias = match inputs.attention_mask {
            Some(mask) => {
                let values: Vec<f32> = mask.iter().map(|&m| if m == 0 { f32::MIN } else { 0.0 }).collect();
                Some(Tensor::from_f32(rt, &values, &[b, 1, 1, t], Category::Input, "attention_mask")?)
            }
            None => None,
        };
        let hs = Heads {
            b,
            t,
            h: c.num_attention_heads,
            kv: c.num_attention_heads,
            d: c.hidden_size / c.num_attention_heads,
        };
        let drop = c.hidden_dropout_prob;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut vars = vec![x.clone()];
            for id in layer.ids {
                vars.push(p(tape, id)?);
            }
            let bias = bias.clone();
            let layer = std::rc::Rc::new(move |tape: &mut Tape, rt: &Runtime, v: &[Var]| {
                encoder_layer(tape, rt, i, (eps, drop, hs, bias.as_ref()), v)
            });
            x = ops::segment(tape, rt, i, &vars, layer)?;
        }
        let [tw, tb, lw, lb] = self.transform.map(|id| p(tape, id));
        let h = ops::linear(tape, rt, &x, &tw?, Some(&tb?), WeightLayout::OutIn, "transform.dense")?;
        let h = ops::gelu_erf(tape, rt, &h, "transform.gelu")?;
        let h = ops::to_f32(tape, rt, &h, "transform.gelu.f32")?;
        let h = ops::layernorm(tape, rt, &h, &lw?, &lb?, eps, "transform.LayerNorm")?;
        let dbias = p(tape, self.decoder_bias)?;
        let logits = ops::linear(tape, rt, &h, &words, Some(&dbias), WeightLayout::OutIn, "decoder")?;
        ops::cross_entropy_mean(tape, rt, &logits, labels.0, labels.1, 2048, "loss")
    }
}

/// One post-LayerNorm encoder layer: LN(x + dense(attention(q, k, v))), then
/// LN(. + dense(gelu(dense(.)))). `v` holds x and the layer's sixteen tensors.
fn encoder_layer(
    tape: &mut Tape,
    rt: &Runtime,
    i: usize,
    (eps, drop, hs, bias): (f32, f32, Heads, Option<&Tensor>),
    v: &[Var],
) -> Result<Var, Error> {
    let l = |n: &str| format!("layer.{i}.{n}");
    let x = &v[0];
    let act = if tape.half_matmuls() { DType::F16 } else { DType::F32 };
    let lin = |tape: &mut Tape, x: &Var, k: usize, out: DType, name: &str| {
        ops::linear_as(tape, rt, x, &v[1 + 2 * k], Some(&v[2 + 2 * k]), WeightLayout::OutIn, out, &l(name))
    };
    let q = lin(tape, x, 0, act, "query")?;
    let k = lin(tape, x, 1, act, "key")?;
    let vv = lin(tape, x, 2, act, "value")?;
    let qkv = ops::pack_heads(tape, rt, (&q, &k, &vv), None, hs, &l("qkv"))?;
    let y = ops::attention_bidirectional(tape, rt, &qkv, hs.h, bias, &l("attention"))?;
    let a = lin(tape, &y, 3, DType::F32, "attention.output.dense")?;
    let a = ops::dropout(tape, rt, &a, drop, &l("attention.output.dropout"))?;
    let x2 = ops::add(tape, rt, x, &a, &l("attention.residual"))?;
    let x2 = ops::layernorm(tape, rt, &x2, &v[9], &v[10], eps, &l("attention.output.LayerNorm"))?;
    let f = lin(tape, &x2, 5, act, "intermediate.dense")?;
    let g = ops::gelu_erf(tape, rt, &f, &l("intermediate.gelu"))?;
    let o = lin(tape, &g, 6, DType::F32, "output.dense")?;
    let o = ops::dropout(tape, rt, &o, drop, &l("output.dropout"))?;
    let x3 = ops::add(tape, rt, &x2, &o, &l("output.residual"))?;
    ops::layernorm(tape, rt, &x3, &v[15], &v[16], eps, &l("output.LayerNorm"))
}
