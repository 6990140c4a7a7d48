//! transformers' checkpoint folders: config.json and model.safetensors as
//! save_pretrained writes them, read within bounds and written whole (`io`), and one
//! training step of such a checkpoint on a batch, for `wgtrain step` (`step`).
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `nn`, `runtime`,
//! `tensor`. Called by: `nn` (the models' loaders), the CLI, tests.

pub mod io;
pub mod step;

pub use io::{read_config, read_weights, write_folder};
pub use step::{HfStep, hf_step, write_grads};
