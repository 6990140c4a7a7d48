// AdamW with 8-bit blockwise state (train.optimizer = "adamw8bit"; engine/src/kernels/
// blockwise.rs has the layout and the host reference): a workgroup per four blocks of
// 256 elements, an invocation per word of four codes. Each moment is read from its codes and the block's absmax, updated in f32
// with PyTorch AdamW's arithmetic (decoupled weight decay, bias correction), the weight
// updated from those f32 moments, then the moments quantized again against the block's
// new absmax: the nearest value of the map, ties to the lower code.
//   m_q, v_q: blocks * 64 words of codes (four a word), then blocks words of absmax bits.
// The maps (signed for the first moment, unsigned for the second, 256 values each,
// sorted) are the host's f32 values' bits, rendered in.
// The gradient is multiplied by p.inv_scale first; the whole update is skipped when
// p.skip_if_found is set and found[0] != 0 (GradScaler). With HALF the updated weight's
// f16 copy is written too.
// Template: HALF, SIGNED_BITS, UNSIGNED_BITS.
//#if HALF
enable f16;
//#endif

struct Params {
    n: u32,
    skip_if_found: u32,
    first_step: u32,
    nesterov: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2_sqrt: f32,
    inv_scale: f32,
    param_offset: u32,
    grad_offset: u32,
    half_offset: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m_q: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_q: array<u32>;
@group(0) @binding(5) var<storage, read_write> found: array<atomic<u32>>;
//#if HALF
@group(0) @binding(6) var<storage, read_write> half_out: array<f16>;
//#endif

const SIGNED_BITS = array<u32, 256>({{SIGNED_BITS}});
const UNSIGNED_BITS = array<u32, 256>({{UNSIGNED_BITS}});

var<workgroup> signed_map: array<f32, 256>;
var<workgroup> unsigned_map: array<f32, 256>;
var<workgroup> max_m: array<f32, 256>;
var<workgroup> max_v: array<f32, 256>;
var<workgroup> skip: u32;

fn nearest_signed(x: f32) -> u32 {
    var lo = 0u;
    for (var step = 128u; step > 0u; step = step >> 1u) {
        if lo + step < 256u && signed_map[lo + step] <= x { lo = lo + step; }
    }
    if lo < 255u && abs(signed_map[lo + 1u] - x) < abs(x - signed_map[lo]) { lo = lo + 1u; }
    return lo;
}

fn nearest_unsigned(x: f32) -> u32 {
    var lo = 0u;
    for (var step = 128u; step > 0u; step = step >> 1u) {
        if lo + step < 256u && unsigned_map[lo + step] <= x { lo = lo + step; }
    }
    if lo < 255u && abs(unsigned_map[lo + 1u] - x) < abs(x - unsigned_map[lo]) { lo = lo + 1u; }
    return lo;
}

// A workgroup takes four blocks; each invocation four consecutive elements of one (one
// word of codes), so it reads and writes its word whole.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lane: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    signed_map[lane] = bitcast<f32>(SIGNED_BITS[lane]);
    unsigned_map[lane] = bitcast<f32>(UNSIGNED_BITS[lane]);
    if lane == 0u {
        skip = select(0u, 1u, p.skip_if_found != 0u && atomicLoad(&found[0]) != 0u);
    }
    // Also the barrier after the maps' loads.
    let skipped = workgroupUniformLoad(&skip);
    let first_blk = (wid.x + wid.y * nwg.x) * 4u;
    let n_blocks = (p.n + 255u) / 256u;
    if skipped != 0u || first_blk >= n_blocks { return; }

    let blk = first_blk + lane / 64u;
    let in_range = blk < n_blocks;
    let word = blk * 64u + lane % 64u;
    let absmax_at = n_blocks * 64u + blk;
    var wm = 0u;
    var wv = 0u;
    var am_old = 0.0;
    var av_old = 0.0;
    if in_range {
        wm = m_q[word];
        wv = v_q[word];
        am_old = bitcast<f32>(m_q[absmax_at]);
        av_old = bitcast<f32>(v_q[absmax_at]);
    }
    let bc1_step = p.lr / p.bias_correction1;
    let decay = 1.0 - p.lr * p.weight_decay;
    var mi: array<f32, 4>;
    var vi: array<f32, 4>;
    var local_m = 0.0;
    var local_v = 0.0;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let i = word * 4u + k;
        let shift = 8u * k;
        var m = signed_map[(wm >> shift) & 255u] * am_old;
        var v = unsigned_map[(wv >> shift) & 255u] * av_old;
        if in_range && i < p.n {
            let g = grad[p.grad_offset + i] * p.inv_scale;
            m = p.beta1 * m + (1.0 - p.beta1) * g;
            v = p.beta2 * v + (1.0 - p.beta2) * g * g;
            let wi = p.param_offset + i;
            let w = param[wi] * decay - bc1_step * m / (sqrt(v) / p.bias_correction2_sqrt + p.eps);
            param[wi] = w;
//#if HALF
            half_out[p.half_offset + i] = f16(w);
//#endif
        } else {
            m = 0.0;
            v = 0.0;
        }
        mi[k] = m;
        vi[k] = v;
        local_m = max(local_m, abs(m));
        local_v = max(local_v, v);
    }

    // Each block's new absmax: a tree over its 64 invocations.
    max_m[lane] = local_m;
    max_v[lane] = local_v;
    for (var s = 32u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if lane % 64u < s {
            max_m[lane] = max(max_m[lane], max_m[lane + s]);
            max_v[lane] = max(max_v[lane], max_v[lane + s]);
        }
    }
    workgroupBarrier();
    if !in_range { return; }
    let am = max_m[lane - lane % 64u];
    let av = max_v[lane - lane % 64u];
    var out_m = 0u;
    var out_v = 0u;
    for (var k = 0u; k < 4u; k = k + 1u) {
        var cm = nearest_signed(0.0);
        var cv = nearest_unsigned(0.0);
        if am > 0.0 { cm = nearest_signed(mi[k] / am); }
        if av > 0.0 { cv = nearest_unsigned(vi[k] / av); }
        out_m = out_m | (cm << (8u * k));
        out_v = out_v | (cv << (8u * k));
    }
    m_q[word] = out_m;
    v_q[word] = out_v;
    if lane % 64u == 0u {
        m_q[absmax_at] = bitcast<u32>(am);
        v_q[absmax_at] = bitcast<u32>(av);
    }
}
