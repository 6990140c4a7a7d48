// One operand of the cooperative-matrix matmul (shaders/matmul_coop.wgsl), rendered once
// for A (X = a, ROLE = A) and once for B (X = b, ROLE = B) and pasted at the main
// template's OPERAND_A / OPERAND_B placeholders.
// The operand's tile is kept in its storage orientation: ROW when its rows are contiguous
// along K (A) or N (B), COL when contiguous the other way (a transposed view), both in
// workgroup memory as [ROWS][COLS] padded by 8 halves a row (16 bytes: the 8 row starts of
// a fragment load fall in distinct banks). Global loads are W halves wide: 8 (`H8`, two
// vec4<f16> of one 16-byte element), 4 (vec4<f16>) or 1 (any strides); the host picks W
// from the alignment of the offset, strides and extent. Where W is 4 or 8 the workgroup
// tile is an array of vec4<f16> (TW = 4), so a fetched vector is stashed with one or two
// stores: one store per half, as an `array<f16>` takes, cost the K loop about 30% on the
// H100 (docs/benchmarks.md). Fragments load from it with index and stride in vec4s
// (SPIR-V measures both in the pointer's type; naga types the fragment by the pointer's
// scalar, so the tile's scalar must be f16). A thread fetches its LOADS vectors of a later
// tile into registers while the current tile is multiplied, then stashes them into the
// workgroup buffer. The registers are named variables (lines holding the load marker, an
// at-sign and l, are repeated by the host once per load): an array of them was kept in
// local memory by the H100's driver. Two sets of them (`rs` 0 and 1, a constant at every
// call) hold two tiles in flight where the main template fetches two ahead.

@group(0) @binding({{BINDING}}) var<storage, read_write> {{X}}_src: array<{{TYPE}}>;
const {{X}}_ROWS: u32 = {{ROWS}}u;
const {{X}}_COLS: u32 = {{COLS}}u;
const {{X}}_LD: u32 = {{X}}_COLS + 8u;
const {{X}}_SIZE: u32 = {{X}}_ROWS * {{X}}_LD;
const {{X}}_W: u32 = {{W}}u;
const {{X}}_PER_ROW: u32 = {{X}}_COLS / {{X}}_W;
const {{X}}_LOADS: u32 = {{X}}_ROWS * {{X}}_PER_ROW / THREADS;
const {{X}}_TW: u32 = {{TW}}u;
var<workgroup> {{X}}_tile: array<{{TILE_TYPE}}, {{TILE_LEN}} / {{X}}_TW>;
var<private> {{X}}_reg0_@l: {{TYPE}};
var<private> {{X}}_reg1_@l: {{TYPE}};

// This thread's `l`-th vector of the tile whose first element is (r0, s0) in storage
// orientation; `rows` x `cols` is the operand's extent there, `outer` and `inner` its
// strides. Elements outside the extent read as zero; without CHECKED (whole tiles, the
// host's rule) every element is inside it and nothing is checked.
fn {{X}}_load(tid: u32, l: u32, base: u32, r0: u32, s0: u32, rows: u32, cols: u32, outer: u32, inner: u32) -> {{TYPE}} {
    let e = tid + l * THREADS;
    let gr = r0 + e / {{X}}_PER_ROW;
    let gs = s0 + (e % {{X}}_PER_ROW) * {{X}}_W;
    var v = {{TYPE}}();
//#if CHECKED
    if gr < rows && gs < cols {
        v = {{X}}_src[(base + gr * outer + gs * inner) / {{X}}_W];
    }
//#else
    v = {{X}}_src[(base + gr * outer + gs * inner) / {{X}}_W];
//#endif
    return v;
}

// Loads this thread's vectors of the tile into its register set `rs`.
fn {{X}}_fetch(rs: u32, tid: u32, base: u32, r0: u32, s0: u32, rows: u32, cols: u32, outer: u32, inner: u32) {
    if rs == 0u {
        {{X}}_reg0_@l = {{X}}_load(tid, @lu, base, r0, s0, rows, cols, outer, inner);
    } else {
        {{X}}_reg1_@l = {{X}}_load(tid, @lu, base, r0, s0, rows, cols, outer, inner);
    }
}

// Writes register set `rs` into workgroup buffer `buf`.
fn {{X}}_stash(rs: u32, tid: u32, buf: u32) {
    if rs == 0u {
        {{X}}_put(tid, buf, @lu, {{X}}_reg0_@l);
    } else {
        {{X}}_put(tid, buf, @lu, {{X}}_reg1_@l);
    }
}

// Writes vector `v`, this thread's `l`-th, into workgroup buffer `buf`.
fn {{X}}_put(tid: u32, buf: u32, l: u32, v: {{TYPE}}) {
    let e = tid + l * THREADS;
    let t = buf * {{X}}_SIZE + (e / {{X}}_PER_ROW) * {{X}}_LD + (e % {{X}}_PER_ROW) * {{X}}_W;
//#if W8
    {{X}}_tile[t / 4u] = v.lo;
    {{X}}_tile[t / 4u + 1u] = v.hi;
//#else
    {{X}}_tile[t / {{X}}_TW] = v;
//#endif
}

// The 16 x 16 fragment at `major` (M for A, N for B) and `kk` (K) of buffer `buf`.
fn {{X}}_frag(buf: u32, major: u32, kk: u32) -> coop_mat16x16<f16, {{ROLE}}> {
    let ld = {{X}}_LD;
    // In the tile's elements: every fragment's first element and every row start are
    // multiples of 8 halves (k and M/N in steps of 16, rows padded to a multiple of 8).
    let i = (buf * {{X}}_SIZE + {{INDEX}}) / {{X}}_TW;
    let stride = ld / {{X}}_TW;
//#if COL
    // [K][M] for A, [N][K] for B: column-major as the fragment sees it.
    return coopLoad<coop_mat16x16<f16, {{ROLE}}>>(&{{X}}_tile[i], stride);
//#else
    return coopLoadT<coop_mat16x16<f16, {{ROLE}}>>(&{{X}}_tile[i], stride);
//#endif
}
