// flash_coop KeyValue sg4.bc64.subgroup.direct
// Fused causal attention on cooperative matrices (tensor cores): the same layout,
// parameters and results as shaders/flash_attention.wgsl, for f16 qkv and head sizes
// that are multiples of 16. Products take f16 operands and accumulate in f32: Q K^T,
// P V, dY V^T, P^T dY, dS^T Q and dS K, with P and dS rounded to f16 for the second
// product (as FlashAttention does) and dY rounded to f16. Softmax, masks and row
// statistics are computed in f32 by the lanes.
//
// A workgroup of SG subgroups of 32 lanes takes BR = 16 * SG rows of one (batch, head);
// subgroup s owns rows 16 s .. 16 s + 15, whose operands it keeps in registers as
// fragments (`own`: Q, or Q and dY, or K and V). The other operand streams through
// workgroup memory in tiles of BC rows (x_t and y_t): each tile is fetched into registers
// while the previous one is used, then stashed. A product's 16 x 16 fragments are stored
// to the subgroup's rows of the f32 staging area, where each row's 2 lanes (columns of
// four columns at a time) read them; what they write for a second product (P or dS,
// f16) goes to the subgroup's rows of `p_t`. Every workgroup array holds vectors, so a
// lane moves four elements with one load or store; cooperative loads and stores take
// their index and stride in those vectors. Those rows are the subgroup's alone: between its phases it
// syncs with ROW_SYNC (a subgroup or workgroup barrier, chosen by the host); only the
// streamed tiles need workgroup barriers.
//
// MODE 0, forward, in one pass over the keys (FlashAttention's online softmax): O is held
//   by the lanes in f32 registers (a row's 2 lanes, 4 columns each of every 8), since
//   WGSL gives no access to an accumulator's elements: each tile's P V goes to fresh
//   fragments, through the staging area, and is added to O rescaled by exp(m - m_new).
// MODE 2, dK and dV: rows are keys; query tiles from the diagonal down: P^T from the
//   saved lse, dV += P^T dY, dS^T = P^T * (dP^T - D), dK += dS^T Q * scale.
// MODE 3, dQ: rows are queries; key tiles up to the diagonal: dQ += dS K * scale.
// (D = rowsum(dY * Y) comes from flash_attention.wgsl's MODE 1.) No atomics: results
// are bitwise repeatable.
//
// The host writes the fragment code unrolled (OWN, SCORES_*, ACC_*, STORE_*), with named
// fragments (an array of cooperative matrices indexed in a loop is not kept in
// registers), and picks this kernel only where the adapter grants 16x16x16
// f16 -> f32 and subgroups of exactly 32.
//
// Global loads take 8 elements (16 bytes of qkv, `H8`; dy's `G8`) at a time.
//
// Template: ATTENTION_COMMON (shaders/attention_common.wgsl), TD (dy), TY (the second
// streamed tile's 8-element load: H8, or G8 for dy), D, SG, BC (>= BR), the mode flags (FWD, BWD, BWD_KV, BWD_Q), the parts of qkv streamed (PX, PY) and owned
// (OWN_X, OWN_Y), ROW_SYNC, PREFETCH (else each tile is fetched when stashed) and the
// unrolled code.
enable f16;
enable wgpu_cooperative_matrix;

// What the fused attention kernels share (shaders/flash_attention.wgsl and
// shaders/flash_attention_coop.wgsl paste it at their ATTENTION_COMMON placeholder):
// the parameters and the indexing of qkv [B, T, 3C], y / dy [B, T, C] and the per-row
// [B, NH, T] vectors. The kernel declares `D4`, the head size in vec4s.

struct Params {
    b: u32,
    nh: u32,
    t: u32,
    c4: u32,        // C / 4: a row of y in vec4s
    scale: f32,
    blocks: u32,    // row blocks per (batch, head)
    per: u32,       // SIMT: keys per tile, a loop bound the compiler does not unroll
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// vec4 index of element (b, t, part, h, 0) of qkv.
fn qkv_at(b: u32, t: u32, part: u32, h: u32) -> u32 {
    return ((b * p.t + t) * 3u + part) * p.c4 + h * D4;
}

// vec4 index of element (b, t, h, 0) of y or dy.
fn y_at(b: u32, t: u32, h: u32) -> u32 {
    return (b * p.t + t) * p.c4 + h * D4;
}

// Index of row (b, h, t) of lse and D.
fn row_at(b: u32, h: u32, t: u32) -> u32 {
    return (b * p.nh + h) * p.t + t;
}

// Eight elements, 16 bytes: the unit of every load from qkv and dy (two vectors).
struct H8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}
struct G8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

