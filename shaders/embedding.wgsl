// Embedding gather and its deterministic scatter-add backward.
//   MODE 0: out[i, c] = table[ids[i], c]                 one thread per (i, c)
//   MODE 1: dtable[v, c] += sum over i in order with ids[i] == v of dout[i, c]
//           one thread per column c walking the tokens in order: no atomics, and the
//           same sums in the same order on every run.
//   MODE 2: the same in parallel over chunks of p.chunk tokens: a thread per (column,
//           chunk) walks its chunk in order into its own zeroed [V, C] slice of part
//           (binding 4); MODE 3: dtable[v, c] += the chunks' part[k, v, c] in chunk
//           order, one thread per element. Deterministic too; used where the partial
//           tables fit a memory budget (small vocabularies).
// Ids outside [0, V) read zeros and are skipped in backward (the data loader rejects
// them before they get here). Template: ENABLE, T, MODE, PARTIALS (modes 2 and 3).
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

const MODE: u32 = {{MODE}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
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
    let c = t;
    if c >= p.cols { return; }
    for (var i = 0u; i < p.tokens; i++) {
        let id = ids[i];
        if id >= 0 && u32(id) < p.vocab {
            let k = u32(id) * p.cols + c;
            table[k] = table[k] + rows[i * p.cols + c];
        }
    }
}
