//! The runtime layer: the only place that records and submits GPU work. `cache` holds
//! compiled kernel variants under typed keys (WGSL rendered only on a miss), `record`
//! is where launches go (a command encoder on the device, or nowhere for the estimate's
//! dry run, chosen at construction), `launch` the [`Runtime`] every op takes.
//!
//! May call: `device`, `memory`, `error`. Called by: `tensor`, `kernels`, and above.

pub mod cache;
pub mod launch;
pub mod profile;
pub mod record;

pub use cache::{Kernel, KernelKey, PARAM_SLOT, render, repeat_marked};
pub use launch::{Bound, Deferred, KernelOverrides, MAX_GROUPS_X, Runtime, grid, overlap};
pub use profile::{HostSpan, LaunchRecord, StepTrace, Work};
pub use record::RING_SLOTS;
