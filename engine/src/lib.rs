//! wgtrain's engine. The data path reads from the tree, each layer calling only those
//! below it: `train` (config, build, step, plan, run) -> `nn` (MLP, GPT) -> `autograd`
//! (tape, ops) -> `kernels` (WGSL launches, host checks) -> `tensor` (views over blocks)
//! -> `runtime` (the only place that records and submits GPU work) -> `memory` (the
//! paged allocator every tensor lives in) -> `device` (adapters, features, typed errors).
//! Beside them: `error` (the engine's error), `data` (host datasets and the loader),
//! `optim` and `scaler` (optimizer and loss scaler over parameters), `files`, `bench`.
//! The types the dashboard reads come from `wgtrain_record`. `tests/architecture.rs`
//! checks that no two modules, and no two files of a folder, import each other.

pub mod autograd;
pub mod bench;
pub mod data;
pub mod device;
pub mod error;
pub mod files;
pub mod hf;
pub mod kernels;
pub mod memory;
pub mod nn;
pub mod optim;
pub mod parallel;
pub mod runtime;
pub mod scaler;
pub mod tensor;
pub mod train;

pub use device::{DeviceError, Gpu};
pub use error::Error;
pub use kernels::TensorOps;
pub use memory::{AllocError, Allocator, Block, Category};
pub use runtime::Runtime;
pub use tensor::{DType, Tensor};
