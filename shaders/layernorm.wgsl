// LayerNorm over the last dim, in f32 (RMS 1: RMSNorm, no centering and no bias: the
// saved mean is 0 and every formula below holds with it). Template: ENABLE, T (x, y,
// dy, dx type), RMS, MODE:
//   0 forward:  y = (x - mean) * rstd * w + b; saves mean, rstd.    one workgroup per row
//   1 backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w   (per row)
//   1 with PARTS (cols <= PART_COLS): R rows a workgroup, which also writes its chunk's
//             partial weight gradients, sum dy * xhat and sum dy over its rows
//             (their sums, 64 lanes a column, are shaders/col_sums.wgsl's, with other sums)
//   2 weight gradients (wider rows): dw[c] = sum dy * xhat, db[c] = sum dy over the rows,
//             in one pass: a workgroup takes U columns (32 bytes of an f32 row) with
//             256 / U lanes of rows each
// Every sum is deterministic (fixed orders), and parallel over rows.
// Bindings (all modes): x, w, b_or_dy, y_or_dx, mean, rstd, dw, db. TY is y_or_dx's type:
// T, or f16 for a forward feeding fp16-mixed's products (the f32 y rounded as written).
// Fused with the residual add before it (RES, forward, T f32): the rows normalised are
// x + dw (the residual branch, bound at dw), written to db (the sum, which the block
// goes on with) as they are read. With the gradient so far (ACC, backward): dx = db +
// the formula above (db bound to the input's gradient from its other uses, the tape's
// accumulation folded in).
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
const RES: bool = {{RES}};
const ACC: bool = {{ACC}};
const PARTS: bool = {{PARTS}};
// Rows a workgroup of the backward with partials takes; its columns (at most 4 an
// invocation).
const R: u32 = 8u;
const PART_COLS: u32 = 4u * 256u;

