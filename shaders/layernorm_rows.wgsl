// LayerNorm and RMSNorm with one subgroup a row: shaders/layernorm.wgsl's forward (MODE
// 0, with the residual prologue RES) and its backward with each chunk's weight-gradient
// partials (MODE 1, with the gradient so far ACC), the same formulas, for rows a multiple
// of 4 and at most 4 * MAXV * SG wide. Each lane keeps its MAXV vec4s of a row in
// registers between the passes, and the row sums are subgroup sums: the forward has no
// workgroup memory and no barriers, where the workgroup-a-row kernel waits on two
// barriers a row and loads one element a lane (on an H200 GPT-2's [8192, 768] forward
// took 39.7 us there against 21.2 here).
// Forward: subgroup s of workgroup g takes row g * ROWS_WG + s.
// Backward: workgroup g takes chunk g, R rows, subgroup s row s of it; the rows' weight
// and bias terms are added into the chunk's partials in row order in workgroup memory,
// which are written [chunk][2][cols] at dw as the workgroup-a-chunk kernel writes them
// (the same chunks and, per column, the same sums in the same order; their sums are
// shaders/col_sums.wgsl's).
// Subgroups are taken as consecutive invocations of SG lanes (as the attention kernels
// take them); the host picks this kernel only where the adapter's subgroup size is fixed.
// Bindings as shaders/layernorm.wgsl's (x, w, b_or_dy, y_or_dx, mean, rstd, dw, db), as
// vec4s where they hold rows; every bound tensor starts its block (the host checks).
{{ENABLE}}

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<{{T}}>>;
@group(0) @binding(2) var<storage, read_write> w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> b_or_dy: array<vec4<{{T}}>>;
@group(0) @binding(4) var<storage, read_write> y_or_dx: array<vec4<{{TY}}>>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(7) var<storage, read_write> dw: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> db: array<vec4<f32>>;

const MODE: u32 = {{MODE}}u;
const RMS: bool = {{RMS}};
const RES: bool = {{RES}};
const ACC: bool = {{ACC}};
// Lanes a subgroup, invocations a workgroup, rows (forward) or chunks (backward) a
// workgroup, vec4s a lane keeps of a row.
const SG: u32 = {{SG}}u;
const WG: u32 = {{WG}}u;
const ROWS_WG: u32 = WG / SG;
const MAXV: u32 = {{MAXV}}u;
// Rows a chunk of the backward (PART_ROWS on the host, R in shaders/layernorm.wgsl): the
// backward's workgroup is R subgroups.
const R: u32 = 8u;
// The backward's chunk partials as they are summed (a lane's columns are the same in
// every subgroup). Declared in the backward's variants alone: the device zeroes a
// kernel's workgroup memory before it starts, so the forward holds none.
//#if BACKWARD
var<workgroup> parts_w: array<vec4<f32>, {{PART_VECS}}>;
var<workgroup> parts_b: array<vec4<f32>, {{PART_VECS}}>;
//#endif

fn sum4(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    let s = lid / SG;
    let lane = lid % SG;
    let c4 = p.cols / 4u;
    let n = f32(p.cols);
    if MODE == 0u {
        // Every branch below is uniform over a subgroup: its lanes share the row.
        let row = group * ROWS_WG + s;
        if row >= p.rows { return; }
        let base = row * c4;
        var xs: array<vec4<f32>, MAXV>;
        var acc = vec4<f32>(0.0);
        for (var k = 0u; k < MAXV; k++) {
            let j = lane + k * SG;
            if j < c4 {
                var e = vec4<f32>(x[base + j]);
                if RES {
                    e += dw[base + j];
                    db[base + j] = e;
                }
                xs[k] = e;
                acc += e;
            }
        }
        var mu = 0.0;
        if !RMS {
            mu = subgroupAdd(sum4(acc)) / n;
        }
        var sq = vec4<f32>(0.0);
        for (var k = 0u; k < MAXV; k++) {
            if lane + k * SG < c4 {
                let d = xs[k] - mu;
                sq += d * d;
            }
        }
        let r = inverseSqrt(subgroupAdd(sum4(sq)) / n + p.eps);
        for (var k = 0u; k < MAXV; k++) {
            let j = lane + k * SG;
            if j < c4 {
                var shift = vec4<f32>(0.0);
                if !RMS {
                    shift = vec4<f32>(b_or_dy[j]);
                }
                y_or_dx[base + j] = vec4<{{TY}}>((xs[k] - mu) * r * w[j] + shift);
            }
        }
        if lane == 0u {
            mean[row] = mu;
            rstd[row] = r;
        }
        return;
    }
//#if BACKWARD
    // The backward: the workgroup's R subgroups take a row each of the chunk. One chunk
    // at least (of no rows: zeros), as the host counts them.
    let chunk = group;
    if chunk >= max((p.rows + R - 1u) / R, 1u) { return; }
    let row = chunk * R + s;
    let has = row < p.rows;
    var dys: array<vec4<f32>, MAXV>;
    var xh: array<vec4<f32>, MAXV>;
    if s == 0u {
        for (var k = 0u; k < MAXV; k++) {
            let j = lane + k * SG;
            if j < c4 {
                parts_w[j] = vec4<f32>(0.0);
                parts_b[j] = vec4<f32>(0.0);
            }
        }
    }
    if has {
        let base = row * c4;
        let mu = mean[row];
        let r = rstd[row];
        var sg = vec4<f32>(0.0);
        var sgx = vec4<f32>(0.0);
        for (var k = 0u; k < MAXV; k++) {
            let j = lane + k * SG;
            if j < c4 {
                let dy = vec4<f32>(b_or_dy[base + j]);
                let xm = vec4<f32>(x[base + j]) - mu;
                let g = dy * w[j];
                sg += g;
                sgx += g * xm * r;
                dys[k] = dy;
                xh[k] = xm * r;
            }
        }
        var m1 = subgroupAdd(sum4(sg)) / n;
        let m2 = subgroupAdd(sum4(sgx)) / n;
        if RMS { m1 = 0.0; }
        for (var k = 0u; k < MAXV; k++) {
            let j = lane + k * SG;
            if j < c4 {
                let g = dys[k] * w[j];
                var d = r * (g - m1 - xh[k] * m2);
                if ACC {
                    d = db[base + j] + d;
                }
                y_or_dx[base + j] = vec4<{{TY}}>(d);
            }
        }
    }
    // The chunk's partials, its rows added in order (subgroup 0 of the workgroup zeroed
    // them above; each subgroup's lanes hold the same columns).
    workgroupBarrier();
    for (var i = 0u; i < R; i++) {
        if s == i && has {
            for (var k = 0u; k < MAXV; k++) {
                let j = lane + k * SG;
                if j < c4 {
                    parts_w[j] += dys[k] * xh[k];
                    parts_b[j] += dys[k];
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = lid; j < c4; j += WG) {
        dw[2u * chunk * c4 + j] = parts_w[j];
        dw[(2u * chunk + 1u) * c4 + j] = parts_b[j];
    }
//#endif
}
