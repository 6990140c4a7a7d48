// Column sums of a row-major [rows, cols] x into f32 (bias gradients: the sum of dy over
// rows), deterministic and parallel over rows, in two passes (one for x of one chunk):
//   partials (this kernel): out[chunk, c] = sum of x[r, c] over the chunk's ROW_CHUNK
//           rows, in row order; one invocation per W columns of a chunk (W 4: vec4 loads,
//           where the columns and the view's offset are multiples of 4), four rows loaded
//           at a time (a warp reads consecutive columns). For x of one chunk, the sums.
//   sums (shaders/col_sums.wgsl, with other sums): out[c] = sum of the partials x[k, c]
//           over the chunks: 16 lanes a column, each summing every 16th chunk in order,
//           then the lanes added in lane order.
// (On the H100 one pass over every row, a workgroup per 8 or 4 columns, took 52-93 us
// for GPT-2's [8192, 768] dy, against 35 + 7 for the two passes: too few workgroups.)
// The element summed is x's, or with ACT x times the activation's derivative at `pre`
// (x's shape, offset 0): a linear's bias gradient through the activation after it,
// where x is that activation's output gradient. With COPY every element summed is also
// written to copy_out (offset 0) as CT: the dy a linear's products read (f16 under
// fp16-mixed), in the pass that sums it. With AGAIN the activation's output at `pre` is
// written to act_out (pre's type, offset 0), the forward's values again: the input of
// the product after the activation, whose weight gradient needs it, so the forward need
// not keep it (`autograd::ops::mlp`).
// Template: ENABLE, T (x's element type), COPY, ACT, ACT_GRAD (the derivative's
// function in shaders/activations.wgsl), AGAIN, ACT_FWD (the activation's function),
// ACTIVATIONS, W, V (f32 or vec4<f32>), XT (T or vec4<T>), CT (the copy's element), PT
// (pre's element).
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
//#if AGAIN
@group(0) @binding(5) var<storage, read_write> act_out: array<{{PT}}>;
//#endif

alias V = {{V}};
{{ACTIVATIONS}}

const ROW_CHUNK: u32 = 64u;
const W: u32 = {{W}}u;

// Element (r, c) (c in units of W) of the rows summed.
fn fetch(r: u32, c: u32, cw: u32) -> V {
    var e = V(x[p.x_offset / W + r * cw + c]);
//#if ACT
    let a = V(pre[r * cw + c]);
    e = e * {{ACT_GRAD}}(a);
//#endif
//#if AGAIN
    act_out[r * cw + c] = {{PT}}({{ACT_FWD}}(a));
//#endif
    return e;
}

// Writes element (r, c)'s copy.
fn put(r: u32, c: u32, cw: u32, e: V) {
//#if COPY
    copy_out[r * cw + c] = {{CT}}(e);
//#endif
}

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
