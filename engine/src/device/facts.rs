//! What kernel plans need to know of an adapter, in one plain value: its
//! multiprocessors (how many workgroups one wave of the device runs), workgroup memory,
//! subgroups, f16 and cooperative matrices, and whether it is a CPU. Built from the
//! adapter's report and the features a device was granted: once when a device opens,
//! or from a saved `wgtrain devices --json` report in plan-only tests; no GPU is needed
//! to hold one.
//!
//! May call: `wgtrain_record` (the adapter report). Called by: `device` (capabilities),
//! the kernels' plans.

use wgtrain_record::AdapterReport;

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
    /// The facts of the adapter `report` describes, for a device granted the features
    /// `granted` says (by the names `wgtrain devices` prints) and `workgroup_bytes` of
    /// workgroup memory.
    pub fn from_report(report: &AdapterReport, granted: impl Fn(&str) -> bool, workgroup_bytes: u64) -> AdapterFacts {
        let subgroup_size = report.subgroup_size.unwrap_or([0, 0]);
        AdapterFacts {
            multiprocessors: report.multiprocessors,
            workgroup_bytes,
            subgroup: granted("SUBGROUP"),
            subgroup_size: (subgroup_size[0], subgroup_size[1]),
            subgroup_barrier: granted("SUBGROUP_BARRIER"),
            shader_f16: granted("SHADER_F16"),
            coop_f16: granted("EXPERIMENTAL_COOPERATIVE_MATRIX")
                && report
                    .cooperative_matrix
                    .iter()
                    .any(|c| c.m == 16 && c.n == 16 && c.k == 16 && c.ab == "f16" && c.cr == "f32"),
            cpu: report.device_type == "cpu",
        }
    }

    /// The facts of a saved report, every feature it lists granted (a device opened
    /// there gets them all).
    pub fn described(report: &AdapterReport) -> AdapterFacts {
        let listed = |name: &str| report.features.iter().any(|f| f == name);
        AdapterFacts::from_report(report, listed, u64::from(report.limits.max_compute_workgroup_storage_size))
    }

    /// Workgroups that fill the device once: one per multiprocessor.
    pub fn wave(&self) -> u64 {
        u64::from(self.multiprocessors.unwrap_or(ASSUMED_MULTIPROCESSORS).max(1))
    }
}
