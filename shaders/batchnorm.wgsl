// BatchNorm2d on NHWC activations seen as [M rows, C channels] (engine/src/kernels/
// batchnorm.rs), with a fused residual add and ReLU (as apex's BN-add-ReLU, backward
// needs no residual: the ReLU's mask is the output's sign, and the output is what the
// next layer keeps anyway).
// Statistics are exact and order-fixed: each chunk of p.rows rows gives per-channel
// (count, mean, M2) (two passes over the chunk), and the chunks are merged with Chan's
// formula, so a channel's variance is never E[x^2] - mean^2. Partials are [chunk][3][C]
// (forward) and [chunk][2][C] (backward); SyncBatchNorm concatenates every device's
// partials before the merge.
//   STATS:  x -> part (count, mean, M2); grid (C / 64, chunks), 64 channels x 4 lanes
//           (with VEC: 16 lanes of 4 channels x 16 lanes down the rows).
//   FINAL:  part, gamma, beta, running mean/var -> coef [4][C] = scale, shift, mean,
//           invstd; in training the running statistics move by p.momentum (the
//           unbiased variance, as PyTorch) and num_batches_tracked counts the batch;
//           with EVAL from the running statistics.
//           One workgroup a channel.
//   APPLY:  y = relu?(x * scale + shift + res?), one thread an element.
//   GSTATS: x, y, dy, coef -> part (sum g, sum g (x - mean)), g = dy * (y > 0) with
//           RELU, else dy.
//   GFINAL: part, coef -> gcoef [2][C] = (sum g / N, sum g (x - mean) invstd^2 / N), or
//           zeros with frozen statistics; dgamma = sum g (x - mean) invstd, dbeta = sum g.
//   GAPPLY: dx = scale (g - gcoef0 - (x - mean) gcoef1); dres = g.
// Template: ENABLE, TX (x, residual), TY (the output, read by backward), TG (dy), TD
// (y, dx), STATS, FINAL, APPLY, GSTATS, GFINAL, GAPPLY, RELU, RES; APPLY and GAPPLY take
// W elements a thread (4 where the channels are a multiple of 4: VEC, and VX, VY, VG,
// VD, VF the vec4 types; else the scalars); so does STATS's x.
{{ENABLE}}

struct Params {
    m: u32,          // rows (this device's)
    c: u32,          // channels
    rows: u32,       // rows a chunk
    chunks: u32,     // chunks in the partials (every device's, for the merge)
    eps: f32,
    momentum: f32,
    update: u32,     // FINAL: move the running statistics
    eval: u32,       // FINAL / GFINAL: frozen (running) statistics
    count: f32,      // rows over every device
    total: u32,      // APPLY / GAPPLY: elements
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

const RELU: bool = {{RELU}};
const W: u32 = {{W}}u;
const RES: bool = {{RES}};

var<workgroup> red: array<f32, 256>;
var<workgroup> red2: array<f32, 256>;
var<workgroup> red3: array<f32, 256>;

// The four lanes' values of channel lane `lane` summed (sub-lane 0 holds the result
// in red[lane]); every thread calls it.
fn sum4(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    red[lid] = v;
    workgroupBarrier();
    let lane = lid % 64u;
    return red[lane] + red[lane + 64u] + red[lane + 128u] + red[lane + 192u];
}

// The channel, sub-lane and row range [r0, r1) of a partial-statistics thread: 64
// channels across a workgroup, 4 sub-lanes down the rows of chunk wid.y.
struct Chunk { ch: u32, sub: u32, r0: u32, r1: u32 }

fn chunk(lid: u32, wid: vec3<u32>) -> Chunk {
    let r0 = wid.y * p.rows;
    return Chunk(wid.x * 64u + lid % 64u, lid / 64u, r0, min(p.m, r0 + p.rows));
}

//#if STATS
@group(0) @binding(1) var<storage, read_write> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read_write> part: array<f32>;

//#if VEC
// Channels a multiple of 4: a thread reads 4 channels of a row (one vector), 16 lanes
// across the workgroup's 64 channels and 16 down the rows.
var<workgroup> redv: array<vec4<f32>, 256>;

// The 16 row lanes' vectors of channel lane lid % 16 summed; every thread calls it.
fn sum16(lid: u32, v: vec4<f32>) -> vec4<f32> {
    workgroupBarrier();
    redv[lid] = v;
    workgroupBarrier();
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < 16u; k++) { s += redv[k * 16u + lid % 16u]; }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let ch = wid.x * 64u + (lid % 16u) * 4u;
    let sub = lid / 16u;
    let r0 = wid.y * p.rows;
    let r1 = min(p.m, r0 + p.rows);
    let live = ch < p.c;
    var s = vec4<f32>(0.0);
    if live {
        for (var r = r0 + sub; r < r1; r += 16u) { s += vec4<f32>(x[(r * p.c + ch) / 4u]); }
    }
    let n = f32(r1 - r0);
    let mean = sum16(lid, s) / n;
    var q = vec4<f32>(0.0);
    if live {
        for (var r = r0 + sub; r < r1; r += 16u) {
            let d = vec4<f32>(x[(r * p.c + ch) / 4u]) - mean;
            q += d * d;
        }
    }
    let m2 = sum16(lid, q);
    if live && sub == 0u {
        for (var l = 0u; l < 4u; l++) {
            let at = wid.y * 3u * p.c + ch + l;
            part[at] = n;
            part[at + p.c] = mean[l];
            part[at + 2u * p.c] = m2[l];
        }
    }
}
//#else
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let k = chunk(lid, wid);
    let ch = k.ch;
    let live = ch < p.c;
    var s = 0.0;
    if live {
        for (var r = k.r0 + k.sub; r < k.r1; r += 4u) { s += f32(x[r * p.c + ch]); }
    }
    let n = f32(k.r1 - k.r0);
    let mean = sum4(lid, s) / n;
    var q = 0.0;
    if live {
        for (var r = k.r0 + k.sub; r < k.r1; r += 4u) {
            let d = f32(x[r * p.c + ch]) - mean;
            q += d * d;
        }
    }
    let m2 = sum4(lid, q);
    if live && k.sub == 0u {
        let at = wid.y * 3u * p.c + ch;
        part[at] = n;
        part[at + p.c] = mean;
        part[at + 2u * p.c] = m2;
    }
}
//#endif
//#endif

