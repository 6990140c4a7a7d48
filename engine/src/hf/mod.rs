//! One training step of a transformers checkpoint folder on a batch, for `wgtrain step`
//! (`step`); the folders themselves are read and written by `nn::hf`.
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `nn`, `runtime`,
//! `tensor`. Called by: the CLI, tests.

pub mod step;

pub use step::{HfStep, MIXED_LOSS_SCALE, hf_step, hf_step_as, resave, write_grads};
