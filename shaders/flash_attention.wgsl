// Fused causal attention (FlashAttention-2's scheme), forward and backward, computed
// in f32 whatever the inputs' type; nothing of size T x T is ever stored.
//
// Layout: qkv [B, T, 3C] (q, k, v of head h at columns h*D.. of their third), the
// output y and its gradient dy [B, T, C], the log-sum-exp lse and D = rowsum(dy * y)
// [B, NH, T] in f32, the gradient dqkv [B, T, 3C] in f32. Scores are scale * q.k.
//
// MODE 0, forward: a workgroup takes BR query rows of one (batch, head); K and V stream
//   through workgroup memory in tiles of BC keys (tiles above the diagonal skipped);
//   each row keeps its running max, sum and output (the online softmax, per key) and
//   ends with
//   y = o / l and lse = m + log(l).
// MODE 1, D = rowsum(dy * y) per row: D4 threads a row (a vec4 each, so that a row's
//   loads are one contiguous run), its partial dot products summed by the row's first
//   thread in column order. MODE 4: the same, and dy written in f16 (CAST) for the
//   tensor-core backward, which reads it 16 bytes at a time.
// MODE 2, dK and dV: a workgroup takes BR key rows; Q, dY, lse and D stream through
//   workgroup memory in tiles of BC query rows (from the diagonal down); P is recomputed
//   from the saved lse: dV += P dY, dK += (P * (dY.V - D)) Q * scale.
//   KV2: two key rows a thread (rows r and r + BR / 2), 8 lanes a pair: see below.
// MODE 3, dQ: a workgroup takes BR query rows; K and V stream as in the forward;
//   dQ += (P * (dY.V - D)) K * scale.
// No atomics: each output row is summed by its own threads in a fixed order, so the
// results are bitwise repeatable.
//
// Threads per row, R: a row's R lanes split its head dimension (lane `sub` holds vec4
// columns sub, sub + R, ...: D / (4 R) of them), take every key (or query) of a tile
// together, and sum their partial dot products with subgroup shuffles (SUBGROUP); R is 1
// on the plain path (a thread per row, workgroup memory only) and where D / 4 is odd.
// Each lane's slices are named variables: a line holding the slice marker (an at-sign
// and k) is repeated by the host once per slice, the marker replaced by its index, so
// that they live in registers (arrays indexed in loops were kept in local memory by the
// H100's driver). The loops over a tile's rows, four at a time, are written out by the
// host (the `//#unroll` blocks, `@u` the copy's index): the driver kept them as loops.
// A thread's tile loads are named variables too (the marker an at-sign and L).
//
// Template: ATTENTION_COMMON (shaders/attention_common.wgsl), ENABLE, TQ (qkv and y),
// TD (dy), D4 (head size / 4), BR, BC, R, WG (threads), MODE, SUBGROUP,
// FWD/PRE/CAST/BWD_KV/BWD_Q (the mode's code and bindings), KV1/KV2 (dK dV with one or
// two key rows a thread) and KV_TILES.
{{ENABLE}}

{{ATTENTION_COMMON}}
//#if FWD
@group(0) @binding(1) var<storage, read_write> qkv: array<vec4<{{TQ}}>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<{{TQ}}>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
//#endif
//#if PRE
@group(0) @binding(1) var<storage, read_write> y: array<vec4<{{TQ}}>>;
@group(0) @binding(2) var<storage, read_write> dy: array<vec4<{{TD}}>>;
@group(0) @binding(3) var<storage, read_write> dvec: array<f32>;
//#if CAST
@group(0) @binding(4) var<storage, read_write> dy16: array<vec4<f16>>;
//#endif
// The row dot's partial sums, one a thread.
var<workgroup> pre_part: array<f32, {{WG}}>;
//#endif
//#if BWD
@group(0) @binding(1) var<storage, read_write> qkv: array<vec4<{{TQ}}>>;
@group(0) @binding(2) var<storage, read_write> dy: array<vec4<{{TD}}>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<vec4<f32>>;
//#endif

