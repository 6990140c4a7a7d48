//! Dynamic loss scaling with torch.amp.GradScaler's semantics, for fp16-mixed training.
//!
//! # Policy (exactly PyTorch's)
//! * The loss is multiplied by `scale` before backward (seed the backward with it).
//! * [`GradScaler::unscale`] multiplies every gradient by 1/scale and records whether
//!   any is inf or NaN; it runs before clipping, so clipping sees true gradients.
//! * A step with a non-finite gradient is skipped (the optimizer does not run).
//! * [`GradScaler::update`]: after a skipped step the scale is multiplied by
//!   `backoff_factor` (0.5) and the clean-step count restarts; after `growth_interval`
//!   (2000) consecutive clean steps it is multiplied by `growth_factor` (2.0).
//! * The initial scale is 2^16 = 65536.
//!
//! May call: `autograd`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use crate::autograd::Params;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::fill;
use crate::kernels::optim_multi::{Update, multi_step, read_only};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// torch.amp.GradScaler's default initial scale.
pub const INIT_SCALE: f32 = 65536.0;
/// Default growth factor.
pub const GROWTH_FACTOR: f32 = 2.0;
/// Default backoff factor.
pub const BACKOFF_FACTOR: f32 = 0.5;
/// Default clean steps between growths.
pub const GROWTH_INTERVAL: u32 = 2000;

/// The scaler's state.
#[derive(Clone, Debug, PartialEq)]
pub struct GradScaler {
    /// Current scale.
    pub scale: f32,
    /// Multiplier after `growth_interval` clean steps.
    pub growth_factor: f32,
    /// Multiplier after a step with inf or NaN gradients.
    pub backoff_factor: f32,
    /// Clean steps between growths.
    pub growth_interval: u32,
    /// Clean steps since the last growth or backoff.
    pub growth_tracker: u32,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: INIT_SCALE,
            growth_factor: GROWTH_FACTOR,
            backoff_factor: BACKOFF_FACTOR,
            growth_interval: GROWTH_INTERVAL,
            growth_tracker: 0,
        }
    }
}

impl GradScaler {
    /// Divides every gradient by the scale; returns true if any was inf or NaN (the
    /// step must then be skipped).
    pub fn unscale(&self, rt: &Runtime, params: &Params) -> Result<bool, Error> {
        let found = self.unscale_on_device(rt, params)?;
        Ok(found.to_f32_vec(rt)?[0] != 0.0)
    }

    /// [`GradScaler::unscale`] without reading the answer back: the flag stays on the
    /// device (non-zero: some gradient was inf or NaN), for kernels that skip on it.
    pub fn unscale_on_device(&self, rt: &Runtime, params: &Params) -> Result<Tensor, Error> {
        self.check_grads(rt, params, Update::UnscaleAndCheck)
    }

    /// The flag of [`GradScaler::unscale_on_device`] without unscaling: the gradients
    /// keep the scale, for an update that multiplies by its inverse itself
    /// (`Optimizer::step_scaled`). Reads each gradient once and writes none.
    pub fn check_on_device(&self, rt: &Runtime, params: &Params) -> Result<Tensor, Error> {
        self.check_grads(rt, params, Update::Check)
    }

    /// [`GradScaler::check_on_device`] into `flag` (a u32 flag on the device), which it
    /// only ever sets: a flag still set from an earlier step stays set.
    pub fn check_into(&self, rt: &Runtime, params: &Params, flag: &Tensor) -> Result<(), Error> {
        let grads: Vec<&Tensor> = params.list.iter().filter_map(|p| p.grad.as_ref()).collect();
        multi_step(rt, Update::Check, &read_only(&grads), 1.0 / self.scale, flag, false)
    }

    fn check_grads(&self, rt: &Runtime, params: &Params, update: Update) -> Result<Tensor, Error> {
        let grads: Vec<&Tensor> = params.list.iter().filter_map(|p| p.grad.as_ref()).collect();
        flag_non_finite(rt, update, &grads, 1.0 / self.scale)
    }

    /// Updates the scale after a step (`found_inf`: the step was skipped).
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
    }
}

/// A flag on the device, non-zero where some element of `tensors` (contiguous f32) is inf
/// or NaN: one pass over them, nothing written to them. An f32 step checks its losses so,
/// for updates that skip on the flag (`Optimizer::step_unless`) before anything is read.
pub fn found_non_finite(rt: &Runtime, tensors: &[&Tensor]) -> Result<Tensor, Error> {
    flag_non_finite(rt, Update::Check, tensors, 1.0)
}

/// [`found_non_finite`] into `flag`, which it only ever sets (a flag set by an earlier
/// step stays set: the updates of the steps after it skip too).
pub fn flag_if_non_finite(rt: &Runtime, tensors: &[&Tensor], flag: &Tensor) -> Result<(), Error> {
    multi_step(rt, Update::Check, &read_only(tensors), 1.0, flag, false)
}

/// The flag of `update` (a check, or an unscale by `inv_scale` and a check) over `tensors`.
fn flag_non_finite(rt: &Runtime, update: Update, tensors: &[&Tensor], inv_scale: f32) -> Result<Tensor, Error> {
    let found = Tensor::empty(rt, &[1], DType::U32, Category::Temporary, "found_inf")?;
    fill(rt, &found, 0.0)?;
    multi_step(rt, update, &read_only(tensors), inv_scale, &found, false)?;
    Ok(found)
}
