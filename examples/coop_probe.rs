//! What the adapter's cooperative matrices (16x16x16 f16 -> f32) can do, apart from any
//! matmul around them. Each probe is a workgroup of 8 subgroups, each holding FM x FN
//! accumulators and multiplying in a loop with no global memory traffic, in three modes:
//!   - `regs`: the A and B fragments loaded once, then multiply-adds only (the ceiling);
//!   - `ldT`: each 16-step loads its fragments from workgroup memory, row-major
//!     (`coopLoadT`, as the matmul loads A [M][K] and B [K][N]);
//!   - `ld`: the same, column-major (`coopLoad`).
//!
//! Then the matmul's K loop rebuilt piece by piece (see [`source`]), and whole products
//! whose fragments come straight from global memory ([`direct_source`]). The gap between
//! `regs` and the load modes is what fragment loads cost; the gap between `regs` and the
//! matmul's TFLOP/s is what the rest of the matmul costs (CHANGELOG.md).
//!
//! Prints one JSON object per probe. Run on a GPU whose adapter grants them:
//!   cargo run --release --example coop_probe -- [ADAPTER]
//! Elsewhere it checks that every probe is valid WGSL and says why nothing ran.
use std::fmt::Write;
use std::sync::Arc;

use wgtrain_engine::memory::{AllocatorOptions, Category};
use wgtrain_engine::runtime::KernelKey;
use wgtrain_engine::{DType, Gpu, Runtime, Tensor};

const ITERS: u32 = 4096;

/// One line per accumulator fragment (i, j) of FM x FN, as `line` writes it.
fn per_fragment(s: &mut String, fm: u32, fn_: u32, line: impl Fn(u32, u32) -> String) {
    for i in 0..fm {
        for j in 0..fn_ {
            s.push_str(&line(i, j));
            s.push('\n');
        }
    }
}

