//! The kernel layer: one family per file, each launching its WGSL source from
//! `shaders/NAME.wgsl` (`kernels/NAME.rs` launches `shaders/NAME.wgsl`). Variants
//! (element type, workgroup size, features) come from one template: `{{KEY}}`
//! placeholders are filled by `runtime::render` on a pipeline-cache miss, and a test
//! renders and validates every variant with naga (`kernels::variants`). Every launch
//! checks on the host what its kernel will index (`common`), since shader modules are
//! created without runtime bounds checks. `tensor_ops` gives tensors the operations that
//! need kernels (fill, contiguous copies, casts, read-back of any view).
//!
//! May call: `device`, `error`, `memory`, `runtime`, `tensor`. Called by: autograd,
//! nn, optim, scaler, train, bench.

pub mod attention;
pub mod attention_plan;
pub mod batchnorm;
pub mod blockwise;
pub mod col_sums;
pub mod common;
pub mod conv;
pub mod cross_entropy;
pub mod embedding;
pub mod flash_attention;
pub mod flash_attention_coop;
pub mod flash_attention_tiled;
pub mod heads;
pub mod layernorm;
pub mod map;
pub mod matmul;
pub mod matmul_coop;
pub mod matmul_params;
pub mod matmul_plan;
pub mod matmul_split;
pub mod optim;
pub mod optim_multi;
pub mod pool;
pub mod reduce;
pub mod softmax;
pub mod tensor_ops;
pub mod tolerance;
pub mod variants;

pub use common::{ACTIVATIONS, check_contiguous, check_tensor, enables, require_f16};
pub use tensor_ops::TensorOps;
