// Elementwise map with broadcasting: out[i] = EXPR(a, b) over a 4-d index space.
// Template: ENABLE, TA, TB, TO (element types), V (f32 or vec4<f32>), LANES (1 or 4),
// LOAD_A / LOAD_B (how a and b are read), EXPR (in terms of a, b, p.alpha, p.beta).
// The vec4 variant (LANES 4) is for contiguous, same-shape operands only.
{{ENABLE}}

struct Params {
    shape: vec4<u32>,      // output dims, outermost first (padded with 1s)
    a_strides: vec4<u32>,  // in elements; 0 broadcasts
    b_strides: vec4<u32>,
    n: u32,                // output elements (vec4s in the vec4 variant)
    a_offset: u32,
    b_offset: u32,
    out_offset: u32,
    alpha: f32,
    beta: f32,
    seed: u32,             // dropout's mask seed
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> xa: array<{{TA}}>;
@group(0) @binding(2) var<storage, read_write> xb: array<{{TB}}>;
@group(0) @binding(3) var<storage, read_write> out: array<{{TO}}>;

alias V = {{V}};
{{ACTIVATIONS}}

// Dropout's keep factor of element e: 0 with probability p.alpha, else p.beta
// (1 / (1 - alpha)), from a hash of the element index and the launch's seed (PCG's
// output permutation, twice), so backward draws the mask forward drew.
fn pcg_hash(x: u32) -> u32 {
    let state = x * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}
fn keep_one(e: u32) -> f32 {
    let u = f32(pcg_hash(pcg_hash(e) ^ p.seed) >> 8u) * (1.0 / 16777216.0);
    return select(0.0, p.beta, u >= p.alpha);
}
fn dropout_keep(i: u32) -> V {
    let e = i * {{LANES}}u;
    return V({{KEEP_LANES}});
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.n { return; }
    let i3 = i % p.shape.w;
    let r2 = i / p.shape.w;
    let i2 = r2 % p.shape.z;
    let r1 = r2 / p.shape.z;
    let i1 = r1 % p.shape.y;
    let i0 = r1 / p.shape.y;
    let idx = vec4<u32>(i0, i1, i2, i3);
    let ia = p.a_offset + dot(idx, p.a_strides);
    let ib = p.b_offset + dot(idx, p.b_strides);
    {{LOAD_A}}
    {{LOAD_B}}
    out[p.out_offset + i] = {{TO}}({{EXPR}});
}
