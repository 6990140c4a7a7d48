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
// MODE 0, forward, in one pass over the keys (FlashAttention's online softmax), O
//   accumulated in fragments: P is formed against a row reference max that moves only
//   when the row's max passes it by more than RESCALE (2^8), so O needs rescaling (a
//   round trip through the staging area, since WGSL gives no access to an accumulator's
//   elements) only on those rare tiles.
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
// streamed tile's 8-element load: H8, or G8 for dy), D, SG, BC, the mode flags (FWD, BWD,
// BWD_KV, BWD_Q), the parts of qkv streamed (PX, PY) and owned (OWN_X, OWN_Y), ROW_SYNC,
// PREFETCH (else each tile is fetched when stashed), the forward's ANY_MOVED (its flags
// tested, bitwise) and the unrolled code.
enable f16;
enable wgpu_cooperative_matrix;

{{ATTENTION_COMMON}}
// Eight elements, 16 bytes: the unit of every load from qkv and dy (two vectors).
struct H8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}
struct G8 {
    lo: vec4<{{TD}}>,
    hi: vec4<{{TD}}>,
}

@group(0) @binding(1) var<storage, read_write> qkv: array<H8>;
// qkv4 (and dy4) are qkv (and dy) again, as vectors: where T is whole, each subgroup
// loads its own rows' fragments from them directly (`own` in the host's code).
//#if FWD
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> qkv4: array<vec4<f16>>;
//#endif
//#if BWD
@group(0) @binding(2) var<storage, read_write> dy: array<G8>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;
@group(0) @binding(6) var<storage, read_write> qkv4: array<vec4<f16>>;
@group(0) @binding(7) var<storage, read_write> dy4: array<vec4<f16>>;
//#endif

const D: u32 = {{D}}u;
const D4: u32 = D / 4u;
const D8: u32 = D / 8u;
const SG: u32 = {{SG}}u;
const BR: u32 = 16u * SG;
const BC: u32 = {{BC}}u;
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
const WHOLE: bool = {{WHOLE}};
// Every thread's LOADS loads fall inside the tile (no check on the load index).
const FULL: bool = LOADS * WG == BC * D8;
const NEG: f32 = -3.0e38;
// How far (log2 units) a row's max may pass the forward's reference max before O is
// rescaled: P stays <= 256, well inside f16.
const RESCALE: f32 = 8.0;
const LOG2E: f32 = 1.4426950408889634;

var<workgroup> x_t: array<vec4<f16>, BC * LD4>;   // FWD, BWD_Q: K; BWD_KV: Q
var<workgroup> y_t: array<vec4<f16>, BC * LD4>;   // FWD, BWD_Q: V; BWD_KV: dY
var<workgroup> stg: array<vec4<f32>, BR * SLD4>;
var<workgroup> p_t: array<vec4<f16>, BR * PLD4>;
// The fetched tile, LOADS 8-element loads of each operand per thread, as named
// variables (lines holding the load marker, an at-sign and l, are repeated by the host
// once per load): arrays of them were kept in local memory by the H100's driver.
var<private> pre_x_@l: H8;
var<private> pre_y_@l: {{TY}};

struct Fetched {
    x: H8,
    y: {{TY}},
}
//#if FWD
// Per subgroup: whether a row's reference max moved. Padded to 16 bytes: the driver may
// place it before the vector tiles, which then need their 16-byte alignment (an 8-byte
// array put the tiles of 1 and 2 subgroups off by 8 bytes on the H100).
var<workgroup> moved: array<u32, (SG + 3u) / 4u * 4u>;
//#endif
//#if BWD_KV
var<workgroup> tile_s: array<vec4<f32>, BC / 4u>;   // the query tile's lse
var<workgroup> tile_d: array<vec4<f32>, BC / 4u>;   // and D
var<private> pre_s: f32;   // (lse in log2 units)
var<private> pre_d: f32;
//#endif


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
    {{ROW_SYNC}}();
}

// Whether row t of a loaded tile is inside T (always, where WHOLE).
fn in_t(t: u32) -> bool {
    return WHOLE || t < p.t;
}

