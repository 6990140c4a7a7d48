// Column sums of a row-major [rows, cols] x into f32 (bias gradients: the sum of dy over
// rows), deterministic and parallel over rows, in one pass:
//   one pass (ONE true): a workgroup takes U units of W columns, with 256 / U lanes of
//           rows each: lane l sums rows l, l + lanes, ... in order (eight rows loaded at a
//           time), then the lanes are added pairwise in a fixed tree. For x with more
//           rows than a chunk; one launch, no partials
//   chunks (ONE false): out[chunk, c] = sum of x[r, c] over the chunk's ROW_CHUNK rows,
//           in row order; one invocation per W columns of a chunk (W 4: vec4 loads, where
//           the columns and the view's offset are multiples of 4), four rows loaded at a
//           time (a warp reads consecutive columns). The host runs it for x of one chunk.
// The element summed is x's, or with ACT x times the activation's derivative at `pre`
// (x's shape, offset 0): a linear's bias gradient through the activation after it,
// where x is that activation's output gradient. With COPY every element summed is also
// written to copy_out (offset 0) as CT: the dy a linear's products read (f16 under
// fp16-mixed), in the pass that sums it.
// Template: ENABLE, T (x's element type), ONE, COPY, ACT, ACT_GRAD (the derivative's
// function in shaders/activations.wgsl), ACTIVATIONS, W, V (f32 or vec4<f32>), XT (T or
// vec4<T>), CT (the copy's element), PT (pre's element).
{{ENABLE}}

struct Params {
    rows: u32,
    cols: u32,
    x_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<{{XT}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;
//#if COPY
@group(0) @binding(3) var<storage, read_write> copy_out: array<{{CT}}>;
//#endif
//#if ACT
@group(0) @binding(4) var<storage, read_write> pre: array<{{PT}}>;
//#endif

alias V = {{V}};
{{ACTIVATIONS}}

const ROW_CHUNK: u32 = 64u;
const W: u32 = {{W}}u;

// Element (r, c) (c in units of W) of the rows summed.
fn fetch(r: u32, c: u32, cw: u32) -> V {
    var e = V(x[p.x_offset / W + r * cw + c]);
//#if ACT
    e = e * {{ACT_GRAD}}(V(pre[r * cw + c]));
//#endif
    return e;
}

// Writes element (r, c)'s copy.
fn put(r: u32, c: u32, cw: u32, e: V) {
//#if COPY
    copy_out[r * cw + c] = {{CT}}(e);
//#endif
}

//#if ONE
// One vec4 unit (16 bytes of a row) or four scalar ones a workgroup: as many workgroups
// as the columns allow, each with many rows in flight.
const U: u32 = 4u / W;
const ROW_LANES: u32 = 256u / U;
var<workgroup> part: array<V, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let cw = p.cols / W;
    let u = lid.x % U;
    let lane = lid.x / U;
    let c = (wid.x + wid.y * nwg.x) * U + u;
    var s = V(0.0);
    if c < cw {
        var r = lane;
        // Eight rows' loads issued before their uses; added in row order.
        for (; r + 7u * ROW_LANES < p.rows; r += 8u * ROW_LANES) {
            var e: array<V, 8>;
            for (var k = 0u; k < 8u; k++) {
                e[k] = fetch(r + k * ROW_LANES, c, cw);
            }
            for (var k = 0u; k < 8u; k++) {
                put(r + k * ROW_LANES, c, cw, e[k]);
                s += e[k];
            }
        }
        for (; r < p.rows; r += ROW_LANES) {
            let e = fetch(r, c, cw);
            put(r, c, cw, e);
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
    var s = V(0.0);
    var r = chunk * ROW_CHUNK;
    // Four rows' loads issued before their uses; added in row order.
    for (; r + 4u <= end; r += 4u) {
        let e0 = fetch(r, c, cw);
        let e1 = fetch(r + 1u, c, cw);
        let e2 = fetch(r + 2u, c, cw);
        let e3 = fetch(r + 3u, c, cw);
        put(r, c, cw, e0);
        put(r + 1u, c, cw, e1);
        put(r + 2u, c, cw, e2);
        put(r + 3u, c, cw, e3);
        s += e0;
        s += e1;
        s += e2;
        s += e3;
    }
    for (; r < end; r++) {
        let e = fetch(r, c, cw);
        put(r, c, cw, e);
        s += e;
    }
    out[chunk * cw + c] = s;
}
//#endif
