//! What an adapter is and can do, as `wgtrain devices --json` prints it and the
//! dashboard's device table shows it.
//!
//! May call: serde. Called by: the engine's device layer, `run`.

use serde::{Deserialize, Serialize};

/// The limits that matter to the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsReport {
    /// Largest buffer.
    pub max_buffer_size: u64,
    /// Largest range one storage binding may see.
    pub max_storage_buffer_binding_size: u64,
    /// Alignment of storage binding offsets.
    pub min_storage_buffer_offset_alignment: u32,
    /// Bytes of workgroup memory.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
}

/// One cooperative matrix configuration: C[m x n] += A[m x k] * B[k x n].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoopMatrixConfig {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Scalar type of A and B ("f16", "f32", "i32", "u32").
    pub ab: String,
    /// Scalar type of C and the result.
    pub cr: String,
}

/// Everything `wgtrain devices` says of one adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterReport {
    /// Position in the enumeration (what `--adapter N` takes).
    pub index: usize,
    /// "vulkan", "metal", "dx12", "gl" or "webgpu".
    pub backend: String,
    /// The adapter's name.
    pub name: String,
    /// "discrete_gpu", "integrated_gpu", "virtual_gpu", "cpu" or "other".
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Which of the engine's features the adapter offers.
    pub features: Vec<String>,
    /// Limits the engine reads.
    pub limits: LimitsReport,
    /// Cooperative matrix configurations (empty without the feature).
    pub cooperative_matrix: Vec<CoopMatrixConfig>,
    /// Device-local memory in bytes where the backend tells it (Vulkan), else null.
    pub memory_bytes: Option<u64>,
    /// Smallest and largest subgroup size, [min, max]; null in reports written before
    /// wgtrain recorded it.
    #[serde(default)]
    pub subgroup_size: Option<[u32; 2]>,
    /// Multiprocessors (NVIDIA's SMs, AMD's compute units; a CPU adapter's threads)
    /// where the driver tells them, else null. Kernel plans size split-K and tiles by
    /// the waves of workgroups these run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiprocessors: Option<u32>,
}