/// The probe's WGSL: 8 subgroups as 2 x 4, FM x FN fragments each, `mode` as above.
/// Modes past `ld` rebuild the matmul's K loop piece by piece around `ldT`'s 16-steps,
/// four of them (K by 64) per iteration: `bar` adds its two workgroup barriers, `stash`
/// the writes of the next tile into workgroup memory between them, `glob` the global
/// loads (16 bytes a thread and load, 8 per thread) behind those writes, issued before
/// the multiply-adds; `late` issues them after the first barrier instead; `mat` loads
/// them as `mat4x2<f16>` (no f16 unpacking).
fn source(fm: u32, fn_: u32, mode: &str) -> String {
    let (bm, bn) = (2 * fm * 16, 4 * fn_ * 16);
    let (lda, ldb) = (64 + 8, bn + 8);
    let has = |flag: &str| mode.split('+').any(|m| m == flag);
    let (mat, coop) = (has("mat"), has("coop"));
    let src_ty = if mat {
        "mat4x2<f16>"
    } else if coop {
        "f16"
    } else {
        "vec4<u32>"
    };
    let first = if mat {
        "src[e % 4096u][0].x"
    } else if coop {
        "src[e % 4096u]"
    } else {
        "f16(unpack2x16float(src[e % 4096u].x).x)"
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         struct Params {{ iters: u32, pad0: u32, pad1: u32, pad2: u32 }}\n\
         @group(0) @binding(0) var<uniform> p: Params;\n\
         @group(0) @binding(1) var<storage, read_write> src: array<{src_ty}>;\n\
         @group(0) @binding(2) var<storage, read_write> dst: array<f32>;\n\
         var<workgroup> a_tile: array<f16, {}>;\nvar<workgroup> b_tile: array<f16, {}>;\n\
         @compute @workgroup_size(256)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         let tid = lid.x;\n let sg = tid / 32u;\n\
         for (var e = tid; e < {}u; e += 256u) {{ a_tile[e] = {first}; }}\n\
         for (var e = tid; e < {}u; e += 256u) {{ b_tile[e] = {first}; }}\n\
         workgroupBarrier();\n\
         let m0 = (sg / 4u) * {}u;\n let n0 = (sg % 4u) * {}u;\n",
        bm * lda,
        64 * ldb,
        bm * lda,
        64 * ldb,
        fm * 16,
        fn_ * 16
    );
    let load = if mode == "ld" { "coopLoad" } else { "coopLoadT" };
    let frags = |s: &mut String, kk: &str| {
        for i in 0..fm {
            let _ = writeln!(
                s,
                "let a_{i} = {load}<coop_mat16x16<f16, A>>(&a_tile[(m0 + {}u) * {lda}u + {kk}], {lda}u);",
                16 * i
            );
        }
        for j in 0..fn_ {
            let _ = writeln!(
                s,
                "let b_{j} = {load}<coop_mat16x16<f16, B>>(&b_tile[{kk} * {ldb}u + n0 + {}u], {ldb}u);",
                16 * j
            );
        }
    };
    // The next tile's global loads: A's then B's vectors of this thread, 16 bytes each.
    let (a_loads, b_loads) = (bm * 64 / 8 / 256, 64 * bn / 8 / 256);
    let fetch = |s: &mut String| {
        if coop {
            // Four 16 x 16 fragments of each operand per subgroup, as A [M][K] and B [K][N]
            // with rows of 4096.
            s.push_str("let g = ((wid.x * 131u + it) * 64u) % 8388608u;\n");
            for q in 0..4 {
                let _ = writeln!(
                    s,
                    "let ca_{q} = coopLoadT<coop_mat16x16<f16, A>>(&src[g + ((sg * 4u + {q}u) / 4u) * 65536u + ((sg * 4u + {q}u) % 4u) * 16u], 4096u);"
                );
                let _ = writeln!(
                    s,
                    "let cb_{q} = coopLoadT<coop_mat16x16<f16, B>>(&src[16777216u + g + ((sg * 4u + {q}u) / 8u) * 65536u + ((sg * 4u + {q}u) % 8u) * 16u], 4096u);"
                );
            }
            return;
        }
        s.push_str("let g = ((wid.x * 131u + it) * 4096u) % 4190208u;\n");
        for l in 0..a_loads + b_loads {
            let _ = writeln!(s, "let r_{l} = src[g + tid + {}u];", 256 * l);
        }
    };
    let stash = |s: &mut String| {
        if coop {
            for q in 0..4 {
                let _ = writeln!(
                    s,
                    "coopStoreT(ca_{q}, &a_tile[((sg * 4u + {q}u) / 4u) * {}u + ((sg * 4u + {q}u) % 4u) * 16u], {lda}u);",
                    16 * lda
                );
                let _ = writeln!(
                    s,
                    "coopStoreT(cb_{q}, &b_tile[((sg * 4u + {q}u) / 8u) * {}u + ((sg * 4u + {q}u) % 8u) * 16u], {ldb}u);",
                    16 * ldb
                );
            }
            return;
        }
        for l in 0..a_loads + b_loads {
            let (tile, ld, per_row, e) = if l < a_loads {
                ("a_tile", lda, 8, l)
            } else {
                ("b_tile", ldb, bn / 8, l - a_loads)
            };
            let _ = writeln!(
                s,
                "{{\n let e = tid + {}u;\n let t = (e / {per_row}u) * {ld}u + (e % {per_row}u) * 8u;",
                256 * e
            );
            if !has("glob") {
                s.push_str(" let h = f16(it);\n for (var i = 0u; i < 8u; i++) { ");
                let _ = writeln!(s, "{tile}[t + i] = h; }}");
            } else if mat {
                for i in 0..8 {
                    let _ = writeln!(s, " {tile}[t + {i}u] = r_{l}[{}].{};", i / 2, ["x", "y"][i % 2]);
                }
            } else {
                for (c, x) in ["x", "y", "z", "w"].iter().enumerate() {
                    let _ = writeln!(s, " let h{c} = vec2<f16>(unpack2x16float(r_{l}.{x}));");
                    let _ = writeln!(s, " {tile}[t + {}u] = h{c}.x;\n {tile}[t + {}u] = h{c}.y;", 2 * c, 2 * c + 1);
                }
            }
            s.push_str("}\n");
        }
    };
    per_fragment(&mut s, fm, fn_, |i, j| format!("var acc_{i}_{j} = coop_mat16x16<f32, C>();"));
    if mode == "regs" {
        frags(&mut s, "0u");
    }
    s += "for (var it = 0u; it < p.iters; it += 4u) {\n";
    if has("glob") && !has("late") {
        fetch(&mut s);
    }
    for step in 0..4 {
        s += "{\n";
        if mode != "regs" {
            frags(&mut s, &format!("{}u", 16 * step));
        }
        per_fragment(&mut s, fm, fn_, |i, j| {
            format!("acc_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, acc_{i}_{j});")
        });
        s += "}\n";
    }
    if has("bar") {
        if !has("one") {
            s += "workgroupBarrier();\n";
        }
        if has("glob") && has("late") {
            fetch(&mut s);
        }
        if has("stash") {
            stash(&mut s);
        }
        s += "workgroupBarrier();\n";
    }
    s += "}\n";
    let _ = writeln!(s, "let out = wid.x * {}u;", bm * bn);
    per_fragment(&mut s, fm, fn_, |i, j| {
        format!(
            "coopStoreT(acc_{i}_{j}, &dst[out + (m0 + {}u) * {bn}u + n0 + {}u], {bn}u);",
            16 * i,
            16 * j
        )
    });
    s += "}\n";
    s
}

