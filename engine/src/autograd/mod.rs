//! Reverse-mode autograd over engine tensors.
//!
//! A [`Tape`] records, for each op run with gradients enabled, a node holding the op's
//! inputs and a backward closure that owns exactly what the backward needs (saved
//! activations). [`Tape::backward`] walks the nodes in reverse recording order (a
//! topological order), hands each node the finished gradient of its output, and drops
//! the node right after: its saved tensors return to the allocator as soon as their
//! last use is done. Gradients of parameters accumulate into [`Params`]; gradients of
//! intermediate values live only until their producer has run.
//!
//! May call: `kernels`, `tensor`, `memory`. Called by: `nn`, the trainer.

pub mod half;
pub mod ops;
pub mod tape;
pub use half::HalfWeights;
pub use tape::{BackwardFn, Buffer, FoldingFn, Gather, Mode, Param, ParamHook, Params, SyncStats, Tape, Var, VarId};
