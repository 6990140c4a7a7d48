//! Optimizers over [`Params`] with PyTorch's semantics (AdamW, SGD with momentum, and
//! AdamW with 8-bit blockwise state as bitsandbytes keeps it), global-norm gradient
//! clipping, and the warmup + cosine learning-rate schedule. A step is a few fused
//! multi-tensor launches (kernels::optim_multi); the steps of ZeRO and offload update one
//! parameter at a time (kernels::optim).
//!
//! May call: `autograd`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use crate::autograd::Params;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::blockwise;
use crate::kernels::map::{MapOp, fill, map_into};
use crate::kernels::optim::{AdamW, OptimState, Sgd, adamw_step, adamw8bit_step, sgd_step};
use crate::kernels::optim_multi::{Item, Update, multi_step, square_sums};
use crate::kernels::reduce::{ReduceOp, reduce_all};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Which update rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// torch.optim.AdamW.
    AdamW(AdamW),
    /// torch.optim.SGD.
    Sgd(Sgd),
    /// AdamW with both moments in 8 bits, blockwise (`kernels::blockwise`), for
    /// parameters of at least 4,096 elements; smaller ones keep f32 state.
    AdamW8bit(AdamW),
}

impl Rule {
    /// Whether the rule keeps two moments (AdamW, 8-bit or not).
    pub fn is_adam(&self) -> bool {
        matches!(self, Rule::AdamW(_) | Rule::AdamW8bit(_))
    }

    /// What a parameter's shards are cut at a multiple of (8-bit state: its blocks).
    pub fn shard_align(&self) -> usize {
        if matches!(self, Rule::AdamW8bit(_)) { blockwise::BLOCK } else { 1 }
    }

    /// Whether a parameter of `numel` elements keeps 8-bit state under this rule.
    pub fn quantizes(&self, numel: usize) -> bool {
        matches!(self, Rule::AdamW8bit(_)) && blockwise::quantized(numel)
    }

    /// Bytes of state one device keeps for parameters of (whole, here) elements: the
    /// whole parameter's and the part of it this device updates.
    pub fn state_bytes_all(&self, numels: impl Iterator<Item = (usize, usize)>) -> u64 {
        numels.map(|(whole, here)| self.state_bytes_of(whole, here)).sum()
    }

    /// Bytes of state a parameter of `numel` elements keeps.
    pub fn state_bytes(&self, numel: usize) -> u64 {
        self.state_bytes_of(numel, numel)
    }

    /// Bytes of host state (`parallel.offload`) for `here` elements of a parameter of
    /// `whole` elements: 8-bit moments as a byte an element and an f32 a block.
    pub fn host_state_bytes_of(&self, whole: usize, here: usize) -> u64 {
        match self {
            Rule::AdamW8bit(_) if here > 0 && self.quantizes(whole) => 2 * (here + 4 * blockwise::blocks(here)) as u64,
            _ => self.state_bytes_of(whole, here),
        }
    }

    /// Bytes of state for `here` elements of a parameter of `whole` elements (a shard).
    pub fn state_bytes_of(&self, whole: usize, here: usize) -> u64 {
        match self {
            Rule::AdamW(_) => 8 * here as u64,
            Rule::Sgd(_) => 4 * here as u64,
            Rule::AdamW8bit(_) if here > 0 && self.quantizes(whole) => 8 * blockwise::words(here) as u64,
            Rule::AdamW8bit(_) => 8 * here as u64,
        }
    }
}

/// What [`Optimizer::bookmark`] keeps: the step count and the states made but unused.
#[derive(Clone, Debug)]
pub struct OptimizerBookmark {
    step: u32,
    fresh: std::collections::HashSet<usize>,
}

