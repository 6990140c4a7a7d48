//! What kernel plans need to know of an adapter, in one plain value: its
//! multiprocessors (how many workgroups one wave of the device runs), workgroup memory,
//! subgroups, f16 and cooperative matrices, and whether it is a CPU. Built once when a
//! device opens (from its report and what it was granted), or by hand in plan-only
//! tests; no GPU is needed to hold one.
//!
//! May call: nothing of the engine. Called by: `device` (built from capabilities), the
//! kernels' plans.

/// The adapter facts kernel plans choose by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterFacts {
    /// Multiprocessors as the driver reports them (`AdapterReport::multiprocessors`),
    /// or None where it does not.
    pub multiprocessors: Option<u32>,
    /// Bytes of workgroup memory a workgroup may take.
    pub workgroup_bytes: u64,
    /// Subgroup operations granted.
    pub subgroup: bool,
    /// Smallest and largest subgroup size.
    pub subgroup_size: (u32, u32),
    /// `subgroupBarrier()` granted.
    pub subgroup_barrier: bool,
    /// f16 in shaders granted.
    pub shader_f16: bool,
    /// 16x16x16 f16 -> f32 cooperative matrices granted.
    pub coop_f16: bool,
    /// A CPU adapter (lavapipe): its compiler unrolls for itself and compiles big code
    /// slowly.
    pub cpu: bool,
}

/// Multiprocessors assumed where the driver does not tell (Metal, DX12, most Vulkan
/// drivers): a large discrete GPU's count, so that products are split along K rather
/// than leave a big device idle; on a small one a split costs one extra pass.
pub const ASSUMED_MULTIPROCESSORS: u32 = 128;

impl AdapterFacts {
    /// Workgroups that fill the device once: one per multiprocessor.
    pub fn wave(&self) -> u64 {
        u64::from(self.multiprocessors.unwrap_or(ASSUMED_MULTIPROCESSORS).max(1))
    }
}
