//! The tape: values with their node ids, parameters with their gradients, and the
//! reverse walk that hands each node its output's gradient and frees its saved tensors
//! as soon as their last use is done (see the module's header).
//!
//! May call: `error`, `kernels`, `memory`, `runtime`, `tensor`. Called by:
//! `autograd::ops`, `nn`, `optim`, `scaler`, the trainer.

use std::collections::HashMap;

use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Identifies a value on the tape.
pub type VarId = usize;

/// A value computed on the tape (or a parameter brought onto it).
#[derive(Clone, Debug)]
pub struct Var {
    /// Its id on the tape.
    pub id: VarId,
    /// The value.
    pub value: Tensor,
}

/// A node's backward: given the gradient of its output and the category each input's
/// gradient should be allocated in (gradient for parameters, temporary otherwise),
/// returns one gradient per input (None where an input needs none).
pub type BackwardFn = Box<dyn FnOnce(&Runtime, &Tensor, &[Category]) -> Result<Vec<Option<Tensor>>, Error>>;

/// A backward that folds the gradient already accumulated for one of its inputs into
/// its own result for that input (the sum written by its kernel, no add of its own): it
/// also receives that gradient (None where none has arrived, or the input is a
/// parameter) and returns the input's whole gradient. [`fold_gradient`] adds them where
/// the kernel cannot.
pub type FoldingFn = Box<dyn FnOnce(&Runtime, &Tensor, &[Category], Option<Tensor>) -> Result<Vec<Option<Tensor>>, Error>>;

enum Backward {
    Plain(BackwardFn),
    /// Folds input `.0`'s gradient so far.
    Folding(usize, FoldingFn),
}

struct Node {
    output: VarId,
    inputs: Vec<VarId>,
    backward: Backward,
    /// The output's label: what its backward allocates is named after it.
    label: Option<std::sync::Arc<str>>,
}

/// Where a tape takes parameters from when they are sharded across devices (ZeRO 3):
/// the whole value of parameter `index`, gathered for this use and freed when the last
/// user lets it go.
pub trait Gather: Send + Sync {
    /// Parameter `index`, whole.
    fn gather(&self, index: usize) -> Result<Tensor, Error>;
}

/// How a multi-device run shares per-batch statistics across its ranks inside a
/// forward or backward pass (SyncBatchNorm): every rank passes its values, every rank
/// gets all of them, concatenated in rank order. Every rank makes the same calls in
/// the same order.
pub trait SyncStats: Send + Sync {
    /// Every rank's `mine`, concatenated in rank order.
    fn all_gather(&self, mine: Vec<f32>) -> Result<Vec<f32>, Error>;
}

/// Called with a parameter whose gradient is final (optimizer-in-backward).
pub type ParamHook<'a> = dyn FnMut(&Runtime, usize, &mut Param) -> Result<(), Error> + 'a;

/// A named trainable tensor and its gradient.
pub struct Param {
    /// The state-dict name.
    pub name: String,
    /// The f32 value (category parameter).
    pub value: Tensor,
    /// The accumulated gradient (category gradient), None after zero_grad.
    pub grad: Option<Tensor>,
}

/// A named tensor of a model's state that no optimizer touches (BatchNorm's running
/// statistics): saved and loaded with the parameters, kept whole on every device (each
/// device's forward moves its own copy), never sharded, never given a gradient.
#[derive(Clone)]
pub struct Buffer {
    /// The state-dict name.
    pub name: String,
    /// The f32 value (category parameter).
    pub value: Tensor,
}

/// Every parameter of a model, in registration order, and its buffers.
#[derive(Default)]
pub struct Params {
    /// The parameters.
    pub list: Vec<Param>,
    /// The buffers (not trained).
    pub buffers: Vec<Buffer>,
}

impl Params {
    /// Registers a parameter; returns its index.
    pub fn add(&mut self, name: &str, value: Tensor) -> usize {
        self.list.push(Param {
            name: name.to_string(),
            value,
            grad: None,
        });
        self.list.len() - 1
    }

    /// The buffers alone (what a recomputed segment reads besides the parameters it
    /// is handed).
    pub fn buffers_only(&self) -> Params {
        Params {
            list: Vec::new(),
            buffers: self.buffers.clone(),
        }
    }

    /// Registers a buffer; returns its index.
    pub fn add_buffer(&mut self, name: &str, value: Tensor) -> usize {
        self.buffers.push(Buffer {
            name: name.to_string(),
            value,
        });
        self.buffers.len() - 1
    }

    /// The index of the buffer `name`.
    pub fn find_buffer(&self, name: &str) -> Option<usize> {
        self.buffers.iter().position(|b| b.name == name)
    }