/// An optimizer and its per-parameter state (made lazily on the first step, as PyTorch).
pub struct Optimizer {
    /// The rule and its hyperparameters (lr is overwritten by the schedule each step).
    pub rule: Rule,
    /// Steps taken.
    pub step: u32,
    /// (exp_avg or momentum_buffer, exp_avg_sq) per parameter; under 8-bit AdamW a
    /// large parameter's are u32 tensors in `kernels::blockwise`'s layout.
    pub state: Vec<Option<(Tensor, Tensor)>>,
    found_inf: Option<Tensor>,
    /// States made but not yet used (SGD's first use copies the gradient in).
    fresh: std::collections::HashSet<usize>,
    /// The fresh states the current step used (given back if the step is undone).
    used_fresh: Vec<usize>,
    /// fp16-mixed on one device: the weights' f16 copies, written with each update
    /// (`autograd::half`).
    pub halves: Option<std::sync::Arc<crate::autograd::HalfWeights>>,
    /// A sharded run's whole parameters' element counts (whether a shard keeps 8-bit
    /// state is its parameter's size's to say); empty: the parameters are whole.
    pub whole_numels: Vec<usize>,
}

impl Optimizer {
    /// An optimizer with no state yet.
    pub fn new(rule: Rule) -> Optimizer {
        Optimizer {
            rule,
            step: 0,
            state: Vec::new(),
            found_inf: None,
            fresh: Default::default(),
            used_fresh: Vec::new(),
            halves: None,
            whole_numels: Vec::new(),
        }
    }

    /// Names of the state tensors of parameter `name`, as torch's optimizer state dict
    /// keys them.
    pub fn state_names(&self, name: &str) -> [String; 2] {
        match self.rule {
            Rule::AdamW(_) | Rule::AdamW8bit(_) => [format!("{name}.exp_avg"), format!("{name}.exp_avg_sq")],
            Rule::Sgd(_) => [format!("{name}.momentum_buffer"), format!("{name}.unused")],
        }
    }

    /// One step with learning rate `lr` over every parameter that has a gradient. All
    /// memory the step needs is allocated before any parameter changes, so a step that
    /// runs out of memory leaves parameters and state as they were (and can be retried).
    pub fn step(&mut self, rt: &Runtime, params: &Params, lr: f32) -> Result<(), Error> {
        self.step_unless(rt, params, lr, None)
    }

    /// [`Optimizer::step`], each update skipped on the device when `found` (a flag on
    /// the device, GradScaler's inf/NaN check) is non-zero: nothing waits for the flag.
    /// A caller that then reads a set flag calls [`Optimizer::undo_skipped_step`].
    pub fn step_unless(&mut self, rt: &Runtime, params: &Params, lr: f32, found: Option<&Tensor>) -> Result<(), Error> {
        self.step_scaled(rt, params, lr, found, 1.0)
    }

    /// [`Optimizer::step_unless`] over gradients still multiplied by the loss scale:
    /// each update multiplies its gradient by `inv_scale` first (GradScaler's unscale
    /// fused into the update, the same f32 products). The f32 states update in a few
    /// multi-tensor launches (`kernels::optim_multi`), 8-bit states one parameter at a
    /// time.
    pub fn step_scaled(&mut self, rt: &Runtime, params: &Params, lr: f32, found: Option<&Tensor>, inv_scale: f32) -> Result<(), Error> {
        self.start_step(rt, params)?;
        let (found, skip_if_found) = match found {
            Some(f) => (f, true),
            None => (self.found_inf.as_ref().expect("begin_step made it"), false),
        };
        let update = match self.rule {
            Rule::AdamW(h) | Rule::AdamW8bit(h) => Update::AdamW(AdamW { lr, ..h }, self.step),
            Rule::Sgd(h) => Update::Sgd(Sgd { lr, ..h }),
        };
        let halves: Vec<Option<Tensor>> = params
            .list
            .iter()
            .map(|p| self.halves.as_ref().and_then(|h| h.get(&p.value)))
            .collect();
        let mut items = Vec::new();
        for (i, p) in params.list.iter().enumerate() {
            let Some(grad) = &p.grad else { continue };
            // SGD's first use of a buffer copies the gradient into it (PyTorch).
            let first = self.fresh.remove(&i);
            if first {
                self.used_fresh.push(i);
            }
            let (m, v) = self.state[i].as_ref().expect("start_step made it");
            let state = OptimState {
                param: &p.value,
                grad,
                m,
                v,
                half: halves[i].as_ref(),
            };
            match (self.rule, m.dtype()) {
                (Rule::AdamW8bit(h), DType::U32) => {
                    adamw8bit_step(rt, &AdamW { lr, ..h }, &state, self.step, inv_scale, found, skip_if_found)?
                }
                _ => items.push(Item { state, first }),
            }
        }
        multi_step(rt, update, &items, inv_scale, found, skip_if_found)
    }

