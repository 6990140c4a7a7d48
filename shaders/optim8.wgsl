// AdamW with 8-bit blockwise state (train.optimizer = "adamw8bit"; engine/src/kernels/
// blockwise.rs has the layout and the host reference): one workgroup per block of 256
// elements. Each moment is read from its codes and the block's absmax, updated in f32
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
var<workgroup> code_m: array<u32, 256>;
var<workgroup> code_v: array<u32, 256>;
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

fn code_at(words: u32, k: u32) -> u32 {
    return (words >> (8u * (k & 3u))) & 255u;
}

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
    let blk = wid.x + wid.y * nwg.x;
    let n_blocks = (p.n + 255u) / 256u;
    if skipped != 0u || blk >= n_blocks { return; }

    let i = blk * 256u + lane;
    let valid = i < p.n;
    let word = blk * 64u + lane / 4u;
    let absmax_at = n_blocks * 64u + blk;
    var mi = signed_map[code_at(m_q[word], lane)] * bitcast<f32>(m_q[absmax_at]);
    var vi = unsigned_map[code_at(v_q[word], lane)] * bitcast<f32>(v_q[absmax_at]);
    var g = 0.0;
    if valid { g = grad[p.grad_offset + i] * p.inv_scale; }
    mi = p.beta1 * mi + (1.0 - p.beta1) * g;
    vi = p.beta2 * vi + (1.0 - p.beta2) * g * g;
    if valid {
        let wi = p.param_offset + i;
        var w = param[wi] * (1.0 - p.lr * p.weight_decay);
        let denom = sqrt(vi) / p.bias_correction2_sqrt + p.eps;
        w = w - (p.lr / p.bias_correction1) * mi / denom;
        param[wi] = w;
//#if HALF
        half_out[p.half_offset + i] = f16(w);
//#endif
    } else {
        mi = 0.0;
        vi = 0.0;
    }

    // The block's new absmax of each moment.
    max_m[lane] = abs(mi);
    max_v[lane] = vi;
    for (var s = 128u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if lane < s {
            max_m[lane] = max(max_m[lane], max_m[lane + s]);
            max_v[lane] = max(max_v[lane], max_v[lane + s]);
        }
    }
    workgroupBarrier();
    let am = max_m[0];
    let av = max_v[0];
    var cm = nearest_signed(0.0);
    var cv = nearest_unsigned(0.0);
    if am > 0.0 { cm = nearest_signed(mi / am); }
    if av > 0.0 { cv = nearest_unsigned(vi / av); }
    code_m[lane] = cm << (8u * (lane & 3u));
    code_v[lane] = cv << (8u * (lane & 3u));
    workgroupBarrier();
    if lane < 64u {
        let k = lane * 4u;
        m_q[blk * 64u + lane] = code_m[k] | code_m[k + 1u] | code_m[k + 2u] | code_m[k + 3u];
        v_q[blk * 64u + lane] = code_v[k] | code_v[k + 1u] | code_v[k + 2u] | code_v[k + 3u];
    }
    if lane == 0u {
        m_q[absmax_at] = bitcast<u32>(am);
        v_q[absmax_at] = bitcast<u32>(av);
    }
}