@group(0) @binding(1) var<storage, read_write> qkv: array<H8>;
@group(0) @binding(2) var<storage, read_write> dy: array<G8>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;

const D: u32 = 64u;
const D4: u32 = D / 4u;
const D8: u32 = D / 8u;
const SG: u32 = 4u;
const BR: u32 = 16u * SG;
const BC: u32 = 64u;
const WG: u32 = 32u * SG;
const LD: u32 = D + 8u;      // f16 tile rows, padded by 16 bytes
const PLD: u32 = BC + 8u;    // P or dS rows (f16)
const SLD: u32 = BC + 8u;    // staging rows (f32): a row's 2 lanes and the next rows'
                             // read distinct banks (rows 2 banks of 16 bytes apart)
const LD4: u32 = LD / 4u;    // the same in vec4s
const PLD4: u32 = PLD / 4u;
const SLD4: u32 = SLD / 4u;
const LOADS: u32 = (BC * D8 + WG - 1u) / WG;   // 8-element loads a thread makes per tile
// T a multiple of BR and BC (the host's rule): every row a load reads is inside T, and
// the loads go unchecked (on the H100 the tensor-core matmul's bounds checks cost it 15%).
const WHOLE: bool = true;
// Every thread's LOADS loads fall inside the tile (no check on the load index).
const FULL: bool = LOADS * WG == BC * D8;
const NEG: f32 = -3.0e38;
const LOG2E: f32 = 1.4426950408889634;

var<workgroup> x_t: array<vec4<f16>, BC * LD4>;   // FWD, BWD_Q: K; BWD_KV: Q
var<workgroup> y_t: array<vec4<f16>, BC * LD4>;   // FWD, BWD_Q: V; BWD_KV: dY
var<workgroup> stg: array<vec4<f32>, BR * SLD4>;
var<workgroup> p_t: array<vec4<f16>, BR * PLD4>;
// The fetched tile, LOADS 8-element loads of each operand per thread, as named
// variables (lines holding the load marker, an at-sign and l, are repeated by the host
// once per load): arrays of them were kept in local memory by the H100's driver.
var<private> pre_x_0: H8;
var<private> pre_x_1: H8;
var<private> pre_x_2: H8;
var<private> pre_x_3: H8;
var<private> pre_y_0: G8;
var<private> pre_y_1: G8;
var<private> pre_y_2: G8;
var<private> pre_y_3: G8;

struct Fetched {
    x: H8,
    y: G8,
}
var<workgroup> tile_s: array<vec4<f32>, BC / 4u>;   // the query tile's lse
var<workgroup> tile_d: array<vec4<f32>, BC / 4u>;   // and D
var<private> pre_s: f32;   // (lse in log2 units)
var<private> pre_d: f32;


// A lane's four columns c .. c + 3 of its row (c a multiple of 4, `at` the element
// index of column c): the SIMT phases take four at a time, one vector load or store each,
// as independent chains (loads, exp, stores) the compiler can overlap, branch-free.
const STEP: vec4<u32> = vec4<u32>(0u, 1u, 2u, 3u);

fn staged4(at: u32) -> vec4<f32> {
    return stg[at / 4u];
}

fn p4(at: u32) -> vec4<f32> {
    return vec4<f32>(p_t[at / 4u]);
}

fn put_p4(at: u32, v: vec4<f32>) {
    p_t[at / 4u] = vec4<f16>(v);
}

// One staged element (the stores of y and of dQ, dK, dV).
fn staged1(at: u32) -> f32 {
    return stg[at / 4u][at % 4u];
}

// Syncs a subgroup's own rows of the staging area and of p_t between phases.
fn row_sync() {
    subgroupBarrier();
}

// Whether row t of a loaded tile is inside T (always, where WHOLE).
fn in_t(t: u32) -> bool {
    return WHOLE || t < p.t;
}