const D4: u32 = {{D4}}u;
const RS: u32 = D4 + 1u;       // a tile row's stride in vec4s: padded so the rows a warp reads sit in different banks
const BR: u32 = {{BR}}u;
const BC: u32 = {{BC}}u;
const R: u32 = {{R}}u;
const WG: u32 = {{WG}}u;    // threads: R a row, or R a pair of rows (KV2)
const MODE: u32 = {{MODE}}u;
const NEG: f32 = -3.0e38;
const LOG2E: f32 = 1.4426950408889634;
const QUAD: vec4<u32> = vec4<u32>(0u, 1u, 2u, 3u);   // four keys (or queries) at a time

// Two tiles of BC rows of D4 vec4s (stride RS) in workgroup memory (K and V, or Q and dY), and a
// tile's lse and D.
var<workgroup> tile_a: array<vec4<f32>, {{TILE}}>;
var<workgroup> tile_b: array<vec4<f32>, {{TILE}}>;
// The query tile's lse and D, four rows a vec4 (read four at a time).
var<workgroup> tile_s: array<vec4<f32>, BC / 4u>;
var<workgroup> tile_d: array<vec4<f32>, BC / 4u>;


//#if SUBGROUP
fn merge_sum4(x: vec4<f32>) -> vec4<f32> {
    var v = x;
    for (var o = 1u; o < R; o <<= 1u) {
        v += subgroupShuffleXor(v, o);
    }
    return v;
}
//#else
fn merge_sum4(x: vec4<f32>) -> vec4<f32> { return x; }
//#endif

//#if KV_TILES
// Loads keys j0.. of (b, h) into tile_a (K) and tile_b (V); zeros past T. Element e of
// the tile (row e / D4, vec4 column e % D4) is loaded by thread e % WG, all of a
// thread's loads issued before any is stored (rows past T read row T - 1): one round
// trip to memory a tile, where a loop of loads and stores made one a turn.
fn load_kv(lid: u32, b: u32, h: u32, j0: u32) {
    let e_@L = min(lid + WG * @Lu, BC * D4 - 1u);
    let j_@L = min(j0 + e_@L / D4, p.t - 1u);
    let k_@L = vec4<f32>(qkv[qkv_at(b, j_@L, 1u, h) + e_@L % D4]);
    let v_@L = vec4<f32>(qkv[qkv_at(b, j_@L, 2u, h) + e_@L % D4]);
    if lid + WG * @Lu < BC * D4 { tile_a[e_@L / D4 * RS + e_@L % D4] = select(vec4<f32>(0.0), k_@L, j0 + e_@L / D4 < p.t); }
    if lid + WG * @Lu < BC * D4 { tile_b[e_@L / D4 * RS + e_@L % D4] = select(vec4<f32>(0.0), v_@L, j0 + e_@L / D4 < p.t); }
}
//#endif


