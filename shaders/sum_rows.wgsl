// Column sums of a row-major [rows, cols] x into f32 (bias gradients: the sum of dy over
// rows), deterministic and parallel over rows, in one pass:
//   one pass (ONE true): a workgroup takes U units of W columns, with 256 / U lanes of
//           rows each: lane l sums rows l, l + lanes, ... in order (four rows loaded at a
//           time), then the lanes are added pairwise in a fixed tree. For x with more
//           rows than a chunk; one launch, no partials
//   chunks (ONE false): out[chunk, c] = sum of x[r, c] over the chunk's ROW_CHUNK rows,
//           in row order; one invocation per W columns of a chunk (W 4: vec4 loads, where
//           the columns and the view's offset are multiples of 4), four rows loaded at a
//           time (a warp reads consecutive columns). The host runs it for x of one chunk.
// With HALF (x f32), every element read is also written to half_out as f16:
// the f16 copy fp16-mixed's products read (a linear's dy), in the pass that sums it.
// Template: ENABLE, T (x's element type), ONE, HALF, W, V (f32 or vec4<f32>), XT (T or
// vec4<T>), HT (f16 or vec4<f16>).
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

//#if ONE
// Two vec4 units (32 bytes of a row) or eight scalar ones a workgroup.
const U: u32 = 8u / W;
const ROW_LANES: u32 = 256u / U;
var<workgroup> part: array<{{V}}, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let cw = p.cols / W;
    let u = lid.x % U;
    let lane = lid.x / U;
    let c = (wid.x + wid.y * nwg.x) * U + u;
    var s = {{V}}(0.0);
    if c < cw {
        let base = p.x_offset / W + c;
        var r = lane;
        // Four rows' loads issued before their uses; added in row order.
        for (; r + 3u * ROW_LANES < p.rows; r += 4u * ROW_LANES) {
            let e0 = {{V}}(x[base + r * cw]);
            let e1 = {{V}}(x[base + (r + ROW_LANES) * cw]);
            let e2 = {{V}}(x[base + (r + 2u * ROW_LANES) * cw]);
            let e3 = {{V}}(x[base + (r + 3u * ROW_LANES) * cw]);
//#if HALF
            half_out[r * cw + c] = {{HT}}(e0);
            half_out[(r + ROW_LANES) * cw + c] = {{HT}}(e1);
            half_out[(r + 2u * ROW_LANES) * cw + c] = {{HT}}(e2);
            half_out[(r + 3u * ROW_LANES) * cw + c] = {{HT}}(e3);
//#endif
            s += e0;
            s += e1;
            s += e2;
            s += e3;
        }
        for (; r < p.rows; r += ROW_LANES) {
            let e = {{V}}(x[base + r * cw]);
//#if HALF
            half_out[r * cw + c] = {{HT}}(e);
//#endif
            s += e;
        }
    }
    part[lid.x] = s;
    workgroupBarrier();
    for (var h = ROW_LANES / 2u; h > 0u; h >>= 1u) {
        if lane < h {
            part[lid.x] = part[lid.x] + part[lid.x + h * U];
        }
        workgroupBarrier();
    }
    if lane == 0u && c < cw {
        out[c] = part[lid.x];
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

