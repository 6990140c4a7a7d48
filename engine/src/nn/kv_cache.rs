//! The key/value cache of generation, shared by the decoders (the GPT's in
//! `gpt/decode.rs`, the Llama's in `llama.rs`): each layer keeps the keys and values of
//! the positions so far, so a new token runs every layer on one position and attends
//! over the cache instead of running the whole window again. The caches are f32
//! whatever the precision, [T, B, H, D] per layer and kind (a position's keys for every
//! sequence are one contiguous write), allocated once for the model's whole context
//! under the allocator's `kv_cache` category. Attention over the cache is two batched
//! products and a softmax, as PyTorch's eager attention. Grouped-query models keep their
//! key/value heads only (the packed attention input repeats each for its query heads:
//! one of each group is cached), and a group's queries attend together.
//!
//! May call: `error`, `kernels`, `memory`, `runtime`, `tensor`.

use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::copy_into;
use crate::kernels::matmul::{MatmulOptions, matmul_into};
use crate::kernels::softmax::softmax_into;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Every layer's keys and values of the positions decoded so far.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    batch: usize,
    /// Query heads; the cache holds `kv_heads` of them, each serving heads / kv_heads.
    heads: usize,
    kv_heads: usize,
}

impl KvCache {
    /// An empty cache of `layers` layers for `batch` sequences of up to `positions`
    /// tokens, `heads` query heads of `d` sharing `kv_heads` key/value heads (allocated
    /// now: 2 x layers x positions x batch x kv_heads x d f32); layer i's tensors are
    /// labelled `prefix(i)` + `.key_cache` and `.value_cache`.
    pub fn new(
        rt: &Runtime,
        (layers, positions, batch): (usize, usize, usize),
        (heads, kv_heads, d): (usize, usize, usize),
        prefix: impl Fn(usize) -> String,
    ) -> Result<KvCache, Error> {
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::shape(
                "key/value cache",
                "key/value heads dividing the query heads",
                format!("{kv_heads} of {heads}"),
            ));
        }
        let shape = [positions, batch, kv_heads, d];
        let (mut keys, mut values) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        for i in 0..layers {
            keys.push(Tensor::empty(
                rt,
                &shape,
                DType::F32,
                Category::KvCache,
                &format!("{}.key_cache", prefix(i)),
            )?);
            values.push(Tensor::empty(
                rt,
                &shape,
                DType::F32,
                Category::KvCache,
                &format!("{}.value_cache", prefix(i)),
            )?);
        }
        Ok(KvCache {
            keys,
            values,
            len: 0,
            batch,
            heads,
            kv_heads,
        })
    }

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

    /// Sequences decoded together.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The position the next token goes to, after checking `ids` is one token a
    /// sequence and the cache has room.
    pub fn next_position(&self, ids: &Tensor) -> Result<usize, Error> {
        let b = self.batch;
        if ids.shape() != [b] {
            return Err(Error::shape(
                "decode ids",
                format!("[{b}] (one token a sequence)"),
                format!("{:?}", ids.shape()),
            ));
        }
        if self.len >= self.capacity() {
            return Err(Error::invalid(
                "decode",
                format!("the cache is full: the model reads at most {} positions", self.capacity()),
            ));
        }
        Ok(self.len)
    }

    /// Counts the position every layer has now written.
    pub fn advance(&mut self) {
        self.len += 1;
    }

    /// Attention of the new position's queries over every cached position of block
    /// `layer`, after writing its keys and values at `pos`: qkv [B, 1, 3C] (the packed
    /// attention input, every head's keys and values) in, [B, 1, C] f32 out.
    pub fn attend(&self, rt: &Runtime, qkv: &Tensor, layer: usize, pos: usize) -> Result<Tensor, Error> {
        let (heads, kv) = (self.heads, self.kv_heads);
        let [b, _, three_c] = *qkv.shape() else {
            return Err(Error::shape("cached attention", "qkv [B, 1, 3C]", format!("{:?}", qkv.shape())));
        };
        let c = three_c / 3;
        let d = c / heads;
        let group = heads / kv;
        // This position's keys and values into the caches (cast to f32 on the way): the
        // first query head of each group holds its key/value head.
        if group == 1 {
            // Every head its own (the GPT): each position's keys [1, B, C] in one copy.
            for (cached, from) in [(&self.keys[layer], c), (&self.values[layer], 2 * c)] {
                let src = qkv.slice(2, from, c)?.transpose(0, 1)?;
                copy_into(rt, &src, &cached.slice(0, pos, 1)?.reshape(&[1, b, c])?)?;
            }
        } else {
            let qkv = if qkv.is_contiguous() { qkv.clone() } else { qkv.contiguous(rt)? };
            for (cached, from) in [(&self.keys[layer], c), (&self.values[layer], 2 * c)] {
                // [1, B, KV, D]: sequence b's group j at b * 3C + from + j * G * D.
                let src = qkv.as_strided(&[1, b, kv, d], &[b * three_c, three_c, group * d, 1], qkv.offset() + from)?;
                copy_into(rt, &src, &cached.slice(0, pos, 1)?)?;
            }
        }
        let len = pos + 1;
        // A group's queries together: [B, KV, G, D] (head h is group h / G's member h % G);
        // without groups [B, H, 1, D].
        let q = qkv.slice(2, 0, c)?.cast(rt, DType::F32, Category::Temporary, "decode.q")?;
        let (q, rows) = if group == 1 {
            (q.reshape(&[b, 1, heads, d])?.transpose(1, 2)?, 1)
        } else {
            (q.reshape(&[b, kv, group, d])?, group)
        };
        // [T, B, KV, D] -> [B, KV, T, D]
        let by_head = |t: &Tensor| -> Result<Tensor, Error> { t.slice(0, 0, len)?.transpose(0, 1)?.transpose(1, 2) };
        let keys = by_head(&self.keys[layer])?.transpose(2, 3)?; // [B, KV, D, T]
        let scores = Tensor::empty(rt, &[b, kv, rows, len], DType::F32, Category::Temporary, "decode.scores")?;
        let scaled = MatmulOptions {
            alpha: 1.0 / (d as f32).sqrt(),
            ..Default::default()
        };
        matmul_into(rt, &q, &keys, &scores, &scaled)?;
        let probs = Tensor::empty(rt, &[b, kv, rows, len], DType::F32, Category::Temporary, "decode.probs")?;
        softmax_into(rt, &scores, &probs, false, false)?;
        let y = Tensor::empty(rt, &[b, kv, rows, d], DType::F32, Category::Temporary, "decode.y")?;
        matmul_into(rt, &probs, &by_head(&self.values[layer])?, &y, &MatmulOptions::default())?;
        if group == 1 {
            y.transpose(1, 2)?.contiguous(rt)?.reshape(&[b, 1, c])
        } else {
            y.reshape(&[b, 1, c])
        }
    }
}
