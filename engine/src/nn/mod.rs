//! Models built from autograd ops. Parameter names follow PyTorch's state dicts so that
//! checkpoints, the memory estimate and the dashboard name the same tensors.
//!
//! May call: nothing of the engine.

pub mod gpt;
pub mod init;
pub mod mlp;

pub use gpt::{Gpt, GptConfig};
pub use init::Init;
pub use mlp::Mlp;
