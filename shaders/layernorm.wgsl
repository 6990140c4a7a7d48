// LayerNorm over the last dim, in f32 (RMS 1: RMSNorm, no centering and no bias: the
// saved mean is 0 and every formula below holds with it). Template: ENABLE, T (x, y,
// dy, dx type), RMS, MODE:
//   0 forward:  y = (x - mean) * rstd * w + b; saves mean, rstd.    one workgroup per row
//   1 backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w   (per row)
//   2 weight partials: for the chunk of ROW_CHUNK rows given by workgroup_id.y,
//             pw[chunk, c] = sum dy * xhat, pb[chunk, c] = sum dy      one thread per column
//             (pw, pb bound where dw, db are)
//   3 weight sums: dw[c] = sum over chunks of pw, db[c] = ... of pb, LANES invocations a
//             column each summing every LANES-th chunk in order, then the lanes in order
//             (pw, pb bound where mean, rstd are): deterministic, and parallel over rows
// Bindings (all modes): x, w, b_or_dy, y_or_dx, mean, rstd, dw, db. TY is y_or_dx's type:
// T, or f16 for a forward feeding fp16-mixed's products (the f32 y rounded as written).
{{ENABLE}}

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> b_or_dy: array<{{T}}>;
@group(0) @binding(4) var<storage, read_write> y_or_dx: array<{{TY}}>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(7) var<storage, read_write> dw: array<f32>;
@group(0) @binding(8) var<storage, read_write> db: array<f32>;

const MODE: u32 = {{MODE}}u;
const RMS: bool = {{RMS}};
const WG: u32 = 256u;
const ROW_CHUNK: u32 = 64u;
const LANES: u32 = 16u;
const SUM_COLS: u32 = WG / LANES;
var<workgroup> lane_sums: array<vec2<f32>, 256>;
{{WORKGROUP_REDUCE}}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let group = wid.x + wid.y * nwg.x;
    if MODE == 2u {
        let c = wid.x * WG + lid;
        if c >= p.cols { return; }
        let chunk = wid.y;
        let end = min(p.rows, (chunk + 1u) * ROW_CHUNK);
        var sw = 0.0;
        var sb = 0.0;
        var r = chunk * ROW_CHUNK;
        // Four rows' loads issued before their uses; added in row order.
        for (; r + 4u <= end; r += 4u) {
            var g: array<f32, 4>;
            var xhat: array<f32, 4>;
            for (var k = 0u; k < 4u; k++) {
                g[k] = f32(b_or_dy[(r + k) * p.cols + c]);
                xhat[k] = (f32(x[(r + k) * p.cols + c]) - mean[r + k]) * rstd[r + k];
            }
            for (var k = 0u; k < 4u; k++) {
                sw += g[k] * xhat[k];
                sb += g[k];
            }
        }
        for (; r < end; r++) {
            let g = f32(b_or_dy[r * p.cols + c]);
            let xhat = (f32(x[r * p.cols + c]) - mean[r]) * rstd[r];
            sw += g * xhat;
            sb += g;
        }
        dw[chunk * p.cols + c] = sw;
        db[chunk * p.cols + c] = sb;
        return;
    }
    if MODE == 3u {
        // LANES invocations a column: lane l sums chunks l, l + LANES, ... in order, then
        // the lanes are added in lane order.
        let col = lid % SUM_COLS;
        let lane = lid / SUM_COLS;
        let c = group * SUM_COLS + col;
        let chunks = (p.rows + ROW_CHUNK - 1u) / ROW_CHUNK;
        var s = vec2<f32>(0.0);
        if c < p.cols {
            for (var k = lane; k < chunks; k += LANES) {
                s += vec2<f32>(mean[k * p.cols + c], rstd[k * p.cols + c]);
            }
        }
        lane_sums[lid] = s;
        workgroupBarrier();
        if lane == 0u && c < p.cols {
            var t = vec2<f32>(0.0);
            for (var l = 0u; l < LANES; l++) {
                t += lane_sums[l * SUM_COLS + col];
            }
            dw[c] = t.x;
            db[c] = t.y;
        }
        return;
    }
    let row = group;
    if row >= p.rows { return; }
    let base = row * p.cols;
    let n = f32(p.cols);
    if MODE == 0u {
        var mu = 0.0;
        if !RMS {
            var s = 0.0;
            for (var j = lid; j < p.cols; j += WG) { s += f32(x[base + j]); }
            mu = workgroup_sum2(lid, s, 0.0).x / n;
        }
        var v = 0.0;
        for (var j = lid; j < p.cols; j += WG) {
            let d = f32(x[base + j]) - mu;
            v += d * d;
        }
        let r = inverseSqrt(workgroup_sum2(lid, v, 0.0).x / n + p.eps);
        for (var j = lid; j < p.cols; j += WG) {
            let shift = select(f32(b_or_dy[j]), 0.0, RMS);
            y_or_dx[base + j] = {{TY}}((f32(x[base + j]) - mu) * r * w[j] + shift);
        }
        if lid == 0u {
            mean[row] = mu;
            rstd[row] = r;
        }
        return;
    }
    let mu = mean[row];
    let r = rstd[row];
    var sg = 0.0;
    var sgx = 0.0;
    for (var j = lid; j < p.cols; j += WG) {
        let g = f32(b_or_dy[base + j]) * w[j];
        sg += g;
        sgx += g * (f32(x[base + j]) - mu) * r;
    }
    var sums = workgroup_sum2(lid, sg, sgx) / n;
    if RMS { sums.x = 0.0; }
    for (var j = lid; j < p.cols; j += WG) {
        let g = f32(b_or_dy[base + j]) * w[j];
        let xhat = (f32(x[base + j]) - mu) * r;
        y_or_dx[base + j] = {{TY}}(r * (g - sums.x - xhat * sums.y));
    }
}
