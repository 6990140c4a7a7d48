// Multi-tensor optimizer steps: one launch updates every tensor of a group, whose
// tensors live in at most SLOTS allocator pages (bound whole, as u32 words, in s0...).
//   MODE 0 unscale and check: grad *= inv_scale in place; found[0] = 1 if any result is
//                  inf or NaN (torch's _amp_foreach_non_finite_check_and_unscale_)
//   MODE 1 AdamW:  PyTorch's torch.optim.AdamW (decoupled weight decay, bias correction)
//   MODE 2 SGD:    PyTorch's torch.optim.SGD with momentum, dampening, nesterov
//   MODE 3 check:  found[0] = 1 if any grad * inv_scale is inf or NaN; writes nothing
//                  (the update then applies inv_scale itself)
//   MODE 4 squares: found[1 + p.first_sum + group] = the f32 bits of the sum of
//                  (grad * inv_scale)^2 over the workgroup's elements (in a fixed order:
//                  each invocation's, then a tree over the workgroup), for clipping's
//                  norm; writes nothing else
// The arithmetic is shaders/optim.wgsl's, element for element. Updates skip entirely when
// p.skip_if_found is set and found[0] != 0 (GradScaler). The table holds one entry of
// ENTRY words per tensor: its length, its first workgroup in the launch, then a
// (slot, word offset) pair for the weight, the gradient, the two moments and the f16
// copy (slot NONE: no copy), and SGD's first-use flag. A workgroup takes 512 PAIRS
// elements of one tensor, two at a time per invocation, so the f16 copy is written a
// word (two halves) at a time. Entries are in workgroup order; a workgroup finds its own
// by bisection.
// WIDE (MODE 0 to 3, where the host finds every tensor's length a multiple of 8 and
// every offset on 16 bytes): the pages are bound as vectors of four words and an
// invocation takes two vectors of four elements, 1,024 elements apart, and stores eight
// halves of the f16 copy (gathered in workgroup memory); a workgroup takes 2,048
// elements. The arithmetic is the same, element for element.
// Template: MODE, PAIRS, HALF, SQUARES (MODE 4), WIDE, WORD (u32 or vec4<u32>), and
// SLOT_BINDINGS, LOAD_CASES, STORE_CASES for SLOTS pages.
//#if HALF
enable f16;
//#endif

