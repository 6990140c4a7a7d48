//! How fast a CPU adapter (lavapipe) runs the simplest matmul at several workgroup and
//! thread-tile shapes: each thread R rows x 4Q columns of C straight from memory (no
//! workgroup memory, no barriers), K by 4, whole shapes only. On this project's 2-core
//! machine none passed about 1 GFLOP/s, against 0.4-0.7 for shaders/matmul.wgsl, so the
//! CPU adapters keep the tiled kernel (`kernels::matmul_plan::tiled_tile`).
//!
//!   cargo run --release --example cpu_matmul_probe
//!
//! Prints a line per shape and variant. May call: `wgtrain_engine` (runtime, tensors).
use std::fmt::Write;
use std::sync::Arc;

use wgtrain_engine::memory::{AllocatorOptions, Category};
use wgtrain_engine::runtime::KernelKey;
use wgtrain_engine::{DType, Gpu, Runtime, Tensor};

/// R rows x 4Q columns a thread, workgroup WX x WY; k by 4.
fn source(wx: u32, wy: u32, r: u32, q: u32) -> String {
    let mut s = format!(
        "struct Params {{ m: u32, k: u32, n: u32, _c: u32 }}\n\
         @group(0) @binding(0) var<uniform> p: Params;\n\
         @group(0) @binding(1) var<storage, read_write> a: array<vec4<f32>>;\n\
         @group(0) @binding(2) var<storage, read_write> b: array<vec4<f32>>;\n\
         @group(0) @binding(3) var<storage, read_write> c: array<vec4<f32>>;\n\
         @compute @workgroup_size({wx}, {wy})\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         let row0 = gid.y * {r}u; let col4 = gid.x * {q}u; let k4 = p.k / 4u; let n4 = p.n / 4u;\n"
    );
    for i in 0..r {
        for j in 0..q {
            let _ = writeln!(s, "var acc{i}_{j} = vec4<f32>(0.0);");
        }
    }
    s += "for (var kk = 0u; kk < k4; kk++) {\n";
    for i in 0..r {
        let _ = writeln!(s, "let a{i} = a[(row0 + {i}u) * k4 + kk];");
    }
    for l in 0..4 {
        for j in 0..q {
            let _ = writeln!(s, "let b{l}_{j} = b[(kk * 4u + {l}u) * n4 + col4 + {j}u];");
        }
    }
    for i in 0..r {
        for j in 0..q {
            for (l, lane) in ["x", "y", "z", "w"].iter().enumerate() {
                let _ = writeln!(s, "acc{i}_{j} = fma(vec4<f32>(a{i}.{lane}), b{l}_{j}, acc{i}_{j});");
            }
        }
    }
    s += "}\n";
    for i in 0..r {
        for j in 0..q {
            let _ = writeln!(s, "c[(row0 + {i}u) * n4 + col4 + {j}u] = acc{i}_{j};");
        }
    }
    s += "}\n";
    s
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Arc::new(Gpu::open(None)?);
    let rt = Runtime::new(gpu, AllocatorOptions::default())?;
    let mut code = 0;
    for (m, k, n) in [(2048u32, 64u32, 192u32), (2048, 256, 64), (512, 512, 512)] {
        let filled = |rows: u32, cols: u32, v: f32| {
            let shape = [rows as usize, cols as usize];
            Tensor::from_f32(&rt, &vec![v; shape[0] * shape[1]], &shape, Category::Activation, "operand")
        };
        let (a, b) = (filled(m, k, 0.5)?, filled(k, n, 0.25)?);
        let c = Tensor::empty(&rt, &[m as usize, n as usize], DType::F32, Category::Activation, "c")?;
        for (wx, wy, r, q) in [
            (8u32, 8u32, 4u32, 2u32),
            (8, 8, 8, 2),
            (4, 8, 4, 4),
            (2, 8, 8, 4),
            (8, 2, 8, 2),
            (16, 16, 4, 2),
            (8, 1, 8, 2),
        ] {
            if n % (wx * q * 4) != 0 || m % (wy * r) != 0 {
                continue;
            }
            code += 1;
            let wgsl = source(wx, wy, r, q);
            let kernel = rt.kernel(KernelKey::new("cpu_probe", &[code]), 3, || format!("probe {code}"), || Ok(wgsl))?;
            let params: [u32; 4] = [m, k, n, 0];
            let groups = [n / (wx * q * 4), m / (wy * r), 1];
            let run = || rt.launch(&kernel, bytemuck::bytes_of(&params), &[&a, &b, &c], groups);
            run()?;
            rt.sync()?;
            let got = c.read_f32(&rt)?;
            let want = 0.125 * k as f32;
            assert!(got.iter().all(|&x| (x - want).abs() < 1e-3), "{:?}", &got[..4]);
            let s = rt.time(run)?;
            println!(
                "{m}x{k}x{n} wg {wx}x{wy} thread {r}x{} : {:.1} us {:.2} GFLOP/s",
                4 * q,
                s * 1e6,
                2.0 * (m * k * n) as f64 / s / 1e9
            );
        }
    }
    Ok(())
}
