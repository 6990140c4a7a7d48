//! Described adapters: a device that stands in for an adapter this machine does not have,
//! from the report `wgtrain devices --json` wrote on the machine that has it. The stand-in
//! takes that report's features, limits, subgroup sizes, cooperative matrices and memory,
//! so kernels choose the variants, tiles and split-K slices they would choose there; the
//! wgpu device underneath is a local one that only keeps the books of a dry run. This is
//! how `wgtrain estimate --described FILE` predicts a step's peak on another GPU.
//!
//! May call: `device` (its report and capabilities), serde_json.

use std::path::Path;

use super::{AdapterReport, Capabilities, DeviceError, Gpu, choose_report, report, withheld_features};

/// Reads the adapter reports of `path` (a JSON list, as `wgtrain devices --json` writes
/// it, or one report) and picks the one `selector` names as `--adapter` would.
pub fn read_description(path: &Path, selector: Option<&str>) -> Result<AdapterReport, DeviceError> {
    let bad = |reason: String| DeviceError::Description {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let reports: Vec<AdapterReport> = if value.is_array() {
        serde_json::from_value(value)
    } else {
        serde_json::from_value(value).map(|r| vec![r])
    }
    .map_err(|e| bad(format!("not a `wgtrain devices --json` report: {e}")))?;
    let index = choose_report(&reports, selector)?;
    let chosen = reports
        .into_iter()
        .find(|r| r.index == index)
        .ok_or_else(|| bad(format!("no report has index {index}")))?;
    check(&chosen).map_err(bad)?;
    Ok(chosen)
}

/// What a report must say to stand in for its adapter.
fn check(r: &AdapterReport) -> Result<(), String> {
    let l = &r.limits;
    if l.max_buffer_size == 0 || l.max_storage_buffer_binding_size == 0 || l.max_compute_workgroup_storage_size == 0 {
        return Err(format!("'{}': a buffer or workgroup-memory limit of 0", r.name));
    }
    if !l.min_storage_buffer_offset_alignment.is_power_of_two() {
        return Err(format!(
            "'{}': min_storage_buffer_offset_alignment {} is not a power of two",
            r.name, l.min_storage_buffer_offset_alignment
        ));
    }
    if r.features.iter().any(|f| f == "SUBGROUP") {
        match r.subgroup_size {
            None => {
                return Err(format!(
                    "'{}' has subgroups but the report does not give their size (written by an older \
                     wgtrain; write it again with `wgtrain devices --json`)",
                    r.name
                ));
            }
            Some([min, max]) if min == 0 || min > max || !min.is_power_of_two() || !max.is_power_of_two() => {
                return Err(format!("'{}': subgroup size [{min}, {max}] is not a power-of-two range", r.name));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The limits a described adapter grants: wgpu's defaults, with the ones the engine reads
/// taken from the report.
fn limits(r: &AdapterReport) -> wgpu::Limits {
    let l = &r.limits;
    wgpu::Limits {
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        ..wgpu::Limits::default()
    }
}

impl Gpu {
    /// A stand-in for the adapter `described` reports, on a local device (the one
    /// `local` selects) that keeps the books: for dry runs only.
    pub fn stand_in(described: AdapterReport, local: Option<&str>) -> Result<Gpu, DeviceError> {
        check(&described).map_err(|reason| DeviceError::Description {
            path: described.name.clone(),
            reason,
        })?;
        let mut gpu = Gpu::open(local)?;
        let granted = report::ENGINE_FEATURES
            .iter()
            .filter(|(name, _)| described.features.iter().any(|f| f == name))
            .fold(wgpu::Features::empty(), |acc, (_, f)| acc | *f)
            & !withheld_features();
        gpu.caps = Capabilities::granted(&described, granted, limits(&described));
        gpu.report = described;
        gpu.stand_in = true;
        // It compiles nothing: nothing to keep.
        gpu.pipeline_cache = None;
        Ok(gpu)
    }
}
