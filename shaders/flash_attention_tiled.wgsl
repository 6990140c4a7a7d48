// Fused causal attention in f32, register-tiled (SIMT, no tensor cores): the forward,
// dQ and dK dV of FlashAttention-2, each product computed as a small matmul in which a
// thread owns a block of the result, as the tiled f32 matmul does. The inputs may be
// f16; everything is computed in f32. Nothing of size T x T is ever stored.
//
// Layout as in shaders/flash_attention.wgsl: qkv [B, T, 3C], y and dy [B, T, C], lse and
// D = rowsum(dy * y) [B, NH, T] (f32), dqkv [B, T, 3C] (f32). dQ computes D for its own
// rows and writes it (no row-dot kernel runs), so it runs before dK dV. Scores are
// scale * q.k; exponents are taken in log2 units (the scale times log2 e folded into the
// operand that the scores read first).
//
// A workgroup owns BR rows of one (batch, head): queries (FWD, BWD_Q) or keys (BWD_KV),
// and streams tiles of BC rows of the other side through workgroup memory, skipping the
// tiles the causal mask empties. Its 8 * RG threads form RG row groups of 8 lanes:
// thread (rg, cg) owns rows rg + RG * i (i < TM) of the owned block, streamed rows
// cg + 8 * j (j < SN = BC / 8) of each score block, and vec4 columns cg + 8 * e
// (e < DN = D4 / 8) of each output row. The score block S (TM x SN) is a sum of vec4
// dot products over the head dimension; the output block (TM rows x DN vec4) is a sum
// over the tile's rows of P (or dS) times the tile, read back from workgroup memory.
//
// Workgroup tiles are rows of D4 vec4s (or BC / 4 for P and dS) with the vec4 column c
// of row r stored at c ^ (r & 7): the 8 rows a warp's lanes read at one column, and the
// 4 own rows, fall in distinct banks without padding (RG is a multiple of 8, so a
// thread's own rows share one swizzle). Row maxima (FWD) are merged over a row group's
// 8 lanes with subgroup shuffles; each row's sum is kept per lane and merged at the end.
//
// Each thread's block is named variables: a line holding a marker (an at-sign and I, J
// or E) is repeated by the host once per own row, streamed row or owned column (the
// marker replaced by its index; O and L likewise for a thread's loads, C for the
// chunks a turn of a loop takes), so that the blocks live in registers. The loops over
// the head dimension and over a tile's rows (`//#unroll` blocks, `@u` the turn) are
// kept as loops of CU chunks a turn (2 on GPUs by default) or written out by the host.
// No atomics: each output is summed by its own thread in a fixed order, so results are
// bitwise repeatable.
//
// Template: ATTENTION_COMMON, ENABLE, TQ, TD, D4, BR, BC, RG, D4U and BC4U (the unroll
// counts), CU, OWN_B, STR_A, STR_B (array lengths), NT, FWD / BWD / BWD_Q / BWD_KV,
// PREFETCH / FETCH_NOW.
{{ENABLE}}

{{ATTENTION_COMMON}}
//#if FWD
@group(0) @binding(1) var<storage, read_write> qkv: array<vec4<{{TQ}}>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<{{TQ}}>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
//#else
@group(0) @binding(1) var<storage, read_write> qkv: array<vec4<{{TQ}}>>;
@group(0) @binding(2) var<storage, read_write> dy: array<vec4<{{TD}}>>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<vec4<f32>>;
//#if BWD_Q
@group(0) @binding(6) var<storage, read_write> y: array<vec4<{{TQ}}>>;
//#endif
//#endif

const D4: u32 = {{D4}}u;
const BR: u32 = {{BR}}u;
const BC: u32 = {{BC}}u;
const RG: u32 = {{RG}}u;
const NT: u32 = 8u * RG;
const P4: u32 = BC / 4u;       // a P (or dS) row in vec4s
const CU: u32 = {{CU}}u;       // chunks (of the head dimension, or of 4 rows) a turn of a loop
const NEG: f32 = -3.0e38;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;

