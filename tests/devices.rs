//! The device layer and `wgtrain devices`: the adapter list as JSON, adapter choice by
//! index, backend and name, typed errors for bad selectors and bad shaders, and host
//! transfers (both upload paths) that return the bytes they were given.

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

/// Two zeroed `size`-byte device buffers, and `total` bytes of a pattern (from `seed`)
/// written into `ranges` of them (which name the buffers by index: 0 or 1).
fn two_buffers_with_data(gpu: &Gpu, size: u64, ranges: &[(usize, u64, u64)], seed: u64) -> ([wgpu::Buffer; 2], Vec<u8>) {
    let make = || {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("transfer test"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    };
    let buffers = [make(), make()];
    let zeros = vec![0u8; 2 * size as usize];
    gpu.upload(&[(&buffers[0], 0, size), (&buffers[1], 0, size)], &zeros).unwrap();
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    let data: Vec<u8> = (0..total).map(|i| ((i * seed + i / 4093) % 251) as u8).collect();
    let refs: Vec<_> = ranges.iter().map(|&(k, o, l)| (&buffers[k], o, l)).collect();
    gpu.upload(&refs, &data).unwrap();
    (buffers, data)
}

/// Uploads then downloads ranges of two buffers that span several staging chunks, through
/// buffers in host memory and through mapped wgpu buffers, and checks every byte (and
/// the bytes around the ranges, which must stay as they were).
#[test]
fn uploads_and_downloads_return_every_byte_through_both_upload_paths() {
    use wgtrain_engine::device::transfer::CHUNK;
    let gpu = std::sync::Arc::new(Gpu::open(Some("vulkan")).unwrap());
    let spans = [(0, 4096, CHUNK - 1000), (1, 0, 8), (1, 1 << 20, 2 << 20)];
    for (pinned, seed) in [(true, 7u64), (false, 13)] {
        gpu.set_pinned_uploads(pinned);
        let (buffers, data) = two_buffers_with_data(&gpu, CHUNK + (3 << 20), &spans, seed);
        assert_eq!(gpu.pinned_uploads(), Some(pinned), "lavapipe can make host-memory upload buffers");
        let [a, b] = &buffers;
        let ranges: Vec<_> = spans.iter().map(|&(k, o, l)| (&buffers[k], o, l)).collect();
        let back = gpu.download(&ranges).unwrap().finish().unwrap();
        assert!(back == data, "pinned {pinned}: the bytes came back changed");
        // Around the ranges: still zero.
        let around = gpu.download(&[(a, 0, 4096), (b, 8, 4096)]).unwrap().finish().unwrap();
        assert!(around.iter().all(|&x| x == 0), "pinned {pinned}: bytes outside the ranges changed");
    }
    gpu.check().unwrap();
}

#[test]
fn host_vectors_take_and_give_every_byte_pinned_or_plain() {
    let gpu = std::sync::Arc::new(Gpu::open(Some("vulkan")).unwrap());
    // Ranges of two buffers, one empty, laid end to end in the vector.
    let spans = [(0, 4096, (3 << 20) - 12), (1, 0, 0), (1, 1 << 20, 2 << 20)];
    let total: u64 = spans.iter().map(|r| r.2).sum();
    for (pinned, seed) in [(true, 7u64), (false, 13)] {
        gpu.set_pinned_uploads(pinned);
        let (buffers, data) = two_buffers_with_data(&gpu, 6 << 20, &spans, seed);
        let [a, b] = &buffers;
        let ranges: Vec<_> = spans.iter().map(|&(k, o, l)| (&buffers[k], o, l)).collect();
        let got = gpu.download_host(&ranges).unwrap().finish().unwrap();
        assert_eq!(got.is_pinned_for(&gpu), pinned, "lavapipe can make pinned host vectors");
        assert!(
            bytemuck::cast_slice::<f32, u8>(&got) == &data[..],
            "pinned {pinned}: the download changed bytes"
        );
        // Changed on the host and copied back, from the same vector.
        let mut got = got;
        got.iter_mut().for_each(|x| *x = -*x);
        let want: Vec<u8> = bytemuck::cast_slice(&got).to_vec();
        gpu.upload_host(&ranges, got).unwrap();
        let back = gpu.download(&ranges).unwrap().finish().unwrap();
        assert!(back == want, "pinned {pinned}: the upload changed bytes");
        let around = gpu.download(&[(a, 0, 4096), (b, 0, 1 << 20)]).unwrap().finish().unwrap();
        assert!(around.iter().all(|&x| x == 0), "pinned {pinned}: bytes outside the ranges changed");
        // A vector of another device (or a plain one) goes through staging: same bytes.
        let other = std::sync::Arc::new(Gpu::open(Some("vulkan")).unwrap());
        let foreign = other.host_vec((total / 4) as usize);
        assert!(!foreign.is_pinned_for(&gpu));
        let mut foreign = foreign;
        let values: Vec<f32> = data.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        foreign.copy_from_slice(&values);
        gpu.upload_host(&ranges, foreign).unwrap();
        assert!(
            gpu.download(&ranges).unwrap().finish().unwrap() == data,
            "pinned {pinned}: another device's vector"
        );
    }
    gpu.check().unwrap();
}

#[test]
fn the_memory_budget_and_this_processs_usage_are_told_and_move_with_allocations() {
    // `wgtrain devices --json`: lavapipe's memory is the host's, so it tells them.
    let out = wgtrain(&["devices", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lavapipe = list.as_array().unwrap().iter().find(|a| a["backend"] == "vulkan").unwrap();
    let (budget, usage) = (lavapipe["memory_budget_bytes"].as_u64(), lavapipe["memory_usage_bytes"].as_u64());
    assert!(budget.zip(usage).is_some_and(|(b, u)| b > u && u > 0), "{lavapipe}");
    // In a process: 256 MiB written on the device shows in the usage.
    let gpu = Gpu::open(Some("vulkan")).unwrap();
    let before = gpu.memory_budget().expect("lavapipe tells it");
    let size = 256u64 << 20;
    let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("budget test"),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    gpu.queue.write_buffer(&buffer, 0, &vec![1u8; size as usize]);
    gpu.wait().unwrap();
    let after = gpu.memory_budget().unwrap();
    assert!(
        after.usage >= before.usage + size * 3 / 4,
        "usage {} -> {} after writing {size} bytes",
        before.usage,
        after.usage
    );
    drop(buffer);
}
