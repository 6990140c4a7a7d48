// Row reductions accumulating in f32: out[r] = scale * OP(x[r*cols + j] for j < cols,
// r*cols + j < total). One workgroup per row. Template: ENABLE, T, OP (sum | max).
{{ENABLE}}

struct Params {
    rows: u32,
    cols: u32,
    total: u32,     // elements of x in play (the last row may be short)
    x_offset: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
{{WORKGROUP_REDUCE}}

fn combine(a: f32, b: f32) -> f32 {
    return {{COMBINE}};
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if row >= p.rows { return; }   // uniform across the workgroup
    let start = row * p.cols;
    let end = min(start + p.cols, p.total);
    var acc = {{IDENTITY}};
    for (var j = start + lid.x; j < end; j += WG) {
        acc = combine(acc, f32(x[p.x_offset + j]));
    }
    let total = {{WORKGROUP_OP}}(lid.x, acc);
    if lid.x == 0u {
        out[row] = total * p.scale;
    }
}