// The owned rows: Q (FWD, BWD_Q) or K (BWD_KV), scaled by scale * log2 e; and dY
// (BWD_Q) or V (BWD_KV).
var<workgroup> own_a: array<vec4<f32>, BR * D4>;
//#if BWD
var<workgroup> own_b: array<vec4<f32>, {{OWN_B}}>;
//#endif
// The streamed tile: K then P (FWD), K (BWD_Q) or Q (BWD_KV); and V (FWD), V then dS
// (BWD_Q) or dY (BWD_KV).
var<workgroup> str_a: array<vec4<f32>, {{STR_A}}>;
var<workgroup> str_b: array<vec4<f32>, {{STR_B}}>;
//#if BWD_KV
// P transposed and dS transposed (key rows, query columns), and the query tile's lse
// (log2 units) and D.
var<workgroup> pt: array<vec4<f32>, BR * P4>;
var<workgroup> dt: array<vec4<f32>, BR * P4>;
var<workgroup> tile_l: array<f32, BC>;
var<workgroup> tile_d: array<f32, BC>;
//#endif

// Swizzled index of vec4 column c of row r in a tile of w vec4s a row.
fn sw(r: u32, c: u32, w: u32) -> u32 {
    return r * w + (c ^ (r & 7u));
}

// The loads of a tile: NL (own rows: NLO) vec4s a thread, element e = lid + NT * i at
// row e / D4 and column e % D4 of the tile. Every load of a tile is issued before any
// is stored (rows past T read row T - 1 and store zeros): one round trip to memory a
// tile, where a loop of loads and stores made one a turn.

// Rows t0.. of part `part` of qkv for (b, h), times f, into own_a.
fn load_own_a(lid: u32, b: u32, h: u32, t0: u32, part: u32, f: f32) {
    let e_@O = lid + NT * @Ou;
    let t_@O = min(t0 + e_@O / D4, p.t - 1u);
    let x_@O = vec4<f32>(qkv[qkv_at(b, t_@O, part, h) + e_@O % D4]) * f;
    own_a[sw(e_@O / D4, e_@O % D4, D4)] = select(vec4<f32>(0.0), x_@O, t0 + e_@O / D4 < p.t);
}

//#if BWD_Q
// dY rows t0.. into own_b.
fn load_own_b(lid: u32, b: u32, h: u32, t0: u32) {
    let e_@O = lid + NT * @Ou;
    let t_@O = min(t0 + e_@O / D4, p.t - 1u);
    let x_@O = vec4<f32>(dy[y_at(b, t_@O, h) + e_@O % D4]);
    own_b[sw(e_@O / D4, e_@O % D4, D4)] = select(vec4<f32>(0.0), x_@O, t0 + e_@O / D4 < p.t);
}
//#endif

//#if BWD_KV
// V rows t0.. into own_b.
fn load_own_b(lid: u32, b: u32, h: u32, t0: u32) {
    let e_@O = lid + NT * @Ou;
    let t_@O = min(t0 + e_@O / D4, p.t - 1u);
    let x_@O = vec4<f32>(qkv[qkv_at(b, t_@O, 2u, h) + e_@O % D4]);
    own_b[sw(e_@O / D4, e_@O % D4, D4)] = select(vec4<f32>(0.0), x_@O, t0 + e_@O / D4 < p.t);
}
//#endif

// A streamed tile in registers between its fetch and its stash (PREFETCH: fetched
// before the tile before it is computed).
var<private> fa_@L: vec4<f32>;
var<private> fb_@L: vec4<f32>;
//#if BWD_KV
var<private> fl: f32;
var<private> fd: f32;

