//! GPT with exactly the parameter layout of Hugging Face transformers'
//! GPT2LMHeadModel: `transformer.wte.weight` [V, C], `transformer.wpe.weight` [P, C],
//! per layer `transformer.h.{i}.ln_1`, `attn.c_attn` (Conv1D, weight [C, 3C]),
//! `attn.c_proj` [C, C], `ln_2`, `mlp.c_fc` [C, 4C], `mlp.c_proj` [4C, C], then
//! `transformer.ln_f`; the head is tied to wte; gelu_new; attention scaled by
//! 1/sqrt(head_dim). A model.safetensors and config.json written by save_pretrained
//! load unchanged, and [`Gpt::save_hf`] writes files transformers loads back.
//! Generation one token at a time over a key/value cache is in `gpt/decode.rs`.
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `nn::{builder, init}`, `runtime`,
//! `tensor`.

mod decode;
pub use super::kv_cache::KvCache;
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::builder::{Builder, Fill};
use super::init::Init;
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::MapOp;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// The fields of transformers' GPT2Config that the model uses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size V.
    pub vocab_size: usize,
    /// Context length P (rows of wpe).
    pub n_positions: usize,
    /// Width C.
    pub n_embd: usize,
    /// Layers L.
    pub n_layer: usize,
    /// Heads NH.
    pub n_head: usize,
    /// LayerNorm epsilon (kept as written, so that a saved config round-trips).
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// Must be gelu_new (GPT-2's tanh approximation).
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// Dropout after each block's attention and MLP projections (training mode only).
    #[serde(default)]
    pub resid_pdrop: f32,
    /// Dropout of the embeddings' sum.
    #[serde(default)]
    pub embd_pdrop: f32,
    /// Dropout of attention probabilities: only 0 trains (the fused attention keeps
    /// no probabilities to drop).
    #[serde(default)]
    pub attn_pdrop: f32,
    /// Every other field of config.json, written back unchanged by save_hf.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_activation() -> String {
    "gelu_new".into()
}

/// Most layers of a GPT the engine builds.
pub const MAX_LAYERS: usize = 1024;
/// Most attention heads.
pub const MAX_HEADS: usize = 1024;
/// Widest embedding.
pub const MAX_EMBD: usize = 1 << 16;
/// Longest context (n_positions, block_size).
pub const MAX_POSITIONS: usize = 1 << 20;
/// Largest vocabulary.
pub const MAX_VOCAB: usize = 1 << 24;

impl GptConfig {
    /// Checks what the engine implements, and sizes against the bounds above (checked
    /// before anything is allocated: a config.json asking for 10^11 layers is refused,
    /// not attempted).
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::invalid("GPT config", m));
        for (key, value, max) in [
            ("n_layer", self.n_layer, MAX_LAYERS),
            ("n_head", self.n_head, MAX_HEADS),
            ("n_embd", self.n_embd, MAX_EMBD),
            ("n_positions", self.n_positions, MAX_POSITIONS),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
        ] {
            if value > max {
                return bad(format!("{key} {value} is above the largest the engine builds ({max})"));
            }
        }
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!("n_embd {} is not divisible by n_head {}", self.n_embd, self.n_head));
        }
        let head = self.n_embd / self.n_head;
        if !head.is_multiple_of(4) || head > crate::kernels::flash_attention::MAX_HEAD {
            return bad(format!(
                "head size n_embd / n_head = {head} is not supported by the fused attention (a multiple of 4 up to {})",
                crate::kernels::flash_attention::MAX_HEAD
            ));
        }
        if self.vocab_size == 0 || self.n_positions == 0 || self.n_layer == 0 {
            return bad("vocab_size, n_positions and n_layer must be positive".into());
        }
        // LayerNorm divides by sqrt(var + eps): a negative or non-finite epsilon gives
        // NaN losses, not an error.
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0 && self.layer_norm_epsilon < 1.0) {
            return bad(format!(
                "layer_norm_epsilon {} must be a positive number below 1",
                self.layer_norm_epsilon
            ));
        }
        if !["gelu_new", "gelu_pytorch_tanh"].contains(&self.activation_function.as_str()) {
            return bad(format!(
                "activation_function '{}' is not supported (gelu_new)",
                self.activation_function
            ));
        }
        let flag = |k: &str| self.extra.get(k).and_then(|v| v.as_bool());
        if flag("scale_attn_by_inverse_layer_idx") == Some(true)
            || flag("reorder_and_upcast_attn") == Some(true)
            || flag("scale_attn_weights") == Some(false)
        {
            return bad("only GPT-2's standard attention scaling (1/sqrt(head_dim)) is supported".into());
        }
        if let Some(inner) = self.extra.get("n_inner").and_then(|v| v.as_u64())
            && inner as usize != 4 * self.n_embd
        {
            return bad(format!("n_inner {inner} is not supported (the MLP is 4 * n_embd wide)"));
        }
        Ok(())
    }

    /// Whether any dropout probability is non-zero (a step then draws masks PyTorch does
    /// not, so `wgtrain step` refuses it).
    pub fn has_dropout(&self) -> bool {
        self.resid_pdrop > 0.0 || self.embd_pdrop > 0.0 || self.attn_pdrop > 0.0
    }
}

