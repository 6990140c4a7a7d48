//! Models built from autograd ops. Parameter names follow PyTorch's state dicts so that
//! checkpoints, the memory estimate and the dashboard name the same tensors: `builder`
//! (parameters by path, and the forward context), `layers` (the layer library),
//! `init` (seeded initialisation), `hf` (transformers' folders), and the engine's models (`mlp`, `gpt`, `llama`, `bert`, `resnet`, `cnn`); `conv` holds the conv-net layers.
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `runtime`, `tensor`.

pub mod bert;
pub mod builder;
pub mod cnn;
pub mod conv;
pub mod gpt;
pub mod hf;
pub mod init;
pub mod kv_cache;
pub mod layers;
pub mod llama;
pub mod mlp;
pub mod resnet;

pub use bert::{Bert, BertConfig};
pub use builder::{BufferId, Builder, Ctx, Fill, ParamId};
pub use cnn::{Cnn, CnnConfig};
pub use conv::{BatchNorm2d, Conv2d, ConvOptions, Flatten, Pool2d};
pub use gpt::{Gpt, GptConfig};
pub use init::Init;
pub use layers::{
    Act, Activation, Attention, AttentionOptions, Dropout, Embedding, LayerNorm, Linear, LinearOptions, Module, Residual, RmsNorm,
    Sequential,
};
pub use llama::{Llama, LlamaConfig};
pub use mlp::Mlp;
pub use resnet::{ResNet, ResNetConfig};
