//! Multi-head self-attention, composed of the batched matmul and the softmax (causal, or
//! over every key with an additive padding bias): S = Q K^T / sqrt(D) (+ bias),
//! P = softmax(S), Y = P V. It stores the
//! [B, NH, T, T] probabilities for backward (a fused kernel that never stores them is
//! the goal; this composite is what is measured in `wgtrain bench`).
//!
//! Q, K and V are read in place from the fused projection qkv [B, T, 3C] through
//! strided views, and Y is written straight into [B, T, C] layout.
//!
//! May call: `error`, `kernels::{map, matmul, softmax}`, `memory`, `runtime`,
//! `tensor`.

use super::matmul::{MatmulOptions, matmul_into};
use super::softmax::{softmax_backward_into, softmax_into};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Q, K or V of qkv [B, T, 3C] as a [B, NH, T, D] view (which = 0, 1, 2).
pub fn head_view(qkv: &Tensor, nh: usize, which: usize) -> Result<Tensor, Error> {
    let [b, t, c3] = qkv.shape() else {
        return Err(Error::shape("attention qkv", "[B, T, 3C]", format!("{:?}", qkv.shape())));
    };
    let (b, t, c3) = (*b, *t, *c3);
    if c3 % 3 != 0 || (c3 / 3) % nh != 0 || !qkv.is_contiguous() {
        return Err(Error::shape(
            "attention qkv",
            format!("a contiguous [B, T, 3C] with C divisible by {nh} heads"),
            format!("{:?}", qkv.shape()),
        ));
    }
    let c = c3 / 3;
    let d = c / nh;
    qkv.as_strided(&[b, nh, t, d], &[t * c3, d, c3, 1], qkv.offset() + which * c)
}

/// [B, T, C] (contiguous) as a [B, NH, T, D] view.
pub fn heads_of(y: &Tensor, nh: usize) -> Result<Tensor, Error> {
    let [b, t, c] = y.shape() else {
        return Err(Error::shape("attention heads", "[B, T, C]", format!("{:?}", y.shape())));
    };
    let (b, t, c) = (*b, *t, *c);
    if c % nh != 0 || !y.is_contiguous() {
        return Err(Error::shape(
            "attention heads",
            format!("a contiguous [B, T, C] with C divisible by {nh} heads"),
            format!("{:?}", y.shape()),
        ));
    }
    let d = c / nh;
    y.as_strided(&[b, nh, t, d], &[t * c, d, c, 1], y.offset())
}

/// What the forward keeps for backward.
pub struct AttentionSaved {
    /// Softmax probabilities [B, NH, T, T].
    pub probs: Tensor,
}

/// Y [B, T, C] = causal attention of qkv [B, T, 3C] with `nh` heads.
pub fn forward(rt: &Runtime, qkv: &Tensor, nh: usize, label: &str) -> Result<(Tensor, AttentionSaved), Error> {
    forward_masked(rt, qkv, nh, (true, None), label)
}

/// Attention of qkv [B, T, 3C], causal or not, with an additive bias on the scores of
/// each example's keys (`key_bias` [B, 1, 1, T] f32: 0 where a key is seen, a large
/// negative number where it is padding), added after the 1/sqrt(D) scaling as
/// transformers' eager attention does.
pub fn forward_masked(
    rt: &Runtime,
    qkv: &Tensor,
    nh: usize,
    (causal, key_bias): (bool, Option<&Tensor>),
    label: &str,
) -> Result<(Tensor, AttentionSaved), Error> {
    let q = head_view(qkv, nh, 0)?;
    let k = head_view(qkv, nh, 1)?;
    let v = head_view(qkv, nh, 2)?;
    let [b, _, t, d] = q.shape().try_into().expect("head views are rank 4");
    let dtype = qkv.dtype();
    let scores = Tensor::empty(rt, &[b, nh, t, t], DType::F32, Category::Temporary, &format!("{label}.preatt"))?;
    let opts = MatmulOptions {
        alpha: 1.0 / (d as f32).sqrt(),
        ..Default::default()
    };
    matmul_into(rt, &q, &k.transpose(2, 3)?, &scores, &opts)?;
    if let Some(bias) = key_bias {
        if bias.shape() != [b, 1, 1, t] || bias.dtype() != DType::F32 {
            return Err(Error::shape(
                "attention key bias",
                format!("f32 [{b}, 1, 1, {t}]"),
                format!("{:?}", bias.shape()),
            ));
        }
        super::map::map_into(rt, super::map::MapOp::Add, Some(&scores), Some(bias), &scores, 1.0, 1.0)?;
    }
    let probs = Tensor::empty(rt, &[b, nh, t, t], dtype, Category::Activation, &format!("{label}.att"))?;
    softmax_into(rt, &scores, &probs, false, causal)?;
    drop(scores);
    let y = Tensor::empty(rt, &[b, t, nh * d], dtype, Category::Activation, label)?;
    matmul_into(rt, &probs, &v, &heads_of(&y, nh)?, &MatmulOptions::default())?;
    Ok((y, AttentionSaved { probs }))
}

/// dqkv [B, T, 3C] (f32 whatever qkv's dtype) from dy [B, T, C].
pub fn backward(rt: &Runtime, qkv: &Tensor, nh: usize, saved: &AttentionSaved, dy: &Tensor, label: &str) -> Result<Tensor, Error> {
    let q = head_view(qkv, nh, 0)?;
    let k = head_view(qkv, nh, 1)?;
    let v = head_view(qkv, nh, 2)?;
    let [b, _, t, d] = q.shape().try_into().expect("head views are rank 4");
    let dy_h = heads_of(dy, nh)?;
    let dqkv = Tensor::empty(rt, qkv.shape(), DType::F32, Category::Temporary, label)?;
    let (dq, dk, dv) = (head_view(&dqkv, nh, 0)?, head_view(&dqkv, nh, 1)?, head_view(&dqkv, nh, 2)?);
    // dV = P^T dY; dP = dY V^T; dS = softmax'(dP) / sqrt(D); dQ = dS K; dK = dS^T Q.
    matmul_into(rt, &saved.probs.transpose(2, 3)?, &dy_h, &dv, &MatmulOptions::default())?;
    let dprobs = Tensor::empty(rt, &[b, nh, t, t], DType::F32, Category::Temporary, &format!("{label}.datt"))?;
    matmul_into(rt, &dy_h, &v.transpose(2, 3)?, &dprobs, &MatmulOptions::default())?;
    // dS overwrites dP in place, read against the probabilities in their own dtype.
    softmax_backward_into(rt, &saved.probs, &dprobs, &dprobs)?;
    let dscores = dprobs;
    let scale = MatmulOptions {
        alpha: 1.0 / (d as f32).sqrt(),
        ..Default::default()
    };
    matmul_into(rt, &dscores, &k, &dq, &scale)?;
    matmul_into(rt, &dscores.transpose(2, 3)?, &q, &dk, &scale)?;
    Ok(dqkv)
}