//#if BWD_KV
// Loads queries i0.. of (b, h): Q into tile_a, dY into tile_b (as load_kv does), lse
// and D.
fn load_q(lid: u32, b: u32, h: u32, i0: u32) {
    let e_@L = min(lid + WG * @Lu, BC * D4 - 1u);
    let i_@L = min(i0 + e_@L / D4, p.t - 1u);
    let q_@L = vec4<f32>(qkv[qkv_at(b, i_@L, 0u, h) + e_@L % D4]);
    let g_@L = vec4<f32>(dy[y_at(b, i_@L, h) + e_@L % D4]);
    if lid + WG * @Lu < BC * D4 { tile_a[e_@L / D4 * RS + e_@L % D4] = select(vec4<f32>(0.0), q_@L, i0 + e_@L / D4 < p.t); }
    if lid + WG * @Lu < BC * D4 { tile_b[e_@L / D4 * RS + e_@L % D4] = select(vec4<f32>(0.0), g_@L, i0 + e_@L / D4 < p.t); }
    for (var r = lid; r < BC; r += WG) {
        let i = i0 + r;
        if i < p.t {
            tile_s[r / 4u][r % 4u] = lse[row_at(b, h, i)];
            tile_d[r / 4u][r % 4u] = dvec[row_at(b, h, i)];
        } else {
            tile_s[r / 4u][r % 4u] = 0.0;
            tile_d[r / 4u][r % 4u] = 0.0;
        }
    }
}
//#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
//#if PRE
    // D4 threads per (b, h, t) row, WG / D4 rows a workgroup.
    let c = lid % D4;
    let row = group * (WG / D4) + lid / D4;
    let inside = lid / D4 < WG / D4 && row < p.b * p.nh * p.t;
    var part = 0.0;
    if inside {
        let t = row % p.t;
        let h = (row / p.t) % p.nh;
        let b = row / (p.t * p.nh);
        let g = dy[y_at(b, t, h) + c];
        part = dot(vec4<f32>(y[y_at(b, t, h) + c]), vec4<f32>(g));
//#if CAST
        dy16[y_at(b, t, h) + c] = vec4<f16>(g);
//#endif
    }
    pre_part[lid] = part;
    workgroupBarrier();
    if inside && c == 0u {
        var acc = 0.0;
        for (var j = 0u; j < D4; j++) {
            acc += pre_part[lid + j];
        }
        dvec[row] = acc;
    }
//#else
    // Uniform per workgroup: which (batch, head) and which block of rows.
    // The blocks that see the most of the other side go first: the last query blocks,
    // the first key blocks.
    let bhn = p.b * p.nh;
    if group >= bhn * p.blocks { return; }
    let bh = group % bhn;
    var blk = p.blocks - 1u - group / bhn;
    if MODE == 2u {
        blk = group / bhn;
    }
    let b = bh / p.nh;
    let h = bh % p.nh;
    let r = lid / R;            // the thread's row in the block
    let sub = lid % R;          // its lane among the row's R threads
    let row = blk * BR + r;     // a query row (FWD, BWD_Q) or a key row (BWD_KV)
    let valid = row < p.t;
    let srow = min(row, p.t - 1u);
//#endif
//#if FWD
    // The lane's slice of the row: vec4 columns sub, sub + R, ...
    var q_@k = vec4<f32>(qkv[qkv_at(b, srow, 0u, h) + sub + R * @ku]) * p.scale;
    var o_@k = vec4<f32>(0.0);
    var m = NEG;
    var l = 0.0;
    // Keys up to the block's last row: tiles above the diagonal are never loaded.
    let last = min(p.t, blk * BR + BR);
    for (var j0 = 0u; j0 < last; j0 += BC) {
        workgroupBarrier();
        load_kv(lid, b, h, j0);
        workgroupBarrier();
        // Four keys at a time, the online update (no array of scores is kept): four
        // independent dot products, one correction for the four.
//#unroll ROWS4
        {
            let jj = 4u * @u;
            let at = jj * RS + sub;
            var s4 = vec4<f32>(0.0);
            s4 += vec4<f32>(dot(q_@k, tile_a[at + R * @ku]), dot(q_@k, tile_a[at + RS + R * @ku]), dot(q_@k, tile_a[at + 2u * RS + R * @ku]), dot(q_@k, tile_a[at + 3u * RS + R * @ku]));
            let js = vec4<u32>(j0 + jj) + QUAD;
            let ok = (js <= vec4<u32>(row)) & (js < vec4<u32>(p.t));
            let sv = select(vec4<f32>(NEG), merge_sum4(s4), ok);
            let m_new = max(m, max(max(sv.x, sv.y), max(sv.z, sv.w)));
            let corr = exp(m - m_new);
            let p4 = select(vec4<f32>(0.0), exp(sv - m_new), ok);
            l = l * corr + ((p4.x + p4.y) + (p4.z + p4.w));
            o_@k = o_@k * corr + p4.x * tile_b[at + R * @ku] + p4.y * tile_b[at + RS + R * @ku] + p4.z * tile_b[at + 2u * RS + R * @ku] + p4.w * tile_b[at + 3u * RS + R * @ku];
            m = m_new;
        }
//#end
    }
    if valid {
        let inv = 1.0 / l;
        y[y_at(b, row, h) + sub + R * @ku] = vec4<{{TQ}}>(o_@k * inv);
        if sub == 0u {
            lse[row_at(b, h, row)] = m + log(l);
        }
    }
