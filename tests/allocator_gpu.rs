//! The allocator on the real device (lavapipe here): the model's random sequences on
//! wgpu pages, the cap and the forced out-of-memory path, guard bytes catching a real
//! kernel's overrun, the snapshot and event trace, and the binding scheme that lets two
//! blocks of one page meet in one dispatch.

mod alloc_model;

use std::sync::{Arc, OnceLock};

use alloc_model::{Model, Subject, op_strategy};
use proptest::prelude::*;
use wgtrain_engine::Gpu;
use wgtrain_engine::memory::EventKind;
use wgtrain_engine::memory::pool::{Placement, PoolConfig};
use wgtrain_engine::memory::{AllocError, Allocator, AllocatorOptions, Block, Category, MemoryCap, MemorySnapshot, MemoryStats};

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let selector = std::env::var("WGTRAIN_TEST_ADAPTER").ok();
        Arc::new(Gpu::open(selector.as_deref()).expect("a GPU adapter (lavapipe on CI)"))
    })
    .clone()
}

fn allocator(debug: bool, cap: Option<MemoryCap>) -> Allocator {
    Allocator::new(
        gpu(),
        AllocatorOptions {
            debug: Some(debug),
            cap,
            ..Default::default()
        },
    )
    .expect("allocator")
}

struct GpuSubject {
    alloc: Allocator,
    live: Vec<Block>,
}

fn placement(b: &Block) -> Placement {
    Placement {
        id: b.id(),
        page: b.page(),
        offset: b.offset(),
        size: b.size(),
        requested: b.requested(),
    }
}

impl Subject for GpuSubject {
    fn alloc(&mut self, bytes: u64, category: Category) -> Result<Placement, AllocError> {
        let block = self.alloc.alloc(bytes, category, "prop")?;
        let p = placement(&block);
        self.live.push(block);
        Ok(p)
    }
    fn free(&mut self, index: usize) -> Placement {
        let block = self.live.remove(index);
        let p = placement(&block);
        drop(block);
        p
    }
    fn live(&self) -> usize {
        self.live.len()
    }
    fn empty_cache(&mut self) {
        self.alloc.empty_cache();
    }
    fn reset_peaks(&mut self) {
        self.alloc.reset_peaks();
    }
    fn stats(&self) -> MemoryStats {
        self.alloc.stats()
    }
    fn snapshot(&self) -> MemorySnapshot {
        self.alloc.snapshot()
    }
    fn config(&self) -> PoolConfig {
        self.alloc.config()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.alloc.check_invariants()
    }
    fn backend_reserved(&self) -> Option<u64> {
        None
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The model's checks hold on wgpu pages, with guard bytes on and a cap.
    #[test]
    fn model_agrees_on_the_device(
        ops in prop::collection::vec(op_strategy(40 << 20), 1..60),
        cap_mib in 16u64..160,
    ) {
        let mut subject = GpuSubject { alloc: allocator(true, Some(MemoryCap::Bytes(cap_mib << 20))), live: Vec::new() };
        let mut model = Model::default();
        for op in &ops {
            model.apply(&mut subject, op)?;
            prop_assert!(subject.alloc.stats().reserved.current <= cap_mib << 20);
        }
        prop_assert!(subject.alloc.check_guards().is_ok());
    }
}

#[test]
fn forced_oom_gives_a_clear_error_and_the_device_keeps_working() {
    let alloc = allocator(false, Some(MemoryCap::Bytes(8 << 20)));
    let held = alloc.alloc(3 << 20, Category::Parameter, "wte").unwrap();
    let err = alloc.alloc(12 << 20, Category::Activation, "h.0.att").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("out of memory: tried to allocate 12.00 MiB (activation 'h.0.att')"),
        "{text}"
    );
    // 3 MiB does not fit a shared 32 MiB page under the cap: it gets a tight 4 MiB page.
    assert!(text.contains("4.00 MiB allocated, 4.00 MiB reserved in total"), "{text}");
    assert!(text.contains("cap 8.00 MiB"), "{text}");
    // What the device has left for this process (lavapipe's: the host's).
    assert!(text.contains("this process's budget"), "{text}");
    let stats = alloc.stats();
    assert_eq!((stats.num_ooms, stats.num_alloc_retries), (1, 1));
    assert!(stats.reserved.current <= 8 << 20);
    // The device still works: write and read a block after the failure.
    let data: Vec<u8> = (0..4096u32).flat_map(|i| i.to_le_bytes()).collect();
    held.write(0, &data).unwrap();
    assert_eq!(held.read().unwrap()[..data.len()], data[..]);
    // Lifting the cap lets the same request through.
    alloc.set_cap(None).unwrap();
    assert!(alloc.alloc(12 << 20, Category::Activation, "h.0.att").is_ok());
    let oom_events = alloc.snapshot().events.iter().filter(|e| e.kind == EventKind::Oom).count();
    assert_eq!(oom_events, 1);
}

#[test]
fn a_fraction_cap_uses_the_reported_memory() {
    let gpu = gpu();
    let Some(memory) = gpu.caps.memory_bytes else {
        // Backends that do not report memory refuse fractions with a clear error.
        assert!(
            Allocator::new(
                gpu,
                AllocatorOptions {
                    debug: Some(false),
                    cap: Some(MemoryCap::Fraction(0.5)),
                    ..Default::default()
                }
            )
            .is_err()
        );
        return;
    };
    // The fraction is of this process's budget where the backend reports one
    // (VK_EXT_memory_budget), which moves as this process's tests allocate: within 1%
    // of a quarter of it read just before. Else of the device's memory, exactly.
    let budget = gpu.memory_budget().map(|b| b.budget);
    let alloc = allocator(false, Some(MemoryCap::Fraction(0.25)));
    let cap = alloc.stats().cap.expect("a cap");
    match budget {
        Some(b) => assert!(cap.abs_diff(b / 4) <= b / 400, "cap {cap}, budget {b}"),
        None => assert_eq!(cap, memory / 4),
    }
}