struct Params {
    base: u32,          // the launch's first entry in the table
    count: u32,         // its entries
    total: u32,         // its workgroups
    skip_if_found: u32,
    nesterov: u32,
    first_sum: u32,     // MODE 4: the launch's first workgroup among all its launches'
    pad1: u32,
    pad2: u32,
    lr: f32,
    beta1: f32,         // SGD: momentum
    beta2: f32,         // SGD: dampening
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2_sqrt: f32,
    inv_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> table: array<u32>;
@group(0) @binding(2) var<storage, read_write> found: array<atomic<u32>>;
// The pages: s0, s1, ... at bindings 3, 4, ... (SLOTS of them).
{{SLOT_BINDINGS}}

const MODE: u32 = {{MODE}}u;
//#if SQUARES
var<workgroup> partial: array<f32, 256>;
//#endif
//#if WIDE
//#if HALF
var<workgroup> copy_words: array<u32, 1024>;   // a workgroup's f16 copy, two halves a word
//#endif
//#endif
// Element pairs an invocation takes, 256 apart (the checks: 4; the updates: 2).
const PAIRS: u32 = {{PAIRS}}u;
const ENTRY: u32 = 16u;
const NONE: u32 = 0xffffffffu;

fn load(s: u32, i: u32) -> {{WORD}} {
    switch s {
{{LOAD_CASES}}
    }
}

fn store(s: u32, i: u32, w: {{WORD}}) {
    switch s {
{{STORE_CASES}}
    }
}

//#if WIDE
// A value is four elements; vector i of a tensor whose page offset (in words, a multiple
// of 4) is word k of entry e.
alias V = vec4<f32>;
fn at(e: u32, k: u32, i: u32) -> u32 { return table[e + k] / 4u + i; }
//#else
alias V = f32;
fn at(e: u32, k: u32, i: u32) -> u32 { return table[e + k] + i; }
//#endif
fn ld(s: u32, i: u32) -> V { return bitcast<V>(load(s, i)); }
fn st(s: u32, i: u32, x: V) { store(s, i, bitcast<{{WORD}}>(x)); }

// Element (or, WIDE, vector) i of entry e: the updated weight (MODE 1, 2), the square
// (MODE 4), or 0 (the checks, MODE 0 and 3).
fn element(e: u32, i: u32) -> V {
    let gs = table[e + 4u];
    let gi = at(e, 5u, i);
    let g0 = ld(gs, gi) * p.inv_scale;
    if MODE == 4u {
        return g0 * g0;
    }
    if MODE == 0u || MODE == 3u {
        if MODE == 0u { st(gs, gi, g0); }
        // NaN fails every comparison; inf exceeds the largest finite f32.
        if !all(abs(g0) <= V(3.4028235e38)) { atomicStore(&found[0], 1u); }
        return V(0.0);
    }
    let ps = table[e + 2u];
    let wi = at(e, 3u, i);
    let ms = table[e + 6u];
    let mi = at(e, 7u, i);
    var w = ld(ps, wi);
    if MODE == 1u {
        let vs = table[e + 8u];
        let vi = at(e, 9u, i);
        w = w * (1.0 - p.lr * p.weight_decay);
        let m = p.beta1 * ld(ms, mi) + (1.0 - p.beta1) * g0;
        let v = p.beta2 * ld(vs, vi) + (1.0 - p.beta2) * g0 * g0;
        st(ms, mi, m);
        st(vs, vi, v);
        let denom = sqrt(v) / p.bias_correction2_sqrt + p.eps;
        w = w - (p.lr / p.bias_correction1) * m / denom;
    } else {
        var g = g0 + p.weight_decay * w;
        var buf = g;
        if table[e + 12u] == 0u { buf = p.beta1 * ld(ms, mi) + (1.0 - p.beta2) * g; }
        st(ms, mi, buf);
        if p.nesterov != 0u { g = g + p.beta1 * buf; } else { g = buf; }
        w = w - p.lr * g;
    }
    st(ps, wi, w);
    return w;
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.x + wid.y * nwg.x;
    if group >= p.total { return; }
    var lo = 0u;
    var hi = p.count;
    loop {
        if hi - lo <= 1u { break; }
        let mid = (lo + hi) / 2u;
        if table[(p.base + mid) * ENTRY + 1u] <= group { lo = mid; } else { hi = mid; }
    }
    let e = (p.base + lo) * ENTRY;
    let n = table[e];
    let skip = (MODE == 1u || MODE == 2u) && p.skip_if_found != 0u && atomicLoad(&found[0]) != 0u;
//#if WIDE
    // Two vectors of four elements an invocation, 1,024 elements apart, so that a
    // subgroup's loads and stores cover whole lines (the length is a multiple of 8).
    let q0 = (group - table[e + 1u]) * 512u + lid.x;
    let q1 = q0 + 256u;
    var x0 = V(0.0);
    var x1 = V(0.0);
    if !skip && q0 * 4u < n { x0 = element(e, q0); }
    if !skip && q1 * 4u < n { x1 = element(e, q1); }
//#if HALF
    // The f16 copy's words go through workgroup memory, so that each invocation then
    // stores eight consecutive halves (rounded by the f16 conversion first, as in the
    // pairs below).
    let a = vec4<f32>(vec4<f16>(x0));
    let b = vec4<f32>(vec4<f16>(x1));
    copy_words[2u * lid.x] = pack2x16float(a.xy);
    copy_words[2u * lid.x + 1u] = pack2x16float(a.zw);
    copy_words[512u + 2u * lid.x] = pack2x16float(b.xy);
    copy_words[512u + 2u * lid.x + 1u] = pack2x16float(b.zw);
    workgroupBarrier();
    let hs = table[e + 10u];
    let o = (group - table[e + 1u]) * 256u + lid.x;
    if !skip && hs != NONE && o * 8u < n {
        let w = 4u * lid.x;
        store(hs, at(e, 11u, o), vec4<u32>(copy_words[w], copy_words[w + 1u], copy_words[w + 2u], copy_words[w + 3u]));
    }
//#endif
//#else
//#if SQUARES
    var sum = 0.0;
//#else
    if skip {
        return;
    }
//#endif
    // PAIRS pairs an invocation, 256 apart.
    let first = (group - table[e + 1u]) * 256u * PAIRS + lid.x;
    for (var k = 0u; k < PAIRS; k++) {
        let pair = first + k * 256u;
        let i = pair * 2u;
        if i < n {
            let w0 = element(e, i);
            var w1 = 0.0;
            if i + 1u < n { w1 = element(e, i + 1u); }
//#if SQUARES
            sum += w0 + w1;
//#endif
//#if HALF
            let hs = table[e + 10u];
            if hs != NONE {
                // Rounded by the f16 conversion as shaders/optim.wgsl's copy; packing an
                // f16 value is then exact.
                let h = vec2<f32>(f32(f16(w0)), f32(f16(w1)));
                store(hs, table[e + 11u] + pair, pack2x16float(h));
            }
//#endif
        }
    }
//#endif
//#if SQUARES
    partial[lid.x] = sum;
    workgroupBarrier();
    for (var half_len = 128u; half_len > 0u; half_len /= 2u) {
        if lid.x < half_len {
            partial[lid.x] += partial[lid.x + half_len];
        }
        workgroupBarrier();
    }
    if lid.x == 0u {
        atomicStore(&found[1u + p.first_sum + group], bitcast<u32>(partial[0]));
    }
//#endif
}