    /// The index of the parameter `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.list.iter().position(|p| p.name == name)
    }

    /// Frees every gradient (`zero_grad(set_to_none=True)`).
    pub fn zero_grad(&mut self) {
        for p in &mut self.list {
            p.grad = None;
        }
    }

    /// Total number of scalar parameters.
    pub fn numel(&self) -> usize {
        self.list.iter().map(|p| p.value.numel()).sum()
    }
}

/// The record of one forward pass.
pub struct Tape {
    nodes: Vec<Node>,
    next: VarId,
    leaves: HashMap<VarId, usize>,
    grad_enabled: bool,
    half_matmuls: bool,
    grad_prescale: f32,
    gather: Option<std::sync::Arc<dyn Gather>>,
    mode: Mode,
    recomputing: bool,
    sync: Option<std::sync::Arc<dyn SyncStats>>,
    inputs: std::collections::HashSet<VarId>,
    halves: Option<std::sync::Arc<super::HalfWeights>>,
}

/// What a forward pass is for, visible to every layer through its tape (PyTorch's
/// `module.train()` / `module.eval()`, plus what the trainer decides per step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// Training (dropout drops) or evaluation (dropout passes through).
    pub training: bool,
    /// This forward pass's random seed: dropout masks are a function of it and of each
    /// layer's name, so a recomputed segment draws the same masks.
    pub seed: u64,
    /// Recompute every k-th of the model's checkpointable segments in backward (0: none).
    pub checkpoint_every: usize,
}

impl Default for Mode {
    /// Training, seed 0, no checkpointing.
    fn default() -> Self {
        Mode {
            training: true,
            seed: 0,
            checkpoint_every: 0,
        }
    }
}

impl Mode {
    /// Evaluation: no dropout, no checkpointing.
    pub fn eval() -> Mode {
        Mode {
            training: false,
            ..Mode::default()
        }
    }

    /// This mode with `parts` (a step, a micro-batch, a device's rank) mixed into the
    /// seed: each part draws different masks, and the same parts the same ones.
    pub fn fork(self, parts: &[u64]) -> Mode {
        let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        Mode {
            seed: parts.iter().fold(self.seed, |h, &v| mix(h, v)),
            ..self
        }
    }

    /// A 32-bit seed for the random op labelled `label` (FNV-1a of the label mixed with
    /// this pass's seed through SplitMix64).
    pub fn seed_for(&self, label: &str) -> u32 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let mut z = h ^ self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

impl Default for Tape {
    fn default() -> Self {
        Tape::new()
    }
}

/// `g` plus the gradient `so_far` (where a [`FoldingFn`] could not fold it into its
/// kernel): what the tape's accumulation would have made of them.
pub fn fold_gradient(rt: &Runtime, so_far: Option<Tensor>, g: Tensor) -> Result<Tensor, Error> {
    let mut slot = so_far;
    accumulate(rt, &mut slot, g, Category::Temporary, "grad")?;
    Ok(slot.expect("accumulate fills the slot"))
}

/// Adds `g` into `slot` (taking `g` on first use). In place only when nobody else holds
/// the slot's block (an op may hand one gradient to several inputs). An f16 gradient
/// meeting an f32 one is summed in f32.
fn accumulate(rt: &Runtime, slot: &mut Option<Tensor>, g: Tensor, category: Category, label: &str) -> Result<(), Error> {
    match slot.take() {
        None => *slot = Some(g),
        Some(existing) => {
            let wide = |t: Tensor| -> Result<Tensor, Error> {
                if t.dtype() == DType::F16 {
                    t.cast(rt, DType::F32, category, label)
                } else {
                    Ok(t)
                }
            };
            let (existing, g) = if existing.dtype() != g.dtype() {
                (wide(existing)?, wide(g)?)
            } else {
                (existing, g)
            };
            if g.shape() != existing.shape() {
                return Err(Error::shape(
                    "gradient accumulation",
                    format!("{:?}", existing.shape()),
                    format!("{:?}", g.shape()),
                ));
            }
            let target = if existing.is_unique() {
                existing.clone()
            } else {
                Tensor::empty(rt, existing.shape(), existing.dtype(), category, label)?
            };
            map_into(rt, MapOp::Add, Some(&existing), Some(&g), &target, 1.0, 1.0)?;
            *slot = Some(target);
        }
    }
    Ok(())
}

/// The gradient that starts backward from a one-element loss: `seed` (1, or a loss scale).
fn loss_seed(rt: &Runtime, loss: &Var, seed: f32) -> Result<(VarId, Tensor), Error> {
    if loss.value.numel() != 1 {
        return Err(Error::shape("backward", "a scalar loss", format!("{:?}", loss.value.shape())));
    }
    let t = Tensor::full(
        rt,
        loss.value.shape(),
        crate::tensor::DType::F32,
        seed,
        Category::Temporary,
        "loss.grad",
    )?;
    Ok((loss.id, t))
}

impl Tape {
    /// An empty tape with gradients enabled.
    pub fn new() -> Tape {
        Tape {
            nodes: Vec::new(),
            next: 0,
            leaves: HashMap::new(),
            grad_enabled: true,
            half_matmuls: false,
            grad_prescale: 1.0,
            gather: None,
            mode: Mode::default(),
            recomputing: false,
            sync: None,
            inputs: Default::default(),
            halves: None,
        }
    }

