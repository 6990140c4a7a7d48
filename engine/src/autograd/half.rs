//! f16 copies of f32 weights kept between steps under fp16-mixed ([`HalfWeights`]):
//! the products' ops ask the tape for a weight's copy instead of casting the weight
//! every step (what torch.autocast does within a step), and the optimizer writes each
//! copy in the same pass as the weight's update. The first step casts as before and
//! notes which weights were asked for; the optimizer makes their copies (a cast of the
//! weight, category parameter) before its first update, so from the second step on no
//! weight is cast. (Made in the first forward instead, where the casts were, the char
//! GPT's estimated peak was 1.3 MiB higher than today's; this way it is 0.4 MiB lower.)
//! One device's run only: a registry belongs to one set of parameters.
//!
//! May call: `error`, `kernels`, `memory`, `runtime`, `tensor`. Called by: `autograd::{tape, ops}`,
//! `optim`, the trainer.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Error;
use crate::kernels::tensor_ops::TensorOps;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// A weight by its storage: its block and element count (a whole contiguous f32
/// tensor; no allocation per lookup, which every product of every step makes).
type Key = (u64, usize);

/// The f16 copies of the weights the products read, by weight (see the module).
#[derive(Default)]
pub struct HalfWeights {
    /// Per weight asked for: its copy once made.
    copies: Mutex<HashMap<Key, Option<Tensor>>>,
}

fn key(w: &Tensor) -> Option<Key> {
    (w.dtype() == DType::F32 && w.is_contiguous() && w.offset() == 0 && w.block().category() == Category::Parameter)
        .then(|| (w.block().id(), w.numel()))
}

impl HalfWeights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Option<Tensor>>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The f16 copy of parameter `w` when made; otherwise none, and `w` is noted as
    /// asked for (a tensor that is not a whole f32 parameter never has one).
    pub fn get_or_want(&self, w: &Tensor) -> Option<Tensor> {
        let k = key(w)?;
        self.lock().entry(k).or_default().clone()
    }

    /// The copy of `w`, if made.
    pub fn get(&self, w: &Tensor) -> Option<Tensor> {
        self.lock().get(&key(w)?).cloned().flatten()
    }

    /// Makes `w`'s copy (a cast, labelled `name.f16`, category parameter) when `w` was
    /// asked for and has none yet; returns whether it made one.
    pub fn make_if_wanted(&self, rt: &Runtime, w: &Tensor, name: &str) -> Result<bool, Error> {
        let Some(k) = key(w) else { return Ok(false) };
        let mut copies = self.lock();
        match copies.get_mut(&k) {
            Some(slot @ None) => {
                *slot = Some(w.cast(rt, DType::F16, Category::Parameter, &format!("{name}.f16"))?);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Forgets every copy (the weights were replaced: a checkpoint restored).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Bytes the copies hold.
    pub fn bytes(&self) -> u64 {
        self.lock().values().flatten().map(|t| t.numel() as u64 * 2).sum()
    }
}