//#endif
//#if BWD_Q
    var q_@k = vec4<f32>(qkv[qkv_at(b, srow, 0u, h) + sub + R * @ku]);
    var g_@k = vec4<f32>(dy[y_at(b, srow, h) + sub + R * @ku]);
    var dq_@k = vec4<f32>(0.0);
    let lse_i = lse[row_at(b, h, srow)];
    let d_i = dvec[row_at(b, h, srow)];
    let last = min(p.t, blk * BR + BR);
    for (var j0 = 0u; j0 < last; j0 += BC) {
        workgroupBarrier();
        load_kv(lid, b, h, j0);
        workgroupBarrier();
//#unroll ROWS4
        {
            let jj = 4u * @u;
            let at = jj * RS + sub;
            var s4 = vec4<f32>(0.0);
            var dp4 = vec4<f32>(0.0);
            s4 += vec4<f32>(dot(q_@k, tile_a[at + R * @ku]), dot(q_@k, tile_a[at + RS + R * @ku]), dot(q_@k, tile_a[at + 2u * RS + R * @ku]), dot(q_@k, tile_a[at + 3u * RS + R * @ku]));
            dp4 += vec4<f32>(dot(g_@k, tile_b[at + R * @ku]), dot(g_@k, tile_b[at + RS + R * @ku]), dot(g_@k, tile_b[at + 2u * RS + R * @ku]), dot(g_@k, tile_b[at + 3u * RS + R * @ku]));
            let js = vec4<u32>(j0 + jj) + QUAD;
            let ok = (js <= vec4<u32>(row)) & (js < vec4<u32>(p.t));
            let p4 = select(vec4<f32>(0.0), exp(merge_sum4(s4) * p.scale - lse_i), ok);
            let ds = p4 * (merge_sum4(dp4) - d_i);
            dq_@k += ds.x * tile_a[at + R * @ku] + ds.y * tile_a[at + RS + R * @ku] + ds.z * tile_a[at + 2u * RS + R * @ku] + ds.w * tile_a[at + 3u * RS + R * @ku];
        }
//#end
    }
    if valid {
        dqkv[qkv_at(b, row, 0u, h) + sub + R * @ku] = dq_@k * p.scale;
    }
//#endif
//#if KV1
    var k_@k = vec4<f32>(qkv[qkv_at(b, srow, 1u, h) + sub + R * @ku]);
    var v_@k = vec4<f32>(qkv[qkv_at(b, srow, 2u, h) + sub + R * @ku]);
    var dk_@k = vec4<f32>(0.0);
    var dv_@k = vec4<f32>(0.0);
    // Queries from the block's first key row down: tiles above the diagonal skipped.
    let first = (blk * BR) / BC * BC;
    for (var i0 = first; i0 < p.t; i0 += BC) {
        workgroupBarrier();
        load_q(lid, b, h, i0);
        workgroupBarrier();
//#unroll ROWS4
        {
            let ii = 4u * @u;
            let at = ii * RS + sub;
            var s4 = vec4<f32>(0.0);
            var dp4 = vec4<f32>(0.0);
            s4 += vec4<f32>(dot(tile_a[at + R * @ku], k_@k), dot(tile_a[at + RS + R * @ku], k_@k), dot(tile_a[at + 2u * RS + R * @ku], k_@k), dot(tile_a[at + 3u * RS + R * @ku], k_@k));
            dp4 += vec4<f32>(dot(tile_b[at + R * @ku], v_@k), dot(tile_b[at + RS + R * @ku], v_@k), dot(tile_b[at + 2u * RS + R * @ku], v_@k), dot(tile_b[at + 3u * RS + R * @ku], v_@k));
            let is = vec4<u32>(i0 + ii) + QUAD;
            let ok = (is >= vec4<u32>(row)) & (is < vec4<u32>(p.t)) & vec4<bool>(valid);
            let ls = tile_s[ii / 4u];
            let dd = tile_d[ii / 4u];
            let p4 = select(vec4<f32>(0.0), exp(merge_sum4(s4) * p.scale - ls), ok);
            let ds = p4 * (merge_sum4(dp4) - dd);
            dv_@k += p4.x * tile_b[at + R * @ku] + p4.y * tile_b[at + RS + R * @ku] + p4.z * tile_b[at + 2u * RS + R * @ku] + p4.w * tile_b[at + 3u * RS + R * @ku];
            dk_@k += ds.x * tile_a[at + R * @ku] + ds.y * tile_a[at + RS + R * @ku] + ds.z * tile_a[at + 2u * RS + R * @ku] + ds.w * tile_a[at + 3u * RS + R * @ku];
        }
//#end
    }
    if valid {
        dqkv[qkv_at(b, row, 1u, h) + sub + R * @ku] = dk_@k * p.scale;
        dqkv[qkv_at(b, row, 2u, h) + sub + R * @ku] = dv_@k;
    }
