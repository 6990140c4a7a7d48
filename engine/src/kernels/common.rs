//! What every kernel family shares: the host checks that stand in for the shaders'
//! bounds checks, the `enable f16;` line, the SHADER_F16 requirement, and the WGSL
//! snippets pasted into several families (activations, workgroup reductions).
//!
//! May call: `device`, `error`, `runtime`, `tensor`. Called by: the kernel families.

use crate::device::DeviceError;
use crate::error::Error;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Activation functions shared by kernels (pasted at `{{ACTIVATIONS}}`).
pub const ACTIVATIONS: &str = include_str!("../../../shaders/activations.wgsl");
/// The fused attention kernels' parameters and indexing (pasted at
/// `{{ATTENTION_COMMON}}`; the kernel declares `D4`).
pub const ATTENTION_COMMON: &str = include_str!("../../../shaders/attention_common.wgsl");
/// Workgroup tree reductions (sum, max, paired sum) shared by the row kernels (pasted
/// at `{{WORKGROUP_REDUCE}}`; the kernel declares `WG`).
pub const WORKGROUP_REDUCE: &str = include_str!("../../../shaders/workgroup_reduce.wgsl");

/// Checks on the host that `t` holds `dtype` and that every element it addresses lies
/// inside its block: what the unchecked shader would otherwise overrun.
pub fn check_tensor(what: &str, t: &Tensor, dtype: DType) -> Result<(), Error> {
    if t.dtype() != dtype {
        return Err(Error::shape(what, dtype, t.dtype()));
    }
    if t.extent() > t.capacity() {
        return Err(Error::shape(
            what,
            format!("a view inside its {}-element block", t.capacity()),
            format!(
                "view {:?} (strides {:?}, offset {}) reaching element {}",
                t.shape(),
                t.strides(),
                t.offset(),
                t.extent()
            ),
        ));
    }
    if t.numel() > u32::MAX as usize || t.capacity() > u32::MAX as usize {
        return Err(Error::shape(
            what,
            "at most 2^32 elements",
            format!("{} elements", t.capacity().max(t.numel())),
        ));
    }
    Ok(())
}

/// Checks that `t` is contiguous with shape `shape`.
pub fn check_contiguous(what: &str, t: &Tensor, shape: &[usize]) -> Result<(), Error> {
    if t.shape() != shape || !t.is_contiguous() {
        return Err(Error::shape(
            what,
            format!("a contiguous {shape:?}"),
            format!("{:?} with strides {:?}", t.shape(), t.strides()),
        ));
    }
    Ok(())
}

/// The `enable f16;` line a variant needs for `dtype`.
pub fn enables(dtypes: &[DType]) -> String {
    if dtypes.contains(&DType::F16) {
        "enable f16;".into()
    } else {
        String::new()
    }
}

/// Fails clearly when an f16 variant is asked of an adapter without SHADER_F16.
pub fn require_f16(rt: &Runtime, dtypes: &[DType]) -> Result<(), Error> {
    if dtypes.contains(&DType::F16) && !rt.gpu.caps.shader_f16 {
        return Err(DeviceError::MissingFeature {
            adapter: rt.gpu.report.name.clone(),
            feature: "SHADER_F16",
        }
        .into());
    }
    Ok(())
}