// Loads OWN_ROWS of the block's own rows from row r0 into x_t (qkv part OWN_X) and y_t
// (OWN_Y); zeros past T. (qkv_at and y_at give vec4 indices; heads start at multiples
// of 16.) Where the streamed tiles are shorter than the block, the own rows come in
// BR / BC passes (see `own` in kernels/flash_attention_coop.rs).
const OWN_ROWS: u32 = min(BR, BC);
fn load_own(lid: u32, b: u32, h: u32, r0: u32) {
    for (var e = lid; e < OWN_ROWS * D8; e += WG) {
        let r = e / D8;
        let c = e % D8;
        let t = r0 + r;
        var xv = H8();
        var yv = H8();
        if in_t(t) {
            xv = qkv[qkv_at(b, t, {{OWN_X}}u, h) / 2u + c];
//#if BWD_Q
            let g = dy[y_at(b, t, h) / 2u + c];
            yv = H8(vec4<f16>(g.lo), vec4<f16>(g.hi));
//#else
            yv = qkv[qkv_at(b, t, {{OWN_Y}}u, h) / 2u + c];
//#endif
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
        v.x = qkv[qkv_at(b, t, {{PX}}u, h) / 2u + c];
//#if BWD_KV
        v.y = dy[y_at(b, t, h) / 2u + c];
//#else
        v.y = qkv[qkv_at(b, t, {{PY}}u, h) / 2u + c];
//#endif
    }
    return v;
}

fn fetch(lid: u32, b: u32, h: u32, r0: u32) {
    { let v = fetch_one(lid, @lu, b, h, r0); pre_x_@l = v.x; pre_y_@l = v.y; }
//#if BWD_KV
    let i = r0 + lid;
    pre_s = 0.0;
    pre_d = 0.0;
    if lid < BC && in_t(i) {
        pre_s = lse[row_at(b, h, i)] * LOG2E;
        pre_d = dvec[row_at(b, h, i)];
    }
//#endif
}

// Writes the fetched tile into x_t and y_t.
fn stash_one(lid: u32, l: u32, x: H8, y: {{TY}}) {
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
    stash_one(lid, @lu, pre_x_@l, pre_y_@l);
//#if BWD_KV
    if lid < BC {
        tile_s[lid / 4u][lid % 4u] = pre_s;
        tile_d[lid / 4u][lid % 4u] = pre_d;
    }
//#endif
}

//#if BWD
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
//#endif


// Starts a pass over the streamed tiles from row `first` (PREFETCH: fetches it).
fn begin_tiles(lid: u32, b: u32, h: u32, first: u32) {
//#if PREFETCH
    fetch(lid, b, h, first);
//#endif
}

// Makes tile t0 the current one in x_t and y_t once every subgroup is done with the
// previous one; with PREFETCH the next tile's loads are then in flight while this one is
// used. Every thread calls it (it holds barriers).
fn next_tile(lid: u32, b: u32, h: u32, t0: u32, end: u32) {
    workgroupBarrier();
//#if PREFETCH
    stash(lid);
    workgroupBarrier();
    if t0 + BC < end {
        fetch(lid, b, h, t0 + BC);
    }
//#else
    fetch(lid, b, h, t0);
    stash(lid);
    workgroupBarrier();
//#endif
}

// Which of the lane's four columns c .. c + 3 of tile t0 its row sees:
// keys up to the row (FWD, BWD_Q), or queries from the key row down and inside T (BWD_KV).
fn unmasked(t0: u32, c: u32, row: u32) -> vec4<bool> {
    let i = vec4<u32>(t0 + c) + STEP;
//#if BWD_KV
    return (i >= vec4<u32>(row)) & (i < vec4<u32>(p.t));
//#else
    return i <= vec4<u32>(row);
//#endif
}

// The lane's masked P = exp(scale s - lse) = exp2(sc2 s - lse log2 e) from tile t0's
// staged scores, into p_t in f16 (`sc2` = scale log2 e; lse in log2 units: the row's
// `row_lse`, or (BWD_KV) each query's from tile_s).
fn write_p(t0: u32, row: u32, half: u32, sat: u32, pat: u32, row_lse: f32, sc2: f32) {
//#unroll COLS4
    {
        let c = 4u * (half + 2u * @u);
//#if BWD_KV
        let ls = tile_s[c / 4u];
//#else
        let ls = vec4<f32>(row_lse);
//#endif
        let ok = unmasked(t0, c, row);
        put_p4(pat + c, select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - ls), ok));
    }
//#end
}

//#if BWD
// dS = P (dP - D) from p_t and the staged dP, back into p_t in f16; D is the row's
// `row_d`, or (BWD_KV) each query's from tile_d.
fn write_ds(half: u32, sat: u32, pat: u32, row_d: f32) {
//#unroll COLS4
    {
        let c = 4u * (half + 2u * @u);
//#if BWD_KV
        let dd = tile_d[c / 4u];
//#else
        let dd = vec4<f32>(row_d);
//#endif
        put_p4(pat + c, p4(pat + c) * (staged4(sat + c) - dd));
    }
//#end
}
//#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    // The blocks that see the most of the other side go first (the last query blocks,
    // the first key blocks): the longest workgroups start in the first wave, and the
    // last wave's are short.
    let bhn = p.b * p.nh;
    if group >= bhn * p.blocks { return; }
    let bh = group % bhn;
