// Embedding gather and its deterministic scatter-add backward.
//   MODE 0: out[i, c] = table[ids[i], c]                 one thread per (i, c)
//   MODE 1 and 4: dtable[v, c] += the dout[i, c] of the tokens with ids[i] == v, added
//           in token order, as a stable sort by id lets every id's tokens be walked in
//           parallel. MODE 1 ranks: one thread per token counts the tokens before it in
//           (id, position) order, reading the ids a workgroup tile at a time, and writes
//           its index there (perm, binding 4). MODE 4: one thread per (sorted position,
//           column); the first position of each id walks that id's tokens in order
//           into dtable. No atomics: the same sums in the same order on every run.
//   MODE 2: the same in parallel over chunks of p.chunk tokens: a thread per (column,
//           chunk) walks its chunk in order into its own zeroed [V, C] slice of part
//           (binding 4); MODE 3: dtable[v, c] += the chunks' part[k, v, c] in chunk
//           order, one thread per element. Deterministic too; used where the partial
//           tables fit a memory budget (small vocabularies).
// Ids outside [0, V) read zeros and are skipped in backward (the data loader rejects
// them before they get here; the sort puts them last). Template: ENABLE, T, MODE,
// PARTIALS (modes 2 and 3), SORTED (modes 1 and 4).
{{ENABLE}}

struct Params {
    tokens: u32,
    cols: u32,
    vocab: u32,
    chunk: u32,
    chunks: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> table: array<{{T}}>;  // MODE 1: dtable
@group(0) @binding(3) var<storage, read_write> rows: array<{{T}}>;   // MODE 0: out; MODE 1: dout
//#if PARTIALS
@group(0) @binding(4) var<storage, read_write> part: array<f32>;     // [chunks, V, C]
//#endif
//#if SORTED
@group(0) @binding(4) var<storage, read_write> perm: array<u32>;     // [tokens]: sorted position -> token
var<workgroup> tile: array<u32, 256>;

// The sort key of token i: its id, or V for an id outside the table.
fn key(i: u32) -> u32 {
    let id = ids[i];
    return select(p.vocab, u32(id), id >= 0 && u32(id) < p.vocab);
}
//#endif

const MODE: u32 = {{MODE}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = gid.x + gid.y * nwg.x * 256u;
//#if SORTED
    if MODE == 1u {
        // Every thread takes part in the tiles' barriers; those past the end rank nothing.
        let i = t;
        var mine = 0u;
        if i < p.tokens { mine = key(i); }
        var before = 0u;
        for (var base = 0u; base < p.tokens; base += 256u) {
            if base + lid < p.tokens { tile[lid] = key(base + lid); }
            workgroupBarrier();
            let n = min(256u, p.tokens - base);
            for (var k = 0u; k < n; k++) {
                let other = tile[k];
                before += select(0u, 1u, other < mine || (other == mine && base + k < i));
            }
            workgroupBarrier();
        }
        if i < p.tokens { perm[before] = i; }
        return;
    }
    let at = t / p.cols;
    let c = t % p.cols;
    if at >= p.tokens { return; }
    let id = key(perm[at]);
    if id >= p.vocab || (at > 0u && key(perm[at - 1u]) == id) { return; }
    let k = id * p.cols + c;
    var acc = table[k];
    for (var q = at; q < p.tokens; q++) {
        let i = perm[q];
        if key(i) != id { break; }
        acc = acc + rows[i * p.cols + c];
    }
    table[k] = acc;
    return;
//#endif
    if MODE == 0u {
        if t >= p.tokens * p.cols { return; }
        let i = t / p.cols;
        let c = t % p.cols;
        let id = ids[i];
        var v = {{T}}(0.0);
        if id >= 0 && u32(id) < p.vocab { v = table[u32(id) * p.cols + c]; }
        rows[t] = v;
        return;
    }
//#if PARTIALS
    if MODE == 2u {
        let c = gid.x;
        let k = gid.y;
        if c >= p.cols || k >= p.chunks { return; }
        let slice = k * p.vocab * p.cols;
        for (var i = k * p.chunk; i < min(p.tokens, (k + 1u) * p.chunk); i++) {
            let id = ids[i];
            if id >= 0 && u32(id) < p.vocab {
                let at = slice + u32(id) * p.cols + c;
                part[at] = part[at] + f32(rows[i * p.cols + c]);
            }
        }
        return;
    }
    if t >= p.vocab * p.cols { return; }
    var s = 0.0;
    for (var k = 0u; k < p.chunks; k++) {
        s += part[k * p.vocab * p.cols + t];
    }
    table[t] = table[t] + {{T}}(s);
    return;
//#endif
}
