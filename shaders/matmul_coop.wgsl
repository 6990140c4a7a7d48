// Batched matmul on cooperative matrices (tensor cores): f16 A and B, f32 accumulation,
// the same strided operands, parameters and epilogue as matmul.wgsl.
// A workgroup of GM x GN subgroups of 32 computes a BM x BN tile of C; each subgroup owns
// FM x FN fragments of 16 x 16, accumulators in registers: the host writes their
// declarations, multiply-adds (every 16-step of a K tile) and stores out unrolled (ACC_DECL, MMA, STORE_WIDE,
// STORE_STAGED) as named variables, since an array of cooperative matrices indexed in a
// loop ran at ~30 TFLOP/s on the H100 against 100-150 unrolled (it is not kept in registers). K steps by BK through
// NBUF workgroup buffers per operand: the next tile is fetched from global memory into
// registers while the current one is multiplied, then stashed; with two buffers into the
// other one, one barrier a step, else after a barrier, two a step. With one buffer AHEAD
// (1 or 2) tiles are in flight in registers. Two buffers or two ahead take two K tiles a
// turn (PAIRS). The operands' loaders and fragment loads come from
// shaders/matmul_coop_operand.wgsl (OPERAND_A, OPERAND_B): each reads its operand in
// its storage orientation, so transposed views load as wide as plain ones.
// Where the host finds whole tiles (M, N and K multiples of the tile, an even count of
// K tiles where two are taken a turn), CHECKED is off and the operands load without
// bounds checks: on the H100 the checks cost 15% at 4096^3 (each load became a branch
// region of its own in the driver's code; docs/benchmarks.md).
// Out: each fragment goes through a 16 x 16 staging area per subgroup and the epilogue.
// Whole tiles with the host's flag (C's offset and strides multiples of 4) then store four
// neighbouring elements a lane at once (`store_wide`); other tiles one element a lane, with
// bounds checks (`store_staged`). On the H100 the wide stores took GPT-2's attn_proj.fwd
// from 73.7 to 57.2 us against storing the fragments straight to C (coopStoreT with C's
// row stride), and 4096^3 from 611 to 581 (docs/benchmarks.md). The host picks this
// kernel only where the adapter grants 16x16x16 f16 -> f32 and subgroups of exactly 32.
enable f16;
enable wgpu_cooperative_matrix;

{{MATMUL_COMMON}}

const GM: u32 = {{GM}}u;
const GN: u32 = {{GN}}u;
const FM: u32 = {{FM}}u;
const FN: u32 = {{FN}}u;
const BM: u32 = GM * FM * 16u;
const BN: u32 = GN * FN * 16u;
const BK: u32 = {{BK}}u;
const THREADS: u32 = GM * GN * 32u;
const NBUF: u32 = {{NBUF}}u;
const AHEAD: u32 = {{AHEAD}}u;   // K tiles in flight in registers (2 only with one buffer)