//#if BWD_KV
    let blk = group / bhn;
//#else
    let blk = p.blocks - 1u - group / bhn;
//#endif
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
{{OWN}}
//#if BWD_KV
    // Queries from the block's first key row down: tiles above the diagonal skipped.
    let first = row0 / BC * BC;
    let end = p.t;
//#else
    // Keys up to the block's last row: tiles above the diagonal skipped.
    let first = 0u;
    let end = min(p.t, row0 + BR);
//#endif
//#if FWD
    // One pass over the keys with the online softmax, O accumulated in fragments. Per
    // tile: the row's max (its two lanes merged); P = exp2(s - m) into p_t against the
    // row's reference max m, which moves only where the tile's max passes it by more
    // than RESCALE (P <= 2^RESCALE otherwise, as FlashAttention-4 does); then P V added
    // to O. Where some row's m moved (rarely after the first tile), every subgroup first
    // rescales its O by exp2(m - m_new) through the staging area. (m and the exponents in
    // log2 units; l, the lane's part of the row sum, against m.)
    var m = NEG;
    var l = 0.0;
{{ACC_DECL}}
    begin_tiles(lid, b, h, first);
    for (var t0 = first; t0 < end; t0 += BC) {
        next_tile(lid, b, h, t0, end);
{{SCORES_X}}
        row_sync();
        var tm = vec4<f32>(NEG);
//#unroll COLS4
        {
            let c = 4u * (half + 2u * @u);
            tm = max(tm, select(vec4<f32>(NEG), staged4(sat + c) * sc2, unmasked(t0, c, row)));
        }
//#end
        let lm = max(max(tm.x, tm.y), max(tm.z, tm.w));
        let m_tile = max(lm, subgroupShuffleXor(lm, 1u));
        let m_new = select(m, m_tile, m_tile > m + RESCALE);
        let alpha = exp2(m - m_new);
        var sum = vec4<f32>(0.0);
//#unroll COLS4
        {
            let c = 4u * (half + 2u * @u);
            let e = select(vec4<f32>(0.0), exp2(staged4(sat + c) * sc2 - m_new), unmasked(t0, c, row));
            sum += e;
            put_p4(pat + c, e);
        }
//#end
        l = l * alpha + ((sum.x + sum.y) + (sum.z + sum.w));
        // Whether some row of the workgroup moved its reference (O is zero until the first
        // tile's P V: nothing to rescale before). The rescale's cooperative loads and
        // stores need control flow uniform over the workgroup, hence one flag a subgroup
        // and a uniform load of them.
        let moved_here = subgroupAny(alpha != 1.0 && t0 != first);
        if lane == 0u {
            moved[s] = select(0u, 1u, moved_here);
        }
        let flags = workgroupUniformLoad(&moved);
        if {{ANY_MOVED}} {
{{RESCALE}}
        }
        m = m_new;
        row_sync();
{{ACC_FIRST}}
    }
    // The row's sum over both lanes, its lse, and 1 / l for y = O / l.
    let l_row = l + subgroupShuffleXor(l, 1u);
    let row_lse = m / LOG2E + log(l_row);
    let inv = 1.0 / l_row;
    if row < p.t && half == 0u {
        lse[row_at(b, h, row)] = row_lse;
    }
//#endif
//#if BWD
//#if BWD_Q
    let lse_i = lse[row_at(b, h, srow)] * LOG2E;
    let d_i = dvec[row_at(b, h, srow)];
//#else
    let lse_i = 0.0;   // (per query, from tile_s and tile_d)
    let d_i = 0.0;
//#endif
{{ACC_DECL}}
    begin_tiles(lid, b, h, first);
    for (var t0 = first; t0 < end; t0 += BC) {
        next_tile(lid, b, h, t0, end);
{{SCORES_X}}
        row_sync();
        write_p(t0, row, half, sat, pat, lse_i, sc2);
        row_sync();
{{ACC_SECOND}}
{{SCORES_Y}}
        row_sync();
        write_ds(half, sat, pat, d_i);
        row_sync();
{{ACC_FIRST}}
    }
//#endif
    row_sync();
{{STORE}}
}