/// Parameter indices of one block.
struct Block {
    ln_1: (usize, usize),
    c_attn: (usize, usize),
    attn_proj: (usize, usize),
    ln_2: (usize, usize),
    c_fc: (usize, usize),
    mlp_proj: (usize, usize),
}

/// The model.
pub struct Gpt {
    /// Its configuration.
    pub config: GptConfig,
    wte: usize,
    wpe: usize,
    blocks: Vec<Block>,
    ln_f: (usize, usize),
}

/// Every parameter name and shape of a config, in state-dict order.
pub fn parameter_shapes(c: &GptConfig) -> Vec<(String, Vec<usize>)> {
    let e = c.n_embd;
    let mut out = vec![
        ("transformer.wte.weight".to_string(), vec![c.vocab_size, e]),
        ("transformer.wpe.weight".to_string(), vec![c.n_positions, e]),
    ];
    for i in 0..c.n_layer {
        let p = |n: &str| format!("transformer.h.{i}.{n}");
        out.extend([
            (p("ln_1.weight"), vec![e]),
            (p("ln_1.bias"), vec![e]),
            (p("attn.c_attn.weight"), vec![e, 3 * e]),
            (p("attn.c_attn.bias"), vec![3 * e]),
            (p("attn.c_proj.weight"), vec![e, e]),
            (p("attn.c_proj.bias"), vec![e]),
            (p("ln_2.weight"), vec![e]),
            (p("ln_2.bias"), vec![e]),
            (p("mlp.c_fc.weight"), vec![e, 4 * e]),
            (p("mlp.c_fc.bias"), vec![4 * e]),
            (p("mlp.c_proj.weight"), vec![4 * e, e]),
            (p("mlp.c_proj.bias"), vec![e]),
        ]);
    }
    out.push(("transformer.ln_f.weight".into(), vec![e]));
    out.push(("transformer.ln_f.bias".into(), vec![e]));
    out
}

