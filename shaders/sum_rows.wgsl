// Column sums of a row-major [rows, cols] x into f32 (bias gradients: the sum of dy over
// rows), deterministic and parallel over rows, in two passes:
//   MODE 0: part[chunk, c] = sum of x[r, c] over the chunk's ROW_CHUNK rows, in row order
//           (one thread per column of a chunk: a warp reads consecutive columns)
//   MODE 1: out[c] = sum of part[k, c] over the chunks, in chunk order (x is the partials)
// With HALF (MODE 0, x f32), every element read is also written to half_out as f16: the
// f16 copy fp16-mixed's products read (a linear's dy), in the pass that sums it.
// Template: ENABLE, T (x's type; f32 in MODE 1), MODE, HALF.
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
@group(0) @binding(1) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
//#if HALF
@group(0) @binding(3) var<storage, read_write> half_out: array<f16>;
//#endif

const MODE: u32 = {{MODE}}u;
const ROW_CHUNK: u32 = 64u;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if MODE == 0u {
        let c = wid.x * 256u + lid.x;
        if c >= p.cols { return; }
        let chunk = wid.y;
        let end = min(p.rows, (chunk + 1u) * ROW_CHUNK);
        var s = 0.0;
        for (var r = chunk * ROW_CHUNK; r < end; r++) {
            let e = f32(x[p.x_offset + r * p.cols + c]);
            s += e;
//#if HALF
            half_out[r * p.cols + c] = f16(e);
//#endif
        }
        out[chunk * p.cols + c] = s;
        return;
    }
    let c = (wid.x + wid.y * nwg.x) * 256u + lid.x;
    if c >= p.cols { return; }
    let chunks = (p.rows + ROW_CHUNK - 1u) / ROW_CHUNK;
    var s = 0.0;
    for (var k = 0u; k < chunks; k++) {
        s += f32(x[k * p.cols + c]);
    }
    out[c] = s;
}