// Queries t0..: Q and dY, lse (log2 units) and D (threads lid < BC).
fn fetch_tile(lid: u32, b: u32, h: u32, t0: u32) {
    let t_@L = min(t0 + (lid + NT * @Lu) / D4, p.t - 1u);
    fa_@L = vec4<f32>(qkv[qkv_at(b, t_@L, 0u, h) + (lid + NT * @Lu) % D4]);
    fb_@L = vec4<f32>(dy[y_at(b, t_@L, h) + (lid + NT * @Lu) % D4]);
    let r = min(t0 + lid, p.t - 1u);
    fl = lse[row_at(b, h, r)] * LOG2E;
    fd = dvec[row_at(b, h, r)];
}
//#else
// Keys t0..: K and V.
fn fetch_tile(lid: u32, b: u32, h: u32, t0: u32) {
    let t_@L = min(t0 + (lid + NT * @Lu) / D4, p.t - 1u);
    fa_@L = vec4<f32>(qkv[qkv_at(b, t_@L, 1u, h) + (lid + NT * @Lu) % D4]);
    fb_@L = vec4<f32>(qkv[qkv_at(b, t_@L, 2u, h) + (lid + NT * @Lu) % D4]);
}
//#endif

// The fetched tile of rows t0.. into str_a and str_b (and tile_l, tile_d); zeros past T.
fn stash_tile(lid: u32, t0: u32) {
    let e_@L = lid + NT * @Lu;
    str_a[sw(e_@L / D4, e_@L % D4, D4)] = select(vec4<f32>(0.0), fa_@L, t0 + e_@L / D4 < p.t);
    str_b[sw(e_@L / D4, e_@L % D4, D4)] = select(vec4<f32>(0.0), fb_@L, t0 + e_@L / D4 < p.t);
//#if BWD_KV
    if lid < BC {
        tile_l[lid] = select(0.0, fl, t0 + lid < p.t);
        tile_d[lid] = select(0.0, fd, t0 + lid < p.t);
    }
//#endif
}

// The first streamed tile, rows t0..: with PREFETCH, fetched into registers before the loop.
fn first_tile(lid: u32, b: u32, h: u32, t0: u32) {
//#if PREFETCH
    fetch_tile(lid, b, h, t0);
//#endif
}

// A turn of the loop over streamed tiles begins: tile t0.. into workgroup memory once
// every thread is done with the one before; with PREFETCH, the next tile (if below
// `end`) fetched into registers while this one is computed.
fn enter_tile(lid: u32, b: u32, h: u32, t0: u32, end: u32) {
    workgroupBarrier();
//#if FETCH_NOW
    fetch_tile(lid, b, h, t0);
//#endif
    stash_tile(lid, t0);
    workgroupBarrier();
//#if PREFETCH
    if t0 + BC < end {
        fetch_tile(lid, b, h, t0 + BC);
    }
//#endif
}

@compute @workgroup_size({{NT}})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    let bhn = p.b * p.nh;
    if group >= bhn * p.blocks { return; }
    // The blocks that see the most of the other side go first: the last query blocks,
    // the first key blocks.
    let bh = group % bhn;
//#if BWD_KV
    let blk = group / bhn;
//#else
    let blk = p.blocks - 1u - group / bhn;
//#endif
    let b = bh / p.nh;
    let h = bh % p.nh;
    let rg = lid / 8u;
    let cg = lid % 8u;
    let r0 = blk * BR;
    let xr = rg & 7u;           // the swizzle of the thread's own rows
    let row_@I = r0 + rg + RG * @Iu;