/// A whole 4096^3 product C = A B with no workgroup memory at all: each subgroup loads
/// its fragments straight from A [M][K] and B [K][N] in the storage buffer (the caches
/// share them between subgroups), so the K loop has no barriers and no stores.
/// GM x GN subgroups of FM x FN fragments.
fn direct_source(gm: u32, gn: u32, fm: u32, fn_: u32) -> String {
    let (bm, bn, n) = (gm * fm * 16, gn * fn_ * 16, 4096);
    let mut s = String::new();
    let _ = write!(
        s,
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         struct Params {{ iters: u32, pad0: u32, pad1: u32, pad2: u32 }}\n\
         @group(0) @binding(0) var<uniform> p: Params;\n\
         @group(0) @binding(1) var<storage, read_write> src: array<f16>;\n\
         @group(0) @binding(2) var<storage, read_write> dst: array<f32>;\n\
         @compute @workgroup_size({})\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         let sg = lid.x / 32u;\n\
         let row = wid.y * {bm}u + (sg / {gn}u) * {}u;\n let col = wid.x * {bn}u + (sg % {gn}u) * {}u;\n",
        gm * gn * 32,
        fm * 16,
        fn_ * 16
    );
    per_fragment(&mut s, fm, fn_, |i, j| format!("var acc_{i}_{j} = coop_mat16x16<f32, C>();"));
    s += "for (var k = 0u; k < p.iters; k += 32u) {\n";
    for step in 0..2 {
        s += "{\n";
        for i in 0..fm {
            let _ = writeln!(
                s,
                "let a_{i} = coopLoadT<coop_mat16x16<f16, A>>(&src[(row + {}u) * {n}u + k + {}u], {n}u);",
                16 * i,
                16 * step
            );
        }
        for j in 0..fn_ {
            let _ = writeln!(
                s,
                "let b_{j} = coopLoadT<coop_mat16x16<f16, B>>(&src[{}u + (k + {}u) * {n}u + col + {}u], {n}u);",
                n * n,
                16 * step,
                16 * j
            );
        }
        per_fragment(&mut s, fm, fn_, |i, j| {
            format!("acc_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, acc_{i}_{j});")
        });
        s += "}\n";
    }
    s += "}\n";
    per_fragment(&mut s, fm, fn_, |i, j| {
        format!(
            "coopStoreT(acc_{i}_{j}, &dst[(row + {}u) * {n}u + col + {}u], {n}u);",
            16 * i,
            16 * j
        )
    });
    s += "}\n";
    s
}

/// The direct probes: (GM, GN, FM, FN).
const DIRECT: [(u32, u32, u32, u32); 5] = [(2, 4, 4, 2), (2, 2, 4, 4), (2, 4, 4, 4), (2, 2, 4, 2), (4, 4, 2, 2)];

