//! wgtrain's engine. The data path reads from the tree:
//! `tensor` (views over blocks) -> `kernels` (WGSL launches) -> `memory` (the paged
//! allocator every tensor lives in) -> `device` (adapters, features, typed errors).
//! `bench` measures kernels and the allocator.

pub mod autograd;
pub mod bench;
pub mod data;
pub mod device;
pub mod error;
pub mod files;
pub mod kernels;
pub mod memory;
pub mod nn;
pub mod optim;
pub mod runtime;
pub mod scaler;
pub mod tensor;
pub mod train;

pub use device::{DeviceError, Gpu};
pub use error::Error;
pub use kernels::TensorOps;
pub use runtime::Runtime;
pub use memory::{AllocError, Allocator, Block, Category};
pub use tensor::{DType, Tensor};