//#if FWD
    load_own_a(lid, b, h, r0, 0u, p.scale * LOG2E);
    var m_@I = NEG;
    var l_@I = 0.0;
    var o_@I_@E = vec4<f32>(0.0);
    let last = min(p.t, r0 + BR);
    first_tile(lid, b, h, 0u);
    for (var j0 = 0u; j0 < last; j0 += BC) {
        enter_tile(lid, b, h, j0, last);
        var s_@I_@J = 0.0;
//#unroll D4U
        {
            let c_@C = @u * CU + @Cu;
            let qa_@C_@I = own_a[(rg + RG * @Iu) * D4 + (c_@C ^ xr)];
            let kb_@C_@J = str_a[(cg + 8u * @Ju) * D4 + (c_@C ^ cg)];
            s_@I_@J += dot(qa_@C_@I, kb_@C_@J);
        }
//#end
        let key_@J = j0 + cg + 8u * @Ju;
        let sv_@I_@J = select(NEG, s_@I_@J, key_@J <= row_@I && key_@J < p.t);
        var mt_@I = m_@I;
        mt_@I = max(mt_@I, sv_@I_@J);
        mt_@I = max(mt_@I, subgroupShuffleXor(mt_@I, 1u));
        mt_@I = max(mt_@I, subgroupShuffleXor(mt_@I, 2u));
        mt_@I = max(mt_@I, subgroupShuffleXor(mt_@I, 4u));
        let corr_@I = exp2(m_@I - mt_@I);
        m_@I = mt_@I;
        let p_@I_@J = exp2(sv_@I_@J - mt_@I);
        l_@I *= corr_@I;
        l_@I += p_@I_@J;
        o_@I_@E *= corr_@I;
        // P replaces K in str_a once every thread has read K.
        workgroupBarrier();
        str_a[(rg + RG * @Iu) * P4 + (((cg + 8u * @Ju) / 4u) ^ xr)][cg % 4u] = p_@I_@J;
        workgroupBarrier();
//#unroll BC4U
        {
            let k4_@C = @u * CU + @Cu;
            let pa_@C_@I = str_a[(rg + RG * @Iu) * P4 + (k4_@C ^ xr)];
            let va_@C_@E = str_b[(4u * k4_@C) * D4 + ((cg ^ ((4u * k4_@C) & 7u)) + 8u * @Eu)];
            let vb_@C_@E = str_b[(4u * k4_@C + 1u) * D4 + ((cg ^ ((4u * k4_@C + 1u) & 7u)) + 8u * @Eu)];
            let vc_@C_@E = str_b[(4u * k4_@C + 2u) * D4 + ((cg ^ ((4u * k4_@C + 2u) & 7u)) + 8u * @Eu)];
            let vd_@C_@E = str_b[(4u * k4_@C + 3u) * D4 + ((cg ^ ((4u * k4_@C + 3u) & 7u)) + 8u * @Eu)];
            o_@I_@E += pa_@C_@I.x * va_@C_@E + pa_@C_@I.y * vb_@C_@E + pa_@C_@I.z * vc_@C_@E + pa_@C_@I.w * vd_@C_@E;
        }
//#end
    }
    l_@I += subgroupShuffleXor(l_@I, 1u);
    l_@I += subgroupShuffleXor(l_@I, 2u);
    l_@I += subgroupShuffleXor(l_@I, 4u);
    if row_@I < p.t { y[y_at(b, row_@I, h) + cg + 8u * @Eu] = vec4<{{TQ}}>(o_@I_@E / l_@I); }
    if cg == 0u && row_@I < p.t { lse[row_at(b, h, row_@I)] = (m_@I + log2(l_@I)) * LN2; }
