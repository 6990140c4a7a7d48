//! Element types of tensors and their WGSL names.
//!
//! May call: nothing of the engine.

use serde::{Deserialize, Serialize};

/// A tensor's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit float (needs SHADER_F16 in kernels).
    F16,
    /// 32-bit signed integer (indices).
    I32,
    /// 32-bit unsigned integer (indices).
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 => 2,
            _ => 4,
        }
    }

    /// The WGSL scalar type.
    pub fn wgsl(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    /// Whether it is a float type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wgsl())
    }
}