    /// A step's start over `params`: every parameter with a gradient has its state
    /// (zeros when new), then [`Optimizer::begin_step`].
    fn start_step(&mut self, rt: &Runtime, params: &Params) -> Result<(), Error> {
        if self.state.len() < params.list.len() {
            self.state.resize_with(params.list.len(), || None);
        }
        for (i, p) in params.list.iter().enumerate() {
            if p.grad.is_some() {
                self.ensure_state(rt, i, p)?;
                // The f16 copy a product asked for (a cast now, then kept by the updates).
                if let Some(h) = &self.halves {
                    h.make_if_wanted(rt, &p.value, &p.name)?;
                }
            }
        }
        self.begin_step(rt, params.list.len())
    }

    /// [`Optimizer::step`] that also measures each parameter's update: per parameter
    /// with a gradient, the sum of the squares of its change and of its new values
    /// (each weight copied to a temporary before its update, one parameter at a time;
    /// the sums read back together at the end).
    pub fn step_measured(&mut self, rt: &Runtime, params: &Params, lr: f32) -> Result<Vec<Option<(f64, f64)>>, Error> {
        self.start_step(rt, params)?;
        let mut sums = Vec::new();
        for (i, p) in params.list.iter().enumerate() {
            if p.grad.is_none() {
                sums.push(None);
                continue;
            }
            let shape = p.value.shape();
            let before = Tensor::empty(rt, shape, DType::F32, Category::Temporary, &format!("{}.before", p.name))?;
            map_into(rt, MapOp::Scale, Some(&p.value), None, &before, 1.0, 0.0)?;
            self.update_param_unless(rt, i, p, lr, None)?;
            let sq = Tensor::empty(rt, shape, DType::F32, Category::Temporary, "update^2")?;
            map_into(rt, MapOp::Sub, Some(&p.value), Some(&before), &sq, 1.0, 1.0)?;
            drop(before);
            map_into(rt, MapOp::Mul, Some(&sq), Some(&sq), &sq, 1.0, 1.0)?;
            let update = reduce_all(rt, ReduceOp::Sum, &sq, "update norm")?;
            map_into(rt, MapOp::Mul, Some(&p.value), Some(&p.value), &sq, 1.0, 1.0)?;
            let weight = reduce_all(rt, ReduceOp::Sum, &sq, "weight norm")?;
            sums.push(Some((update, weight)));
        }
        let ranges: Vec<_> = sums
            .iter()
            .flatten()
            .flat_map(|(u, w)| [(u.block(), 0u64, 4u64), (w.block(), 0u64, 4u64)])
            .collect();
        let bytes = rt.download(&ranges)?.finish().map_err(Error::from)?;
        let mut values = bytemuck::pod_collect_to_vec::<u8, f32>(&bytes).into_iter().map(f64::from);
        Ok(sums
            .iter()
            .map(|s| s.as_ref().and_then(|_| Some((values.next()?, values.next()?))))
            .collect())
    }

    /// The flag the updates skip on when the caller asks (`step_scaled` with it as
    /// `found`): a u32 on the device the optimizer keeps (made zero at its first use),
    /// so steps that check into it (`train::step`) need no flag of their own. Only
    /// checks set it; the caller that reads it set clears it.
    pub fn skip_flag(&mut self, rt: &Runtime) -> Result<Tensor, Error> {
        if let Some(f) = &self.found_inf {
            return Ok(f.clone());
        }
        let f = Tensor::empty(rt, &[1], DType::U32, Category::OptimizerState, "found_inf")?;
        fill(rt, &f, 0.0)?;
        self.found_inf = Some(f.clone());
        Ok(f)
    }