//#endif
//#if BWD_Q
    load_own_a(lid, b, h, r0, 0u, p.scale * LOG2E);
    load_own_b(lid, b, h, r0);
    let lse_@I = lse[row_at(b, h, min(row_@I, p.t - 1u))] * LOG2E;
    // D = rowsum(dY * Y) of the own rows (the row dot, folded in): each lane's columns,
    // then the row group's 8 lanes; written for dK dV, which runs after.
    workgroupBarrier();
    var dd_@I = 0.0;
    dd_@I += dot(own_b[(rg + RG * @Iu) * D4 + ((cg + 8u * @Eu) ^ xr)], vec4<f32>(y[y_at(b, min(row_@I, p.t - 1u), h) + cg + 8u * @Eu]));
    dd_@I += subgroupShuffleXor(dd_@I, 1u);
    dd_@I += subgroupShuffleXor(dd_@I, 2u);
    dd_@I += subgroupShuffleXor(dd_@I, 4u);
    if cg == 0u && row_@I < p.t { dvec[row_at(b, h, row_@I)] = dd_@I; }
    var dq_@I_@E = vec4<f32>(0.0);
    let last = min(p.t, r0 + BR);
    first_tile(lid, b, h, 0u);
    for (var j0 = 0u; j0 < last; j0 += BC) {
        enter_tile(lid, b, h, j0, last);
        var s_@I_@J = 0.0;
        var dp_@I_@J = 0.0;
//#unroll D4U
        {
            let c_@C = @u * CU + @Cu;
            let qa_@C_@I = own_a[(rg + RG * @Iu) * D4 + (c_@C ^ xr)];
            let ga_@C_@I = own_b[(rg + RG * @Iu) * D4 + (c_@C ^ xr)];
            let kb_@C_@J = str_a[(cg + 8u * @Ju) * D4 + (c_@C ^ cg)];
            let vb_@C_@J = str_b[(cg + 8u * @Ju) * D4 + (c_@C ^ cg)];
            s_@I_@J += dot(qa_@C_@I, kb_@C_@J);
            dp_@I_@J += dot(ga_@C_@I, vb_@C_@J);
        }
//#end
        let key_@J = j0 + cg + 8u * @Ju;
        let ds_@I_@J = select(0.0, exp2(s_@I_@J - lse_@I) * (dp_@I_@J - dd_@I), key_@J <= row_@I && key_@J < p.t);
        // dS replaces V in str_b once every thread has read V.
        workgroupBarrier();
        str_b[(rg + RG * @Iu) * P4 + (((cg + 8u * @Ju) / 4u) ^ xr)][cg % 4u] = ds_@I_@J;
        workgroupBarrier();
//#unroll BC4U
        {
            let k4_@C = @u * CU + @Cu;
            let da_@C_@I = str_b[(rg + RG * @Iu) * P4 + (k4_@C ^ xr)];
            let ka_@C_@E = str_a[(4u * k4_@C) * D4 + ((cg ^ ((4u * k4_@C) & 7u)) + 8u * @Eu)];
            let kb_@C_@E = str_a[(4u * k4_@C + 1u) * D4 + ((cg ^ ((4u * k4_@C + 1u) & 7u)) + 8u * @Eu)];
            let kc_@C_@E = str_a[(4u * k4_@C + 2u) * D4 + ((cg ^ ((4u * k4_@C + 2u) & 7u)) + 8u * @Eu)];
            let kd_@C_@E = str_a[(4u * k4_@C + 3u) * D4 + ((cg ^ ((4u * k4_@C + 3u) & 7u)) + 8u * @Eu)];
            dq_@I_@E += da_@C_@I.x * ka_@C_@E + da_@C_@I.y * kb_@C_@E + da_@C_@I.z * kc_@C_@E + da_@C_@I.w * kd_@C_@E;
        }
//#end
    }
    if row_@I < p.t { dqkv[qkv_at(b, row_@I, 0u, h) + cg + 8u * @Eu] = dq_@I_@E * p.scale; }