/// The probes: (FM, FN, mode).
fn probes() -> Vec<(u32, u32, &'static str)> {
    let mut out = vec![(2, 2, "regs"), (2, 2, "ldT"), (4, 2, "regs"), (4, 2, "ldT"), (4, 2, "ld")];
    for mode in [
        "bar",
        "bar+one",
        "bar+stash",
        "bar+stash+glob",
        "bar+stash+glob+one",
        "bar+stash+glob+late",
        "bar+stash+glob+mat",
        "bar+stash+glob+coop",
        "bar+stash+glob+coop+one",
    ] {
        out.push((4, 2, mode));
    }
    out
}

/// The median GPU time of 15 calls of `run`, after 5 to warm up.
fn median_seconds(rt: &Runtime, run: impl Fn() -> Result<(), wgtrain_engine::Error>) -> Result<f64, wgtrain_engine::Error> {
    for _ in 0..5 {
        run()?;
    }
    rt.sync()?;
    let mut times: Vec<f64> = (0..15).map(|_| rt.time(&run)).collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let adapter = std::env::args().nth(1);
    let gpu = Arc::new(Gpu::open(adapter.as_deref())?);
    if !gpu.caps.coop_f16_16x16x16() {
        // Still check that every probe is valid WGSL, then say why nothing ran.
        let sources = probes().into_iter().map(|(fm, fn_, mode)| source(fm, fn_, mode));
        for wgsl in sources.chain(DIRECT.map(|(gm, gn, fm, fn_)| direct_source(gm, gn, fm, fn_))) {
            let module = naga::front::wgsl::parse_str(&wgsl).map_err(|e| e.emit_to_string(&wgsl))?;
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                .validate(&module)
                .map_err(|e| e.emit_to_string(&wgsl))?;
        }
        return Err("the probes are valid WGSL, but this adapter grants no 16x16x16 f16 cooperative matrices".into());
    }
    let rt = Runtime::new(gpu, AllocatorOptions::default())?;
    let src: Vec<f32> = (0..1 << 24).map(|i| ((i * 7919) % 2001) as f32 / 4000.0).collect();
    let src = Tensor::from_f32(&rt, &src, &[1 << 24], Category::Activation, "src")?;
    let groups = 132 * 4;
    let dst = Tensor::empty(&rt, &[4096 * 4096], DType::F32, Category::Activation, "dst")?;
    let params: [u32; 4] = [ITERS, 0, 0, 0];
    for (code, (fm, fn_, mode)) in probes().into_iter().enumerate() {
        {
            let wgsl = source(fm, fn_, mode);
            let kernel = rt.kernel(
                KernelKey::new("coop_probe", &[code as u32]),
                2,
                || format!("coop_probe {code}"),
                || Ok(wgsl),
            )?;
            let run = || rt.launch(&kernel, bytemuck::bytes_of(&params), &[&src, &dst], [groups, 1, 1]);
            let seconds = median_seconds(&rt, run)?;
            let flops = f64::from(groups) * 8.0 * f64::from(fm * fn_) * 2.0 * 4096.0 * f64::from(ITERS);
            println!(
                "{{\"probe\": \"{fm}x{fn_} {mode}\", \"us\": {:.1}, \"tflops\": {:.1}}}",
                seconds * 1e6,
                flops / seconds / 1e12
            );
        }
    }
    // The direct products: 4096^3, K in full.
    let params: [u32; 4] = [4096, 0, 0, 0];
    for (code, (gm, gn, fm, fn_)) in DIRECT.into_iter().enumerate() {
        let wgsl = direct_source(gm, gn, fm, fn_);
        let kernel = rt.kernel(
            KernelKey::new("coop_probe_direct", &[code as u32]),
            2,
            || format!("coop_probe_direct {code}"),
            || Ok(wgsl),
        )?;
        let groups = [4096 / (gn * fn_ * 16), 4096 / (gm * fm * 16), 1];
        let run = || rt.launch(&kernel, bytemuck::bytes_of(&params), &[&src, &dst], groups);
        let seconds = median_seconds(&rt, run)?;
        println!(
            "{{\"probe\": \"direct {gm}x{gn}x{fm}x{fn_}\", \"us\": {:.1}, \"tflops\": {:.1}}}",
            seconds * 1e6,
            2.0 * 4096f64.powi(3) / seconds / 1e12
        );
    }
    Ok(())
}
