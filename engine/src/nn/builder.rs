//! Where a model's parameters come from: a builder that names each one by its path
//! (`h.0.attn.c_attn.weight`, as PyTorch's state dicts and candle's VarBuilder do),
//! initialises it from the run's seed, and registers it in `Params`. Everything that
//! follows parameters (checkpoints, safetensors, the allocator's block labels, the
//! estimate, the dashboard's peak table, ZeRO shards, offload) goes by these names.
//!
//! May call: `autograd`, `error`, `nn::init`, `runtime`, `tensor`. Called by: layers and
//! models (the engine's and a user's).

use std::collections::BTreeMap;

use super::init::Init;
use crate::autograd::{Params, Tape, Var};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// A parameter registered by a [`Builder`]: its index in `Params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamId(pub usize);

/// A buffer registered by a [`Builder`] (an index into [`Params::buffers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferId(pub usize);

/// How a new parameter is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// Uniform in [-bound, bound) (torch.nn.Linear's default with bound 1/sqrt(fan_in)).
    Uniform(f32),
    /// Normal(0, std) (GPT-2's and BERT's 0.02, torch.nn.Embedding's 1).
    Normal(f32),
    /// Every element `value` (norm weights 1, biases 0).
    Constant(f32),
}

/// Registers parameters under a path prefix. `sub("h")` is a builder for the names
/// below `h.`; parameters are registered in call order (the state dict's order).
pub struct Builder<'a> {
    rt: &'a Runtime,
    params: &'a mut Params,
    init: &'a mut Init,
    prefix: String,
    /// Values to take instead of initialising (a loaded checkpoint), by full name.
    given: Option<&'a mut BTreeMap<String, Tensor>>,
}

impl<'a> Builder<'a> {
    /// A builder at the root, initialising from `init`.
    pub fn new(rt: &'a Runtime, params: &'a mut Params, init: &'a mut Init) -> Builder<'a> {
        Builder {
            rt,
            params,
            init,
            prefix: String::new(),
            given: None,
        }
    }

    /// A builder that takes every parameter from `values` (name -> tensor, moved out as
    /// they are used) instead of initialising it; a missing name or a wrong shape is an
    /// error naming it.
    pub fn from_values(
        rt: &'a Runtime,
        params: &'a mut Params,
        init: &'a mut Init,
        values: &'a mut BTreeMap<String, Tensor>,
    ) -> Builder<'a> {
        Builder {
            given: Some(values),
            ..Builder::new(rt, params, init)
        }
    }

