//! wgtrain's engine: the device layer (`device`) and the paged allocator every tensor
//! lives in (`memory`). Kernels, tensors, autograd and the trainer build on these.
//!
//! The data path reads from the tree: device -> memory (allocator) -> ...

pub mod device;
pub mod memory;

pub use device::{DeviceError, Gpu};
pub use memory::{AllocError, Allocator, Block, Category};
pub mod bench;