    /// The host's bookkeeping (the step count and the states not yet used), to return
    /// to with [`Optimizer::restore`] when the device skipped the steps since.
    pub fn bookmark(&self) -> OptimizerBookmark {
        OptimizerBookmark {
            step: self.step,
            fresh: self.fresh.clone(),
        }
    }

    /// Returns the bookkeeping to `mark`: as if no step since had been taken (their
    /// updates were skipped on the device).
    pub fn restore(&mut self, mark: OptimizerBookmark) {
        self.step = mark.step;
        self.fresh = mark.fresh;
        self.used_fresh.clear();
    }

    /// Undoes the bookkeeping of a step whose updates the device skipped: the step
    /// count and the fresh states are as if the step had not been taken (PyTorch's
    /// GradScaler does not call the optimizer's step then).
    pub fn undo_skipped_step(&mut self) {
        self.step = self.step.saturating_sub(1);
        self.fresh.extend(self.used_fresh.drain(..));
    }

    /// Starts a step: counts it and makes room for `n_params` states. A step is one
    /// `begin_step` and an [`Optimizer::update_param`] per parameter with a gradient.
    pub fn begin_step(&mut self, rt: &Runtime, n_params: usize) -> Result<(), Error> {
        if self.state.len() < n_params {
            self.state.resize_with(n_params, || None);
        }
        self.skip_flag(rt)?;
        self.step += 1;
        self.used_fresh.clear();
        Ok(())
    }

    /// Makes parameter `i`'s state (zeros) if it has none; returns whether it was made.
    fn ensure_state(&mut self, rt: &Runtime, i: usize, p: &crate::autograd::Param) -> Result<bool, Error> {
        if self.state[i].is_some() {
            return Ok(false);
        }
        let [m_name, v_name] = self.state_names(&p.name);
        let numel = p.value.numel();
        if self.quantizes(i, numel) {
            // All zeros: every absmax 0 stands every code for 0.
            let words = [blockwise::words(numel)];
            let m = Tensor::full(rt, &words, DType::U32, 0.0, Category::OptimizerState, &m_name)?;
            let v = Tensor::full(rt, &words, DType::U32, 0.0, Category::OptimizerState, &v_name)?;
            self.state[i] = Some((m, v));
            self.fresh.insert(i);
            return Ok(true);
        }
        let m = Tensor::full(rt, p.value.shape(), DType::F32, 0.0, Category::OptimizerState, &m_name)?;
        let v = match self.rule {
            Rule::AdamW(_) | Rule::AdamW8bit(_) => Tensor::full(rt, p.value.shape(), DType::F32, 0.0, Category::OptimizerState, &v_name)?,
            Rule::Sgd(_) => m.clone(),
        };
        self.state[i] = Some((m, v));
        self.fresh.insert(i);
        Ok(true)
    }

    /// Whether parameter `i` (`numel` elements here: the whole or this rank's shard)
    /// keeps 8-bit state: by its whole size.
    fn quantizes(&self, i: usize, numel: usize) -> bool {
        self.rule.quantizes(self.whole_numels.get(i).copied().unwrap_or(numel))
    }

