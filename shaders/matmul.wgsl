// Batched matmul with strided (hence transposable) operands, register-tiled, f32
// accumulation: C[z] = act(alpha * A[z] @ B[z] + bias + beta * C[z]).
// A[z] is M x K, B[z] is K x N; element (r, c) of X[z] sits at
//   x_off + (z / batch1) * x_bs0 + (z % batch1) * x_bs1 + r * x_rs + c * x_cs.
// Each workgroup of 16 x 16 threads computes a (16*TM) x (16*TM) tile of C, each
// thread TM x TM of it in vec4 registers, stepping K by 16 through workgroup memory;
// the next K tile's global loads are in flight while the current one is multiplied.
// Template: ENABLE, TA, TB, TC (element types), TM (4 or 8), ACT (epilogue on v), and
// the register code generated for TM by the host (ACC_DECL, INNER, STORE): named
// registers instead of indexed private arrays, which drivers may spill to memory;
// and the tile loads (TYPE_A and the VEC_A / COL_A blocks, TYPE_B and VEC_B / COL_B):
// scalar for any strides, vec4 where a row is contiguous (VEC) or a column is (COL, a
// transposed view) and offsets, strides and the contiguous extent are multiples of 4.
{{ENABLE}}

{{MATMUL_COMMON}}
@group(0) @binding(1) var<storage, read_write> a: array<{{TYPE_A}}>;
@group(0) @binding(2) var<storage, read_write> b: array<{{TYPE_B}}>;

const TM: u32 = {{TM}}u;
const BM: u32 = 16u * TM;      // tile rows = tile cols
const BK: u32 = 16u;
const Q: u32 = TM / 4u;        // vec4s per thread per row of fragments
// Tiles stored k-major as vec4s: tile[kk][x] at (kk * BM + x) / 4.
var<workgroup> a_tile: array<vec4<f32>, BK * BM / 4u>;
var<workgroup> b_tile: array<vec4<f32>, BK * BM / 4u>;

// Writes 4 consecutive columns of row gm from gn0, with the epilogue and bounds.
fn store4(c_base: u32, gm: u32, gn0: u32, acc: vec4<f32>) {
    if gm >= p.m { return; }
    for (var j = 0u; j < 4u; j++) {
        let gn = gn0 + j;
        if gn >= p.n { return; }
        store_c(c_base + gm * p.c_rs + gn, gn, acc[j]);
    }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z0 = wid.z / p.batch1;
    let z1 = wid.z % p.batch1;
    let a_base = p.a_off + z0 * p.a_bs0 + z1 * p.a_bs1;
    let b_base = p.b_off + z0 * p.b_bs0 + z1 * p.b_bs1;
    let c_base = p.c_off + z0 * p.c_bs0 + z1 * p.c_bs1;
    let row0 = wid.y * BM;
    let col0 = wid.x * BM;
    let tid = lid.y * 16u + lid.x;
{{ACC_DECL}}
//#if VEC_A
    var ra: array<vec4<f32>, BM / 64u>;
//#else
//#if COL_A
    var ra: array<vec4<f32>, BM / 64u>;
//#else
    var ra: array<f32, BM * BK / 256u>;
//#endif
//#endif
//#if VEC_B
    var rb: array<vec4<f32>, BM / 64u>;
//#else
//#if COL_B
    var rb: array<vec4<f32>, BM / 64u>;
//#else
    var rb: array<f32, BM * BK / 256u>;
//#endif
//#endif
    // Each turn loads tile k0 into registers, multiplies the previous tile (already in
    // workgroup memory) while those loads are in flight, then stores tile k0.
    var k0 = 0u;
    loop {
        // Global -> registers (tile k0; zeros past K).
//#if VEC_A
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let gm = row0 + e / 4u;
            let gk = k0 + (e % 4u) * 4u;
            var v = vec4<f32>(0.0);
            if gm < p.m && gk < p.k { v = vec4<f32>(a[(a_base + gm * p.a_rs + gk) / 4u]); }
            ra[l] = v;
        }
//#else
//#if COL_A
        // A contiguous down its columns (a transposed view): vec4s along M, which is
        // the tile's own (k-major) layout.
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let gk = k0 + e / (BM / 4u);
            let gm = row0 + (e % (BM / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if gk < p.k && gm < p.m { v = vec4<f32>(a[(a_base + gk * p.a_cs + gm) / 4u]); }
            ra[l] = v;
        }
//#else
        for (var l = 0u; l < BM * BK / 256u; l++) {
            let e = tid + l * 256u;
            let gm = row0 + e / BK;
            let gk = k0 + e % BK;
            var v = 0.0;
            if gm < p.m && gk < p.k { v = f32(a[a_base + gm * p.a_rs + gk * p.a_cs]); }
            ra[l] = v;
        }
//#endif
//#endif
//#if VEC_B
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let gk = k0 + e / (BM / 4u);
            let gn = col0 + (e % (BM / 4u)) * 4u;
            var v = vec4<f32>(0.0);
            if gk < p.k && gn < p.n { v = vec4<f32>(b[(b_base + gk * p.b_rs + gn) / 4u]); }
            rb[l] = v;
        }
//#else
//#if COL_B
        // B contiguous down its columns (a transposed view): vec4s along K, spread over
        // the tile's k-major rows.
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let gn = col0 + e / 4u;
            let gk = k0 + (e % 4u) * 4u;
            var v = vec4<f32>(0.0);
            if gn < p.n && gk < p.k { v = vec4<f32>(b[(b_base + gn * p.b_cs + gk) / 4u]); }
            rb[l] = v;
        }