// Loads the block's own BR rows from row r0 into x_t (qkv part OWN_X) and y_t (OWN_Y);
// zeros past T. (qkv_at and y_at give vec4 indices; heads start at multiples of 16.)
fn load_own(lid: u32, b: u32, h: u32, r0: u32) {
    for (var e = lid; e < BR * D8; e += WG) {
        let r = e / D8;
        let c = e % D8;
        let t = r0 + r;
        var xv = H8();
        var yv = H8();
        if in_t(t) {
            xv = qkv[qkv_at(b, t, 1u, h) / 2u + c];
            yv = qkv[qkv_at(b, t, 2u, h) / 2u + c];
        }
        let at = r * LD4 + 2u * c;
        x_t[at] = xv.lo;
        x_t[at + 1u] = xv.hi;
        y_t[at] = yv.lo;
        y_t[at + 1u] = yv.hi;
    }
}

// Fetches the tile of BC rows from row r0 into registers (qkv part PX, and PY or dY);
// zeros past T.
fn fetch_one(lid: u32, l: u32, b: u32, h: u32, r0: u32) -> Fetched {
    let e = lid + l * WG;
    let t = r0 + e / D8;
    let c = e % D8;
    var v = Fetched();
    if (FULL || e < BC * D8) && in_t(t) {
        v.x = qkv[qkv_at(b, t, 0u, h) / 2u + c];
        v.y = dy[y_at(b, t, h) / 2u + c];
    }
    return v;
}

fn fetch(lid: u32, b: u32, h: u32, r0: u32) {
    { let v = fetch_one(lid, 0u, b, h, r0); pre_x_0 = v.x; pre_y_0 = v.y; }
    { let v = fetch_one(lid, 1u, b, h, r0); pre_x_1 = v.x; pre_y_1 = v.y; }
    { let v = fetch_one(lid, 2u, b, h, r0); pre_x_2 = v.x; pre_y_2 = v.y; }
    { let v = fetch_one(lid, 3u, b, h, r0); pre_x_3 = v.x; pre_y_3 = v.y; }
    let i = r0 + lid;
    pre_s = 0.0;
    pre_d = 0.0;
    if lid < BC && in_t(i) {
        pre_s = lse[row_at(b, h, i)] * LOG2E;
        pre_d = dvec[row_at(b, h, i)];
    }
}

// Writes the fetched tile into x_t and y_t.
fn stash_one(lid: u32, l: u32, x: H8, y: G8) {
    let e = lid + l * WG;
    if FULL || e < BC * D8 {
        let at = (e / D8) * LD4 + 2u * (e % D8);
        x_t[at] = x.lo;
        x_t[at + 1u] = x.hi;
        y_t[at] = vec4<f16>(y.lo);
        y_t[at + 1u] = vec4<f16>(y.hi);
    }
}

fn stash(lid: u32) {
    stash_one(lid, 0u, pre_x_0, pre_y_0);
    stash_one(lid, 1u, pre_x_1, pre_y_1);
    stash_one(lid, 2u, pre_x_2, pre_y_2);
    stash_one(lid, 3u, pre_x_3, pre_y_3);
    if lid < BC {
        tile_s[lid / 4u][lid % 4u] = pre_s;
        tile_d[lid / 4u][lid % 4u] = pre_d;
    }
}

// Writes the subgroup's 16 x 16 block staged at its rows' columns 0..15, times `f`, to
// dqkv's `part` at rows r0 + m0 .. and columns col .. of head h.
fn write_dqkv(lane: u32, b: u32, h: u32, r0: u32, m0: u32, part: u32, col: u32, f: f32) {
    for (var e = lane; e < 256u; e += 32u) {
        let r = e / 16u;
        let c = e % 16u;
        let t = r0 + m0 + r;
        if t < p.t {
            dqkv[4u * qkv_at(b, t, part, h) + col + c] = staged1((m0 + r) * SLD + c) * f;
        }
    }
}


// Starts a pass over the streamed tiles from row `first` (PREFETCH: fetches it).
fn begin_tiles(lid: u32, b: u32, h: u32, first: u32) {
}

// Makes tile t0 the current one in x_t and y_t once every subgroup is done with the
// previous one; with PREFETCH the next tile's loads are then in flight while this one is
// used. Every thread calls it (it holds barriers).
fn next_tile(lid: u32, b: u32, h: u32, t0: u32, end: u32) {
    workgroupBarrier();
    fetch(lid, b, h, t0);
    stash(lid);
    workgroupBarrier();
}