    /// Parameter `i`'s state on the host (a parameter of `numel` elements, this rank's
    /// shard of it), if it has any: the first moment (or momentum), the second moment for
    /// AdamW, and under 8-bit state each moment's block absmax values (the moments then
    /// are the values their codes stand for).
    pub fn state_host(&self, rt: &Runtime, i: usize, numel: usize) -> Result<Option<StateHost>, Error> {
        let Some(Some((m, v))) = self.state.get(i) else { return Ok(None) };
        if m.dtype() != DType::U32 {
            return Ok(Some(StateHost {
                m: m.read_f32(rt)?,
                v: if self.rule.is_adam() { Some(v.read_f32(rt)?) } else { None },
                absmax: None,
            }));
        }
        let read = |t: &Tensor, signed: bool| -> Result<(Vec<f32>, Vec<f32>), Error> {
            let bytes = rt.read(t.block())?;
            let words = bytemuck::pod_collect_to_vec::<u8, u32>(&bytes);
            let (codes, absmax) = blockwise::unpack(&words, numel);
            Ok((blockwise::dequantize(&blockwise::dynamic_map(signed), &codes, &absmax), absmax))
        };
        let (m, am) = read(m, true)?;
        let (v, av) = read(v, false)?;
        Ok(Some(StateHost {
            m,
            v: Some(v),
            absmax: Some((am, av)),
        }))
    }

    /// Installs parameter `i`'s state from the host (`shape`: the parameter's, or its
    /// shard's): quantized again under 8-bit AdamW, with the saved absmax values where
    /// given (exactly the codes saved), else each block's own.
    pub fn place_state(&mut self, rt: &Runtime, i: usize, name: &str, shape: &[usize], s: &StateHost) -> Result<(), Error> {
        if self.state.len() <= i {
            self.state.resize_with(i + 1, || None);
        }
        let names = self.state_names(name);
        let numel: usize = shape.iter().product();
        if self.quantizes(i, numel) {
            let v = s.v.as_deref().unwrap_or(&[]);
            let put = |values: &[f32], absmax: Option<&[f32]>, signed: bool, name: &str| -> Result<Tensor, Error> {
                let map = blockwise::dynamic_map(signed);
                let (codes, absmax) = blockwise::quantize(&map, values, absmax.filter(|a| a.len() == blockwise::blocks(numel)));
                let words = blockwise::pack(&map, &codes, &absmax);
                let t = Tensor::empty(rt, &[words.len()], DType::U32, Category::OptimizerState, name)?;
                rt.write(t.block(), 0, bytemuck::cast_slice(&words))?;
                Ok(t)
            };
            let absmax = s.absmax.as_ref();
            let mt = put(&s.m, absmax.map(|a| a.0.as_slice()), true, &names[0])?;
            let vt = put(v, absmax.map(|a| a.1.as_slice()), false, &names[1])?;
            self.state[i] = Some((mt, vt));
            return Ok(());
        }
        let mt = Tensor::from_f32(rt, &s.m, shape, Category::OptimizerState, &names[0])?;
        let vt = match &s.v {
            Some(v) => Tensor::from_f32(rt, v, shape, Category::OptimizerState, &names[1])?,
            None => mt.clone(),
        };
        self.state[i] = Some((mt, vt));
        Ok(())
    }

    /// Updates parameter `i` from its gradient (nothing if it has none).
    pub fn update_param(&mut self, rt: &Runtime, i: usize, p: &crate::autograd::Param, lr: f32) -> Result<(), Error> {
        self.update_param_unless(rt, i, p, lr, None)
    }

    fn update_param_unless(
        &mut self,
        rt: &Runtime,
        i: usize,
        p: &crate::autograd::Param,
        lr: f32,
        skip: Option<&Tensor>,
    ) -> Result<(), Error> {
        let Some(grad) = &p.grad else { return Ok(()) };
        self.ensure_state(rt, i, p)?;
        // SGD's first use of a buffer copies the gradient into it (PyTorch).
        let first = self.fresh.remove(&i);
        if first {
            self.used_fresh.push(i);
        }
        let (m, v) = self.state[i].as_ref().expect("made above");
        let (found, skip_if_found) = match skip {
            Some(f) => (f, true),
            None => (self.found_inf.as_ref().expect("begin_step made it"), false),
        };
        let half = self.halves.as_ref().and_then(|h| h.get(&p.value));
        let s = OptimState {
            param: &p.value,
            grad,
            m,
            v,
            half: half.as_ref(),
        };
        match self.rule {
            Rule::AdamW8bit(h) if m.dtype() == DType::U32 => {
                adamw8bit_step(rt, &AdamW { lr, ..h }, &s, self.step, 1.0, found, skip_if_found)
            }
            Rule::AdamW(h) | Rule::AdamW8bit(h) => adamw_step(rt, &AdamW { lr, ..h }, &s, self.step, 1.0, found, skip_if_found),
            Rule::Sgd(h) => sgd_step(rt, &Sgd { lr, ..h }, &s, first, 1.0, found, skip_if_found),
        }
    }
}