    /// This tape in `mode` (training or evaluation, the pass's seed, checkpointing).
    pub fn with_mode(mut self, mode: Mode) -> Tape {
        self.mode = mode;
        self
    }

    /// See [`Tape::with_mode`].
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether layers run in training mode (dropout active).
    pub fn training(&self) -> bool {
        self.mode.training
    }

    /// A fresh tape with this one's settings (precision, mode, gathering), recording
    /// (`grad`) or not: what a checkpointed segment runs on.
    pub fn child(&self, grad: bool) -> Tape {
        Tape {
            grad_enabled: grad,
            half_matmuls: self.half_matmuls,
            grad_prescale: self.grad_prescale,
            mode: self.mode,
            recomputing: self.recomputing,
            sync: self.sync.clone(),
            halves: self.halves.clone(),
            ..Tape::new()
        }
    }

    /// This tape reading the weights' f16 copies kept in `halves` under fp16-mixed
    /// (see `autograd::half`).
    pub fn with_half_weights(mut self, halves: Option<std::sync::Arc<super::HalfWeights>>) -> Tape {
        self.halves = halves;
        self
    }

    /// The kept f16 copy of weight `w` for a product under fp16-mixed, if made (else `w`
    /// is noted as asked for, and the caller casts it).
    pub fn half_weight(&self, w: &Tensor) -> Option<Tensor> {
        if !self.half_matmuls || self.gather.is_some() {
            return None;
        }
        self.halves.as_ref()?.get_or_want(w)
    }

    /// This tape marked as recomputing a checkpointed segment in backward: state that a
    /// forward moves (BatchNorm's running statistics) moved already.
    pub fn for_recompute(mut self) -> Tape {
        self.recomputing = true;
        self
    }

    /// This tape sharing batch statistics through `sync` (SyncBatchNorm across the
    /// ranks of a multi-device run).
    pub fn with_sync(mut self, sync: Option<std::sync::Arc<dyn SyncStats>>) -> Tape {
        self.sync = sync;
        self
    }

    /// Where batch statistics are shared, if they are.
    pub fn sync(&self) -> Option<std::sync::Arc<dyn SyncStats>> {
        self.sync.clone()
    }

    /// Whether this pass recomputes a segment (see [`Tape::for_recompute`]).
    pub fn recomputing(&self) -> bool {
        self.recomputing
    }

    /// This tape taking parameters from `gather` (ZeRO 3) instead of `Params`' values.
    pub fn with_gather(mut self, gather: Option<std::sync::Arc<dyn Gather>>) -> Tape {
        self.gather = gather;
        self
    }

    /// Where this tape gathers parameters from, if they are sharded.
    pub fn gatherer(&self) -> Option<std::sync::Arc<dyn Gather>> {
        self.gather.clone()
    }

    /// The parameter a leaf value stands for, if it is one.
    pub fn leaf_index(&self, id: VarId) -> Option<usize> {
        self.leaves.get(&id).copied()
    }

    /// The gradient backward will be seeded with (the loss scale times any
    /// accumulation weight). Ops that form gradients already in forward (the fused
    /// language-model head) scale them by it *before* casting to f16, as PyTorch's
    /// backward sees the scaled gradient, so small gradients do not underflow.
    pub fn with_grad_prescale(mut self, scale: f32) -> Tape {
        self.grad_prescale = scale;
        self
    }

    /// See [`Tape::with_grad_prescale`].
    pub fn grad_prescale(&self) -> f32 {
        self.grad_prescale
    }

    /// This tape with fp16-mixed matmuls on or off (autocast): linear layers and the
    /// language-model head cast their inputs and weights to f16, keep those f16 copies
    /// for backward, and accumulate in f32; everything else stays f32.
    pub fn with_half_matmuls(mut self, on: bool) -> Tape {
        self.half_matmuls = on;
        self
    }

