//! The GPT one token at a time with a key/value cache, for generation: each block keeps
//! the keys and values of the positions so far ([`KvCache`]), so a new token runs every
//! layer on one position and attends over the cache, instead of running the whole
//! window again. The caches are f32 whatever the precision, [T, B, H, D] per layer and
//! kind (a position's keys for every sequence are one contiguous write), allocated once
//! for the model's whole context. Attention over the cache is two batched products and
//! a softmax, as PyTorch's eager attention; the rest of a block is the training ops
//! with no tape.
//!
//! May call: `autograd`, `error`, `kernels`, `memory`, `nn::gpt`, `runtime`, `tensor`.

use super::Gpt;
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::copy_into;
use crate::kernels::matmul::{MatmulOptions, matmul_into};
use crate::kernels::softmax::softmax_into;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Every block's keys and values of the positions decoded so far.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    batch: usize,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions it can hold (the model's context).
    pub fn capacity(&self) -> usize {
        self.keys.first().map_or(0, |k| k.shape()[0])
    }
}

impl Gpt {
    /// An empty cache for `batch` sequences, sized to the model's whole context
    /// (allocated now: 2 x layers x positions x batch x width f32).
    pub fn kv_cache(&self, rt: &Runtime, batch: usize) -> Result<KvCache, Error> {
        let c = &self.config;
        let (h, d) = (c.n_head, c.n_embd / c.n_head);
        let shape = [c.n_positions, batch, h, d];
        let mut keys = Vec::with_capacity(c.n_layer);
        let mut values = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let label = |kind: &str| format!("transformer.h.{i}.attn.{kind}_cache");
            keys.push(Tensor::empty(rt, &shape, DType::F32, Category::KvCache, &label("key"))?);
            values.push(Tensor::empty(rt, &shape, DType::F32, Category::KvCache, &label("value"))?);
        }
        Ok(KvCache {
            keys,
            values,
            len: 0,
            batch,
        })
    }

    /// The next-token logits [B, V] after token `ids` [B] (i32, one a sequence) at the
    /// cache's next position, whose keys and values the cache keeps.
    pub fn decode(&self, tape: &mut Tape, rt: &Runtime, params: &Params, cache: &mut KvCache, ids: &Tensor) -> Result<Var, Error> {
        let c = &self.config;
        let b = cache.batch;
        if ids.shape() != [b] {
            return Err(Error::shape(
                "decode ids",
                format!("[{b}] (one token a sequence)"),
                format!("{:?}", ids.shape()),
            ));
        }
        let pos = cache.len;
        if pos >= cache.capacity() {
            return Err(Error::invalid(
                "decode",
                format!("the cache is full: the model reads at most {} positions", cache.capacity()),
            ));
        }
        let p = |tape: &mut Tape, i: usize| tape.param(params, i);
        let wte = p(tape, self.wte)?;
        let wpe = p(tape, self.wpe)?;
        let tok = ops::embedding(tape, rt, &ids.reshape(&[b, 1])?, &wte, "transformer.wte")?;
        let at = Tensor::from_i32(rt, &[pos as i32], &[1], Category::Input, "position")?;
        let pe = ops::embedding(tape, rt, &at, &wpe, "transformer.wpe")?;
        let mut x = ops::add(tape, rt, &tok, &pe, "transformer.embeddings")?;
        let act = if tape.half_matmuls() { DType::F16 } else { DType::F32 };
        let eps = c.layer_norm_epsilon as f32;
        for (i, blk) in self.blocks.iter().enumerate() {
            let l = |n: &str| format!("transformer.h.{i}.{n}");
            let v: Vec<Var> = [blk.ln_1, blk.c_attn, blk.attn_proj, blk.ln_2, blk.c_fc, blk.mlp_proj]
                .into_iter()
                .flat_map(|(w, bias)| [w, bias])
                .map(|id| p(tape, id))
                .collect::<Result<_, _>>()?;
            let h = ops::layernorm(tape, rt, &x, &v[0], &v[1], eps, &l("ln_1"))?;
            let qkv = ops::linear_as(tape, rt, &h, &v[2], Some(&v[3]), WeightLayout::InOut, act, &l("attn.c_attn"))?;
            let y = cached_attention(rt, &qkv.value, cache, i, pos, c.n_head)?;
            let y = tape.constant(y);
            let a = ops::linear(tape, rt, &y, &v[4], Some(&v[5]), WeightLayout::InOut, &l("attn.c_proj"))?;
            let x2 = ops::add(tape, rt, &x, &a, &l("attn.residual"))?;
            let h = ops::layernorm(tape, rt, &x2, &v[6], &v[7], eps, &l("ln_2"))?;
            let f = ops::linear_as(tape, rt, &h, &v[8], Some(&v[9]), WeightLayout::InOut, act, &l("mlp.c_fc"))?;
            let g = ops::gelu(tape, rt, &f, &l("mlp.act"))?;
            let m = ops::linear(tape, rt, &g, &v[10], Some(&v[11]), WeightLayout::InOut, &l("mlp.c_proj"))?;
            x = ops::add(tape, rt, &x2, &m, &l("mlp.residual"))?;
        }
        cache.len += 1;
        let (w, bias) = (p(tape, self.ln_f.0)?, p(tape, self.ln_f.1)?);
        let h = ops::layernorm(tape, rt, &x, &w, &bias, eps, "transformer.ln_f")?;
        ops::last_position_logits(tape, rt, &h, &wte)
    }
}