/// One parameter's optimizer state on the host (`Optimizer::state_host`).
#[derive(Clone, Debug, PartialEq)]
pub struct StateHost {
    /// exp_avg, or SGD's momentum buffer.
    pub m: Vec<f32>,
    /// exp_avg_sq (AdamW).
    pub v: Option<Vec<f32>>,
    /// Under 8-bit state: each moment's block absmax values (first, second).
    pub absmax: Option<(Vec<f32>, Vec<f32>)>,
}

/// The global L2 norm of every gradient; if it exceeds `max_norm`, scales the gradients
/// by max_norm / (norm + 1e-6) as torch.nn.utils.clip_grad_norm_. Returns the norm.
pub fn clip_grad_norm(rt: &Runtime, params: &Params, max_norm: f32) -> Result<f32, Error> {
    let norm = grad_norm(rt, params)?;
    scale_grads(rt, params, clip_coef(norm, max_norm))?;
    Ok(norm)
}

/// The global L2 norm of every gradient ([`grad_square_sum`]'s root), for a caller that
/// applies clipping's factor itself (an update that multiplies each gradient as it reads
/// it: `Optimizer::step_scaled`).
pub fn grad_norm(rt: &Runtime, params: &Params) -> Result<f32, Error> {
    Ok(grad_square_sum(rt, params)?.sqrt() as f32)
}

/// The sum of the squares of every gradient element: one multi-tensor pass on the device
/// (`kernels::optim_multi::square_sums`: a sum per 2,048 elements of a gradient), read
/// back at once (one wait) and added up in order in f64. Gradients that pass cannot take
/// (not contiguous f32) are summed one by one.
pub fn grad_square_sum(rt: &Runtime, params: &Params) -> Result<f64, Error> {
    let grads: Vec<&Tensor> = params.list.iter().filter_map(|p| p.grad.as_ref()).collect();
    let (multi, single): (Vec<&Tensor>, Vec<&Tensor>) = grads.into_iter().partition(|g| g.dtype() == DType::F32 && g.is_contiguous());
    let mut ranges = Vec::new();
    let sums = if multi.is_empty() {
        None
    } else {
        Some(square_sums(rt, &multi, 1.0)?)
    };
    if let Some(s) = sums.as_ref().filter(|s| s.numel() > 1) {
        ranges.push((s.block(), 4 * (s.offset() as u64 + 1), 4 * (s.numel() as u64 - 1)));
    }
    let mut singles = Vec::new();
    for g in single {
        let sq = Tensor::empty(rt, g.shape(), DType::F32, Category::Temporary, "grad^2")?;
        map_into(rt, MapOp::Mul, Some(g), Some(g), &sq, 1.0, 1.0)?;
        singles.push(reduce_all(rt, ReduceOp::Sum, &sq, "grad norm")?);
    }
    ranges.extend(singles.iter().map(|s| (s.block(), 4 * s.offset() as u64, 4u64)));
    let bytes = rt.download(&ranges)?.finish().map_err(Error::from)?;
    Ok(bytemuck::pod_collect_to_vec::<u8, f32>(&bytes).into_iter().map(f64::from).sum())
}

/// clip_grad_norm_'s factor for a global norm: max_norm / (norm + 1e-6).
pub fn clip_coef(norm: f32, max_norm: f32) -> f32 {
    max_norm / (norm + 1e-6)
}

