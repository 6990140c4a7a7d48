//! The device layer and `wgtrain devices`: the adapter list as JSON, adapter choice by
//! index, backend and name, and typed errors for bad selectors and bad shaders.

use std::process::Command;

use wgtrain_engine::device::{self, DeviceError, Gpu};

fn wgtrain(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(args)
        .output()
        .expect("run wgtrain")
}

#[test]
fn devices_json_lists_a_vulkan_adapter_with_every_field() {
    let out = wgtrain(&["devices", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let list = list.as_array().expect("a list");
    let vulkan = list
        .iter()
        .find(|a| a["backend"] == "vulkan")
        .expect("a Vulkan adapter (lavapipe on CI)");
    for key in [
        "index",
        "backend",
        "name",
        "device_type",
        "driver",
        "features",
        "limits",
        "cooperative_matrix",
        "memory_bytes",
        "subgroup_size",
    ] {
        assert!(vulkan.get(key).is_some(), "missing {key}: {vulkan}");
    }
    for key in [
        "max_buffer_size",
        "max_storage_buffer_binding_size",
        "min_storage_buffer_offset_alignment",
        "max_compute_workgroup_storage_size",
        "max_compute_invocations_per_workgroup",
    ] {
        assert!(vulkan["limits"][key].as_u64().unwrap_or(0) > 0, "limit {key}: {vulkan}");
    }
    // Vulkan reports its device-local heaps.
    assert!(vulkan["memory_bytes"].as_u64().unwrap_or(0) > 0, "{vulkan}");
    for (i, a) in list.iter().enumerate() {
        assert_eq!(a["index"].as_u64(), Some(i as u64));
    }
}

#[test]
fn adapters_are_chosen_by_index_backend_and_name() {
    let adapters = device::enumerate_adapters();
    let reports = device::list_adapters();
    let vulkan = reports.iter().find(|r| r.backend == "vulkan").expect("a Vulkan adapter");
    assert_eq!(
        device::choose_adapter(&adapters, Some(&vulkan.index.to_string())).unwrap(),
        vulkan.index
    );
    let by_backend = device::choose_adapter(&adapters, Some("VULKAN")).unwrap();
    assert_eq!(reports[by_backend].backend, "vulkan");
    let word = vulkan.name.split_whitespace().next().unwrap().to_lowercase();
    let by_name = device::choose_adapter(&adapters, Some(&word)).unwrap();
    assert!(reports[by_name].name.to_lowercase().contains(&word));
    // Without a selector, GL is never preferred over a native backend.
    let default = device::choose_adapter(&adapters, None).unwrap();
    assert_ne!(reports[default].backend, "gl");
    match device::choose_adapter(&adapters, Some("no-such-gpu")) {
        Err(DeviceError::NoMatch { selector, available }) => {
            assert_eq!(selector, "no-such-gpu");
            assert!(available.contains(&vulkan.name), "{available}");
        }
        other => panic!("expected NoMatch, got {other:?}"),
    }
}

#[test]
fn a_bad_selector_on_the_command_line_is_a_clear_error() {
    let out = wgtrain(&["bench", "--quick", "--adapter", "no-such-gpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: no adapter matches 'no-such-gpu'; available:"), "{err}");
}

#[test]
fn the_device_records_what_it_was_granted() {
    let gpu = Gpu::open(Some("vulkan")).unwrap();
    let l = &gpu.caps.limits;
    assert_eq!(l.max_storage_buffer_binding_size, gpu.report.limits.max_storage_buffer_binding_size);
    assert_eq!(gpu.caps.shader_f16, gpu.report.features.iter().any(|f| f == "SHADER_F16"));
    assert_eq!(gpu.caps.subgroup, gpu.report.features.iter().any(|f| f == "SUBGROUP"));
    // No cooperative matrices on lavapipe; the host logic must then say no.
    assert_eq!(
        gpu.caps.coop_f16_16x16x16(),
        gpu.caps
            .cooperative_matrix
            .iter()
            .any(|c| c.m == 16 && c.ab == "f16" && c.cr == "f32")
    );
    gpu.check().unwrap();
}

#[test]
fn a_bad_shader_is_a_typed_error_not_a_panic() {
    let gpu = Gpu::open(Some("vulkan")).unwrap();
    match gpu.create_module("broken", "@compute @workgroup_size(1) fn main() { let x: f32 = undefined_thing; }") {
        Err(DeviceError::Shader { label, message }) => {
            assert_eq!(label, "broken");
            assert!(message.contains("undefined_thing"), "{message}");
        }
        other => panic!("expected a shader error, got {:?}", other.map(|_| ())),
    }
    gpu.check().unwrap();
}