//#if FINAL
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(3) var<storage, read_write> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> rmean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rvar: array<f32>;
@group(0) @binding(6) var<storage, read_write> coef: array<f32>;
@group(0) @binding(7) var<storage, read_write> batches: array<f32>;

// Chan's merge of (na, ma, qa) and (nb, mb, qb).
fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    if n == 0.0 { return a; }
    let d = b.y - a.y;
    return vec3<f32>(n, a.y + d * b.x / n, a.z + b.z + d * d * a.x * b.x / n);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let ch = wid.x;
    var acc = vec3<f32>(0.0);
    if p.eval == 0u {
        for (var k = lid; k < p.chunks; k += 256u) {
            let at = k * 3u * p.c + ch;
            acc = merge(acc, vec3<f32>(part[at], part[at + p.c], part[at + 2u * p.c]));
        }
    }
    red[lid] = acc.x;
    red2[lid] = acc.y;
    red3[lid] = acc.z;
    for (var half = 128u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if lid < half {
            let o = merge(vec3<f32>(red[lid], red2[lid], red3[lid]),
                          vec3<f32>(red[lid + half], red2[lid + half], red3[lid + half]));
            red[lid] = o.x;
            red2[lid] = o.y;
            red3[lid] = o.z;
        }
    }
    workgroupBarrier();
    if lid != 0u { return; }
    var mean = red2[0];
    var var_b = red3[0] / max(red[0], 1.0);
    if p.eval != 0u {
        mean = rmean[ch];
        var_b = rvar[ch];
    } else if p.update != 0u {
        let n = red[0];
        let unbiased = red3[0] / max(n - 1.0, 1.0);
        rmean[ch] = (1.0 - p.momentum) * rmean[ch] + p.momentum * mean;
        rvar[ch] = (1.0 - p.momentum) * rvar[ch] + p.momentum * unbiased;
        if ch == 0u { batches[0] += 1.0; }
    }
    let invstd = 1.0 / sqrt(var_b + p.eps);
    let scale = gamma[ch] * invstd;
    coef[ch] = scale;
    coef[p.c + ch] = beta[ch] - mean * scale;
    coef[2u * p.c + ch] = mean;
    coef[3u * p.c + ch] = invstd;
}
//#endif

