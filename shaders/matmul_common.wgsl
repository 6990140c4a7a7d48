// Shared by matmul.wgsl and matmul_coop.wgsl, pasted at their MATMUL_COMMON placeholder:
// the launch parameters (engine/src/kernels/matmul.rs's Params), bindings 0, 3 and 4,
// and the epilogue every output element goes through.
struct Params {
    m: u32, n: u32, k: u32, batch1: u32,
    a_off: u32, a_rs: u32, a_cs: u32, a_bs0: u32,
    a_bs1: u32, b_off: u32, b_rs: u32, b_cs: u32,
    b_bs0: u32, b_bs1: u32, c_off: u32, c_rs: u32,
    c_bs0: u32, c_bs1: u32, bias_off: u32, has_bias: u32,
    alpha: f32, beta: f32, flags: u32, splits: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> c: array<{{TC}}>;
@group(0) @binding(4) var<storage, read_write> bias: array<f32>;

alias V = f32;
{{ACTIVATIONS}}

// One element of the epilogue, for column gn of the output: act(alpha * acc + bias[gn] +
// beta * old), `old` being C's element before (read only where beta is not 0).
fn epilogue(acc: f32, gn: u32, old: f32) -> f32 {
    var v = p.alpha * acc;
    if p.has_bias != 0u { v += bias[p.bias_off + gn]; }
    if p.beta != 0.0 { v += p.beta * old; }
    return {{ACT}};
}

// c[ci] = act(alpha * acc + bias[gn] + beta * c[ci]), for column gn of the output.
fn store_c(ci: u32, gn: u32, acc: f32) {
    var old = 0.0;
    if p.beta != 0.0 { old = f32(c[ci]); }
    c[ci] = {{TC}}(epilogue(acc, gn, old));
}

// A split product's first pass in uneven K slices (flags bit 1, `matmul_params::SLICED`):
// batch z takes slice z of p.splits, [lo, hi) in whole units of SLICE_UNIT (each slice's
// share of p.k / SLICE_UNIT units rounded, so no slice is a unit longer than another),
// into partial z (C's batch stride). The host sets it only where K is whole units.
const SLICE_UNIT: u32 = 128u;

fn k_slice(z: u32) -> vec2<u32> {
    let units = p.k / SLICE_UNIT;
    return vec2<u32>(z * units / p.splits, (z + 1u) * units / p.splits) * SLICE_UNIT;
}