    /// Whether matmuls run on f16 inputs (see [`Tape::with_half_matmuls`]).
    pub fn half_matmuls(&self) -> bool {
        self.half_matmuls
    }

    /// A tape that records nothing (`torch.no_grad()`).
    pub fn no_grad() -> Tape {
        Tape {
            grad_enabled: false,
            ..Tape::new()
        }
    }

    /// Whether ops record backward nodes.
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    /// A value that needs no gradient (inputs, targets).
    pub fn constant(&mut self, value: Tensor) -> Var {
        let id = self.fresh();
        Var { id, value }
    }

    /// A model's input data (images, token ids): a value no gradient is wanted for, so
    /// the op reading it may skip that gradient's work.
    pub fn input(&mut self, value: Tensor) -> Var {
        let v = self.constant(value);
        self.inputs.insert(v.id);
        v
    }

    /// Whether `v` is input data ([`Tape::input`]).
    pub fn is_input(&self, v: &Var) -> bool {
        self.inputs.contains(&v.id)
    }

    /// Parameter `index` of `params` as a leaf whose gradient accumulates there (its
    /// value gathered whole first when the tape gathers: ZeRO 3).
    pub fn param(&mut self, params: &Params, index: usize) -> Result<Var, Error> {
        let value = match &self.gather {
            Some(g) => g.gather(index)?,
            None => params
                .list
                .get(index)
                .ok_or_else(|| {
                    Error::invalid(
                        "parameters",
                        format!("no parameter {index} here (a segment's parameter not passed in?)"),
                    )
                })?
                .value
                .clone(),
        };
        let id = self.fresh();
        if self.grad_enabled {
            self.leaves.insert(id, index);
        }
        Ok(Var { id, value })
    }

    fn fresh(&mut self) -> VarId {
        self.next += 1;
        self.next
    }

    /// Records an op's output; `backward` maps the output's gradient to one gradient
    /// per input (None where an input needs none).
    pub fn record(&mut self, value: Tensor, inputs: &[&Var], backward: BackwardFn) -> Var {
        self.push(value, inputs, Backward::Plain(backward))
    }

    /// [`record`](Self::record) with a backward that folds input `fold`'s gradient so
    /// far into its own ([`FoldingFn`]).
    pub fn record_folding(&mut self, value: Tensor, inputs: &[&Var], fold: usize, backward: FoldingFn) -> Var {
        self.push(value, inputs, Backward::Folding(fold, backward))
    }

    fn push(&mut self, value: Tensor, inputs: &[&Var], backward: Backward) -> Var {
        let id = self.fresh();
        if self.grad_enabled {
            self.nodes.push(Node {
                output: id,
                inputs: inputs.iter().map(|v| v.id).collect(),
                backward,
                label: value.block().label().map(Into::into),
            });
        }
        Var { id, value }
    }

    /// Backpropagates from `loss` (a one-element tensor, seeded with 1) and accumulates
    /// parameter gradients into `params`. Consumes the tape.
    pub fn backward(self, rt: &Runtime, loss: &Var, params: &mut Params) -> Result<(), Error> {
        self.backward_with(rt, loss, 1.0, params)
    }

    /// As [`Tape::backward`], seeding the loss gradient with `seed` (a loss scale).
    pub fn backward_with(self, rt: &Runtime, loss: &Var, seed: f32, params: &mut Params) -> Result<(), Error> {
        self.run_backward(rt, vec![loss_seed(rt, loss, seed)?], Some(params))?;
        Ok(())
    }

    /// As [`Tape::backward_with`], calling `on_complete(rt, index, param)` as soon as a
    /// parameter's gradient is final (no node still to run uses it), so the caller can
    /// apply the update and free the gradient right away (optimizer-in-backward).
    pub fn backward_with_hook(
        self,
        rt: &Runtime,
        loss: &Var,
        seed: f32,
        params: &mut Params,
        on_complete: &mut ParamHook<'_>,
    ) -> Result<(), Error> {
        self.run_backward_hooked(rt, vec![loss_seed(rt, loss, seed)?], Some(params), Some(on_complete))?;
        Ok(())
    }

    /// Backpropagates from `output` seeded with `grad` (its shape) and returns the
    /// gradients of `wanted` values (None where nothing flowed). Parameters brought onto
    /// this tape must not be used: the caller owns the gradients (activation
    /// checkpointing recomputes a segment this way).
    pub fn gradients_of(self, rt: &Runtime, output: &Var, grad: Tensor, wanted: &[&Var]) -> Result<Vec<Option<Tensor>>, Error> {
        if !self.leaves.is_empty() {
            return Err(Error::invalid("gradients_of", "the tape has parameter leaves"));
        }
        let mut grads = self.run_backward(rt, vec![(output.id, grad)], None)?;
        Ok(wanted.iter().map(|v| grads.remove(&v.id)).collect())
    }