/// Multiplies every gradient by `coef` in place when it is below 1 (clipping).
pub fn scale_grads(rt: &Runtime, params: &Params, coef: f32) -> Result<(), Error> {
    if coef < 1.0 {
        for p in &params.list {
            if let Some(g) = &p.grad {
                map_into(rt, MapOp::Scale, Some(g), None, g, coef, 0.0)?;
            }
        }
    }
    Ok(())
}

/// Linear warmup to `base` over `warmup` steps, then cosine decay to `min_lr` at
/// `total` steps (constant when `cosine` is false). `step` counts from 0.
pub fn lr_at(step: u64, base: f32, warmup: u64, total: u64, min_lr: f32, cosine: bool) -> f32 {
    if step < warmup {
        return base * (step + 1) as f32 / warmup as f32;
    }
    if !cosine || total <= warmup {
        return base;
    }
    let progress = ((step - warmup) as f32 / (total - warmup) as f32).min(1.0);
    min_lr + 0.5 * (base - min_lr) * (1.0 + (std::f32::consts::PI * progress).cos())
}

/// An optimizer whose state lives in host memory (`parallel.offload = "optimizer"`,
/// ZeRO-Offload's CPU optimizer): the same update rules as the kernels, over f32 slices,
/// spread over the host's cores; 8-bit AdamW's moments as `kernels::blockwise` codes
/// and absmax values, a block of 256 at a time. The step count is the caller's.
#[derive(Default)]
pub struct HostOptimizer {
    /// Per parameter: (first moment or momentum buffer, second moment; empty for SGD).
    pub state: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    /// Per parameter under 8-bit AdamW: its shard's moments in 8 bits.
    pub quantized: Vec<Option<HostQuant>>,
}

/// A shard's two 8-bit moments on the host: each moment's codes (a byte an element) and
/// its blocks' absmax values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostQuant {
    /// exp_avg: codes into the signed map, absmax a block.
    pub m: (Vec<u8>, Vec<f32>),
    /// exp_avg_sq: codes into the unsigned map, absmax a block.
    pub v: (Vec<u8>, Vec<f32>),
}

impl HostQuant {
    /// Zeros for `n` elements.
    pub fn zeros(n: usize) -> HostQuant {
        HostQuant::from_values(&vec![0.0; n], &vec![0.0; n], None)
    }

    /// The codes of moments `m` and `v`, against the absmax values given (where not NaN)
    /// or each block's own.
    pub fn from_values(m: &[f32], v: &[f32], absmax: Option<(&[f32], &[f32])>) -> HostQuant {
        HostQuant {
            m: blockwise::quantize(&blockwise::dynamic_map(true), m, absmax.map(|a| a.0)),
            v: blockwise::quantize(&blockwise::dynamic_map(false), v, absmax.map(|a| a.1)),
        }
    }

    /// The values the codes stand for: (m, v).
    pub fn values(&self) -> (Vec<f32>, Vec<f32>) {
        (
            blockwise::dequantize(&blockwise::dynamic_map(true), &self.m.0, &self.m.1),
            blockwise::dequantize(&blockwise::dynamic_map(false), &self.v.0, &self.v.1),
        )
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (self.m.0.len() + self.v.0.len() + 4 * (self.m.1.len() + self.v.1.len())) as u64
    }
}

impl HostOptimizer {
    /// Bytes of state held.
    pub fn bytes(&self) -> u64 {
        let full: u64 = self.state.iter().flatten().map(|(m, v)| 4 * (m.len() + v.len()) as u64).sum();
        full + self.quantized.iter().flatten().map(HostQuant::bytes).sum::<u64>()
    }