#[test]
fn empty_cache_returns_wholly_free_pages_only() {
    let alloc = allocator(false, None);
    let keep = alloc.alloc(1000, Category::Parameter, "keep").unwrap();
    let big = alloc.alloc(20 << 20, Category::Activation, "big").unwrap();
    let reserved = alloc.stats().reserved.current;
    drop(big);
    assert_eq!(alloc.stats().reserved.current, reserved, "freed blocks stay cached");
    let released = alloc.empty_cache();
    assert_eq!(released, 20 << 20);
    assert_eq!(alloc.stats().reserved.current, reserved - (20 << 20));
    assert_eq!(alloc.stats().pages.current, 1);
    drop(keep);
}

#[test]
fn snapshot_and_trace_match_the_counters() {
    let alloc = allocator(false, None);
    let a = alloc.alloc(4000, Category::Parameter, "ln_1.weight").unwrap();
    alloc.end_step().unwrap();
    let b = alloc.alloc(2 << 20, Category::Gradient, "ln_1.weight.grad").unwrap();
    drop(a);
    let snap = alloc.snapshot();
    snap.check_consistent().unwrap();
    let kinds: Vec<(EventKind, u64)> = snap.events.iter().map(|e| (e.kind, e.step)).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::PageAlloc, 0),
            (EventKind::Alloc, 0),
            (EventKind::PageAlloc, 1),
            (EventKind::Alloc, 1),
            (EventKind::Free, 1),
        ]
    );
    let live: Vec<_> = snap.pages.iter().flat_map(|p| &p.blocks).filter(|b| b.allocated).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].label.as_deref(), Some("ln_1.weight.grad"));
    assert_eq!(live[0].category, Some(Category::Gradient));
    assert!(snap.events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    let json = serde_json::to_string(&snap).unwrap();
    assert!(json.contains("\"kind\":\"page_alloc\""));
    drop(b);
}

/// A kernel that writes `value` to `dst[0..count]` and doubles `src` into `dst`'s
/// neighbour: enough to bind two blocks of one page, and to overrun a block.
const KERNEL: &str = r#"
override count: u32;
@group(0) @binding(0) var<storage, read_write> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3u) {
    if id.x < count { dst[id.x] = 2.0 * src[id.x] + 1.0; }
}
"#;

fn dispatch(gpu: &Gpu, src: &Block, dst: &Block, count: u32, src_read_only: bool) -> Result<(), String> {
    let source = if src_read_only {
        KERNEL.replace("var<storage, read_write> src", "var<storage, read> src")
    } else {
        KERNEL.to_string()
    };
    let module = gpu.create_module("test kernel", &source).map_err(|e| e.to_string())?;
    let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("test kernel"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &[("count", count as f64)],
            ..Default::default()
        },
        cache: None,
    });
    gpu.scoped(wgpu::ErrorFilter::Validation, || {
        let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(src.binding()),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(dst.binding()),
                },
            ],
        });
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(count.div_ceil(64), 1, 1);
        }
        gpu.queue.submit([encoder.finish()]);
    })
    .map_err(|e| e.to_string())?;
    gpu.wait().map_err(|e| e.to_string())
}

#[test]
fn two_blocks_of_one_page_meet_in_one_dispatch() {
    let gpu = gpu();
    let alloc = allocator(true, None);
    let n = 1000u32;
    let src = alloc.alloc(n as u64 * 4, Category::Activation, "x").unwrap();
    let dst = alloc.alloc(n as u64 * 4, Category::Activation, "y").unwrap();
    assert_eq!(src.page(), dst.page(), "both blocks come from one small page");
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    src.write(0, bytemuck::cast_slice(&input)).unwrap();
    // The engine's scheme: every storage binding read_write. Valid, and correct.
    dispatch(&gpu, &src, &dst, n, false).unwrap();
    let out: Vec<f32> = bytemuck::cast_slice(&dst.read().unwrap()).to_vec();
    assert!(out.iter().zip(&input).all(|(o, i)| *o == 2.0 * i + 1.0));
    // Why: one page bound read-only and read-write in one dispatch is refused.
    let err = dispatch(&gpu, &src, &dst, n, true).unwrap_err();
    assert!(
        err.to_lowercase().contains("usage") || err.to_lowercase().contains("conflict"),
        "{err}"
    );
    alloc.check_guards().unwrap();
}

#[test]
fn a_kernel_writing_past_its_block_is_caught_and_named() {
    let gpu = gpu();
    let alloc = allocator(true, None);
    let n = 100u32;
    let src = alloc.alloc(n as u64 * 4 + 64, Category::Temporary, "src").unwrap();
    let dst = alloc.alloc(n as u64 * 4, Category::Activation, "h.3.fch").unwrap();
    alloc.check_guards().unwrap();
    // An off-by-three bug: the kernel writes three elements past the tensor.
    dispatch(&gpu, &src, &dst, n + 3, false).unwrap();
    let err = alloc.end_step().unwrap_err().to_string();
    assert!(
        err.contains("'h.3.fch' (activation, 400 B) was overrun: 12 guard bytes changed, the first 0 bytes past its end"),
        "{err}"
    );
    assert!(!err.contains("'src'"), "{err}");
    // On free, too: the violation is recorded and reported at the next step end.
    drop(dst);
    let err = alloc.end_step().unwrap_err().to_string();
    assert!(err.contains("'h.3.fch'"), "{err}");
    alloc.end_step().unwrap();
}