//#endif
//#if BWD_KV
    load_own_a(lid, b, h, r0, 1u, p.scale * LOG2E);
    load_own_b(lid, b, h, r0);
    var dk_@I_@E = vec4<f32>(0.0);
    var dv_@I_@E = vec4<f32>(0.0);
    // Queries from the block's first key row down: tiles above the diagonal skipped.
    let first = r0 / BC * BC;
    first_tile(lid, b, h, first);
    for (var i0 = first; i0 < p.t; i0 += BC) {
        enter_tile(lid, b, h, i0, p.t);
        var s_@I_@J = 0.0;
        var dp_@I_@J = 0.0;
//#unroll D4U
        {
            let c_@C = @u * CU + @Cu;
            let ka_@C_@I = own_a[(rg + RG * @Iu) * D4 + (c_@C ^ xr)];
            let va_@C_@I = own_b[(rg + RG * @Iu) * D4 + (c_@C ^ xr)];
            let qb_@C_@J = str_a[(cg + 8u * @Ju) * D4 + (c_@C ^ cg)];
            let gb_@C_@J = str_b[(cg + 8u * @Ju) * D4 + (c_@C ^ cg)];
            s_@I_@J += dot(ka_@C_@I, qb_@C_@J);
            dp_@I_@J += dot(va_@C_@I, gb_@C_@J);
        }
//#end
        let qi_@J = i0 + cg + 8u * @Ju;
        let p_@I_@J = select(0.0, exp2(s_@I_@J - tile_l[cg + 8u * @Ju]), qi_@J >= row_@I && qi_@J < p.t);
        pt[(rg + RG * @Iu) * P4 + (((cg + 8u * @Ju) / 4u) ^ xr)][cg % 4u] = p_@I_@J;
        dt[(rg + RG * @Iu) * P4 + (((cg + 8u * @Ju) / 4u) ^ xr)][cg % 4u] = p_@I_@J * (dp_@I_@J - tile_d[cg + 8u * @Ju]);
        workgroupBarrier();
//#unroll BC4U
        {
            let k4_@C = @u * CU + @Cu;
            let pa_@C_@I = pt[(rg + RG * @Iu) * P4 + (k4_@C ^ xr)];
            let da_@C_@I = dt[(rg + RG * @Iu) * P4 + (k4_@C ^ xr)];
            let ga_@C_@E = str_b[(4u * k4_@C) * D4 + ((cg ^ ((4u * k4_@C) & 7u)) + 8u * @Eu)];
            let gb_@C_@E = str_b[(4u * k4_@C + 1u) * D4 + ((cg ^ ((4u * k4_@C + 1u) & 7u)) + 8u * @Eu)];
            let gc_@C_@E = str_b[(4u * k4_@C + 2u) * D4 + ((cg ^ ((4u * k4_@C + 2u) & 7u)) + 8u * @Eu)];
            let gd_@C_@E = str_b[(4u * k4_@C + 3u) * D4 + ((cg ^ ((4u * k4_@C + 3u) & 7u)) + 8u * @Eu)];
            let qa_@C_@E = str_a[(4u * k4_@C) * D4 + ((cg ^ ((4u * k4_@C) & 7u)) + 8u * @Eu)];
            let qb_@C_@E = str_a[(4u * k4_@C + 1u) * D4 + ((cg ^ ((4u * k4_@C + 1u) & 7u)) + 8u * @Eu)];
            let qc_@C_@E = str_a[(4u * k4_@C + 2u) * D4 + ((cg ^ ((4u * k4_@C + 2u) & 7u)) + 8u * @Eu)];
            let qd_@C_@E = str_a[(4u * k4_@C + 3u) * D4 + ((cg ^ ((4u * k4_@C + 3u) & 7u)) + 8u * @Eu)];
            dv_@I_@E += pa_@C_@I.x * ga_@C_@E + pa_@C_@I.y * gb_@C_@E + pa_@C_@I.z * gc_@C_@E + pa_@C_@I.w * gd_@C_@E;
            dk_@I_@E += da_@C_@I.x * qa_@C_@E + da_@C_@I.y * qb_@C_@E + da_@C_@I.z * qc_@C_@E + da_@C_@I.w * qd_@C_@E;
        }
//#end
    }
    if row_@I < p.t { dqkv[qkv_at(b, row_@I, 1u, h) + cg + 8u * @Eu] = dk_@I_@E * p.scale; }
    if row_@I < p.t { dqkv[qkv_at(b, row_@I, 2u, h) + cg + 8u * @Eu] = dv_@I_@E; }
//#endif
}
