// Fused cross-entropy over rows of logits, in f32, one workgroup per row:
//   loss[r] = logsumexp(logits[r]) - logits[r, target[r]]   (0 where target is ignored)
//   BACKWARD: dlogits[r, j] = (softmax_j - [j == target]) * p.grad_scale
// With label smoothing e (p.smoothing > 0, PyTorch's form): the target's weight is
// 1 - e and every class gets e / V: loss = lse - (1 - e) x_t - e mean(x), dlogits =
// (softmax - (1 - e) onehot - e / V) * grad_scale.
// dlogits may be the logits' own block (each element is read before it is written).
// Both may have a row stride above the vocabulary (p.ld: rows padded for aligned loads).
// Template: ENABLE, T (logits type), TD (dlogits type: T, or f16 under fp16-mixed, the
// f32 value rounded as it is written), BACKWARD (true | false), VEC (four elements a
// load and store: the host's flag where the row stride is a multiple of four and the
// blocks hold each row's last four; on the H100 GPT-2's head went from 353 us a chunk
// of 1366 rows, about 2 TB/s, as the scalar loop's one load in flight a thread left
// it).
{{ENABLE}}

struct Params {
    rows: u32,        // rows in this launch
    cols: u32,        // vocabulary
    row_offset: u32,  // first row of this launch (chunking)
    ignore_index: i32,
    grad_scale: f32,
    ld: u32,          // row stride of logits and dlogits (>= cols: rows may be padded)
    smoothing: f32,   // label smoothing (0: none)
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
//#if VEC
@group(0) @binding(1) var<storage, read_write> logits: array<vec4<{{T}}>>;
//#else
@group(0) @binding(1) var<storage, read_write> logits: array<{{T}}>;
//#endif
@group(0) @binding(2) var<storage, read_write> targets: array<i32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;
//#if VEC
@group(0) @binding(4) var<storage, read_write> dlogits: array<vec4<{{TD}}>>;
//#else
@group(0) @binding(4) var<storage, read_write> dlogits: array<{{TD}}>;
//#endif

const WG: u32 = 256u;
{{WORKGROUP_REDUCE}}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let local_row = wid.x + wid.y * nwg.x;
    if local_row >= p.rows { return; }
    let row = p.row_offset + local_row;
    let base = row * p.ld;
    let tgt = targets[row];
    let valid = tgt != p.ignore_index && tgt >= 0 && u32(tgt) < p.cols;
    // One pass over the row (online softmax): each thread keeps its running max m and
    // its sum s of exp(x - m), rescaled when the max grows, and the sum of x for label
    // smoothing; the workgroup then combines them against the row's max.
    var m = -3.4028235e38;
    var s = 0.0;
    var sx = 0.0;
//#if VEC
    // Four elements a load (the row's padding to a multiple of four masked off): the
    // running max takes the four's max, then their exps are added at once.
    let base4 = base / 4u;
    let n4 = (p.cols + 3u) / 4u;
    for (var j4 = lid; j4 < n4; j4 += WG) {
        let x = vec4<f32>(logits[base4 + j4]);
        let valid4 = vec4<u32>(4u * j4) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.cols);
        let xm = select(vec4<f32>(-3.4028235e38), x, valid4);
        let top = max(max(xm.x, xm.y), max(xm.z, xm.w));
        if top > m {
            s *= exp(m - top);
            m = top;
        }
        let e4 = select(vec4<f32>(0.0), exp(x - m), valid4);
        s += (e4.x + e4.y) + (e4.z + e4.w);
        let x0 = select(vec4<f32>(0.0), x, valid4);
        sx += (x0.x + x0.y) + (x0.z + x0.w);
    }
//#else
    for (var j = lid; j < p.cols; j += WG) {
        let x = f32(logits[base + j]);
        if x > m {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else {
            s += exp(x - m);
        }
        sx += x;
    }
//#endif
    let row_max = workgroup_max(lid, m);
    let total = workgroup_sum(lid, s * exp(m - row_max));
    let e = p.smoothing;
    var mean_x = 0.0;
    if e > 0.0 {
        mean_x = workgroup_sum(lid, sx) / f32(p.cols);
    }
    if lid == 0u {
        var loss = 0.0;
        if valid {
//#if VEC
            let xt = f32(logits[(base + u32(tgt)) / 4u][u32(tgt) % 4u]);
//#else
            let xt = f32(logits[base + u32(tgt)]);
//#endif
            if e > 0.0 {
                loss = log(total) + row_max - (1.0 - e) * xt - e * mean_x;
            } else {
                loss = log(total) + row_max - xt;
            }
        }
        losses[row] = loss;
    }
    if {{BACKWARD}} {
        // Every thread has read what it needs before any element is overwritten.
        workgroupBarrier();
        let scale = select(0.0, p.grad_scale, valid);
//#if VEC
        for (var j4 = lid; j4 < n4; j4 += WG) {
            let idx = vec4<u32>(4u * j4) + vec4<u32>(0u, 1u, 2u, 3u);
            let prob = exp(vec4<f32>(logits[base4 + j4]) - row_max) / total;
            let hot = select(vec4<f32>(0.0), vec4<f32>(1.0), (idx == vec4<u32>(u32(tgt))) & vec4<bool>(valid));
            var d = (prob - hot) * scale;
            if e > 0.0 {
                d = (prob - (1.0 - e) * hot - e / f32(p.cols)) * scale;
            }
            // The padding past the vocabulary gets zeros (nothing reads it).
            dlogits[base4 + j4] = vec4<{{TD}}>(select(vec4<f32>(0.0), d, idx < vec4<u32>(p.cols)));
        }
//#else
        for (var j = lid; j < p.cols; j += WG) {
            let prob = exp(f32(logits[base + j]) - row_max) / total;
            let hot = select(0.0, 1.0, valid && u32(tgt) == j);
            if e > 0.0 {
                dlogits[base + j] = {{TD}}((prob - (1.0 - e) * hot - e / f32(p.cols)) * scale);
            } else {
                dlogits[base + j] = {{TD}}((prob - hot) * scale);
            }
        }
//#endif
    }
}
