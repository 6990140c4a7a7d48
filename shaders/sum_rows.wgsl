// Column sums of a row-major [rows, cols] x into f32 (bias gradients: the sum of dy over
// rows), deterministic and parallel over rows, in two passes:
//   partials (SUMS false): part[chunk, c] = sum of x[r, c] over the chunk's ROW_CHUNK rows,
//           in row order; one invocation per W columns of a chunk (W 4: vec4 loads, where
//           the columns and the view's offset are multiples of 4), four rows loaded at a
//           time (a warp reads consecutive columns)
//   sums (SUMS true): out[c] = sum of part[k, c] over the chunks: LANES invocations per
//           column, lane l summing chunks l, l + LANES, ... in order, then the lanes added
//           in lane order (x is the partials)
// With HALF (partials, x f32), every element read is also written to half_out as f16:
// the f16 copy fp16-mixed's products read (a linear's dy), in the pass that sums it.
// Template: ENABLE, T (x's element type; f32 for the sums), SUMS, HALF, W, V (f32 or
// vec4<f32>), XT (T or vec4<T>), HT (f16 or vec4<f16>).
{{ENABLE}}
//#if HALF
enable f16;
//#endif

struct Params {
    rows: u32,
    cols: u32,
    x_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<{{XT}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;
//#if HALF
@group(0) @binding(3) var<storage, read_write> half_out: array<{{HT}}>;
//#endif

const ROW_CHUNK: u32 = 64u;
const W: u32 = {{W}}u;
const LANES: u32 = 16u;
const COLS_PER_GROUP: u32 = 256u / LANES;

//#if SUMS
var<workgroup> lane_sums: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let col = lid.x % COLS_PER_GROUP;
    let lane = lid.x / COLS_PER_GROUP;
    let c = (wid.x + wid.y * nwg.x) * COLS_PER_GROUP + col;
    let chunks = (p.rows + ROW_CHUNK - 1u) / ROW_CHUNK;
    var s = 0.0;
    if c < p.cols {
        for (var k = lane; k < chunks; k += LANES) {
            s += x[k * p.cols + c];
        }
    }
    lane_sums[lid.x] = s;
    workgroupBarrier();
    if lane == 0u && c < p.cols {
        var t = 0.0;
        for (var l = 0u; l < LANES; l++) {
            t += lane_sums[l * COLS_PER_GROUP + col];
        }
        out[c] = t;
    }
}
//#else
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let cw = p.cols / W;
    let c = wid.x * 256u + lid.x;
    if c >= cw { return; }
    let chunk = wid.y;
    let end = min(p.rows, (chunk + 1u) * ROW_CHUNK);
    let base = p.x_offset / W + c;
    var s = {{V}}(0.0);
    var r = chunk * ROW_CHUNK;
    // Four rows' loads issued before their uses; added in row order.
    for (; r + 4u <= end; r += 4u) {
        let e0 = {{V}}(x[base + r * cw]);
        let e1 = {{V}}(x[base + (r + 1u) * cw]);
        let e2 = {{V}}(x[base + (r + 2u) * cw]);
        let e3 = {{V}}(x[base + (r + 3u) * cw]);
//#if HALF
        half_out[r * cw + c] = {{HT}}(e0);
        half_out[(r + 1u) * cw + c] = {{HT}}(e1);
        half_out[(r + 2u) * cw + c] = {{HT}}(e2);
        half_out[(r + 3u) * cw + c] = {{HT}}(e3);
//#endif
        s += e0;
        s += e1;
        s += e2;
        s += e3;
    }
    for (; r < end; r++) {
        let e = {{V}}(x[base + r * cw]);
//#if HALF
        half_out[r * cw + c] = {{HT}}(e);
//#endif
        s += e;
    }
    out[chunk * cw + c] = s;
}
//#endif