//#else
        for (var l = 0u; l < BM * BK / 256u; l++) {
            let e = tid + l * 256u;
            let gk = k0 + e / BM;
            let gn = col0 + e % BM;
            var v = 0.0;
            if gk < p.k && gn < p.n { v = f32(b[b_base + gk * p.b_rs + gn * p.b_cs]); }
            rb[l] = v;
        }
//#endif
//#endif
        if k0 > 0u {
            for (var kk = 0u; kk < BK; kk++) {
                // Thread (x, y) owns rows y*4 + 64*q .. +4 and the same pattern in
                // columns, so a warp reads whole vec4s without bank conflicts.
                let base = (kk * BM) / 4u;
{{INNER}}
            }
            workgroupBarrier();
        }
        if k0 >= p.k { break; }
        // Registers -> tiles.
//#if VEC_A
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let mm = e / 4u;
            let kq = e % 4u;
            for (var j = 0u; j < 4u; j++) {
                let t = (kq * 4u + j) * BM + mm;
                a_tile[t / 4u][t % 4u] = ra[l][j];
            }
        }
//#else
//#if COL_A
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            a_tile[(e / (BM / 4u)) * (BM / 4u) + e % (BM / 4u)] = ra[l];
        }
//#else
        for (var l = 0u; l < BM * BK / 256u; l++) {
            let e = tid + l * 256u;
            let t = (e % BK) * BM + e / BK;
            a_tile[t / 4u][t % 4u] = ra[l];
        }
//#endif
//#endif
//#if VEC_B
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            b_tile[(e / (BM / 4u)) * (BM / 4u) + e % (BM / 4u)] = rb[l];
        }
//#else
//#if COL_B
        for (var l = 0u; l < BM / 64u; l++) {
            let e = tid + l * 256u;
            let nn = e / 4u;
            let kq = e % 4u;
            for (var j = 0u; j < 4u; j++) {
                let t = (kq * 4u + j) * BM + nn;
                b_tile[t / 4u][t % 4u] = rb[l][j];
            }
        }
//#else
        for (var l = 0u; l < BM * BK / 256u; l++) {
            let e = tid + l * 256u;
            let t = (e / BM) * BM + e % BM;
            b_tile[t / 4u][t % 4u] = rb[l];
        }
//#endif
//#endif
        workgroupBarrier();
        k0 += BK;
    }
{{STORE}}
}