impl Gpt {
    /// Registers the parameters through `vb` in state-dict order, as GPT2LMHeadModel
    /// initialises them: normal(0, 0.02) weights, zero biases, unit LayerNorm weights,
    /// c_proj weights scaled by 1/sqrt(2 L) (a builder over given values takes those).
    pub fn build(vb: &mut Builder, config: GptConfig) -> Result<Gpt, Error> {
        config.validate()?;
        let proj_std = 0.02 / (2.0 * config.n_layer as f32).sqrt();
        let mut index = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let fill = if name.contains("ln_") && name.ends_with("weight") {
                Fill::Constant(1.0)
            } else if name.ends_with("bias") {
                Fill::Constant(0.0)
            } else if name.ends_with("c_proj.weight") {
                Fill::Normal(proj_std)
            } else {
                Fill::Normal(0.02)
            };
            let id = vb.param(&name, &shape, fill)?;
            index.insert(name, id.0);
        }
        let at = |n: String| index[&n];
        let pair = |i: usize, n: &str| {
            (
                at(format!("transformer.h.{i}.{n}.weight")),
                at(format!("transformer.h.{i}.{n}.bias")),
            )
        };
        let blocks = (0..config.n_layer)
            .map(|i| Block {
                ln_1: pair(i, "ln_1"),
                c_attn: pair(i, "attn.c_attn"),
                attn_proj: pair(i, "attn.c_proj"),
                ln_2: pair(i, "ln_2"),
                c_fc: pair(i, "mlp.c_fc"),
                mlp_proj: pair(i, "mlp.c_proj"),
            })
            .collect();
        Ok(Gpt {
            wte: at("transformer.wte.weight".into()),
            wpe: at("transformer.wpe.weight".into()),
            ln_f: (at("transformer.ln_f.weight".into()), at("transformer.ln_f.bias".into())),
            blocks,
            config,
        })
    }

    /// Registers parameters from `values` (name -> tensor), which must hold every one.
    pub fn from_tensors(rt: &Runtime, config: GptConfig, params: &mut Params, mut values: BTreeMap<String, Tensor>) -> Result<Gpt, Error> {
        Gpt::build(&mut Builder::from_values(rt, params, &mut Init::new(0), &mut values), config)
    }

    /// A freshly initialised model (see [`Gpt::build`]).
    pub fn new(rt: &Runtime, config: GptConfig, params: &mut Params, init: &mut Init) -> Result<Gpt, Error> {
        Gpt::build(&mut Builder::new(rt, params, init), config)
    }

    /// Loads config.json and model.safetensors written by transformers' save_pretrained.
    pub fn from_hf_dir(rt: &Runtime, dir: &Path, params: &mut Params) -> Result<Gpt, Error> {
        let config: GptConfig = crate::nn::hf::read_config(dir)?;
        config.validate().map_err(|e| Error::format(&dir.join("config.json"), e))?;
        // Sizes first (the shapes of a config asking for 10^11 layers are never listed),
        // then a bound on the weights' file: every parameter in f32, older files' causal
        // mask buffers ([1, 1, T, T] a layer), and the header.
        let numel: u64 = parameter_shapes(&config)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum();
        let masks = (config.n_layer * config.n_positions * config.n_positions) as u64;
        let wanted: BTreeMap<String, Vec<usize>> = parameter_shapes(&config).into_iter().collect();
        // Older files prefix nothing or carry the tied head and attention-mask buffers
        // (lm_head.weight, attn.bias, attn.masked_bias: skipped).
        let values = crate::nn::hf::read_weights(rt, dir, 4 * (numel + masks) + (16 << 20), &|name| {
            [name.to_string(), format!("transformer.{name}")]
                .into_iter()
                .find(|k| wanted.contains_key(k))
        })?;
        Gpt::from_tensors(rt, config, params, values)
    }

    /// Writes config.json and model.safetensors in transformers' layout (head tied).
    pub fn save_hf(&self, rt: &Runtime, params: &Params, dir: &Path) -> Result<(), Error> {
        let mut config = serde_json::to_value(&self.config).expect("config serializes");
        config["model_type"] = "gpt2".into();
        config["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        config["tie_word_embeddings"] = true.into();
        let mut data = Vec::new();
        for (name, _) in parameter_shapes(&self.config) {
            let p = &params.list[params.find(&name).expect("registered")];
            data.push((name, p.value.shape().to_vec(), p.value.to_f32_vec(rt)?));
        }
        crate::nn::hf::write_folder(dir, &config, &data)
    }

    /// Logits [B, T, V] of token ids [B, T] (i32).
    pub fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        let (h, wte) = self.trunk(tape, rt, params, ids)?;
        // The head is tied: logits = h wte^T.
        ops::linear(tape, rt, &h, &wte, None, WeightLayout::OutIn, "lm_head")
    }

    /// The next-token logits [B, V] after token ids [B, T] (generation: the head on the
    /// last position only).
    pub fn next_token_logits(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<Var, Error> {
        let (h, wte) = self.trunk(tape, rt, params, ids)?;
        ops::last_position_logits(tape, rt, &h, &wte)
    }

    /// The mean next-token loss against `targets` ([B*T] i32, -100 ignored, and how many
    /// are not ignored) through the
    /// fused head + cross-entropy, which holds [row_chunk, V] logits at a time, never
    /// the whole [B*T, V] logits and their gradient.
    pub fn forward_loss(
        &self,
        tape: &mut Tape,
        rt: &Runtime,
        params: &Params,
        ids: &Tensor,
        targets: (&Tensor, usize),
        row_chunk: usize,
    ) -> Result<Var, Error> {
        let (h, wte) = self.trunk(tape, rt, params, ids)?;
        ops::lm_head_cross_entropy(tape, rt, &h, &wte, targets, row_chunk, "loss")
    }

    /// The final hidden states [B, T, C] (after ln_f) and the wte leaf (the tied head).
    fn trunk(&self, tape: &mut Tape, rt: &Runtime, params: &Params, ids: &Tensor) -> Result<(Var, Var), Error> {
        let [b, t] = ids.shape() else {
            return Err(Error::shape("GPT input ids", "[B, T]", format!("{:?}", ids.shape())));
        };
        let (b, t) = (*b, *t);
        if t > self.config.n_positions {
            return Err(Error::shape(
                "GPT input ids",
                format!("a sequence length of at most n_positions {}", self.config.n_positions),
                t,
            ));
        }
        let c = &self.config;
        let p = |tape: &mut Tape, i: usize| tape.param(params, i);
        let wte = p(tape, self.wte)?;
        let wpe = p(tape, self.wpe)?;
        let tok = ops::embedding(tape, rt, ids, &wte, "transformer.wte")?;
        let positions: Vec<i32> = (0..t as i32).collect();
        let pos_ids = Tensor::from_i32(rt, &positions, &[t], Category::Input, "positions")?;
        let pos = ops::embedding(tape, rt, &pos_ids, &wpe, "transformer.wpe")?;
        let x = ops::add(tape, rt, &tok, &pos, "transformer.embeddings")?;
        let mut x = ops::dropout(tape, rt, &x, c.embd_pdrop, "transformer.drop")?;
        let (eps, nh, drop) = (c.layer_norm_epsilon as f32, c.n_head, c.resid_pdrop);
        // Without recomputed segments, each block's last residual add runs in the next
        // LayerNorm's launch (the next block's ln_1, or ln_f): the block hands on the two
        // terms, `pending`.
        let fused = tape.mode().checkpoint_every == 0;
        let mut pending: Option<(Var, Var)> = None;
        for (i, blk) in self.blocks.iter().enumerate() {
            let ids = [blk.ln_1, blk.c_attn, blk.attn_proj, blk.ln_2, blk.c_fc, blk.mlp_proj];
            let mut vars = vec![x.clone()];
            for (w, bias) in ids {
                vars.push(p(tape, w)?);
                vars.push(p(tape, bias)?);
            }
            if fused {
                let input = match pending.take() {
                    Some(terms) => Input::Pending(terms, format!("transformer.h.{}.mlp.residual", i - 1)),
                    None => Input::Sum(x.clone()),
                };
                pending = Some(block_terms(tape, rt, i, (eps, nh, drop), input, &vars[1..])?);
                continue;
            }
            // The tape's mode says how often a block is recomputed in backward.
            let segment = std::rc::Rc::new(move |tape: &mut Tape, rt: &Runtime, v: &[Var]| block(tape, rt, i, (eps, nh, drop), v));
            x = ops::segment(tape, rt, i, &vars, segment)?;
        }
        let (w, bb) = (p(tape, self.ln_f.0)?, p(tape, self.ln_f.1)?);
        let h = match pending {
            Some((x2, m)) => {
                let last = format!("transformer.h.{}.mlp.residual", self.blocks.len() - 1);
                ops::add_layernorm_as(tape, rt, (&x2, &m), &w, &bb, eps, DType::F32, (&last, "transformer.ln_f"))?.1
            }
            None => ops::layernorm(tape, rt, &x, &w, &bb, eps, "transformer.ln_f")?,
        };
        debug_assert_eq!(h.value.shape(), &[b, t, c.n_embd]);
        Ok((h, wte))
    }
}