// Element i of the rows normalised: x's, or after the residual prologue the sum's.
fn xv(i: u32) -> f32 {
    if RES {
        return db[i];
    }
    return f32(x[i]);
}
const WG: u32 = 256u;
const U: u32 = 8u;
const ROW_LANES: u32 = WG / U;
var<workgroup> lane_sums: array<vec2<f32>, 256>;
{{WORKGROUP_REDUCE}}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let group = wid.x + wid.y * nwg.x;
    if MODE == 1u && PARTS {
        // R rows a workgroup, each row's dx as below; each invocation also sums its
        // columns' dy * xhat and dy over the rows in order, written as this chunk's
        // partials [chunk][2][cols] (at dw) for their sums.
        // One chunk at least (of no rows: zeros), as the host counts them.
        if group >= max((p.rows + R - 1u) / R, 1u) { return; }
        let r0 = group * R;
        let r1 = min(r0 + R, p.rows);
        var aw = vec4<f32>(0.0);
        var ab = vec4<f32>(0.0);
        for (var row = r0; row < r1; row++) {
            let kept = backward_row_kept(lid, row, f32(p.cols));
            for (var k = 0u; k < 4u; k++) {
                if lid + k * WG < p.cols {
                    aw[k] += kept.dy[k] * kept.xhat[k];
                    ab[k] += kept.dy[k];
                }
            }
        }
        for (var k = 0u; k < 4u; k++) {
            let j = lid + k * WG;
            if j < p.cols {
                dw[2u * group * p.cols + j] = aw[k];
                dw[(2u * group + 1u) * p.cols + j] = ab[k];
            }
        }
        return;
    }
    if MODE == 2u {
        // U columns a workgroup, ROW_LANES lanes of rows each: lane l sums rows l,
        // l + ROW_LANES, ... in order (four rows' loads issued before their uses), then
        // the lanes are added pairwise in a fixed tree.
        let u = lid % U;
        let lane = lid / U;
        let c = group * U + u;
        var s = vec2<f32>(0.0);
        if c < p.cols {
            var r = lane;
            for (; r + 3u * ROW_LANES < p.rows; r += 4u * ROW_LANES) {
                var g: array<f32, 4>;
                var xhat: array<f32, 4>;
                for (var k = 0u; k < 4u; k++) {
                    let rk = r + k * ROW_LANES;
                    g[k] = f32(b_or_dy[rk * p.cols + c]);
                    xhat[k] = (f32(x[rk * p.cols + c]) - mean[rk]) * rstd[rk];
                }
                for (var k = 0u; k < 4u; k++) {
                    s += vec2<f32>(g[k] * xhat[k], g[k]);
                }
            }
            for (; r < p.rows; r += ROW_LANES) {
                let g = f32(b_or_dy[r * p.cols + c]);
                let xhat = (f32(x[r * p.cols + c]) - mean[r]) * rstd[r];
                s += vec2<f32>(g * xhat, g);
            }
        }
        lane_sums[lid] = s;
        workgroupBarrier();
        for (var h = ROW_LANES / 2u; h > 0u; h >>= 1u) {
            if lane < h {
                lane_sums[lid] = lane_sums[lid] + lane_sums[lid + h * U];
            }
            workgroupBarrier();
        }
        if lane == 0u && c < p.cols {
            dw[c] = lane_sums[lid].x;
            db[c] = lane_sums[lid].y;
        }
        return;
    }
    let row = group;
    if row >= p.rows { return; }
    let base = row * p.cols;
    let n = f32(p.cols);
    if MODE == 0u && p.cols <= PART_COLS {
        // Rows up to PART_COLS wide: each invocation keeps its (at most four) elements in
        // registers between the passes (the sums and their order are the loop's below).
        var xs: array<f32, 4>;
        var s = 0.0;
        for (var k = 0u; k < 4u; k++) {
            let j = lid + k * WG;
            if j < p.cols {
                var e = f32(x[base + j]);
                if RES {
                    e += dw[base + j];
                    db[base + j] = e;
                }
                xs[k] = e;
                s += e;
            }
        }
        var mu = 0.0;
        if !RMS {
            mu = workgroup_sum2(lid, s, 0.0).x / n;
        }
        var v = 0.0;
        for (var k = 0u; k < 4u; k++) {
            if lid + k * WG < p.cols {
                let d = xs[k] - mu;
                v += d * d;
            }
        }
        let r = inverseSqrt(workgroup_sum2(lid, v, 0.0).x / n + p.eps);
        for (var k = 0u; k < 4u; k++) {
            let j = lid + k * WG;
            if j < p.cols {
                let shift = select(f32(b_or_dy[j]), 0.0, RMS);
                y_or_dx[base + j] = {{TY}}((xs[k] - mu) * r * w[j] + shift);
            }
        }
        if lid == 0u {
            mean[row] = mu;
            rstd[row] = r;
        }
        return;
    }
    if MODE == 0u {
        if RES {
            // Each invocation writes the elements it reads below.
            for (var j = lid; j < p.cols; j += WG) {
                db[base + j] = f32(x[base + j]) + dw[base + j];
            }
        }
        var mu = 0.0;
        if !RMS {
            var s = 0.0;
            for (var j = lid; j < p.cols; j += WG) { s += xv(base + j); }
            mu = workgroup_sum2(lid, s, 0.0).x / n;
        }
        var v = 0.0;
        for (var j = lid; j < p.cols; j += WG) {
            let d = xv(base + j) - mu;
            v += d * d;
        }
        let r = inverseSqrt(workgroup_sum2(lid, v, 0.0).x / n + p.eps);
        for (var j = lid; j < p.cols; j += WG) {
            let shift = select(f32(b_or_dy[j]), 0.0, RMS);
            y_or_dx[base + j] = {{TY}}((xv(base + j) - mu) * r * w[j] + shift);
        }
        if lid == 0u {
            mean[row] = mu;
            rstd[row] = r;
        }
        return;
    }
    if p.cols <= PART_COLS {
        _ = backward_row_kept(lid, row, n);
    } else {
        backward_row(lid, row, n);
    }
}

// An invocation's elements of a row (at most four) kept in registers: dy and xhat.
struct Kept {
    dy: array<f32, 4>,
    xhat: array<f32, 4>,
}

// dx of one row up to PART_COLS wide, as `backward_row` forms it (the same sums in the
// same order), each invocation reading its elements once; returns them for the weight
// gradients' partials (every invocation of the workgroup calls it: it holds barriers).
fn backward_row_kept(lid: u32, row: u32, n: f32) -> Kept {
    let base = row * p.cols;
    let mu = mean[row];
    let r = rstd[row];
    var kept: Kept;
    var sg = 0.0;
    var sgx = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let j = lid + k * WG;
        if j < p.cols {
            let dy = f32(b_or_dy[base + j]);
            let xm = f32(x[base + j]) - mu;
            let g = dy * w[j];
            sg += g;
            sgx += g * xm * r;
            kept.dy[k] = dy;
            kept.xhat[k] = xm * r;
        }
    }
    var sums = workgroup_sum2(lid, sg, sgx) / n;
    if RMS { sums.x = 0.0; }
    for (var k = 0u; k < 4u; k++) {
        let j = lid + k * WG;
        if j < p.cols {
            let g = kept.dy[k] * w[j];
            var d = r * (g - sums.x - kept.xhat[k] * sums.y);
            if ACC {
                d = db[base + j] + d;
            }
            y_or_dx[base + j] = {{TY}}(d);
        }
    }
    return kept;
}

// dx of one row (every invocation of the workgroup calls it: it holds barriers).
fn backward_row(lid: u32, row: u32, n: f32) {
    let base = row * p.cols;
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
        var d = r * (g - sums.x - xhat * sums.y);
        if ACC {
            d = db[base + j] + d;
        }
        y_or_dx[base + j] = {{TY}}(d);
    }
}
