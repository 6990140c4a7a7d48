// Softmax, log-softmax and softmax's backward over the last dim, one workgroup per row,
// computed in f32. Template: ENABLE, TX (input), TY (output), MODE (0 softmax,
// 1 log-softmax, 2 backward: dx = y * (dy - sum(dy * y))).
// Causal mask (forward): when p.period > 0, row r may see columns j <= r % p.period.
{{ENABLE}}

struct Params {
    rows: u32,
    cols: u32,
    period: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<{{TX}}>;   // forward: logits; backward: y
@group(0) @binding(2) var<storage, read_write> dy: array<{{TD}}>;  // backward only
@group(0) @binding(3) var<storage, read_write> y: array<{{TY}}>;   // forward: output; backward: dx

const MODE: u32 = {{MODE}}u;
const WG: u32 = 256u;
{{WORKGROUP_REDUCE}}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if row >= p.rows { return; }
    let lid = lid3.x;
    let base = row * p.cols;
    if MODE == 2u {
        var dot = 0.0;
        for (var j = lid; j < p.cols; j += WG) {
            dot += f32(dy[base + j]) * f32(x[base + j]);
        }
        let total = workgroup_sum(lid, dot);
        for (var j = lid; j < p.cols; j += WG) {
            let yj = f32(x[base + j]);
            y[base + j] = {{TY}}(yj * (f32(dy[base + j]) - total));
        }
        return;
    }
    var visible = p.cols;
    if p.period > 0u { visible = min(p.cols, row % p.period + 1u); }
    var m = -3.4028235e38;
    for (var j = lid; j < visible; j += WG) {
        m = max(m, f32(x[base + j]));
    }
    let row_max = workgroup_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < visible; j += WG) {
        s += exp(f32(x[base + j]) - row_max);
    }
    let total = workgroup_sum(lid, s);
    let log_total = log(total);
    for (var j = lid; j < p.cols; j += WG) {
        let z = f32(x[base + j]) - row_max;
        if MODE == 1u {
            y[base + j] = {{TY}}(select(-3.4028235e38, z - log_total, j < visible));
        } else {
            y[base + j] = {{TY}}(select(0.0, exp(z) / total, j < visible));
        }
    }
}