/// One transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)). `v` holds x and the
/// block's 12 parameters in state-dict order.
fn block(tape: &mut Tape, rt: &Runtime, i: usize, consts: (f32, usize, f32), v: &[Var]) -> Result<Var, Error> {
    let (x2, m) = block_terms(tape, rt, i, consts, Input::Sum(v[0].clone()), &v[1..])?;
    ops::add(tape, rt, &x2, &m, &format!("transformer.h.{i}.mlp.residual"))
}

/// A block's input: the residual stream, or the previous block's two last terms (added
/// in ln_1's launch into the sum labelled `.1`).
enum Input {
    Sum(Var),
    Pending((Var, Var), String),
}

/// A block up to its last residual add: the two terms (x2, m) whose sum is its output.
/// `p` holds the block's 12 parameters in state-dict order.
fn block_terms(
    tape: &mut Tape,
    rt: &Runtime,
    i: usize,
    (eps, nh, drop): (f32, usize, f32),
    input: Input,
    p: &[Var],
) -> Result<(Var, Var), Error> {
    let l = |n: &str| format!("transformer.h.{i}.{n}");
    // Under fp16-mixed the projections feeding attention and GELU write f16, and so do
    // the LayerNorms feeding the projections.
    let act = if tape.half_matmuls() { DType::F16 } else { DType::F32 };
    let (x, h) = match input {
        Input::Sum(x) => {
            let h = ops::layernorm_as(tape, rt, &x, &p[0], &p[1], eps, act, &l("ln_1"))?;
            (x, h)
        }
        Input::Pending((a, b), sum_label) => ops::add_layernorm_as(tape, rt, (&a, &b), &p[0], &p[1], eps, act, (&sum_label, &l("ln_1")))?,
    };
    let qkv = ops::linear_as(tape, rt, &h, &p[2], Some(&p[3]), WeightLayout::InOut, act, &l("attn.c_attn"))?;
    let y = ops::attention(tape, rt, &qkv, nh, &l("attn"))?;
    let a = ops::linear(tape, rt, &y, &p[4], Some(&p[5]), WeightLayout::InOut, &l("attn.c_proj"))?;
    let a = ops::dropout(tape, rt, &a, drop, &l("attn.resid_dropout"))?;
    // The residual add and ln_2 in one launch.
    let (x2, h) = ops::add_layernorm_as(tape, rt, (&x, &a), &p[6], &p[7], eps, act, (&l("attn.residual"), &l("ln_2")))?;
    // One node keeping c_fc's output, not GELU's: backward writes GELU's output again in
    // the bias-sum pass that writes c_fc's dy, which runs GELU's backward too.
    let (fc, proj) = ((&p[8], Some(&p[9])), (&p[10], Some(&p[11])));
    let labels = [l("mlp.c_fc"), l("mlp.act"), l("mlp.c_proj")];
    let m = ops::mlp(
        tape,
        rt,
        &h,
        fc,
        MapOp::Gelu,
        proj,
        WeightLayout::InOut,
        act,
        labels.each_ref().map(String::as_str),
    )?;
    let m = ops::dropout(tape, rt, &m, drop, &l("mlp.dropout"))?;
    Ok((x2, m))
}

/// Targets for GPT2LMHeadModel's loss: labels shifted left by one, the last position
/// of each row ignored (-100).
pub fn shifted_targets(labels: &[i32], b: usize, t: usize) -> Vec<i32> {
    let mut out = vec![crate::kernels::cross_entropy::IGNORE_INDEX; b * t];
    for r in 0..b {
        for j in 0..t.saturating_sub(1) {
            out[r * t + j] = labels[r * t + j + 1];
        }
    }
    out
}
