//! One training step of a transformers checkpoint folder on a batch, for `wgtrain step`
//! (`step`); the folders themselves are read and written by `nn::hf`.
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `nn`, `runtime`,
//! `tensor`. Called by: the CLI, tests.

pub mod step;

pub use step::{HfStep, hf_step, resave, write_grads};