/// Attention of the new position's queries over every cached position of block
/// `layer`, after writing its keys and values at `pos`: qkv [B, 1, 3C] in, [B, 1, C] f32
/// out.
fn cached_attention(rt: &Runtime, qkv: &Tensor, cache: &KvCache, layer: usize, pos: usize, heads: usize) -> Result<Tensor, Error> {
    let [b, _, three_c] = *qkv.shape() else {
        return Err(Error::shape("cached attention", "qkv [B, 1, 3C]", format!("{:?}", qkv.shape())));
    };
    let c = three_c / 3;
    let d = c / heads;
    // This position's keys and values into the caches (cast to f32 on the way).
    for (cached, from) in [(&cache.keys[layer], c), (&cache.values[layer], 2 * c)] {
        let src = qkv.slice(2, from, c)?.transpose(0, 1)?;
        copy_into(rt, &src, &cached.slice(0, pos, 1)?.reshape(&[1, b, c])?)?;
    }
    let len = pos + 1;
    let q = qkv.slice(2, 0, c)?.cast(rt, DType::F32, Category::Temporary, "decode.q")?;
    let q = q.reshape(&[b, 1, heads, d])?.transpose(1, 2)?; // [B, H, 1, D]
    // [T, B, H, D] -> [B, H, T, D]
    let by_head = |t: &Tensor| -> Result<Tensor, Error> { t.slice(0, 0, len)?.transpose(0, 1)?.transpose(1, 2) };
    let keys = by_head(&cache.keys[layer])?.transpose(2, 3)?; // [B, H, D, T]
    let scores = Tensor::empty(rt, &[b, heads, 1, len], DType::F32, Category::Temporary, "decode.scores")?;
    let scaled = MatmulOptions {
        alpha: 1.0 / (d as f32).sqrt(),
        ..Default::default()
    };
    matmul_into(rt, &q, &keys, &scores, &scaled)?;
    let probs = Tensor::empty(rt, &[b, heads, 1, len], DType::F32, Category::Temporary, "decode.probs")?;
    softmax_into(rt, &scores, &probs, false, false)?;
    let y = Tensor::empty(rt, &[b, heads, 1, d], DType::F32, Category::Temporary, "decode.y")?;
    matmul_into(rt, &probs, &by_head(&cache.values[layer])?, &y, &MatmulOptions::default())?;
    y.transpose(1, 2)?.contiguous(rt)?.reshape(&[b, 1, c])
}
