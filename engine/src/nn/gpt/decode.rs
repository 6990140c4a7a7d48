//! The GPT one token at a time over a key/value cache (`nn::kv_cache`), for
//! generation: a new token runs every block on one position and attends over the cache;
//! the rest of a block is the training ops with no tape.
//!
//! May call: `autograd`, `error`, `memory`, `nn::{gpt, kv_cache}`, `runtime`, `tensor`.

use super::Gpt;
use crate::autograd::ops::{self, WeightLayout};
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::memory::Category;
use crate::nn::kv_cache::KvCache;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

impl Gpt {
    /// An empty cache for `batch` sequences, sized to the model's whole context
    /// (allocated now: 2 x layers x positions x batch x width f32).
    pub fn kv_cache(&self, rt: &Runtime, batch: usize) -> Result<KvCache, Error> {
        let c = &self.config;
        KvCache::new(
            rt,
            (c.n_layer, c.n_positions, batch),
            (c.n_head, c.n_head, c.n_embd / c.n_head),
            |i| format!("transformer.h.{i}.attn"),
        )
    }

    /// The next-token logits [B, V] after token `ids` [B] (i32, one a sequence) at the
    /// cache's next position, whose keys and values the cache keeps.
    pub fn decode(&self, tape: &mut Tape, rt: &Runtime, params: &Params, cache: &mut KvCache, ids: &Tensor) -> Result<Var, Error> {
        let c = &self.config;
        let b = cache.batch();
        let pos = cache.next_position(ids)?;
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
            let y = cache.attend(rt, &qkv.value, i, pos)?;
            let y = tape.constant(y);
            let a = ops::linear(tape, rt, &y, &v[4], Some(&v[5]), WeightLayout::InOut, &l("attn.c_proj"))?;
            let x2 = ops::add(tape, rt, &x, &a, &l("attn.residual"))?;
            let h = ops::layernorm(tape, rt, &x2, &v[6], &v[7], eps, &l("ln_2"))?;
            let f = ops::linear_as(tape, rt, &h, &v[8], Some(&v[9]), WeightLayout::InOut, act, &l("mlp.c_fc"))?;
            let g = ops::gelu(tape, rt, &f, &l("mlp.act"))?;
            let m = ops::linear(tape, rt, &g, &v[10], Some(&v[11]), WeightLayout::InOut, &l("mlp.c_proj"))?;
            x = ops::add(tape, rt, &x2, &m, &l("mlp.residual"))?;
        }
        cache.advance();
        let (w, bias) = (p(tape, self.ln_f.0)?, p(tape, self.ln_f.1)?);
        let h = ops::layernorm(tape, rt, &x, &w, &bias, eps, "transformer.ln_f")?;
        ops::last_position_logits(tape, rt, &h, &wte)
    }
}
