//! Attention's packed input from separate q, k, v projections (shaders/heads.wgsl):
//! grouped-query heads and rotary embeddings applied while packing, and the gradients
//! unpacked (summed over each key/value head's group, rotated back).
//!
//! May call: `error`, `kernels::common`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::common::{check_contiguous, check_tensor, enables, require_f16};
use crate::error::Error;
use crate::memory::Category;
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/heads.wgsl");

/// The heads of one attention: batch, sequence, query heads, key/value heads, head width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads (a divisor of `h`).
    pub kv: usize,
    /// Head width.
    pub d: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    b: u32,
    t: u32,
    h: u32,
    kv: u32,
    d: u32,
    part: u32,
    n: u32,
    pad: u32,
}

/// The template values of one variant (mode 0 pack, 1 unpack).
pub fn variant(mode: u32, ts: DType, td: DType, rope: bool) -> Vec<(&'static str, String)> {
    vec![
        ("ENABLE", enables(&[ts, td])),
        ("TS", ts.wgsl().into()),
        ("TD", td.wgsl().into()),
        ("MODE", mode.to_string()),
        ("ROPE", rope.to_string()),
    ]
}

impl Heads {
    fn check(&self, rope: Option<(&Tensor, &Tensor)>) -> Result<(), Error> {
        if self.h == 0 || self.kv == 0 || !self.h.is_multiple_of(self.kv) {
            return Err(Error::shape(
                "attention heads",
                "key/value heads dividing the query heads",
                format!("{} and {}", self.h, self.kv),
            ));
        }
        let n = self.b * self.t * 3 * self.h * self.d;
        if n > u32::MAX as usize {
            return Err(Error::shape("attention heads", "fewer than 2^32 packed elements", n));
        }
        if let Some((cos, sin)) = rope {
            if !self.d.is_multiple_of(2) {
                return Err(Error::shape("rotary embeddings", "an even head width", self.d));
            }
            for (what, t) in [("rotary cos", cos), ("rotary sin", sin)] {
                check_tensor(what, t, DType::F32)?;
                check_contiguous(what, t, &[self.t, self.d / 2])?;
            }
        }
        Ok(())
    }

    fn params(&self, part: u32, n: usize) -> Params {
        Params {
            b: self.b as u32,
            t: self.t as u32,
            h: self.h as u32,
            kv: self.kv as u32,
            d: self.d as u32,
            part,
            n: n as u32,
            pad: 0,
        }
    }
}

/// qkv [B, T, 3 H D] from q [B, T, H D] and k, v [B, T, KV D], q and k rotated by the
/// (cos, sin) tables [T, D/2] when given; in q's dtype.
pub fn pack(
    rt: &Runtime,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rope: Option<(&Tensor, &Tensor)>,
    hs: Heads,
    label: &str,
) -> Result<Tensor, Error> {
    hs.check(rope)?;
    let dt = q.dtype();
    check_tensor("attention q", q, dt)?;
    check_contiguous("attention q", q, &[hs.b, hs.t, hs.h * hs.d])?;
    for (what, t) in [("attention k", k), ("attention v", v)] {
        check_tensor(what, t, dt)?;
        check_contiguous(what, t, &[hs.b, hs.t, hs.kv * hs.d])?;
    }
    require_f16(rt, &[dt])?;
    let out = Tensor::empty(rt, &[hs.b, hs.t, 3 * hs.h * hs.d], dt, Category::Activation, label)?;
    let n = out.numel();
    let kernel = rt.kernel(
        KernelKey::new("heads", &[0, dt as u32, dt as u32, rope.is_some() as u32]),
        6,
        || format!("heads pack {}{}", dt.wgsl(), if rope.is_some() { " rope" } else { "" }),
        || render("heads", SOURCE, &variant(0, dt, dt, rope.is_some())),
    )?;
    let (cos, sin) = rope.unwrap_or((q, q));
    rt.launch(
        &kernel,
        bytemuck::bytes_of(&hs.params(0, n)),
        &[q, k, v, &out, cos, sin],
        grid(n.div_ceil(256) as u32),
    )?;
    Ok(out)
}

/// The gradients (dq, dk, dv), f32, of [`pack`]'s inputs from the packed gradient
/// `dqkv` [B, T, 3 H D]; `cats` are the categories of the three.
pub fn unpack(rt: &Runtime, dqkv: &Tensor, rope: Option<(&Tensor, &Tensor)>, hs: Heads, cats: [Category; 3]) -> Result<[Tensor; 3], Error> {
    hs.check(rope)?;
    let ts = dqkv.dtype();
    check_tensor("attention dqkv", dqkv, ts)?;
    check_contiguous("attention dqkv", dqkv, &[hs.b, hs.t, 3 * hs.h * hs.d])?;
    require_f16(rt, &[ts])?;
    let kernel = rt.kernel(
        KernelKey::new("heads", &[1, ts as u32, DType::F32 as u32, rope.is_some() as u32]),
        6,
        || format!("heads unpack {}{}", ts.wgsl(), if rope.is_some() { " rope" } else { "" }),
        || render("heads", SOURCE, &variant(1, ts, DType::F32, rope.is_some())),
    )?;
    let (cos, sin) = rope.unwrap_or((dqkv, dqkv));
    let mut out = Vec::new();
    for (part, (heads, name)) in [(hs.h, "dq"), (hs.kv, "dk"), (hs.kv, "dv")].into_iter().enumerate() {
        let t = Tensor::empty(rt, &[hs.b, hs.t, heads * hs.d], DType::F32, cats[part], name)?;
        let n = t.numel();
        rt.launch(
            &kernel,
            bytemuck::bytes_of(&hs.params(part as u32, n)),
            &[dqkv, dqkv, dqkv, &t, cos, sin],
            grid(n.div_ceil(256) as u32),
        )?;
        out.push(t);
    }
    Ok(out.try_into().expect("three gradients"))
}