    /// Updates `weights` (parameter `i`'s shard, of a parameter of `whole` elements) from
    /// `grad` with `rule` at step `step` (counting from 1), as the device kernels do
    /// (torch.optim.AdamW / SGD; 8-bit AdamW as shaders/optim8.wgsl).
    #[allow(clippy::too_many_arguments)]
    pub fn update(&mut self, rule: &Rule, i: usize, whole: usize, weights: &mut [f32], grad: &[f32], lr: f32, step: u32) {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 14;
        if let (Rule::AdamW8bit(h), true) = (rule, rule.quantizes(whole)) {
            if self.quantized.len() <= i {
                self.quantized.resize_with(i + 1, || None);
            }
            let q = self.quantized[i].get_or_insert_with(|| HostQuant::zeros(weights.len()));
            let (signed, unsigned) = (blockwise::dynamic_map(true), blockwise::dynamic_map(false));
            let (b1, b2) = h.betas;
            let bc1 = 1.0 - b1.powi(step as i32);
            let bc2_sqrt = (1.0 - b2.powi(step as i32)).sqrt();
            let decay = 1.0 - lr * h.weight_decay;
            let step_size = lr / bc1;
            let per = blockwise::BLOCK;
            weights
                .par_chunks_mut(per)
                .zip(grad.par_chunks(per))
                .zip(q.m.0.par_chunks_mut(per).zip(q.m.1.par_iter_mut()))
                .zip(q.v.0.par_chunks_mut(per).zip(q.v.1.par_iter_mut()))
                .for_each(|(((w, g), (mc, ma)), (vc, va))| {
                    let mut m: Vec<f32> = mc.iter().map(|&c| signed[c as usize] * *ma).collect();
                    let mut v: Vec<f32> = vc.iter().map(|&c| unsigned[c as usize] * *va).collect();
                    for k in 0..w.len() {
                        m[k] = b1 * m[k] + (1.0 - b1) * g[k];
                        v[k] = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
                        w[k] = w[k] * decay - step_size * m[k] / (v[k].sqrt() / bc2_sqrt + h.eps);
                    }
                    let (nm, am) = blockwise::quantize(&signed, &m, None);
                    let (nv, av) = blockwise::quantize(&unsigned, &v, None);
                    mc.copy_from_slice(&nm);
                    vc.copy_from_slice(&nv);
                    (*ma, *va) = (am[0], av[0]);
                });
            return;
        }
        if self.state.len() <= i {
            self.state.resize_with(i + 1, || None);
        }
        let fresh = self.state[i].is_none();
        let n = weights.len();
        let (m, v) = self.state[i].get_or_insert_with(|| {
            let second = if rule.is_adam() { n } else { 0 };
            (vec![0.0; n], vec![0.0; second])
        });
        match *rule {
            // 8-bit AdamW's parameters under 4,096 elements keep f32 moments.
            Rule::AdamW(h) | Rule::AdamW8bit(h) => {
                let (b1, b2) = h.betas;
                let bc1 = 1.0 - b1.powi(step as i32);
                let bc2_sqrt = (1.0 - b2.powi(step as i32)).sqrt();
                let decay = 1.0 - lr * h.weight_decay;
                let step_size = lr / bc1;
                weights
                    .par_chunks_mut(CHUNK)
                    .zip(grad.par_chunks(CHUNK))
                    .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
                    .for_each(|((w, g), (m, v))| {
                        for k in 0..w.len() {
                            let mi = b1 * m[k] + (1.0 - b1) * g[k];
                            let vi = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
                            m[k] = mi;
                            v[k] = vi;
                            let denom = vi.sqrt() / bc2_sqrt + h.eps;
                            w[k] = w[k] * decay - step_size * mi / denom;
                        }
                    });
            }
            Rule::Sgd(h) => {
                weights
                    .par_chunks_mut(CHUNK)
                    .zip(grad.par_chunks(CHUNK))
                    .zip(m.par_chunks_mut(CHUNK))
                    .for_each(|((w, g), m)| {
                        for k in 0..w.len() {
                            let mut gk = g[k] + h.weight_decay * w[k];
                            if h.momentum != 0.0 {
                                let buf = if fresh { gk } else { h.momentum * m[k] + (1.0 - h.dampening) * gk };
                                m[k] = buf;
                                gk = if h.nesterov { gk + h.momentum * buf } else { buf };
                            }
                            w[k] -= lr * gk;
                        }
                    });
            }
        }
    }
}