// Eight halves, 16 bytes: an operand's global element where its loads are 8 wide.
struct H8 {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

{{OPERAND_A}}
{{OPERAND_B}}

var<workgroup> stage: array<f32, {{STAGE_LEN}}>;

// Stores one accumulator fragment whose first element is C's (gm0, gn0) through
// subgroup s's 16 x 16 staging area and the epilogue, with bounds checks. Every
// subgroup calls it the same number of times (it holds workgroup barriers).
fn store_staged(frag: coop_mat16x16<f32, C>, s: u32, lane: u32, gm0: u32, gn0: u32, c_base: u32) {
    let at = s * 256u;
    let ld = 16u;
    coopStoreT(frag, &stage[at], ld);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {
        let gm = gm0 + e / 16u;
        let gn = gn0 + e % 16u;
        if gm < p.m && gn < p.n {
            store_c(c_base + gm * p.c_rs + gn, gn, stage[at + e]);
        }
    }
    workgroupBarrier();
}

// C again, four elements an entry, for whole tiles' stores (the host binds C's block here
// too; with f16 C an entry is 8 bytes).
@group(0) @binding(5) var<storage, read_write> c4: array<vec4<{{TC}}>>;

// Stores one accumulator fragment of a whole tile (C's offset and row stride multiples of
// 4) through subgroup s's 16 x 16 staging area and the epilogue (none in a PLAIN variant:
// no bias, activation, scale or accumulation, which the host compiles apart: with the
// epilogue's parameters read at every element GPT-2's attn_proj.fwd took 66.6 us against
// 57.2 on the H100), four elements a lane:
// lane l takes columns 4 (l % 4) .. + 3 of rows l / 4 and l / 4 + 8. Every subgroup calls
// it the same number of times (it holds workgroup barriers).
fn store_wide(frag: coop_mat16x16<f32, C>, s: u32, lane: u32, gm0: u32, gn0: u32, c_base: u32) {
    let at = s * 256u;
    coopStoreT(frag, &stage[at], 16u);
    workgroupBarrier();
    let q = 4u * (lane % 4u);
    let gn = gn0 + q;
    for (var h = 0u; h < 2u; h++) {
        let r = lane / 4u + 8u * h;
        let e = at + r * 16u + q;
        let ci = (c_base + (gm0 + r) * p.c_rs + gn) / 4u;
        let x = vec4<f32>(stage[e], stage[e + 1u], stage[e + 2u], stage[e + 3u]);
//#if PLAIN
        c4[ci] = vec4<{{TC}}>(x);
//#else
        var old = vec4<f32>(0.0);
        if p.beta != 0.0 {
            old = vec4<f32>(c4[ci]);
        }
        let v = vec4<f32>(
            epilogue(x.x, gn, old.x),
            epilogue(x.y, gn + 1u, old.y),
            epilogue(x.z, gn + 2u, old.z),
            epilogue(x.w, gn + 3u, old.w),
        );
        c4[ci] = vec4<{{TC}}>(v);
//#endif
    }
    workgroupBarrier();
}

// Where one output tile's operands start, and its first row and column of C.
struct Place {
    a_base: u32,
    b_base: u32,
    c_base: u32,
    row0: u32,
    col0: u32,
}

// The tile at column `x`, row `y` of tiles, of batch `z`.
fn place(x: u32, y: u32, z: u32) -> Place {
    let z0 = z / p.batch1;
    let z1 = z % p.batch1;
    return Place(
        p.a_off + z0 * p.a_bs0 + z1 * p.a_bs1,
        p.b_off + z0 * p.b_bs0 + z1 * p.b_bs1,
        p.c_off + z0 * p.c_bs0 + z1 * p.c_bs1,
        y * BM,
        x * BN,
    );
}

// Fetches both operands' tile of output tile `at` starting at K index k0 into register
// set `rs`.
fn fetch(rs: u32, tid: u32, at: Place, k0: u32) {
    let row0 = at.row0;
    let col0 = at.col0;
    a_fetch(rs, tid, at.a_base, {{A_FETCH}});
    b_fetch(rs, tid, at.b_base, {{B_FETCH}});
}

// Writes register set `rs` into workgroup buffer `buf`.
fn stash(rs: u32, tid: u32, buf: u32) {
    a_stash(rs, tid, buf);
    b_stash(rs, tid, buf);
}

// Uneven K slices (flags bit 1): batch z takes its slice of K (matmul_common's
// k_slice). The host sets it here only for whole tiles (the loads are unchecked, so no
// slice reads into the next).
@compute @workgroup_size({{THREADS}})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    var here = place(wid.x, wid.y, wid.z);
    var k_len = p.k;
    if (p.flags & 2u) != 0u {
        let sl = k_slice(wid.z);
        here.a_base += sl.x * p.a_cs;
        here.b_base += sl.x * p.b_rs;
        k_len = sl.y - sl.x;
    }
    let tid = lid.x;
    let s = tid / 32u;
    let lane = tid % 32u;
    let m0 = (s / GN) * FM * 16u;
    let n0 = (s % GN) * FN * 16u;
{{ACC_DECL}}
    let tiles = (k_len + BK - 1u) / BK;
    fetch(0u, tid, here, 0u);
//#if PAIRS
    // Two ahead, the second K tile's loads are in flight with the first's.
    if AHEAD == 2u {
        fetch(1u, tid, here, BK);
    }
//#endif
    stash(0u, tid, 0u);
    workgroupBarrier();
//#if PAIRS
    // Two K tiles a turn, so that every buffer and register set is a constant (with
    // `t % 2` the fragment loads and stashes ran at half the speed on the H100); an odd
    // count of tiles gets one more, of zeros (the loads past K read zeros): cooperative
    // operations must not sit under a branch that naga cannot prove uniform. Either:
    // - two buffers (NBUF 2): tile t is multiplied from buffer t % 2 while tile t + 1 is
    //   stashed into the other, one barrier a tile (the one after tile t - 1 has every
    //   subgroup done with the buffer being stashed into); or
    // - one buffer, two K tiles in flight (AHEAD 2): while tile t is multiplied, tile
    //   t + 1 waits in one register set and tile t + 2 is fetched into the other, so the
    //   loads of each tile have two tiles' products to arrive in, not one; each stash
    //   waits for every subgroup to be done with the buffer. Even tiles are fetched into
    //   set 0 and odd ones into set 1, so that the first two are fetched together.
    // (The branches on NBUF and AHEAD are on constants.) Every turn but the last fetches
    // without a condition; the last one is written out on its own and fetches only what
    // is left (on the H100 this took GPT-2's K = 768 products 5-8% faster than one loop
    // whose fetches were conditional; docs/benchmarks.md).
    let pairs = (tiles + 1u) / 2u;
    for (var pr = 0u; pr + 1u < pairs; pr++) {
        let t = 2u * pr;
        {
            let cur = 0u;
            fetch(0u, tid, here, (t + AHEAD) * BK);
{{MMA}}
            if NBUF == 1u {
                workgroupBarrier();
            }
            stash(AHEAD - 1u, tid, NBUF - 1u);
            workgroupBarrier();
        }
        {
            let cur = NBUF - 1u;
            fetch(AHEAD - 1u, tid, here, (t + 1u + AHEAD) * BK);
{{MMA}}
            if NBUF == 1u {
                workgroupBarrier();
            }
            stash(0u, tid, 0u);
            workgroupBarrier();
        }
    }
    // The last turn: K tile 2 * pairs - 1 is the last (or, of an odd count, the tile of
    // zeros); two ahead, it is in registers already.
    {
        let cur = 0u;
        if AHEAD == 1u {
            fetch(0u, tid, here, (2u * pairs - 1u) * BK);
        }
{{MMA}}
        if NBUF == 1u {
            workgroupBarrier();
        }
        stash(AHEAD - 1u, tid, NBUF - 1u);
        workgroupBarrier();
    }
    {
        let cur = NBUF - 1u;
{{MMA}}
    }
//#else
    // One buffer: the next tile is fetched into registers while this one is multiplied,
    // stashed once every subgroup is done with the buffer.
    for (var t = 0u; t < tiles; t++) {
        let cur = 0u;
        let more = t + 1u < tiles;
        if more {
            fetch(0u, tid, here, (t + 1u) * BK);
        }
{{MMA}}
        if more {
            workgroupBarrier();
            stash(0u, tid, 0u);
        }
        workgroupBarrier();
    }
//#endif
    let gm0 = here.row0 + m0;
    let gn0 = here.col0 + n0;
    let c_base = here.c_base;
    if (p.flags & 1u) != 0u && here.row0 + BM <= p.m && here.col0 + BN <= p.n {
{{STORE_WIDE}}
        return;
    }
{{STORE_STAGED}}
}