// Which of the lane's four columns c .. c + 3 of tile t0 its row sees:
// keys up to the row (FWD, BWD_Q), or queries from the key row down and inside T (BWD_KV).
fn unmasked(t0: u32, c: u32, row: u32) -> vec4<bool> {
    let i = vec4<u32>(t0 + c) + STEP;
    return (i >= vec4<u32>(row)) & (i < vec4<u32>(p.t));
}

// The lane's masked P = exp(scale s - lse) = exp2(sc2 s - lse log2 e) from tile t0's
// staged scores, into p_t in f16 (`sc2` = scale log2 e; lse in log2 units: the row's
// `row_lse`, or (BWD_KV) each query's from tile_s).
fn write_p(t0: u32, row: u32, half: u32, sat: u32, pat: u32, row_lse: f32, sc2: f32) {
    {
        let c = 4u * (half + 2u * 0u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 1u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 2u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 3u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 4u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 5u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 6u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
    {
        let c = 4u * (half + 2u * 7u);
        let ls = tile_s[c / 4u];
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
}

// dS = P (dP - D) from p_t and the staged dP, back into p_t in f16; D is the row's
// `row_d`, or (BWD_KV) each query's from tile_d.
fn write_ds(half: u32, sat: u32, pat: u32, row_d: f32) {
    {
        let c = 4u * (half + 2u * 0u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 1u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 2u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 3u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 4u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 5u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 6u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
    {
        let c = 4u * (half + 2u * 7u);
        let dd = tile_d[c / 4u];
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
}

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    let bh = group / p.blocks;
    let blk = group % p.blocks;
    if bh >= p.b * p.nh { return; }
    let b = bh / p.nh;
    let h = bh % p.nh;
    let row0 = blk * BR;
    let sc2 = p.scale * LOG2E;   // scores to log2 units: exp(scale s) = exp2(sc2 s)
    let s = lid / 32u;
    let lane = lid % 32u;
    let m0 = s * 16u;             // the subgroup's first row in the block
    let r = lane / 2u;            // the lane's row among the subgroup's 16
    let half = lane % 2u;         // its columns: 4 half .. 4 half + 3, then every 8th
    let row = row0 + m0 + r;      // a query row (FWD, BWD_Q) or a key row (BWD_KV)
    let srow = min(row, p.t - 1u);
    let sat = (m0 + r) * SLD;     // the lane's row in the staging area
    let pat = (m0 + r) * PLD;     // and in p_t
    load_own(lid, b, h, row0);
    workgroupBarrier();
    let k_0 = coopLoadT<coop_mat16x16<f16, A>>(&x_t[m0 * LD4 + 0u], LD4);
    let k_1 = coopLoadT<coop_mat16x16<f16, A>>(&x_t[m0 * LD4 + 4u], LD4);
    let k_2 = coopLoadT<coop_mat16x16<f16, A>>(&x_t[m0 * LD4 + 8u], LD4);
    let k_3 = coopLoadT<coop_mat16x16<f16, A>>(&x_t[m0 * LD4 + 12u], LD4);
    let v_0 = coopLoadT<coop_mat16x16<f16, A>>(&y_t[m0 * LD4 + 0u], LD4);
    let v_1 = coopLoadT<coop_mat16x16<f16, A>>(&y_t[m0 * LD4 + 4u], LD4);
    let v_2 = coopLoadT<coop_mat16x16<f16, A>>(&y_t[m0 * LD4 + 8u], LD4);
    let v_3 = coopLoadT<coop_mat16x16<f16, A>>(&y_t[m0 * LD4 + 12u], LD4);

    // Queries from the block's first key row down: tiles above the diagonal skipped.
    let first = row0 / BC * BC;
    let end = p.t;
    let lse_i = 0.0;   // (per query, from tile_s and tile_d)
    let d_i = 0.0;
    var dk_0 = coop_mat16x16<f32, C>();
    var dk_1 = coop_mat16x16<f32, C>();
    var dk_2 = coop_mat16x16<f32, C>();
    var dk_3 = coop_mat16x16<f32, C>();
    var dv_0 = coop_mat16x16<f32, C>();
    var dv_1 = coop_mat16x16<f32, C>();
    var dv_2 = coop_mat16x16<f32, C>();
    var dv_3 = coop_mat16x16<f32, C>();

    begin_tiles(lid, b, h, first);
    for (var t0 = first; t0 < end; t0 += BC) {
        next_tile(lid, b, h, t0, end);
        {
            var s_0 = coop_mat16x16<f32, C>();
            var s_1 = coop_mat16x16<f32, C>();
            var s_2 = coop_mat16x16<f32, C>();
            var s_3 = coop_mat16x16<f32, C>();
            s_0 = coopMultiplyAdd(k_0, coopLoad<coop_mat16x16<f16, B>>(&x_t[0u * LD4 + 0u], LD4), s_0);
            s_1 = coopMultiplyAdd(k_0, coopLoad<coop_mat16x16<f16, B>>(&x_t[16u * LD4 + 0u], LD4), s_1);
            s_2 = coopMultiplyAdd(k_0, coopLoad<coop_mat16x16<f16, B>>(&x_t[32u * LD4 + 0u], LD4), s_2);
            s_3 = coopMultiplyAdd(k_0, coopLoad<coop_mat16x16<f16, B>>(&x_t[48u * LD4 + 0u], LD4), s_3);
            s_0 = coopMultiplyAdd(k_1, coopLoad<coop_mat16x16<f16, B>>(&x_t[0u * LD4 + 4u], LD4), s_0);
            s_1 = coopMultiplyAdd(k_1, coopLoad<coop_mat16x16<f16, B>>(&x_t[16u * LD4 + 4u], LD4), s_1);
            s_2 = coopMultiplyAdd(k_1, coopLoad<coop_mat16x16<f16, B>>(&x_t[32u * LD4 + 4u], LD4), s_2);
            s_3 = coopMultiplyAdd(k_1, coopLoad<coop_mat16x16<f16, B>>(&x_t[48u * LD4 + 4u], LD4), s_3);
            s_0 = coopMultiplyAdd(k_2, coopLoad<coop_mat16x16<f16, B>>(&x_t[0u * LD4 + 8u], LD4), s_0);
            s_1 = coopMultiplyAdd(k_2, coopLoad<coop_mat16x16<f16, B>>(&x_t[16u * LD4 + 8u], LD4), s_1);
            s_2 = coopMultiplyAdd(k_2, coopLoad<coop_mat16x16<f16, B>>(&x_t[32u * LD4 + 8u], LD4), s_2);
            s_3 = coopMultiplyAdd(k_2, coopLoad<coop_mat16x16<f16, B>>(&x_t[48u * LD4 + 8u], LD4), s_3);
            s_0 = coopMultiplyAdd(k_3, coopLoad<coop_mat16x16<f16, B>>(&x_t[0u * LD4 + 12u], LD4), s_0);
            s_1 = coopMultiplyAdd(k_3, coopLoad<coop_mat16x16<f16, B>>(&x_t[16u * LD4 + 12u], LD4), s_1);
            s_2 = coopMultiplyAdd(k_3, coopLoad<coop_mat16x16<f16, B>>(&x_t[32u * LD4 + 12u], LD4), s_2);
            s_3 = coopMultiplyAdd(k_3, coopLoad<coop_mat16x16<f16, B>>(&x_t[48u * LD4 + 12u], LD4), s_3);
            coopStoreT(s_0, &stg[m0 * SLD4 + 0u], SLD4);
            coopStoreT(s_1, &stg[m0 * SLD4 + 4u], SLD4);
            coopStoreT(s_2, &stg[m0 * SLD4 + 8u], SLD4);
            coopStoreT(s_3, &stg[m0 * SLD4 + 12u], SLD4);
        }
        row_sync();
        write_p(t0, row, half, sat, pat, lse_i, sc2);
        row_sync();
        for (var kk = 0u; kk < BC; kk += 16u) {
            let fa = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD4 + kk / 4u], PLD4);
            dv_0 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&y_t[kk * LD4 + 0u], LD4), dv_0);
            dv_1 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&y_t[kk * LD4 + 4u], LD4), dv_1);
            dv_2 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&y_t[kk * LD4 + 8u], LD4), dv_2);
            dv_3 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&y_t[kk * LD4 + 12u], LD4), dv_3);
        }
        {
            var s_0 = coop_mat16x16<f32, C>();
            var s_1 = coop_mat16x16<f32, C>();
            var s_2 = coop_mat16x16<f32, C>();
            var s_3 = coop_mat16x16<f32, C>();
            s_0 = coopMultiplyAdd(v_0, coopLoad<coop_mat16x16<f16, B>>(&y_t[0u * LD4 + 0u], LD4), s_0);
            s_1 = coopMultiplyAdd(v_0, coopLoad<coop_mat16x16<f16, B>>(&y_t[16u * LD4 + 0u], LD4), s_1);
            s_2 = coopMultiplyAdd(v_0, coopLoad<coop_mat16x16<f16, B>>(&y_t[32u * LD4 + 0u], LD4), s_2);
            s_3 = coopMultiplyAdd(v_0, coopLoad<coop_mat16x16<f16, B>>(&y_t[48u * LD4 + 0u], LD4), s_3);
            s_0 = coopMultiplyAdd(v_1, coopLoad<coop_mat16x16<f16, B>>(&y_t[0u * LD4 + 4u], LD4), s_0);
            s_1 = coopMultiplyAdd(v_1, coopLoad<coop_mat16x16<f16, B>>(&y_t[16u * LD4 + 4u], LD4), s_1);
            s_2 = coopMultiplyAdd(v_1, coopLoad<coop_mat16x16<f16, B>>(&y_t[32u * LD4 + 4u], LD4), s_2);
            s_3 = coopMultiplyAdd(v_1, coopLoad<coop_mat16x16<f16, B>>(&y_t[48u * LD4 + 4u], LD4), s_3);
            s_0 = coopMultiplyAdd(v_2, coopLoad<coop_mat16x16<f16, B>>(&y_t[0u * LD4 + 8u], LD4), s_0);
            s_1 = coopMultiplyAdd(v_2, coopLoad<coop_mat16x16<f16, B>>(&y_t[16u * LD4 + 8u], LD4), s_1);
            s_2 = coopMultiplyAdd(v_2, coopLoad<coop_mat16x16<f16, B>>(&y_t[32u * LD4 + 8u], LD4), s_2);
            s_3 = coopMultiplyAdd(v_2, coopLoad<coop_mat16x16<f16, B>>(&y_t[48u * LD4 + 8u], LD4), s_3);
            s_0 = coopMultiplyAdd(v_3, coopLoad<coop_mat16x16<f16, B>>(&y_t[0u * LD4 + 12u], LD4), s_0);
            s_1 = coopMultiplyAdd(v_3, coopLoad<coop_mat16x16<f16, B>>(&y_t[16u * LD4 + 12u], LD4), s_1);
            s_2 = coopMultiplyAdd(v_3, coopLoad<coop_mat16x16<f16, B>>(&y_t[32u * LD4 + 12u], LD4), s_2);
            s_3 = coopMultiplyAdd(v_3, coopLoad<coop_mat16x16<f16, B>>(&y_t[48u * LD4 + 12u], LD4), s_3);
            coopStoreT(s_0, &stg[m0 * SLD4 + 0u], SLD4);
            coopStoreT(s_1, &stg[m0 * SLD4 + 4u], SLD4);
            coopStoreT(s_2, &stg[m0 * SLD4 + 8u], SLD4);
            coopStoreT(s_3, &stg[m0 * SLD4 + 12u], SLD4);
        }
        row_sync();
        write_ds(half, sat, pat, d_i);
        row_sync();
        for (var kk = 0u; kk < BC; kk += 16u) {
            let fa = coopLoadT<coop_mat16x16<f16, A>>(&p_t[m0 * PLD4 + kk / 4u], PLD4);
            dk_0 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&x_t[kk * LD4 + 0u], LD4), dk_0);
            dk_1 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&x_t[kk * LD4 + 4u], LD4), dk_1);
            dk_2 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&x_t[kk * LD4 + 8u], LD4), dk_2);
            dk_3 = coopMultiplyAdd(fa, coopLoadT<coop_mat16x16<f16, B>>(&x_t[kk * LD4 + 12u], LD4), dk_3);
        }
    }
    row_sync();
    coopStoreT(dk_0, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 1u, 0u, p.scale);
    row_sync();
    coopStoreT(dk_1, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 1u, 16u, p.scale);
    row_sync();
    coopStoreT(dk_2, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 1u, 32u, p.scale);
    row_sync();
    coopStoreT(dk_3, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 1u, 48u, p.scale);
    row_sync();
    coopStoreT(dv_0, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 2u, 0u, 1.0);
    row_sync();
    coopStoreT(dv_1, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 2u, 16u, 1.0);
    row_sync();
    coopStoreT(dv_2, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 2u, 32u, 1.0);
    row_sync();
    coopStoreT(dv_3, &stg[m0 * SLD4], SLD4);
    row_sync();
    write_dqkv(lane, b, h, row0, m0, 2u, 48u, 1.0);
    row_sync();

}
