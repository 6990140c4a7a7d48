//! How many workgroups the adapter keeps resident at once, by workgroup memory and by
//! registers: each workgroup counts itself in on entry and out on exit with atomics, and
//! the peak count is read back. On a GPU with S multiprocessors, peak / S is the
//! workgroups per multiprocessor that the driver allowed, which no Vulkan query gives (the
//! driver picks the split between L1 and workgroup memory itself).
//!
//! Each probe: WG threads, SMEM bytes of workgroup memory (all of it touched), and R
//! independent FMA chains per thread that keep about R registers live.
//!
//!   cargo run --release --example occupancy_probe -- [ADAPTER] [MULTIPROCESSORS]
//!
//! Prints one JSON object per probe.
use std::fmt::Write;
use std::sync::Arc;

use wgtrain_engine::memory::{AllocatorOptions, Category};
use wgtrain_engine::runtime::KernelKey;
use wgtrain_engine::{DType, Gpu, Runtime, Tensor};

/// The probe's WGSL.
fn source(wg: u32, smem: u32, r: u32) -> String {
    let n4 = smem / 16;
    let mut s = format!(
        "struct Params {{ iters: u32, _a: u32, _b: u32, _c: u32 }}\n\
         @group(0) @binding(0) var<uniform> p: Params;\n\
         @group(0) @binding(1) var<storage, read_write> counters: array<atomic<u32>>;\n\
         @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> pad: array<vec4<f32>, {n4}>;\n\
         @compute @workgroup_size({wg})\n\
         fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         for (var e = lid; e < {n4}u; e += {wg}u) {{ pad[e] = vec4<f32>(f32(e)); }}\n\
         if lid == 0u {{ let c = atomicAdd(&counters[0], 1u) + 1u; atomicMax(&counters[1], c); }}\n\
         workgroupBarrier();\n"
    );
    for j in 0..r {
        let _ = writeln!(s, "var a_{j} = f32(lid + {j}u);");
    }
    let _ = writeln!(s, "for (var i = 0u; i < p.iters; i++) {{\nlet x = pad[(lid * 7u + i) % {n4}u];");
    for j in 0..r {
        let _ = writeln!(
            s,
            "a_{j} = fma(a_{j}, x.{}, x.{});",
            ["x", "y", "z", "w"][j as usize % 4],
            ["y", "z", "w", "x"][j as usize % 4]
        );
    }
    s += "}\nworkgroupBarrier();\nif lid == 0u { atomicSub(&counters[0], 1u); }\n";
    let sum: Vec<String> = (0..r).map(|j| format!("a_{j}")).collect();
    let _ = writeln!(s, "out[wid.x * {wg}u + lid] = {};\n}}", sum.join(" + "));
    s
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let adapter = std::env::args().nth(1);
    let sms: u32 = std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(132);
    let gpu = Arc::new(Gpu::open(adapter.as_deref())?);
    let rt = Runtime::new(gpu, AllocatorOptions::default())?;
    let groups = sms * 32;
    let out = Tensor::empty(&rt, &[(groups * 256) as usize], DType::F32, Category::Activation, "out")?;
    let params: [u32; 4] = [2048, 0, 0, 0];
    let mut code = 0;
    for wg in [128u32, 256] {
        for smem in [4096u32, 16384, 24576, 32768, 40960, 47104] {
            for r in [8u32, 96, 200] {
                code += 1;
                let wgsl = source(wg, smem, r);
                let kernel = rt.kernel(
                    KernelKey::new("occupancy_probe", &[code]),
                    2,
                    || format!("occupancy_probe {code}"),
                    || Ok(wgsl),
                )?;
                let counters = Tensor::from_i32(&rt, &[0, 0], &[2], Category::Activation, "counters")?;
                let run = || rt.launch(&kernel, bytemuck::bytes_of(&params), &[&counters, &out], [groups, 1, 1]);
                run()?;
                rt.sync()?;
                let peak = counters.read_f32(&rt)?[1];
                let seconds = rt.time(run)?;
                println!(
                    "{{\"threads\": {wg}, \"smem\": {smem}, \"chains\": {r}, \"peak\": {peak}, \"per_sm\": {:.2}, \"us\": {:.1}}}",
                    peak / sms as f32,
                    seconds * 1e6
                );
            }
        }
    }
    Ok(())
}
