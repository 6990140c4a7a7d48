// Fused causal attention on cooperative matrices (tensor cores): the same layout,
// parameters and results as shaders/flash_attention.wgsl, for f16 qkv and head sizes
// that are multiples of 16. Products take f16 operands and accumulate in f32: Q K^T,
// P V, dY V^T, P^T dY, dS^T Q and dS K, with P and dS rounded to f16 for the second
// product (as FlashAttention does) and dY rounded to f16. Softmax, masks and row
// statistics are computed in f32 by the lanes.
//
// A workgroup of SG subgroups of 32 lanes takes BR = 16 * SG rows of one (batch, head);
// subgroup s owns rows 16 s .. 16 s + 15. The other operand streams through workgroup
// memory in tiles of BC rows. A product's 16 x 16 fragments are stored to the subgroup's
// rows of the f32 staging area, where each row's 2 lanes (columns of one parity) read
// them; what they write for a second product (P or dS, f16) goes to the subgroup's rows
// of `p_t`.
//
// MODE 0, forward, in two passes over the keys: the first finds each row's max and sum
//   (lse = m + log l); the second forms P = exp(s - lse), already normalized, and
//   accumulates O += P V in fragments across key tiles (no rescaling needed).
// MODE 2, dK and dV: rows are keys; query tiles from the diagonal down: P^T from the
//   saved lse, dV += P^T dY, dS^T = P^T * (dP^T - D), dK += dS^T Q * scale.
// MODE 3, dQ: rows are queries; key tiles up to the diagonal: dQ += dS K * scale.
// (D = rowsum(dY * Y) comes from flash_attention.wgsl's MODE 1.) No atomics: results
// are bitwise repeatable.
//
// The host writes the fragment code unrolled (SCORES_*, ACC_*, STORE_*), with named
// accumulators (an array of cooperative matrices indexed in a loop is not kept in
// registers), and picks this kernel only where the adapter grants 16x16x16
// f16 -> f32 and subgroups of exactly 32.
//
// Template: TD (dy), D, SG, BC, MODE flags (FWD, BWD, BWD_KV, BWD_Q), the tiles' lengths
// (Q_LEN, K_LEN: Q and dY, K and V) and the unrolled code.
enable f16;
enable wgpu_cooperative_matrix;

