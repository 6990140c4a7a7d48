// Batched matmul on cooperative matrices (tensor cores): f16 A and B, f32 accumulation,
// the same strided operands, parameters and epilogue as matmul.wgsl.
// A workgroup of 8 subgroups of 32 computes a 128 x 128 tile of C; subgroup s owns rows
// (s / 2) * 32 .. +32 and columns (s % 2) * 64 .. +64 as 2 x 4 fragments of 16 x 16.
// K steps by 32 through workgroup memory. Fragments go out through a 16 x 16 staging
// area per subgroup, where the epilogue runs with bounds checks.
// Template: TC (output type), ACT, and the tile loads (TYPE_A and the VEC_A block,
// TYPE_B and VEC_B):
// scalar f16 loads for any strides, or vec4<f16> loads when a row is contiguous and
// every offset and row stride is a multiple of 4. The host picks this variant only where the adapter
// grants 16x16x16 f16 -> f32 and subgroups of exactly 32.
enable f16;
enable wgpu_cooperative_matrix;

{{MATMUL_COMMON}}
@group(0) @binding(1) var<storage, read_write> lhs: array<{{TYPE_A}}>;
@group(0) @binding(2) var<storage, read_write> rhs: array<{{TYPE_B}}>;

const BM: u32 = 128u;
const BK: u32 = 32u;
var<workgroup> a_tile: array<f16, 4096>;   // [BM][BK] row-major
var<workgroup> b_tile: array<f16, 4096>;   // [BK][BM] row-major
var<workgroup> stage: array<f32, 2048>;    // 8 subgroups x [16][16]

fn store_fragment(frag: coop_mat16x16<f32, C>, s: u32, lane: u32, row0: u32, col0: u32, c_base: u32) {
    let at = s * 256u;
    let stride = 16u;
    coopStoreT(frag, &stage[at], stride);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {
        let gm = row0 + e / 16u;
        let gn = col0 + e % 16u;
        if gm < p.m && gn < p.n {
            store_c(c_base + gm * p.c_rs + gn, gn, stage[at + e]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let z0 = wid.z / p.batch1;
    let z1 = wid.z % p.batch1;
    let a_base = p.a_off + z0 * p.a_bs0 + z1 * p.a_bs1;
    let b_base = p.b_off + z0 * p.b_bs0 + z1 * p.b_bs1;
    let c_base = p.c_off + z0 * p.c_bs0 + z1 * p.c_bs1;
    let row0 = wid.y * BM;
    let col0 = wid.x * BM;
    let tid = lid.x;
    let s = tid / 32u;
    let lane = tid % 32u;
    let sr = (s / 2u) * 32u;
    let sc = (s % 2u) * 64u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
//#if VEC_A
        for (var l = 0u; l < 4u; l++) {
            let e = tid + l * 256u;
            let mm = e / 8u;
            let kq = e % 8u;
            let gm = row0 + mm;
            let gk = k0 + kq * 4u;
            var v = vec4<f16>(0.0);
            if gm < p.m && gk < p.k { v = lhs[(a_base + gm * p.a_rs + gk) / 4u]; }
            let t = mm * BK + kq * 4u;
            a_tile[t] = v.x;
            a_tile[t + 1u] = v.y;
            a_tile[t + 2u] = v.z;
            a_tile[t + 3u] = v.w;
        }
//#else
        for (var l = 0u; l < 16u; l++) {
            let e = tid + l * 256u;
            let mm = e / BK;
            let kk = e % BK;
            let gm = row0 + mm;
            let gk = k0 + kk;
            var v = f16(0.0);
            if gm < p.m && gk < p.k { v = lhs[a_base + gm * p.a_rs + gk * p.a_cs]; }
            a_tile[mm * BK + kk] = v;
        }
//#endif
//#if VEC_B
        for (var l = 0u; l < 4u; l++) {
            let e = tid + l * 256u;
            let kk = e / 32u;
            let nq = e % 32u;
            let gk = k0 + kk;
            let gn = col0 + nq * 4u;
            var v = vec4<f16>(0.0);
            if gk < p.k && gn < p.n { v = rhs[(b_base + gk * p.b_rs + gn) / 4u]; }
            let t = kk * BM + nq * 4u;
            b_tile[t] = v.x;
            b_tile[t + 1u] = v.y;
            b_tile[t + 2u] = v.z;
            b_tile[t + 3u] = v.w;
        }
//#else
        for (var l = 0u; l < 16u; l++) {
            let e = tid + l * 256u;
            let kk = e / BM;
            let nn = e % BM;
            let gk = k0 + kk;
            let gn = col0 + nn;
            var v = f16(0.0);
            if gk < p.k && gn < p.n { v = rhs[b_base + gk * p.b_rs + gn * p.b_cs]; }
            b_tile[kk * BM + nn] = v;
        }
//#endif
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a_stride = BK;
            let b_stride = BM;
            let ia0 = sr * BK + kk;
            let ia1 = (sr + 16u) * BK + kk;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&a_tile[ia0], a_stride);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&a_tile[ia1], a_stride);
            let ib0 = kk * BM + sc;
            let ib1 = kk * BM + sc + 16u;
            let ib2 = kk * BM + sc + 32u;
            let ib3 = kk * BM + sc + 48u;
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[ib0], b_stride);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[ib1], b_stride);
            let b2 = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[ib2], b_stride);
            let b3 = coopLoadT<coop_mat16x16<f16, B>>(&b_tile[ib3], b_stride);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
        }
        workgroupBarrier();
    }
    let r0 = row0 + sr;
    let r1 = row0 + sr + 16u;
    let cc = col0 + sc;
    store_fragment(c00, s, lane, r0, cc, c_base);
    store_fragment(c01, s, lane, r0, cc + 16u, c_base);
    store_fragment(c02, s, lane, r0, cc + 32u, c_base);
    store_fragment(c03, s, lane, r0, cc + 48u, c_base);
    store_fragment(c10, s, lane, r1, cc, c_base);
    store_fragment(c11, s, lane, r1, cc + 16u, c_base);
    store_fragment(c12, s, lane, r1, cc + 32u, c_base);
    store_fragment(c13, s, lane, r1, cc + 48u, c_base);
}