//#endif
//#if KV2
    // Two key rows a thread, `row` and `row1` = row + BR / 2, and 8 lanes a pair of rows
    // (R = 8): a query tile's vec4 is read once for both rows. K is scaled by scale *
    // log2 e, so that P = exp2(s - lse * log2 e). Per four queries the lanes'
    // partial scores and dY.V (2 rows x 4 queries each) are reduce-scattered over the 8
    // lanes (xor 4: row, xor 2 and xor 1: query), so lane `sub` ends with the full pair
    // for row (sub & 4 ? row1 : row) and query sub & 3, and takes that one exponent; the
    // lanes then all-gather P and dS (xor 1, 2, 4) for the products with the tile.
    let row1 = row + BR / 2u;
    let srow1 = min(row1, p.t - 1u);
    let k0_@k = vec4<f32>(qkv[qkv_at(b, srow, 1u, h) + sub + R * @ku]) * (p.scale * LOG2E);
    let k1_@k = vec4<f32>(qkv[qkv_at(b, srow1, 1u, h) + sub + R * @ku]) * (p.scale * LOG2E);
    let v0_@k = vec4<f32>(qkv[qkv_at(b, srow, 2u, h) + sub + R * @ku]);
    let v1_@k = vec4<f32>(qkv[qkv_at(b, srow1, 2u, h) + sub + R * @ku]);
    var dk0_@k = vec4<f32>(0.0);
    var dk1_@k = vec4<f32>(0.0);
    var dv0_@k = vec4<f32>(0.0);
    var dv1_@k = vec4<f32>(0.0);
    let hi4 = (sub & 4u) != 0u;
    let hi2 = (sub & 2u) != 0u;
    let hi1 = (sub & 1u) != 0u;
    let mine = select(row, row1, hi4);   // the key row of the lane's one exponent
    let qs = sub & 3u;                   // and its query among the four
    let first = (blk * BR) / BC * BC;
    for (var i0 = first; i0 < p.t; i0 += BC) {
        workgroupBarrier();
        load_q(lid, b, h, i0);
        workgroupBarrier();
//#unroll ROWS4
        {
            let ii = 4u * @u;
            let at = ii * RS + sub;
            let qa_@k = tile_a[at + R * @ku];
            let qb_@k = tile_a[at + RS + R * @ku];
            let qc_@k = tile_a[at + 2u * RS + R * @ku];
            let qd_@k = tile_a[at + 3u * RS + R * @ku];
            let ga_@k = tile_b[at + R * @ku];
            let gb_@k = tile_b[at + RS + R * @ku];
            let gc_@k = tile_b[at + 2u * RS + R * @ku];
            let gd_@k = tile_b[at + 3u * RS + R * @ku];
            var s0 = vec4<f32>(0.0);
            var s1 = vec4<f32>(0.0);
            var e0 = vec4<f32>(0.0);
            var e1 = vec4<f32>(0.0);
            s0 += vec4<f32>(dot(qa_@k, k0_@k), dot(qb_@k, k0_@k), dot(qc_@k, k0_@k), dot(qd_@k, k0_@k));
            s1 += vec4<f32>(dot(qa_@k, k1_@k), dot(qb_@k, k1_@k), dot(qc_@k, k1_@k), dot(qd_@k, k1_@k));
            e0 += vec4<f32>(dot(ga_@k, v0_@k), dot(gb_@k, v0_@k), dot(gc_@k, v0_@k), dot(gd_@k, v0_@k));
            e1 += vec4<f32>(dot(ga_@k, v1_@k), dot(gb_@k, v1_@k), dot(gc_@k, v1_@k), dot(gd_@k, v1_@k));
            // Reduce-scatter: keep the half that is the lane's, add the partner's.
            let s4 = select(s0, s1, hi4) + subgroupShuffleXor(select(s1, s0, hi4), 4u);
            let e4 = select(e0, e1, hi4) + subgroupShuffleXor(select(e1, e0, hi4), 4u);
            let lo2 = vec4<f32>(s4.xy, e4.xy);
            let up2 = vec4<f32>(s4.zw, e4.zw);
            let r2 = select(lo2, up2, hi2) + subgroupShuffleXor(select(up2, lo2, hi2), 2u);
            let r1 = select(r2.xz, r2.yw, hi1) + subgroupShuffleXor(select(r2.yw, r2.xz, hi1), 1u);
            let qi = i0 + ii + qs;
            let ok = qi >= mine && qi < p.t && mine < p.t;
            let pv = select(0.0, exp2(r1.x - tile_s[ii / 4u][qs] * LOG2E), ok);
            let pd = vec2<f32>(pv, pv * (r1.y - tile_d[ii / 4u][qs]));
            // All-gather: (P, dS) of queries 0..3 for both rows.
            let x1 = subgroupShuffleXor(pd, 1u);
            let pp = select(vec4<f32>(pd.x, x1.x, pd.y, x1.y), vec4<f32>(x1.x, pd.x, x1.y, pd.y), hi1);
            let x2 = subgroupShuffleXor(pp, 2u);
            let pm = select(vec4<f32>(pp.xy, x2.xy), vec4<f32>(x2.xy, pp.xy), hi2);
            let dm = select(vec4<f32>(pp.zw, x2.zw), vec4<f32>(x2.zw, pp.zw), hi2);
            let po = subgroupShuffleXor(pm, 4u);
            let do4 = subgroupShuffleXor(dm, 4u);
            let p0 = select(pm, po, hi4);
            let p1 = select(po, pm, hi4);
            let d0 = select(dm, do4, hi4);
            let d1 = select(do4, dm, hi4);
            dv0_@k += p0.x * ga_@k + p0.y * gb_@k + p0.z * gc_@k + p0.w * gd_@k;
            dv1_@k += p1.x * ga_@k + p1.y * gb_@k + p1.z * gc_@k + p1.w * gd_@k;
            dk0_@k += d0.x * qa_@k + d0.y * qb_@k + d0.z * qc_@k + d0.w * qd_@k;
            dk1_@k += d1.x * qa_@k + d1.y * qb_@k + d1.z * qc_@k + d1.w * qd_@k;
        }
//#end
    }
    if valid {
        dqkv[qkv_at(b, row, 1u, h) + sub + R * @ku] = dk0_@k * p.scale;
        dqkv[qkv_at(b, row, 2u, h) + sub + R * @ku] = dv0_@k;
    }
    if row1 < p.t {
        dqkv[qkv_at(b, row1, 1u, h) + sub + R * @ku] = dk1_@k * p.scale;
        dqkv[qkv_at(b, row1, 2u, h) + sub + R * @ku] = dv1_@k;
    }
//#endif
}