//#if APPLY
@group(0) @binding(1) var<storage, read_write> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read_write> res: array<{{VX}}>;
@group(0) @binding(3) var<storage, read_write> coef: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<{{VD}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= p.total { return; }
    let ch = (t * W) % p.c;
    var v = {{VF}}(x[t]) * lanes(ch) + lanes(p.c + ch);
    if RES { v += {{VF}}(res[t]); }
    if RELU { v = max(v, {{VF}}(0.0)); }
    y[t] = {{VD}}(v);
}

// W coefficients from `at` on.
fn lanes(at: u32) -> {{VF}} {
//#if VEC
    return vec4<f32>(coef[at], coef[at + 1u], coef[at + 2u], coef[at + 3u]);
//#else
    return coef[at];
//#endif
}
//#endif

//#if GSTATS
@group(0) @binding(1) var<storage, read_write> x: array<{{TX}}>;
@group(0) @binding(2) var<storage, read_write> y: array<{{TY}}>;
@group(0) @binding(3) var<storage, read_write> dy: array<{{TG}}>;
@group(0) @binding(4) var<storage, read_write> coef: array<f32>;
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let k = chunk(lid, wid);
    let ch = k.ch;
    var sg = 0.0;
    var sgx = 0.0;
    if ch < p.c {
        let mean = coef[2u * p.c + ch];
        for (var r = k.r0 + k.sub; r < k.r1; r += 4u) {
            let e = r * p.c + ch;
            let xv = f32(x[e]);
            var g = f32(dy[e]);
            if RELU && f32(y[e]) <= 0.0 { g = 0.0; }
            sg += g;
            sgx += g * (xv - mean);
        }
    }
    let a = sum4(lid, sg);
    let b = sum4(lid, sgx);
    if ch < p.c && k.sub == 0u {
        let at = wid.y * 2u * p.c + ch;
        part[at] = a;
        part[at + p.c] = b;
    }
}
//#endif

//#if GFINAL
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> coef: array<f32>;
@group(0) @binding(3) var<storage, read_write> gcoef: array<f32>;
@group(0) @binding(4) var<storage, read_write> dgamma: array<f32>;
@group(0) @binding(5) var<storage, read_write> dbeta: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let ch = wid.x;
    var a = 0.0;
    var b = 0.0;
    for (var k = lid; k < p.chunks; k += 256u) {
        a += part[k * 2u * p.c + ch];
        b += part[k * 2u * p.c + p.c + ch];
    }
    red[lid] = a;
    red2[lid] = b;
    for (var half = 128u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if lid < half {
            red[lid] += red[lid + half];
            red2[lid] += red2[lid + half];
        }
    }
    workgroupBarrier();
    if lid != 0u { return; }
    let invstd = coef[3u * p.c + ch];
    dgamma[ch] = red2[0] * invstd;
    dbeta[ch] = red[0];
    if p.eval != 0u {
        gcoef[ch] = 0.0;
        gcoef[p.c + ch] = 0.0;
    } else {
        gcoef[ch] = red[0] / p.count;
        gcoef[p.c + ch] = red2[0] * invstd * invstd / p.count;
    }
}
//#endif

//#if GAPPLY
@group(0) @binding(1) var<storage, read_write> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read_write> y: array<{{VY}}>;
@group(0) @binding(3) var<storage, read_write> dy: array<{{VG}}>;
@group(0) @binding(4) var<storage, read_write> coef: array<f32>;
@group(0) @binding(5) var<storage, read_write> gcoef: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<{{VD}}>;
@group(0) @binding(7) var<storage, read_write> dres: array<{{VD}}>;

// W values of `a` from `at` on.
fn lanes(a: u32, at: u32) -> {{VF}} {
//#if VEC
    if a == 0u { return vec4<f32>(coef[at], coef[at + 1u], coef[at + 2u], coef[at + 3u]); }
    return vec4<f32>(gcoef[at], gcoef[at + 1u], gcoef[at + 2u], gcoef[at + 3u]);
//#else
    if a == 0u { return coef[at]; }
    return gcoef[at];
//#endif
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= p.total { return; }
    let ch = (t * W) % p.c;
    let xv = {{VF}}(x[t]);
    var g = {{VF}}(dy[t]);
    if RELU { g = select(g, {{VF}}(0.0), {{VF}}(y[t]) <= {{VF}}(0.0)); }
    let mean = lanes(0u, 2u * p.c + ch);
    dx[t] = {{VD}}(lanes(0u, ch) * (g - lanes(1u, ch) - (xv - mean) * lanes(1u, p.c + ch)));
    if RES { dres[t] = {{VD}}(g); }
}
//#endif