    /// The runtime parameters are created on.
    pub fn rt(&self) -> &'a Runtime {
        self.rt
    }

    /// A builder for the names under `name` (`h` then `0` gives `h.0.`).
    pub fn sub(&mut self, name: impl std::fmt::Display) -> Builder<'_> {
        let prefix = self.path(&name.to_string());
        Builder {
            rt: self.rt,
            params: &mut *self.params,
            init: &mut *self.init,
            prefix,
            given: self.given.as_deref_mut(),
        }
    }

    /// The full name of `name` under this builder's prefix.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else if name.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Registers the parameter `name` of `shape`, filled as `fill` says (or taken from
    /// the given values). A tensor larger than one storage binding of the adapter is
    /// refused before anything is allocated, and so is a name registered twice.
    pub fn param(&mut self, name: &str, shape: &[usize], fill: Fill) -> Result<ParamId, Error> {
        let full = self.path(name);
        if self.params.find(&full).is_some() {
            return Err(Error::invalid("model parameters", format!("{full} is registered twice")));
        }
        let elements = shape.iter().fold(1u128, |a, &d| a * d as u128);
        let max_binding = self.rt.gpu.caps.limits.max_storage_buffer_binding_size as u128;
        if elements * 4 > max_binding {
            return Err(Error::invalid(
                "model parameters",
                format!(
                    "the parameter {full} {shape:?} ({}) is larger than one buffer binding on '{}' ({}); make the model smaller",
                    crate::memory::format_bytes((elements * 4).min(u64::MAX as u128) as u64),
                    self.rt.gpu.report.name,
                    crate::memory::format_bytes(max_binding as u64)
                ),
            ));
        }
        let value = match self.given.as_deref_mut() {
            Some(values) => {
                let t = values
                    .remove(&full)
                    .ok_or_else(|| Error::invalid("model parameters", format!("missing parameter {full}")))?;
                if t.shape() != shape {
                    return Err(Error::shape(&full, format!("{shape:?}"), format!("{:?}", t.shape())));
                }
                t
            }
            None => match fill {
                Fill::Uniform(bound) => self.init.uniform(self.rt, shape, bound, &full)?,
                Fill::Normal(std) => self.init.normal(self.rt, shape, std, &full)?,
                Fill::Constant(v) => self.init.constant(self.rt, shape, v, &full)?,
            },
        };
        Ok(ParamId(self.params.add(&full, value)))
    }

    /// Registers the buffer `name` (state no optimizer touches: running statistics) of
    /// `shape`, filled with `value` (or taken from the given values, which may omit it:
    /// a checkpoint of a model without buffers).
    pub fn buffer(&mut self, name: &str, shape: &[usize], value: f32) -> Result<BufferId, Error> {
        let full = self.path(name);
        if self.params.find_buffer(&full).is_some() || self.params.find(&full).is_some() {
            return Err(Error::invalid("model buffers", format!("{full} is registered twice")));
        }
        let given = match self.given.as_deref_mut() {
            Some(values) => values.remove(&full),
            None => None,
        };
        let value = match given {
            Some(t) if t.numel() != shape.iter().product::<usize>() => {
                return Err(Error::shape(&full, format!("{shape:?}"), format!("{:?}", t.shape())));
            }
            Some(t) => t.reshape(shape)?,
            None => self.init.constant(self.rt, shape, value, &full)?,
        };
        Ok(BufferId(self.params.add_buffer(&full, value)))
    }
}

/// What a layer's forward runs with: the tape (and through it the mode: training or
/// evaluation, the pass's seed, checkpointing), the runtime and the parameters.
pub struct Ctx<'a> {
    /// The tape the forward pass records on.
    pub tape: &'a mut Tape,
    /// The device and allocator.
    pub rt: &'a Runtime,
    /// The model's parameters.
    pub params: &'a Params,
    bound: Vec<(ParamId, Var)>,
}

impl<'a> Ctx<'a> {
    /// A context over `tape`, `rt` and `params`.
    pub fn new(tape: &'a mut Tape, rt: &'a Runtime, params: &'a Params) -> Ctx<'a> {
        Ctx {
            tape,
            rt,
            params,
            bound: Vec::new(),
        }
    }

    /// This context with parameters given as values (a checkpointed segment's inputs:
    /// its parameters enter it as Vars, so the recompute's gradients reach them).
    pub fn with_bound(mut self, bound: impl IntoIterator<Item = (ParamId, Var)>) -> Ctx<'a> {
        self.bound.extend(bound);
        self
    }

    /// Parameter `id` on the tape (gathered whole first under ZeRO 3), or its bound
    /// value.
    pub fn param(&mut self, id: ParamId) -> Result<Var, Error> {
        if let Some((_, v)) = self.bound.iter().find(|(i, _)| *i == id) {
            return Ok(v.clone());
        }
        self.tape.param(self.params, id.0)
    }

    /// Buffer `id` (updated in place by the layer that owns it).
    pub fn buffer(&self, id: BufferId) -> &Tensor {
        &self.params.buffers[id.0].value
    }

    /// A value that needs no gradient (an input: the ops reading it skip its gradient).
    pub fn input(&mut self, value: Tensor) -> Var {
        self.tape.input(value)
    }

    /// Whether layers run in training mode (dropout drops).
    pub fn training(&self) -> bool {
        self.tape.training()
    }
}