struct Params {
    b: u32,
    nh: u32,
    t: u32,
    c4: u32,        // C / 4
    scale: f32,
    blocks: u32,    // row blocks per (batch, head)
    per: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> qkv: array<vec4<f16>>;
//#if FWD
@group(0) @binding(2) var<storage, read_write> y: array<f16>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
//#endif
//#if BWD
@group(0) @binding(2) var<storage, read_write> dy: array<vec4<{{TD}}>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;
//#endif

const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const SG: u32 = {{SG}}u;
const BR: u32 = 16u * SG;
const BC: u32 = {{BC}}u;
const WG: u32 = 32u * SG;
const LD: u32 = D + 8u;      // f16 tile rows, padded by 16 bytes
const PLD: u32 = BC + 8u;    // P or dS rows (f16)
const SLD: u32 = BC + 4u;    // staging rows (f32)
const HALF: u32 = BC / 2u;   // a lane's columns of its row
const NEG: f32 = -3.0e38;

var<workgroup> q_t: array<f16, {{Q_LEN}}>;
var<workgroup> k_t: array<f16, {{K_LEN}}>;
var<workgroup> v_t: array<f16, {{K_LEN}}>;
//#if BWD
var<workgroup> g_t: array<f16, {{Q_LEN}}>;   // dY
//#endif
//#if BWD_KV
var<workgroup> tile_s: array<f32, BC>;        // the query tile's lse
var<workgroup> tile_d: array<f32, BC>;        // and D
//#endif
var<workgroup> stg: array<f32, BR * SLD>;
var<workgroup> p_t: array<f16, BR * PLD>;

// vec4 index of element (b, t, part, h, 0) of qkv.
fn qkv_at(b: u32, t: u32, part: u32, h: u32) -> u32 {
    return ((b * p.t + t) * 3u + part) * p.c4 + h * D4;
}

fn row_at(b: u32, h: u32, t: u32) -> u32 {
    return (b * p.nh + h) * p.t + t;
}

// Writes vec4 `v` at element `at` of an f16 tile.
fn put_q(at: u32, v: vec4<f16>) { q_t[at] = v.x; q_t[at + 1u] = v.y; q_t[at + 2u] = v.z; q_t[at + 3u] = v.w; }
fn put_k(at: u32, v: vec4<f16>) { k_t[at] = v.x; k_t[at + 1u] = v.y; k_t[at + 2u] = v.z; k_t[at + 3u] = v.w; }
fn put_v(at: u32, v: vec4<f16>) { v_t[at] = v.x; v_t[at + 1u] = v.y; v_t[at + 2u] = v.z; v_t[at + 3u] = v.w; }

// Loads `n` rows of K and V from key j0 of (b, h); zeros past T.
fn load_kv(lid: u32, b: u32, h: u32, j0: u32, n: u32) {
    for (var e = lid; e < n * D4; e += WG) {
        let r = e / D4;
        let c = e % D4;
        let j = j0 + r;
        var kv = vec4<f16>();
        var vv = vec4<f16>();
        if j < p.t {
            kv = qkv[qkv_at(b, j, 1u, h) + c];
            vv = qkv[qkv_at(b, j, 2u, h) + c];
        }
        put_k(r * LD + 4u * c, kv);
        put_v(r * LD + 4u * c, vv);
    }
}

//#if FWD
// Loads `n` rows of Q from query i0 of (b, h); zeros past T.
fn load_q(lid: u32, b: u32, h: u32, i0: u32, n: u32) {
    for (var e = lid; e < n * D4; e += WG) {
        let r = e / D4;
        let c = e % D4;
        let i = i0 + r;
        var qv = vec4<f16>();
        if i < p.t {
            qv = qkv[qkv_at(b, i, 0u, h) + c];
        }
        put_q(r * LD + 4u * c, qv);
    }
}
//#endif

//#if BWD
fn put_g(at: u32, v: vec4<f16>) { g_t[at] = v.x; g_t[at + 1u] = v.y; g_t[at + 2u] = v.z; g_t[at + 3u] = v.w; }

// Loads `n` rows of Q and dY (rounded to f16) from query i0 of (b, h); zeros past T.
fn load_qg(lid: u32, b: u32, h: u32, i0: u32, n: u32) {
    for (var e = lid; e < n * D4; e += WG) {
        let r = e / D4;
        let c = e % D4;
        let i = i0 + r;
        var qv = vec4<f16>();
        var gv = vec4<f16>();
        if i < p.t {
            qv = qkv[qkv_at(b, i, 0u, h) + c];
            gv = vec4<f16>(dy[(b * p.t + i) * p.c4 + h * D4 + c]);
        }
        put_q(r * LD + 4u * c, qv);
        put_g(r * LD + 4u * c, gv);
    }
}

// Writes the subgroup's 16 x 16 block staged at its rows' columns 0..15, times `f`, to
// dqkv's `part` at rows row0 + m0 .. and columns col .. of head h.
fn write_dqkv(lane: u32, b: u32, h: u32, r0: u32, m0: u32, part: u32, col: u32, f: f32) {
    for (var e = lane; e < 256u; e += 32u) {
        let r = e / 16u;
        let c = e % 16u;
        let t = r0 + m0 + r;
        if t < p.t {
            dqkv[4u * qkv_at(b, t, part, h) + col + c] = stg[(m0 + r) * SLD + c] * f;
        }
    }
}
//#endif

//#if FWD
// The same for y.
fn write_y(lane: u32, b: u32, h: u32, r0: u32, m0: u32, col: u32) {
    for (var e = lane; e < 256u; e += 32u) {
        let r = e / 16u;
        let c = e % 16u;
        let t = r0 + m0 + r;
        if t < p.t {
            y[4u * ((b * p.t + t) * p.c4 + h * D4) + col + c] = f16(stg[(m0 + r) * SLD + c]);
        }
    }
}
//#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    let bh = group / p.blocks;
    let blk = group % p.blocks;
    if bh >= p.b * p.nh { return; }
    let b = bh / p.nh;
    let h = bh % p.nh;
    let row0 = blk * BR;
    let s = lid / 32u;
    let lane = lid % 32u;
    let m0 = s * 16u;             // the subgroup's first row in the block
    let r = lane / 2u;            // the lane's row among the subgroup's 16
    let half = lane % 2u;         // its columns: half, half + 2, ...
    let row = row0 + m0 + r;      // a query row (FWD, BWD_Q) or a key row (BWD_KV)
    let srow = min(row, p.t - 1u);
    let sat = (m0 + r) * SLD;     // the lane's row in the staging area
    let pat = (m0 + r) * PLD;     // and in p_t
//#if FWD
    load_q(lid, b, h, row0, BR);
    let last = min(p.t, row0 + BR);
    // Pass 1: each row's max and sum over its keys.
    var m = NEG;
    var l = 0.0;
    for (var j0 = 0u; j0 < last; j0 += BC) {
        workgroupBarrier();
        load_kv(lid, b, h, j0, BC);
        workgroupBarrier();
{{SCORES_QK}}
        workgroupBarrier();
        var tm = NEG;
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            if j0 + c <= row {
                tm = max(tm, stg[sat + c] * p.scale);
            }
        }
        let m_new = max(m, tm);
        var sum = 0.0;
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            if j0 + c <= row {
                sum += exp(stg[sat + c] * p.scale - m_new);
            }
        }
        l = l * exp(m - m_new) + sum;
        m = m_new;
    }
    // Merge the row's two lanes.
    let m2 = subgroupShuffleXor(m, 1u);
    let l2 = subgroupShuffleXor(l, 1u);
    let mm = max(m, m2);
    let row_lse = mm + log(l * exp(m - mm) + l2 * exp(m2 - mm));
    if row < p.t && half == 0u {
        lse[row_at(b, h, row)] = row_lse;
    }
    // Pass 2: O += P V with P = exp(s - lse).
{{O_DECL}}
    for (var j0 = 0u; j0 < last; j0 += BC) {
        workgroupBarrier();
        load_kv(lid, b, h, j0, BC);
        workgroupBarrier();
{{SCORES_QK}}
        workgroupBarrier();
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            var pj = 0.0;
            if j0 + c <= row {
                pj = exp(stg[sat + c] * p.scale - row_lse);
            }
            p_t[pat + c] = f16(pj);
        }
        workgroupBarrier();
{{ACC_O}}
    }
    workgroupBarrier();
{{STORE_O}}
//#endif
//#if BWD_Q
    load_qg(lid, b, h, row0, BR);
    let lse_i = lse[row_at(b, h, srow)];
    let d_i = dvec[row_at(b, h, srow)];
    var pr: array<f32, HALF>;
{{DQ_DECL}}
    let last = min(p.t, row0 + BR);
    for (var j0 = 0u; j0 < last; j0 += BC) {
        workgroupBarrier();
        load_kv(lid, b, h, j0, BC);
        workgroupBarrier();
{{SCORES_QK}}
        workgroupBarrier();
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            var pj = 0.0;
            if j0 + c <= row {
                pj = exp(stg[sat + c] * p.scale - lse_i);
            }
            pr[u] = pj;
        }
        workgroupBarrier();
{{SCORES_GV}}
        workgroupBarrier();
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            p_t[pat + c] = f16(pr[u] * (stg[sat + c] - d_i));
        }
        workgroupBarrier();
{{ACC_DQ}}
    }
    workgroupBarrier();
{{STORE_DQ}}
//#endif
//#if BWD_KV
    load_kv(lid, b, h, row0, BR);
    var pr: array<f32, HALF>;
{{DKV_DECL}}
    // Queries from the block's first key row down: tiles above the diagonal skipped.
    for (var i0 = row0 / BC * BC; i0 < p.t; i0 += BC) {
        workgroupBarrier();
        load_qg(lid, b, h, i0, BC);
        for (var e = lid; e < BC; e += WG) {
            let i = i0 + e;
            var ls = 0.0;
            var dd = 0.0;
            if i < p.t {
                ls = lse[row_at(b, h, i)];
                dd = dvec[row_at(b, h, i)];
            }
            tile_s[e] = ls;
            tile_d[e] = dd;
        }
        workgroupBarrier();
{{SCORES_KQ}}
        workgroupBarrier();
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            let i = i0 + c;
            var pj = 0.0;
            if i >= row && i < p.t {
                pj = exp(stg[sat + c] * p.scale - tile_s[c]);
            }
            pr[u] = pj;
            p_t[pat + c] = f16(pj);
        }
        workgroupBarrier();
{{ACC_DV}}
{{SCORES_VG}}
        workgroupBarrier();
        for (var u = 0u; u < HALF; u++) {
            let c = half + 2u * u;
            p_t[pat + c] = f16(pr[u] * (stg[sat + c] - tile_d[c]));
        }
        workgroupBarrier();
{{ACC_DK}}
    }
    workgroupBarrier();
{{STORE_DKV}}
//#endif
}