    fn run_backward(self, rt: &Runtime, seeds: Vec<(VarId, Tensor)>, params: Option<&mut Params>) -> Result<HashMap<VarId, Tensor>, Error> {
        self.run_backward_hooked(rt, seeds, params, None)
    }

    fn run_backward_hooked(
        mut self,
        rt: &Runtime,
        seeds: Vec<(VarId, Tensor)>,
        mut params: Option<&mut Params>,
        mut on_complete: Option<&mut ParamHook<'_>>,
    ) -> Result<HashMap<VarId, Tensor>, Error> {
        // Uses of each parameter still ahead, so a hook fires once its gradient is final.
        let mut pending: HashMap<usize, usize> = HashMap::new();
        if on_complete.is_some() {
            for node in &self.nodes {
                for i in &node.inputs {
                    if let Some(&index) = self.leaves.get(i) {
                        *pending.entry(index).or_default() += 1;
                    }
                }
            }
        }
        let mut grads: HashMap<VarId, Tensor> = seeds.into_iter().collect();
        while let Some(node) = self.nodes.pop() {
            let Some(grad_out) = grads.remove(&node.output) else {
                // Nothing flows back through this node; its saved tensors go now.
                if let (Some(hook), Some(params)) = (on_complete.as_deref_mut(), params.as_deref_mut()) {
                    for i in &node.inputs {
                        if let Some(&index) = self.leaves.get(i) {
                            Self::release(&mut pending, index, rt, params, hook)?;
                        }
                    }
                }
                continue;
            };
            let categories: Vec<Category> = node
                .inputs
                .iter()
                .map(|i| {
                    if self.leaves.contains_key(i) {
                        Category::Gradient
                    } else {
                        Category::Temporary
                    }
                })
                .collect();
            let outer = rt.alloc.set_scope(node.label.clone());
            let input_grads = match node.backward {
                Backward::Plain(f) => f(rt, &grad_out, &categories),
                Backward::Folding(i, f) => {
                    // Taken out of the map: what the node returns for the input is its
                    // whole gradient, accumulated below into an empty slot.
                    let input = node.inputs[i];
                    let so_far = if self.leaves.contains_key(&input) {
                        None
                    } else {
                        grads.remove(&input)
                    };
                    f(rt, &grad_out, &categories, so_far)
                }
            };
            rt.alloc.set_scope(outer);
            let input_grads = input_grads?;
            drop(grad_out);
            for (input, g) in node.inputs.iter().zip(input_grads) {
                let Some(g) = g else {
                    // No gradient for this input; a parameter's use still counts as done.
                    if let (Some(&index), Some(hook), Some(params)) =
                        (self.leaves.get(input), on_complete.as_deref_mut(), params.as_deref_mut())
                    {
                        Self::release(&mut pending, index, rt, params, hook)?;
                    }
                    continue;
                };
                match (self.leaves.get(input), params.as_deref_mut()) {
                    (Some(&index), Some(params)) => {
                        let p = &mut params.list[index];
                        let label = format!("{}.grad", p.name);
                        accumulate(rt, &mut p.grad, g, Category::Gradient, &label)?;
                        if let Some(hook) = on_complete.as_deref_mut() {
                            Self::release(&mut pending, index, rt, params, hook)?;
                        }
                    }
                    _ => {
                        let mut slot = grads.remove(input);
                        accumulate(rt, &mut slot, g, Category::Temporary, "grad")?;
                        if let Some(t) = slot {
                            grads.insert(*input, t);
                        }
                    }
                }
            }
        }
        // Sums held back to share launches (`kernels::col_sums`) are recorded by the end
        // of backward, so what they hold is freed where the estimate expects.
        rt.settle()?;
        Ok(grads)
    }

    /// Counts one finished use of parameter `index`; at the last, hands it to the hook.
    fn release(
        pending: &mut HashMap<usize, usize>,
        index: usize,
        rt: &Runtime,
        params: &mut Params,
        hook: &mut ParamHook<'_>,
    ) -> Result<(), Error> {
        let left = pending.get_mut(&index).expect("counted before the walk");
        *left -= 1;
        if *left == 0 {
            hook(rt, index, &mut params.list[index])?;
        }
        Ok(())
    }
}
